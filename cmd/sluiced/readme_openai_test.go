package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/testdep"
	"github.com/sluice-sched/sluice/internal/testwait"
)

// The README's "Through an OpenAI client" commands work as written: the
// engine simulator, sluiced pointed at it, a streamed chat completion with
// curl, then sluicectl's tenant view. The binaries are built first (go run
// would build them the same); the test substitutes only where things
// live: free ports for the fixed ones, a temporary file for the topology.
func TestReadmeOpenAICommands(t *testing.T) {
	curl := testdep.Binary(t, "apt-get install -y curl", "curl")
	block := readmeOpenAIBlock(t)
	if len(block) != 3 || !strings.HasPrefix(block[0], "go run ./cmd/sluicectl engine-sim ") ||
		!strings.HasPrefix(block[1], "go run ./cmd/sluiced ") || !strings.HasPrefix(block[2], "curl ") {
		t.Fatalf("the README's OpenAI block is not the simulator, sluiced and curl:\n%s", strings.Join(block, "\n"))
	}
	dir := t.TempDir()
	bins := map[string]string{}
	for _, name := range []string{"sluiced", "sluicectl"} {
		bins[name] = filepath.Join(dir, name)
		if out, err := exec.Command("go", "build", "-o", bins[name], "../"+name).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", name, err, out)
		}
	}
	front, grpcAddr, httpAddr := freePort(t), freePort(t), freePort(t)
	topo := filepath.Join(dir, "sim-topology.yaml")
	subst := strings.NewReplacer("go run ./cmd/sluicectl", bins["sluicectl"], "go run ./cmd/sluiced", bins["sluiced"],
		"/tmp/sim-topology.yaml", topo, "127.0.0.1:8080", front)

	startCommand(t, subst.Replace(block[0])+" --listen 127.0.0.1:0", nil)
	testwait.Until(t, 30*time.Second, "the simulator's topology file", func() bool {
		_, err := os.Stat(topo)
		return err == nil
	})
	startCommand(t, subst.Replace(block[1]), []string{"SLUICE_GRPC_ADDR=" + grpcAddr, "SLUICE_HTTP_ADDR=" + httpAddr})
	testwait.Until(t, 30*time.Second, "sluiced's OpenAI front", func() bool {
		resp, err := http.Get("http://" + front + "/v1/models")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})

	line := strings.Replace(subst.Replace(block[2]), "curl ", curl+" -i ", 1)
	out, err := exec.Command("sh", "-c", line).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", block[2], err, out)
	}
	if !bytes.Contains(bytes.ToLower(out), []byte("x-sluice-domain: ")) || !bytes.Contains(out, []byte(`"content":`)) || !bytes.HasSuffix(bytes.TrimSpace(out), []byte("data: [DONE]")) {
		t.Fatalf("curl's stream:\n%s", out)
	}
	tenant := exec.Command(bins["sluicectl"], "tenant", "acme")
	tenant.Env = append(os.Environ(), "SLUICE_SERVER="+grpcAddr)
	if out, err := tenant.CombinedOutput(); err != nil || !bytes.Contains(out, []byte("acme")) {
		t.Fatalf("sluicectl tenant acme: %v\n%s", err, out)
	}
}

// readmeOpenAIBlock returns the command lines of the first sh block under
// the README's "## Through an OpenAI client".
func readmeOpenAIBlock(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(src), "\n## Through an OpenAI client\n")
	if !ok {
		t.Fatal(`README.md has no "## Through an OpenAI client" section`)
	}
	_, block, ok := strings.Cut(section, "```sh\n")
	if !ok {
		t.Fatal("the section has no sh block")
	}
	block, _, _ = strings.Cut(block, "```")
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(block), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return lines
}

// startCommand runs a README line through sh, with env added, until the
// test ends.
func startCommand(t *testing.T, line string, env []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "sh", "-c", "exec "+line)
	cmd.Env = append(os.Environ(), env...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("%s:\n%s", line, logs.String())
		}
	})
}

// freePort returns a loopback address no one listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
