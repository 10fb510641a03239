package admissiontest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission/admissiontest"
	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/state/memstate"
)

func charge() *sharing.StrictCharge {
	return &sharing.StrictCharge{
		Takes: []sharing.StrictTake{{Key: "t/a/tok", Rate: 10, Burst: 100, Amount: 60}},
		KV:    sharing.KVHold{Key: "d/d1/kv", Lease: "r/1", Limit: 1000, Bytes: 1, TTL: time.Minute},
	}
}

// A flaky store fails every call while down, reaching nothing behind it,
// and passes calls through once up.
func TestFlaky(t *testing.T) {
	ctx := context.Background()
	counted := admissiontest.NewCounting(memstate.New(nil))
	f := admissiontest.NewFlaky(counted)
	f.SetDown(true)
	if !f.Down() {
		t.Fatal("down, yet Down says up")
	}
	if _, err := f.Commit(ctx, charge()); !errors.Is(err, admissiontest.ErrDown) {
		t.Errorf("Commit while down: %v", err)
	}
	if _, err := f.Reconcile(ctx, &sharing.ReconcileRequest{Replica: "r", Replicas: 1}); !errors.Is(err, admissiontest.ErrDown) {
		t.Errorf("Reconcile while down: %v", err)
	}
	if err := f.Settle(ctx, &sharing.StrictSettle{}); !errors.Is(err, admissiontest.ErrDown) {
		t.Errorf("Settle while down: %v", err)
	}
	if err := f.Ping(ctx); !errors.Is(err, admissiontest.ErrDown) {
		t.Errorf("Ping while down: %v", err)
	}
	if n := len(counted.Reports()) + counted.Commits() + counted.Settles(); n != 0 {
		t.Errorf("%d calls reached the store behind a store that is down", n)
	}
	f.SetDown(false)
	if v, err := f.Commit(ctx, charge()); err != nil || !v.Admitted {
		t.Errorf("Commit once up: %+v %v", v, err)
	}
	if counted.Commits() != 1 {
		t.Errorf("%d commits reached the store, want 1", counted.Commits())
	}
}

// Counting counts the tenant and domain buckets and gauges of each report.
func TestCounting(t *testing.T) {
	c := admissiontest.NewCounting(memstate.New(nil))
	_, err := c.Reconcile(context.Background(), &sharing.ReconcileRequest{
		Replica: "r", Replicas: 1, Stale: time.Second,
		Buckets: []sharing.BucketReport{
			{Key: "t/a/rps", Rate: 1, Burst: 1, Epoch: 1},
			{Key: "t/a/tok", Rate: 1, Burst: 1, Epoch: 1},
			{Key: "d/d1/pf", Rate: 1, Burst: 1, Epoch: 1},
		},
		Gauges: []sharing.GaugeReport{{Key: "d/d1/kv", Limit: 10, TTL: time.Minute}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := admissiontest.Report{TenantBuckets: 2, DomainBuckets: 1, Gauges: 1}
	if got := c.Reports(); len(got) != 1 || got[0] != want {
		t.Errorf("reports %+v, want [%+v]", got, want)
	}
}

// A gated commit waits for the test: Refuse answers it without the store,
// Pass lets the store decide, and a context that ends frees it.
func TestGated(t *testing.T) {
	ctx := context.Background()
	counted := admissiontest.NewCounting(memstate.New(nil))
	g := admissiontest.NewGated(counted, 1)
	type answer struct {
		v   sharing.StrictVerdict
		err error
	}
	commit := func(ctx context.Context) <-chan answer {
		out := make(chan answer, 1)
		go func() {
			v, err := g.Commit(ctx, charge())
			out <- answer{v, err}
		}()
		<-g.Entered()
		return out
	}
	got := commit(ctx)
	g.Refuse(sharing.StrictVerdict{Admitted: true, Refused: 0, RetryAfter: time.Second})
	if a := <-got; a.err != nil || a.v.Admitted || a.v.RetryAfter != time.Second || counted.Commits() != 0 {
		t.Errorf("refused: %+v, %d commits reached the store; want a refusal without the store", a, counted.Commits())
	}
	got = commit(ctx)
	g.Pass()
	if a := <-got; a.err != nil || !a.v.Admitted || counted.Commits() != 1 {
		t.Errorf("passed: %+v, %d commits reached the store; want the store's admission", a, counted.Commits())
	}
	cctx, cancel := context.WithCancel(ctx)
	got = commit(cctx)
	cancel()
	if a := <-got; !errors.Is(a.err, context.Canceled) {
		t.Errorf("gave up: %+v, want the context's error", a)
	}
}
