package drill

import (
	"context"
	"slices"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-sched/sluice/internal/load"
)

// The table is the drills in `all`'s order, and each entry is whole: a
// drill that stops a part names it, and one with a fault has its undo.
func TestDrillTable(t *testing.T) {
	want := []string{DrainDomain, KillAgent, KillReplica, StopEtcd, KillRedis, CreditExhaustion, DeferredBurst}
	if !slices.Equal(Names, want) {
		t.Fatalf("Names = %v, want %v", Names, want)
	}
	for _, d := range drills {
		if d.stops != (d.part != nil) {
			t.Errorf("%s: stops %v but part %v", d.name, d.stops, d.part != nil)
		}
		if d.drive == nil || (d.fault == nil) != (d.mend == nil) {
			t.Errorf("%s: drive %v, fault %v, mend %v: want a drive, and a fault only with its undo", d.name, d.drive != nil, d.fault != nil, d.mend != nil)
		}
		if (d.departure == "") != (d.back == "") {
			t.Errorf("%s: departure %q, back %q: want both or neither", d.name, d.departure, d.back)
		}
	}
	if drillNamed("explode") != nil || drillNamed(KillRedis).name != KillRedis {
		t.Errorf("drillNamed finds the wrong drill")
	}
}

// Run refuses a drill the fleet cannot run, before it touches the fleet:
// one that stops a part without hooks, one that needs etcd without it.
func TestRunRefusesWhatTheFleetLacks(t *testing.T) {
	for _, tc := range []struct {
		f    *Fleet
		name string
		want string
	}{
		{&Fleet{}, KillAgent, "drill kill-agent stops part of the fleet"},
		{&Fleet{}, KillReplica, "drill kill-replica stops part of the fleet"},
		{&Fleet{}, StopEtcd, "drill stop-etcd stops part of the fleet"},
		{&Fleet{}, KillRedis, "drill kill-redis stops part of the fleet"},
		{&Fleet{Faults: ShellFaults{}}, KillAgent, "drill kill-agent watches the agent's record: the fleet needs etcd"},
		{&Fleet{Faults: ShellFaults{}}, StopEtcd, "drill stop-etcd: the fleet has no etcd"},
		{&Fleet{}, "explode", `drill "explode": want one of`},
	} {
		if _, err := Run(context.Background(), tc.f, tc.name, "", Defaults()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s on faults %v, etcd %v: %v; want an error containing %q", tc.name, tc.f.Faults != nil, tc.f.Etcd != nil, err, tc.want)
		}
	}
}

// Soak draws only the drills the fleet can run: none that stops a part
// without hooks, none that needs etcd without it, kill-agent only where
// it can pick a node (the self-contained fleet), credit-exhaustion only
// with a credit tenant, deferred-burst only with bursting tenants.
func TestSoakDrawsWhatTheFleetCanRun(t *testing.T) {
	etcd, faults, local := &clientv3.Client{}, ShellFaults{}, &Local{}
	burst := Defaults().BurstTenants
	for _, tc := range []struct {
		f      *Fleet
		credit string
		burst  []load.Mix
		want   []string
	}{
		{&Fleet{}, "", nil, []string{DrainDomain}},
		{&Fleet{}, "spiky", nil, []string{DrainDomain, CreditExhaustion}},
		{&Fleet{}, "", burst, []string{DrainDomain, DeferredBurst}},
		{&Fleet{Etcd: etcd}, "", nil, []string{DrainDomain}},
		{&Fleet{Faults: faults}, "", nil, []string{DrainDomain, KillReplica, KillRedis}},
		{&Fleet{Faults: faults, Etcd: etcd}, "", nil, []string{DrainDomain, KillReplica, StopEtcd, KillRedis}},
		{&Fleet{Faults: faults, Local: local}, "", burst, []string{DrainDomain, KillReplica, KillRedis, DeferredBurst}},
		{&Fleet{Faults: faults, Etcd: etcd, Local: local}, "spiky", burst, Names},
	} {
		o := Defaults()
		o.CreditTenant, o.BurstTenants = tc.credit, tc.burst
		var got []string
		for _, d := range drills {
			if d.soakable(tc.f, o) {
				got = append(got, d.name)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("faults %v, etcd %v, local %v, credit tenant %q, bursting tenants %v: soak draws %v, want %v",
				tc.f.Faults != nil, tc.f.Etcd != nil, tc.f.Local != nil, tc.credit, tc.burst, got, tc.want)
		}
	}
}
