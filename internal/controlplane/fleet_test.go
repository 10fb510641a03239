package controlplane

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/topology/topologytest"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// BenchmarkTenantChangeAtFleetScale is one tenant's change through etcd
// among SLUICE_BENCH_TENANTS (default 1,000,000) tenant documents, each a
// tenant of its own on 1,400 NVL72 domains: from the put of its document to
// the replica's applied revision reaching the put's. Beside it, the same
// round trip through etcd alone (a put of another key, until a plain watch
// delivers it), measured in the same loop. It also reports the replica's
// start-up from etcd: the full read and application of every document.
func BenchmarkTenantChangeAtFleetScale(b *testing.B) {
	n := 1_000_000
	if s := os.Getenv("SLUICE_BENCH_TENANTS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatalf("SLUICE_BENCH_TENANTS=%q: %v", s, err)
		}
	}
	etcd := etcdtest.Start(b)
	cli := etcd.Client(b)
	ctx := context.Background()
	if _, err := ApplyConfig(ctx, cli, DefaultPrefix, "sluice.yaml", config.DefaultYAML()); err != nil {
		b.Fatal(err)
	}
	writeTenantDocuments(b, cli, n)
	cfg, err := config.Default()
	if err != nil {
		b.Fatal(err)
	}
	eng, err := admission.New(cfg, topologytest.NVL72(b, 1400))
	if err != nil {
		b.Fatal(err)
	}
	ctl, err := New(Options{Client: cli, Engine: eng, Logger: testLogger()})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := ctl.Sync(ctx); err != nil {
		b.Fatal(err)
	}
	startup := time.Since(start)
	if got := len(eng.Config().Tenants); got < n {
		b.Fatalf("%d tenants configured after start-up, want at least %d", got, n)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { ctl.Run(runCtx); close(done) }()
	defer func() { cancel(); <-done }()
	ref := cli.Watch(runCtx, "/bench/ref")

	var change, trip time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		if _, err := cli.Put(ctx, "/bench/ref", strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
		<-ref
		trip += time.Since(t0)

		t0 = time.Now()
		resp, err := cli.Put(ctx, TenantKey(DefaultPrefix, "fleet-0000000"), fmt.Sprintf(`{"tier":"free","weight":%d}`, 1+i%2))
		if err != nil {
			b.Fatal(err)
		}
		for ctl.Revision() < resp.Header.Revision {
			time.Sleep(50 * time.Microsecond)
		}
		change += time.Since(t0)
	}
	ops := float64(b.N)
	b.ReportMetric(float64(change.Microseconds())/1e3/ops, "ms/change")
	b.ReportMetric(float64(trip.Microseconds())/1e3/ops, "ms/etcd-trip")
	b.ReportMetric(float64(change)/float64(trip), "ratio")
	b.ReportMetric(startup.Seconds(), "startup-s")
}

// writeTenantDocuments writes n tenant documents, fleet-0000000 onwards,
// on the tier free, in transactions of maxTxnOps from a few writers.
func writeTenantDocuments(b *testing.B, cli *clientv3.Client, n int) {
	b.Helper()
	const writers = 8
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			ops := make([]clientv3.Op, 0, maxTxnOps)
			for i := w * maxTxnOps; i < n; i += writers * maxTxnOps {
				ops = ops[:0]
				for j := i; j < min(i+maxTxnOps, n); j++ {
					ops = append(ops, clientv3.OpPut(TenantKey(DefaultPrefix, fmt.Sprintf("fleet-%07d", j)), `{"tier":"free"}`))
				}
				if _, err := cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}
