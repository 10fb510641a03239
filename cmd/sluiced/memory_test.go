//go:build linux

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/config"
)

// sluiced serving 100k configured (idle) tenants settles at ≤ 64 MB of
// resident memory: a separate process built as it is deployed (no race
// detector, which multiplies memory), on the embedded default with its
// tenants replaced by 100k on a tier without a floor.
func TestHundredThousandTenantsResidentMemory(t *testing.T) {
	const (
		tenants = 100_000
		limit   = 64 << 20
	)
	bin := buildSluiced(t)
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(path, withTenants(t, tenants), 0o600); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(bin, "--config", path, "--topology", "simulated", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json")
	logs, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	httpAddr := readyAddr(t, logs, tenants)
	resp, err := http.Get("http://" + httpAddr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	// The config's parse is garbage once it is applied.
	least := settledResident(t, cmd.Process.Pid, limit/2)
	t.Logf("sluiced with %d tenants: %.1f MB resident", tenants, float64(least)/(1<<20))
	if least > limit {
		t.Errorf("sluiced with %d tenants: %.1f MB resident, want ≤ %d MB", tenants, float64(least)/(1<<20), limit>>20)
	}
}

// buildSluiced builds sluiced as it is deployed (no race detector, which
// multiplies memory) and returns the binary's path.
func buildSluiced(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sluiced")
	gobin, err := exec.LookPath("go") // go test runs with its own go first on PATH
	if err != nil {
		t.Fatalf("no go on PATH to build sluiced with: %v", err)
	}
	build := exec.Command(gobin, "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// withTenants is the embedded default config with its tenants replaced by
// n tenants on the first tier (by name) that has no floor.
func withTenants(t *testing.T, n int) []byte {
	t.Helper()
	cfg, err := config.Default()
	if err != nil {
		t.Fatal(err)
	}
	var tier string
	for _, name := range slices.Sorted(maps.Keys(cfg.Tiers)) {
		if cfg.Tiers[name].Floor == 0 {
			tier = name
			break
		}
	}
	if tier == "" {
		t.Fatal("the embedded default has no tier without a floor")
	}
	doc := config.DefaultYAML()
	start := bytes.Index(doc, []byte("\ntenants:"))
	if start < 0 {
		t.Fatal("the embedded default has no top-level tenants: section")
	}
	end := len(doc)
	if next := regexp.MustCompile(`\n[a-z_]+:`).FindIndex(doc[start+1:]); next != nil {
		end = start + 1 + next[0]
	}
	var b bytes.Buffer
	b.Write(doc[:start])
	b.WriteString("\ntenants:\n")
	for i := range n {
		fmt.Fprintf(&b, "  tenant-%06d: {tier: %s}\n", i, tier)
	}
	b.Write(doc[end:])
	return b.Bytes()
}

// readyAddr reads sluiced's JSON log until its ready line and returns the
// HTTP address it serves on.
func readyAddr(t *testing.T, logs io.Reader, tenants int) string {
	t.Helper()
	_, httpAddr := readyAddrs(t, logs, tenants)
	return httpAddr
}

// readyAddrs reads sluiced's JSON log until its ready line and returns the
// gRPC and HTTP addresses it serves on; tenants ≥ 0 is the tenant count
// it must report.
func readyAddrs(t *testing.T, logs io.Reader, tenants int) (grpcAddr, httpAddr string) {
	t.Helper()
	sc := bufio.NewScanner(logs)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg     string `json:"msg"`
			GRPC    string `json:"grpc"`
			HTTP    string `json:"http"`
			Tenants int    `json:"tenants"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Msg != "sluiced ready" {
			continue
		}
		if tenants >= 0 && line.Tenants != tenants {
			t.Fatalf("sluiced ready with %d tenants, want %d", line.Tenants, tenants)
		}
		go func() { // keep draining, so that logging never blocks it
			for sc.Scan() {
			}
		}()
		return line.GRPC, line.HTTP
	}
	t.Fatalf("sluiced exited before it was ready: %v", sc.Err())
	return "", ""
}

// residentBytes reads a process's resident set size from /proc.
func residentBytes(t *testing.T, pid int) int64 { return statusBytes(t, pid, "VmRSS") }

// settledResident is the least of PID's resident bytes over ten samples
// half a second apart, or the first at most enough: the runtime hands
// freed memory back to the system in the background, and the least is
// what the process settles at. The process is another one, on the wall
// clock: nothing here can be a fake clock.
func settledResident(t *testing.T, pid int, enough int64) int64 {
	t.Helper()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	least := residentBytes(t, pid)
	for i := 1; i < 10 && least > enough; i++ {
		<-tick.C
		least = min(least, residentBytes(t, pid))
	}
	return least
}

// statusBytes reads a size in kB of /proc/PID/status (VmRSS, VmHWM) in
// bytes.
func statusBytes(t *testing.T, pid int, field string) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("%s %q: %v", field, rest, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
