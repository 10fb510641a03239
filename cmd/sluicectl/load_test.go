package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/internal/load"
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
