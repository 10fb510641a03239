package sharing_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/state/memstate"
	"github.com/sluice-sched/sluice/internal/state/redisstate"
	"github.com/sluice-sched/sluice/internal/state/redistest"
	"github.com/sluice-sched/sluice/internal/testwait"
	"github.com/sluice-sched/sluice/pd"
)

// heldStore holds back the commit of one lease until let go, and fails
// every call while down.
type heldStore struct {
	sharing.Store
	lease   string
	entered chan struct{}
	letGo   chan struct{}
	down    atomic.Bool
}

func (h *heldStore) Commit(ctx context.Context, c *sharing.StrictCharge) (sharing.StrictVerdict, error) {
	if c.KV.Lease == h.lease {
		close(h.entered)
		<-h.letGo
	}
	if h.down.Load() {
		return sharing.StrictVerdict{}, errors.New("store down")
	}
	return h.Store.Commit(ctx, c)
}

func (h *heldStore) Ping(ctx context.Context) error {
	if h.down.Load() {
		return errors.New("store down")
	}
	return h.Store.Ping(ctx)
}

// Strict, a commit sent before the breaker opened that succeeds after
// leaves it open: only the prober closes it, once the store has the
// replica's resume report, and its next probe does.
func TestStrictCommitAnsweredWhileOpenLeavesTheBreakerOpen(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_700_000_000, 0))
	tn := newTenant("o", 0, false, rps100, tokens1k)
	v := newView(t, clk, tn)
	store := &heldStore{Store: memstate.New(clk), lease: "a/1", entered: make(chan struct{}), letGo: make(chan struct{})}
	var closes atomic.Int64
	s := newStrategy(t, v, store, sharing.Options{
		Mode: sharing.Strict, Replica: "a", Replicas: 2, Failures: 1,
		Timeout: time.Minute, Interval: time.Millisecond, Cooldown: time.Minute,
		OnBreaker: func(open bool) {
			if !open {
				closes.Add(1)
			}
		},
	})
	ctx := context.Background()
	v.admit(1, tn, 100, smallCost)
	first := make(chan sharing.Refusal)
	go func() { first <- s.Decided(ctx, "r1", 1) }()
	<-store.entered

	store.down.Store(true)
	v.admit(2, tn, 100, smallCost)
	s.Decided(ctx, "r2", 2)
	if st, _ := s.Status(); !st.BreakerOpen {
		t.Fatal("breaker closed after a failure with Failures 1")
	}
	store.down.Store(false)
	close(store.letGo)
	if why := <-first; why.Refused() {
		t.Fatalf("lease 1, committed, refused: %+v", why)
	}
	if st, _ := s.Status(); !st.BreakerOpen || closes.Load() != 0 {
		t.Fatalf("breaker open %v (closed %d times) after a commit sent before it opened succeeded: want it open until a probe",
			st.BreakerOpen, closes.Load())
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { s.Run(runCtx); close(done) }()
	defer func() { cancel(); <-done }()
	clk.Advance(time.Millisecond) // past the probe's cool-down
	testwait.Until(t, 10*time.Second, "the prober closes the breaker", func() bool {
		st, _ := s.Status()
		return !st.BreakerOpen
	})
	if n := closes.Load(); n != 1 {
		t.Errorf("breaker closed %d times, want once, by the probe", n)
	}
}

// strictPair is two strict replicas, a and b, of one domain, sharing store.
func strictPair(t *testing.T, clk *clock.Manual, store sharing.Store, expiryA func() time.Time) (va, vb *fakeView, a, b sharing.Strategy, ta, tb *fakeTenant) {
	t.Helper()
	many := [2]int64{1e6 * sharing.RequestUnit, 1e6 * sharing.RequestUnit}
	ta, tb = newTenant("o", 0, false, many, tokens1k), newTenant("o", 0, false, many, tokens1k)
	va, vb = newView(t, clk, ta), newView(t, clk, tb)
	opts := sharing.Options{Mode: sharing.Strict, Replicas: 2, Interval: 10 * time.Millisecond, Timeout: 5 * time.Second}
	opts.Replica, opts.MemberExpiry = "a", expiryA
	a = newStrategy(t, va, store, opts)
	opts.Replica, opts.MemberExpiry = "b", nil
	b = newStrategy(t, vb, store, opts)
	return va, vb, a, b, ta, tb
}

// Strict, the KV holds of a replica that dies are reclaimed once its
// membership lapses (its member lease's expiry as of its last renewal),
// as batched mode reclaims a dead replica's holding, not at the lease TTL
// (a minute here): against a real redis-server, whose clock runs the
// lapse.
func TestStrictDeadReplicaKVHoldsReclaimedAtItsMembershipExpiry(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_700_000_000, 0))
	srv := redistest.Start(t)
	store := redisstate.New(srv.Client(), "reclaim")
	memberTTL := time.Hour
	va, vb, a, b, ta, tb := strictPair(t, clk, store, func() time.Time { return clk.Now().Add(memberTTL) })
	ctx := context.Background()
	_, _, kv := va.dom.cap.FullLimits()

	va.admit(1, ta, 1, pd.Cost{PrefillFLOP: 1, KVBytes: kv * 3 / 4})
	if why := a.Decided(ctx, "a1", 1); why.Refused() {
		t.Fatalf("a's lease refused: %+v", why)
	}
	vb.admit(1, tb, 1, pd.Cost{PrefillFLOP: 1, KVBytes: kv / 2})
	if why := b.Decided(ctx, "b1", 1); why.Cause != sharing.OverCapacity {
		t.Fatalf("b's lease with a live and holding 3/4 of the KV: %+v, want refused over capacity", why)
	}

	// a's last renewal: its member lease expires 100 ms on (its keepalives
	// stopped), and then a dies.
	memberTTL = 100 * time.Millisecond
	clk.Advance(time.Hour)
	if err := a.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	id := uint64(1)
	testwait.Until(t, 10*time.Second, "b admitted on the KV the dead a held, well before the lease TTL (1 min)", func() bool {
		id++
		vb.admit(id, tb, 1, pd.Cost{PrefillFLOP: 1, KVBytes: kv / 2})
		return !b.Decided(ctx, "b", id).Refused()
	})
}

// Strict, a live replica renews its liveness on the KV it holds (Reconcile,
// every half of it), so its holds outlive the liveness it last sent; once
// it stops, they go when that lapses.
func TestStrictLiveReplicaRenewsItsKVHolds(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_700_000_000, 0))
	va, vb, a, b, ta, tb := strictPair(t, clk, memstate.New(clk), nil) // alive: SilentHoldRounds intervals, 100 ms
	ctx := context.Background()
	_, _, kv := va.dom.cap.FullLimits()
	va.admit(1, ta, 1, pd.Cost{PrefillFLOP: 1, KVBytes: kv * 3 / 4})
	if why := a.Decided(ctx, "a1", 1); why.Refused() {
		t.Fatalf("a's lease refused: %+v", why)
	}
	id := uint64(0)
	bFits := func() bool {
		id++
		vb.admit(id, tb, 1, pd.Cost{PrefillFLOP: 1, KVBytes: kv / 2})
		return !b.Decided(ctx, "b", id).Refused()
	}
	for range 4 {
		clk.Advance(60 * time.Millisecond)
		if err := a.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		if bFits() {
			t.Fatalf("b admitted at %v on KV a holds and renews", clk.Now())
		}
	}
	clk.Advance(110 * time.Millisecond)
	if !bFits() {
		t.Fatal("b refused after a stopped renewing for longer than its liveness")
	}
}
