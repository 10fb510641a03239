package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/internal/server"
)

// startSluiced runs a sluiced in-process on loopback, following etcd at
// endpoint, until the test ends.
func startSluiced(t *testing.T, endpoint string) *server.Server {
	t.Helper()
	srv, err := server.New(server.Options{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Topology: "simulated",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Etcd: server.EtcdOptions{Endpoints: endpoint, MemberTTL: time.Second,
			ProbeEvery: 50 * time.Millisecond, RetryEvery: 20 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return srv
}

// sluicectl runs the CLI and returns its exit code, stdout and stderr.
func sluicectl(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// eventually polls cond until it holds, for up to 30 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still not %s after 30s", what)
		}
		<-tick.C
	}
}

// drain and undrain write and delete the mark (with $USER and --reason);
// the server acts on it, and domains shows both the mark and the server's
// state with its in-flight count.
func TestDrainUndrainDomains(t *testing.T) {
	etcd := etcdtest.Start(t)
	srv := startSluiced(t, etcd.Endpoint())
	addr := srv.GRPCAddr().String()
	t.Setenv("USER", "alice")
	t.Setenv("SLUICE_ETCD", "") // the flags below say where etcd is

	code, out, errs := sluicectl("drain", "nvl72-a", "--reason", "rack swap", "--etcd", etcd.Endpoint())
	if code != 0 || !strings.Contains(out, "drained by alice") || !strings.Contains(out, "rack swap") {
		t.Fatalf("drain: %d %q %q", code, out, errs)
	}
	draining := func(want bool) func() bool {
		return func() bool {
			for _, d := range srv.Engine().Domains() {
				if d.ID == "nvl72-a" {
					return d.Draining == want
				}
			}
			return false
		}
	}
	eventually(t, "nvl72-a drained on the server", draining(true))

	code, out, errs = sluicectl("domains", "--server", addr, "--etcd", etcd.Endpoint())
	if code != 0 {
		t.Fatalf("domains: %d %q", code, errs)
	}
	var line string
	for l := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(l, "nvl72-a ") {
			line = l
		}
	}
	if f := strings.Fields(line); len(f) < 7 || f[3] != "yes" || f[4] != "0" || !strings.Contains(line, "drained by alice") {
		t.Fatalf("domains line for nvl72-a: %q\n%s", line, out)
	}
	if !strings.Contains(out, "nvl72-b ") || !strings.Contains(out, "DRAIN MARK") {
		t.Fatalf("domains output:\n%s", out)
	}
	code, out, _ = sluicectl("domains", "--server", addr, "-o", "json")
	if code != 0 || !strings.Contains(out, `"draining": true`) {
		t.Fatalf("domains -o json: %d\n%s", code, out)
	}

	code, out, errs = sluicectl("undrain", "nvl72-a", "--etcd", etcd.Endpoint())
	if code != 0 || !strings.Contains(out, "removed") {
		t.Fatalf("undrain: %d %q %q", code, out, errs)
	}
	eventually(t, "nvl72-a undrained on the server", draining(false))
	if code, out, _ = sluicectl("undrain", "nvl72-a", "--etcd", etcd.Endpoint()); code != 0 || !strings.Contains(out, "no drain mark") {
		t.Fatalf("second undrain: %d %q", code, out)
	}

	// Without etcd, --server drains the one replica directly.
	if code, out, errs = sluicectl("drain", "hgx-h200-1", "--server", addr, "--reason", "fan"); code != 0 || !strings.Contains(out, "only") {
		t.Fatalf("drain --server: %d %q %q", code, out, errs)
	}
	if code, _, errs = sluicectl("drain", "nvl72-a"); code == 0 || !strings.Contains(errs, "--etcd") {
		t.Fatalf("drain without --etcd or --server: %d %q", code, errs)
	}
	if code, _, _ = sluicectl("drain"); code == 0 {
		t.Fatal("drain without a domain succeeded")
	}
}
