package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/internal/fleetgen"
	"github.com/sluice-sched/sluice/internal/load"
	"github.com/sluice-sched/sluice/internal/server"
)

// Bad flags are refused before anything is dialled, each with an error
// that names the flag.
func TestLoadFlagErrors(t *testing.T) {
	t.Setenv("SLUICE_ETCD", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--rate", "100", "--concurrency", "4"}, "--concurrency is the closed loop's"},
		{[]string{"--rate", "-1"}, "--rate -1"},
		{[]string{"--arrivals", "fixed"}, "--arrivals is for the open loop"},
		{[]string{"--rate", "10", "--arrivals", "bursty"}, `--arrivals "bursty"`},
		{[]string{"--mix", "acme:large:1"}, "--mix needs --trace"},
		{[]string{"--trace", replayTrace, "--mix", replayMix, "--rate", "5"}, "--rate is for the closed and open loops"},
		{[]string{"--trace", replayTrace}, "--mix is required"},
		{[]string{"--tenants", "acme:large"}, "--tenants"},
		{[]string{"--concurrency", "0"}, "--concurrency 0"},
		{[]string{"--duration", "0s"}, "--duration"},
		{[]string{"--hold", "-1s"}, "--hold"},
		{[]string{"--rounds", "3"}, "needs --reference health"},
		{[]string{"--reference", "ping"}, `--reference "ping"`},
		{[]string{"--conns", "0"}, "--conns 0"},
		{[]string{"--prefill", "-5"}, "--prefill -5"},
		{[]string{"--server-pid", "-1"}, "--server-pid -1"},
		{[]string{"-o", "xml"}, `-o "xml"`},
		{[]string{"--etcd", "http://127.0.0.1:1", "--reference", "health"}, "--reference runs against one server"},
		{[]string{"--etcd", "http://127.0.0.1:1", "--conns", "2"}, "--conns is for one server"},
		{[]string{"--trace", replayTrace, "--mix", replayMix, "--prefill", "10"}, "--prefill admits leases of --tenants"},
		{[]string{"--tenant-pool", "fleet:10:small"}, "want one %d"},
		{[]string{"--tenant-pool", "fleet-%d:0:small"}, "count must be"},
		{[]string{"--tenants", "acme:small:1", "--tenant-pool", "fleet-%d:10:small"}, "--tenants and --tenant-pool: give one"},
		{[]string{"--tenant-pool", "fleet-%d:10:small", "--tenant-order", "sideways"}, `--tenant-order "sideways"`},
		{[]string{"--tenant-order", "sequential"}, "it needs --tenant-pool"},
		{[]string{"--trace", replayTrace, "--mix", replayMix, "--tenant-pool", "fleet-%d:10:small"}, "--tenant-pool and --tenant-order are for the closed and open loops"},
		{[]string{"--churn-rate", "5"}, "it needs --churn"},
		{[]string{"--churn", "--etcd", "http://127.0.0.1:1"}, "--churn changes one server's placement"},
		{[]string{"--churn", "--trace", replayTrace, "--mix", replayMix}, "--churn draws its health cuts' tenants"},
		{[]string{"--churn", "--churn-rate", "0", "--server", "127.0.0.1:1"}, "--churn-rate 0"},
	} {
		code, _, errs := sluicectl(append([]string{"load"}, tc.args...)...)
		if code != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("load %v: exit %d, %q; want an error containing %q", tc.args, code, errs, tc.want)
		}
	}
	// An argument is the command line's error: exit 2.
	if code, _, errs := sluicectl("load", "extra"); code != 2 || !strings.Contains(errs, `unexpected argument "extra"`) {
		t.Errorf("load extra: exit %d, %q; want 2 and an error naming the argument", code, errs)
	}
	if code, out, _ := sluicectl("load", "--help"); code != 0 || !strings.Contains(out, "--concurrency") || !strings.Contains(out, "--reference") {
		t.Errorf("load --help: exit %d\n%s", code, out)
	}
}

// loadJSON runs load -o json with args and decodes the report.
func loadJSON(t *testing.T, args ...string) load.Report {
	t.Helper()
	code, out, errs := sluicectl(append([]string{"load", "-o", "json"}, args...)...)
	if code != 0 {
		t.Fatalf("load %v: exit %d: %s", args, code, errs)
	}
	var rep load.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("-o json does not parse: %v\n%s", err, out)
	}
	return rep
}

// The command against a real server: the closed loop with the reference,
// Admit-only with the lease count the server reports, and a trace.
func TestLoadCommand(t *testing.T) {
	srv := startSluiced(t, "")
	addr := srv.GRPCAddr().String()
	rep := loadJSON(t, "--server", addr, "--tenants", "acme:small:1", "--concurrency", "2", "--duration", "100ms",
		"--reference", "health", "--rounds", "2")
	if rep.Reference == nil || rep.Reference.Calls == 0 || len(rep.Rounds) != 2 || rep.Ratio <= 0 {
		t.Errorf("reference: %+v, rounds %+v, ratio %v", rep.Reference, rep.Rounds, rep.Ratio)
	}
	if rep.Load.Kind != load.KindAdmitRelease || rep.Load.AdmitCalls == 0 || rep.LeasesHeld == nil || *rep.LeasesHeld != 0 {
		t.Errorf("load: %+v, leases held %v", rep.Load, rep.LeasesHeld)
	}

	rep = loadJSON(t, "--server", addr, "--tenants", "globex:small:1", "--concurrency", "2", "--duration", "100ms",
		"--release=false", "--prefill", "10")
	admitted := rep.Load.Tenants[0].Admitted + rep.Load.Tenants[0].Degraded
	if rep.Load.Kind != load.KindAdmitOnly || rep.Prefilled != 10 || rep.LeasesHeld == nil || *rep.LeasesHeld != 10+admitted {
		t.Errorf("admit-only: kind %s, prefilled %d, admitted %d, leases held %v", rep.Load.Kind, rep.Prefilled, admitted, rep.LeasesHeld)
	}
	if got := int64(srv.Engine().LeaseCount()); rep.LeasesHeld == nil || got != *rep.LeasesHeld {
		t.Errorf("the server holds %d leases, the report says %v", got, rep.LeasesHeld)
	}

	code, out, errs := sluicectl("load", "--server", addr, "--trace", replayTrace, "--mix", replayMix, "--to", "20s", "--speed", "100")
	if code != 0 || !strings.Contains(out, "trace arrivals") || !strings.Contains(out, "Admit latency") {
		t.Errorf("trace: exit %d\n%s\n%s", code, out, errs)
	}
}

// The fleet's files, written by fleet generate, serve as sluiced reads
// them; load draws from their tenants with the printed --tenant-pool, in
// turn, while --churn changes placement, and says what it did.
func TestFleetGenerateThenLoadWithChurn(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "fleet")
	code, out, errs := sluicectl("fleet", "generate", "--dir", dir, "--domains", "6", "--tenants", "500", "-o", "json")
	if code != 0 {
		t.Fatalf("fleet generate: exit %d: %s", code, errs)
	}
	var f fleetgen.Files
	if err := json.Unmarshal([]byte(out), &f); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	if f.Domains != 6 || f.Tenants != 500 || f.TenantPool != "fleet-%03d:500:small" || f.Topology != filepath.Join(dir, "topology.yaml") {
		t.Errorf("fleet generate: %+v", f)
	}
	if code, out, errs := sluicectl("fleet", "generate", "--dir", dir, "--domains", "3", "--tenants", "7"); code != 0 ||
		!strings.Contains(out, "3 NVL72 domains, 216 GPUs") || !strings.Contains(out, "--tenant-pool fleet-%01d:7:small") {
		t.Errorf("fleet generate, table: exit %d\n%s%s", code, out, errs)
	}
	if code, _, errs := sluicectl("fleet", "generate", "--dir", dir, "--domains", "0"); code != 1 || !strings.Contains(errs, "--domains 0") {
		t.Errorf("--domains 0: exit %d, %q", code, errs)
	}
	if code, _, errs := sluicectl("fleet", "generate", "--dir", dir, "--domains", "6", "--tenants", "500"); code != 0 {
		t.Fatalf("fleet generate: exit %d: %s", code, errs)
	}
	if code, out, errs := sluicectl("config", "validate", "-f", f.Config); code != 0 {
		t.Errorf("config validate of the fleet's config: exit %d\n%s%s", code, out, errs)
	}
	srv, err := server.New(server.Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Topology: f.Topology, ConfigPath: f.Config,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	addr := srv.GRPCAddr().String()

	rep := loadJSON(t, "--server", addr, "--tenant-pool", f.TenantPool, "--tenant-order", "sequential", "--concurrency", "2",
		"--duration", "300ms", "--churn", "--churn-rate", "50")
	row := rep.Load.Tenants[0]
	if row.Tenant != "fleet-%03d" || row.Pool != 500 || row.Admitted != rep.Load.AdmitCalls || row.Distinct != min(rep.Load.AdmitCalls, 500) || row.Distinct == 0 {
		t.Errorf("pool row %+v, %d Admit calls: want every call admitted, each name once until all 500 were called", row, rep.Load.AdmitCalls)
	}
	ch := rep.Load.Churn
	if ch == nil || ch.Drains == 0 || ch.Undrains != ch.Drains || ch.HealthCuts == 0 || ch.Draining != 0 || ch.WeightCut != int(ch.HealthCuts) || len(ch.Errors) != 0 {
		t.Errorf("churn: %+v; want drains all undone, health cuts the server shows, no error", ch)
	}
}

// --etcd without --server routes each tenant to its replica, as
// client.Router does, and sums the fleet's leases.
func TestLoadFleet(t *testing.T) {
	etcd := etcdtest.Start(t)
	t.Setenv("SLUICE_ETCD", "")
	s1, s2 := startSluiced(t, etcd.Endpoint()), startSluiced(t, etcd.Endpoint())
	waitMembers(t, etcd, 2)
	rep := loadJSON(t, "--etcd", etcd.Endpoint(), "--tenants", "acme:small:1,globex:small:1,initech:small:1",
		"--concurrency", "2", "--duration", "150ms", "--release=false")
	if !strings.Contains(rep.Target, "2 replicas") || rep.Load.AdmitCalls == 0 || len(rep.Load.Errors) != 0 {
		t.Fatalf("fleet: target %q, %+v", rep.Target, rep.Load)
	}
	held := int64(s1.Engine().LeaseCount() + s2.Engine().LeaseCount())
	if rep.LeasesHeld == nil || *rep.LeasesHeld != held || held != rep.Load.Held {
		t.Errorf("leases: report %v, tool %d, servers %d", rep.LeasesHeld, rep.Load.Held, held)
	}
}
