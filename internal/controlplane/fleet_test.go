package controlplane

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/topology/topologytest"
)

// Drains at fleet scale: on 1,400 NVL72 domains, a drain mark written to
// etcd is honoured once the replica's watch has delivered it (its applied
// revision reaches the write's): no Admit lands on a drained domain after
// that, for the tenant that was placed there nor for any other, and a mark
// deleted lets its domain take placements again.
func TestDrainsHonouredAtFleetScale(t *testing.T) {
	etcd := etcdtest.Start(t)
	cfg, err := config.Default()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		cfg.Tenants[fmt.Sprintf("fleet-%d", i)] = admission.TenantConfig{Tier: "enterprise"}
	}
	eng, err := admission.New(cfg, topologytest.NVL72(t, 1400))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { eng.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	cli := newClient(t, etcd)
	r := startReplica(t, cli, Options{Engine: eng})
	eventually(t, "synced", r.ctl.Synced)

	placeOn := func(tenant string) string {
		t.Helper()
		d := admit(t, eng, tenant, "small")
		if d.LeaseID == 0 {
			t.Fatalf("%s not admitted: %+v", tenant, d)
		}
		if _, err := eng.Release(context.Background(), admission.Release{LeaseID: d.LeaseID, OutputTokens: 10}); err != nil {
			t.Fatal(err)
		}
		return d.Domain
	}
	type placed struct{ tenant, domain string }
	var marks []placed // drained, oldest first
	drained := map[string]bool{}
	for round := range 30 {
		tenant := fmt.Sprintf("fleet-%d", round)
		dom := placeOn(tenant)
		if drained[dom] {
			t.Fatalf("round %d: %s placed on drained %s", round, tenant, dom)
		}
		rev, err := PutDrain(ctxT(t), cli, DefaultPrefix, DrainMark{Domain: dom, Reason: "rack swap", By: "test", At: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		marks, drained[dom] = append(marks, placed{tenant, dom}), true
		eventually(t, "the mark applied", func() bool { return r.ctl.Revision() >= rev })
		for i := range 300 {
			other := fmt.Sprintf("fleet-%d", (round*37+i)%300)
			if got := placeOn(other); drained[got] {
				t.Fatalf("round %d: %s placed on drained %s after the watch delivered its mark", round, other, got)
			}
		}
		if round%3 == 2 { // the oldest mark goes: its tenant returns to its first choice
			back := marks[0]
			marks = marks[1:]
			if ok, err := DeleteDrain(ctxT(t), cli, DefaultPrefix, back.domain); err != nil || !ok {
				t.Fatalf("delete the mark of %s: %v %v", back.domain, ok, err)
			}
			delete(drained, back.domain)
			eventually(t, back.tenant+" placed on "+back.domain+" again", func() bool { return placeOn(back.tenant) == back.domain })
		}
	}
}
