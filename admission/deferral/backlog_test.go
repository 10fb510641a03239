package deferral_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/deferral"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/testwait"
	"github.com/sluice-sched/sluice/topology/topologytest"
)

var epoch = time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)

// quotaConfig gives tenants a token quota of rate weighted tokens/s with a
// burst of 2,000 at the least (one request of 1,000 prompt and 10 output tokens, 1,040
// weighted, fits; a second at once does not) and weights 3 (gold) and 1
// (bronze).
func quotaConfig(rate float64) admission.Config {
	big := admission.Limit{Rate: 1e9, Burst: 1e9}
	q := admission.Limit{Rate: rate, Burst: max(2000, 2*rate)}
	return admission.Config{
		Tiers: map[string]admission.TierPolicy{
			"gold":   {RPS: big, Tokens: q, Weight: 3},
			"bronze": {RPS: big, Tokens: q, Weight: 1},
		},
		Tenants: map[string]admission.TenantConfig{
			"a": {Tier: "gold"}, "b": {Tier: "bronze"}, "c": {Tier: "bronze"},
		},
	}
}

type rig struct {
	t     *testing.T
	clk   *clock.Manual
	e     *admission.Engine
	b     *deferral.Backlog
	store deferral.Store
}

func newRig(t *testing.T, cfg admission.Config, store deferral.Store) *rig {
	t.Helper()
	clk := clock.NewManual(epoch)
	e, err := admission.New(cfg, topologytest.HGX(t, 2), admission.WithClock(clk))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(e.Close)
	b := deferral.New(e, store, clk, nil)
	// Started without the loop: the test steps it on its clock.
	return &rig{t: t, clk: clk, e: e, b: b, store: store}
}

func deferrable(tenant string, prompt, output int64) admission.Request {
	return admission.Request{Tenant: tenant, Model: "small", PromptTokens: prompt, MaxOutputTokens: output, Deferrable: true}
}

func (r *rig) admit(req admission.Request) deferral.Answer {
	r.t.Helper()
	a, err := r.b.Admit(context.Background(), req)
	if err != nil {
		r.t.Fatalf("Admit(%+v): %v", req, err)
	}
	return a
}

// worker claims work in a goroutine and collects what it receives.
type worker struct {
	mu     sync.Mutex
	got    []deferral.Delivery
	cancel context.CancelFunc
	done   chan error
}

func (r *rig) worker(opts deferral.ClaimOptions) *worker {
	ctx, cancel := context.WithCancel(context.Background())
	w := &worker{cancel: cancel, done: make(chan error, 1)}
	go func() {
		w.done <- r.b.Claim(ctx, opts, func(d deferral.Delivery) error {
			w.mu.Lock()
			w.got = append(w.got, d)
			w.mu.Unlock()
			return nil
		})
	}()
	r.t.Cleanup(func() { w.cancel(); <-w.done })
	return w
}

// take waits for the worker to hold n deliveries and returns them.
func (w *worker) take(t *testing.T, r *rig, n int) []deferral.Delivery {
	t.Helper()
	testwait.Until(t, 10*time.Second, fmt.Sprintf("the worker to hold %d deliveries", n), func() bool {
		r.b.Step(context.Background())
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.got) >= n
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	got := w.got[:n:n]
	w.got = w.got[n:]
	return got
}

func (w *worker) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.got)
}

func (r *rig) release(d deferral.Delivery) admission.ReleaseResult {
	r.t.Helper()
	res, err := r.e.Release(context.Background(), admission.Release{LeaseID: d.Decision.LeaseID, OutputTokens: 1, Outcome: admission.ReleaseOK})
	if err != nil {
		r.t.Fatalf("Release: %v", err)
	}
	if !res.Deferred {
		r.t.Fatalf("Release of a deferred ticket's lease: Deferred false")
	}
	r.b.Released(context.Background(), d.Decision.LeaseID)
	return res
}

func TestDeferrableThatFitsRunsNow(t *testing.T) {
	r := newRig(t, quotaConfig(1e6), deferral.NewMemStore())
	a := r.admit(deferrable("a", 100, 10))
	if a.Decision.Outcome != admission.Admitted || a.Ticket != "" {
		t.Fatalf("got %v ticket %q, want ADMITTED without a ticket", a.Decision.Outcome, a.Ticket)
	}
}

// A tenant over its quota gets a ticket, not a refusal; the ticket is
// admitted once the quota refills and a worker claims it, and its Release
// ends it.
func TestOverQuotaIsDeferredThenDeliveredOnce(t *testing.T) {
	r := newRig(t, quotaConfig(1000), deferral.NewMemStore())
	// 2,000 burst: one request of 1,040 weighted tokens fits, the next not.
	if a := r.admit(deferrable("b", 1000, 10)); a.Decision.Outcome != admission.Admitted {
		t.Fatalf("first: %v", a.Decision.Outcome)
	}
	a := r.admit(deferrable("b", 1000, 10))
	if a.Decision.Outcome != admission.Deferred || a.Ticket == "" || a.Decision.Reason != admission.ReasonQuotaExceeded {
		t.Fatalf("second: %v %v ticket %q, want DEFERRED QUOTA_EXCEEDED with a ticket", a.Decision.Outcome, a.Decision.Reason, a.Ticket)
	}
	w := r.worker(deferral.ClaimOptions{MaxInFlight: 4})
	testwait.Until(t, 10*time.Second, "the worker to register", func() bool { return r.b.Claiming() == 1 })
	r.b.Step(context.Background()) // hands over synchronously what it admits
	if n := r.b.Counts().Claimed.Load(); n != 0 {
		t.Fatalf("delivered %d tickets before the quota refilled", n)
	}
	r.clk.Advance(2 * time.Second)
	got := w.take(t, r, 1)
	if got[0].Record.ID != a.Ticket || got[0].Record.State != deferral.StateClaimed || got[0].Decision.LeaseID == 0 {
		t.Fatalf("delivery %+v, want ticket %s claimed with a lease", got[0].Record, a.Ticket)
	}
	rec, err := r.b.Get(context.Background(), a.Ticket, nil)
	if err != nil || rec.State != deferral.StateClaimed {
		t.Fatalf("Get: %v %v, want CLAIMED", rec.State, err)
	}
	r.release(got[0])
	rec, err = r.b.Get(context.Background(), a.Ticket, nil)
	if err != nil || rec.State != deferral.StateDone {
		t.Fatalf("Get after Release: %v %v, want DONE", rec.State, err)
	}
	r.clk.Advance(10 * time.Second)
	r.b.Step(context.Background())
	if n := w.count(); n != 0 {
		t.Fatalf("delivered %d more", n)
	}
}

// A repeated request id gets the same ticket, not a second one.
func TestRepeatedRequestIDJoinsItsTicket(t *testing.T) {
	r := newRig(t, quotaConfig(100), deferral.NewMemStore())
	r.admit(deferrable("b", 1000, 10)) // takes the burst
	req := deferrable("b", 1000, 10)
	req.RequestID = "job-1"
	first := r.admit(req)
	again := r.admit(req)
	if first.Decision.Outcome != admission.Deferred || again.Ticket != first.Ticket {
		t.Fatalf("tickets %q and %q, want one DEFERRED ticket", first.Ticket, again.Ticket)
	}
	if got := r.b.Tenants(); len(got) != 1 || got[0].Pending != 1 {
		t.Fatalf("backlog %+v, want one pending ticket", got)
	}
}

// While an interactive request waits in the queue, deferred work does not
// run, even where it would fit.
func TestInteractiveWaitingGoesFirst(t *testing.T) {
	cfg := quotaConfig(1e9)
	r := newRig(t, cfg, deferral.NewMemStore())
	// Fill both domains' decode buckets with large interactive requests
	// until one queues.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var queued *admission.Ticket
	for range 10000 {
		d, tk, err := r.e.Submit(ctx, admission.Request{Tenant: "a", Model: "medium", PromptTokens: 8000, MaxOutputTokens: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if tk != nil {
			queued = tk
			break
		}
		if d.Outcome == admission.Rejected {
			t.Fatalf("interactive rejected %v before queueing", d.Reason)
		}
	}
	if queued == nil {
		t.Fatal("no interactive request queued")
	}
	a := r.admit(deferrable("b", 10, 1))
	if a.Decision.Outcome != admission.Deferred || a.Decision.Reason != admission.ReasonInteractiveFirst {
		t.Fatalf("deferrable while interactive waits: %v %v, want DEFERRED INTERACTIVE_FIRST", a.Decision.Outcome, a.Decision.Reason)
	}
	cancel()
	r.e.Await(ctx, queued)
}

// A worker that dies holding claimed work: the lease reaches its TTL, the
// ticket is delivered again, and the tenant is charged for it once.
func TestExpiredLeaseRedeliversAndChargesOnce(t *testing.T) {
	cfg := quotaConfig(1000)
	cfg.Leases.TTL = admission.Duration{Duration: 100 * time.Millisecond}
	r := newRig(t, cfg, deferral.NewMemStore())
	r.admit(deferrable("b", 1000, 10)) // takes the burst
	a := r.admit(deferrable("b", 1000, 10))
	if a.Ticket == "" {
		t.Fatalf("not deferred: %v", a.Decision.Outcome)
	}
	r.clk.Advance(2 * time.Second) // the quota refills to its burst
	first := r.worker(deferral.ClaimOptions{})
	got := first.take(t, r, 1)
	first.cancel() // dies holding it, unreleased
	<-first.done
	first.done <- nil
	claimed, _ := r.e.Tenant("b")
	// The lease expires after refilling 100 of the 1,040 it took: settled
	// as unused it gives all of them back (to the 2,000 burst); charged,
	// the level would stay near 1,060.
	r.clk.Advance(101 * time.Millisecond)
	r.e.Tick()
	expired, _ := r.e.Tenant("b")
	if expired.TokenLevel < 1900 {
		t.Fatalf("token level %d after the expiry (%d while claimed): the lost run was charged", expired.TokenLevel, claimed.TokenLevel)
	}
	second := r.worker(deferral.ClaimOptions{})
	again := second.take(t, r, 1)
	if again[0].Record.ID != got[0].Record.ID || again[0].Decision.LeaseID == got[0].Decision.LeaseID {
		t.Fatalf("redelivered %s lease %x, want %s with a new lease", again[0].Record.ID, again[0].Decision.LeaseID, got[0].Record.ID)
	}
	r.release(again[0])
	if rec, _ := r.b.Get(context.Background(), a.Ticket, nil); rec.State != deferral.StateDone {
		t.Fatalf("state %v, want DONE", rec.State)
	}
}

// A ticket still pending at its defer_within expires with its reason.
func TestPendingTicketExpiresWithReason(t *testing.T) {
	r := newRig(t, quotaConfig(100), deferral.NewMemStore())
	r.admit(deferrable("b", 1000, 10)) // takes the burst
	req := deferrable("b", 1000, 10)
	req.DeferWithin = time.Minute
	a := r.admit(req)
	r.clk.Advance(61 * time.Second)
	r.b.Step(context.Background())
	rec, err := r.b.Get(context.Background(), a.Ticket, nil)
	if err != nil || rec.State != deferral.StateExpired || !strings.Contains(rec.Reason, "QUOTA_EXCEEDED") {
		t.Fatalf("ticket %v %q (%v), want EXPIRED naming QUOTA_EXCEEDED", rec.State, rec.Reason, err)
	}
}

func TestCancel(t *testing.T) {
	r := newRig(t, quotaConfig(100), deferral.NewMemStore())
	r.admit(deferrable("b", 1000, 10)) // takes the burst
	a := r.admit(deferrable("b", 1000, 10))
	notB := func(tenant string) bool { return tenant != "b" }
	if _, err := r.b.Cancel(context.Background(), a.Ticket, notB); !errors.Is(err, deferral.ErrNotYours) {
		t.Fatalf("Cancel by another tenant: %v, want ErrNotYours", err)
	}
	rec, err := r.b.Cancel(context.Background(), a.Ticket, nil)
	if err != nil || rec.State != deferral.StateCancelled {
		t.Fatalf("Cancel: %v %v", rec.State, err)
	}
	if got := r.b.Tenants(); len(got) != 0 {
		t.Fatalf("backlog after cancel: %+v", got)
	}
}

func TestBoundsAnswerQueueFull(t *testing.T) {
	cfg := quotaConfig(100)
	cfg.Deferral.MaxPerTenant, cfg.Deferral.MaxTotal = 2, 3
	r := newRig(t, cfg, deferral.NewMemStore())
	for _, tenant := range []string{"a", "b", "c"} {
		r.admit(deferrable(tenant, 1000, 10)) // takes the burst
	}
	for range 2 {
		if a := r.admit(deferrable("b", 1000, 10)); a.Ticket == "" {
			t.Fatalf("not deferred: %v", a.Decision.Outcome)
		}
	}
	a := r.admit(deferrable("b", 1000, 10))
	if a.Decision.Outcome != admission.Rejected || a.Decision.Reason != admission.ReasonQueueFull || !strings.Contains(a.Message, "holds 2 tickets") {
		t.Fatalf("third: %v %v %q, want QUEUE_FULL naming the backlog's size", a.Decision.Outcome, a.Decision.Reason, a.Message)
	}
	r.admit(deferrable("c", 1000, 10))
	if a := r.admit(deferrable("a", 1000, 10)); a.Decision.Reason != admission.ReasonQueueFull || !strings.Contains(a.Message, "max_total") {
		t.Fatalf("past the total: %v %q", a.Decision.Reason, a.Message)
	}
}

// A restart on the same store takes every unfinished ticket back: pending
// ones are admitted once, claimed ones once their lease would have ended.
func TestRestartAdoptsEveryTicketOnce(t *testing.T) {
	store := deferral.NewMemStore()
	cfg := quotaConfig(100)
	r := newRig(t, cfg, store) // not started: the store's first Adopt is the restart's
	ids := map[string]bool{}
	for range 50 {
		a := r.admit(deferrable("b", 100, 10))
		if a.Ticket != "" {
			ids[a.Ticket] = true
		}
	}
	if len(ids) < 25 {
		t.Fatalf("only %d of 50 deferred", len(ids))
	}
	// A new engine and backlog on the same store, as after kill -9.
	cfg.Tiers["bronze"] = admission.TierPolicy{RPS: admission.Limit{Rate: 1e9, Burst: 1e9}, Tokens: admission.Limit{Rate: 1e9, Burst: 1e9}, Weight: 1}
	r2 := newRig(t, cfg, store)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := r2.b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	w := r2.worker(deferral.ClaimOptions{MaxInFlight: 100})
	got := w.take(t, r2, len(ids))
	seen := map[string]bool{}
	for _, d := range got {
		if !ids[d.Record.ID] || seen[d.Record.ID] {
			t.Fatalf("delivered %s: unknown or twice", d.Record.ID)
		}
		seen[d.Record.ID] = true
		r2.release(d)
	}
	r2.b.Step(context.Background())
	if n := w.count(); n != 0 {
		t.Fatalf("%d more deliveries after every ticket", n)
	}
}

// Backlogged tenants are admitted in weighted fair order: gold (weight 3)
// gets three tickets for each of bronze's (weight 1) while both wait.
func TestBacklogDrainsInWeightedFairOrder(t *testing.T) {
	r := newRig(t, quotaConfig(1e9), deferral.NewMemStore())
	for _, d := range []string{"d1", "d2"} {
		if err := r.e.Drain(d, "test"); err != nil {
			t.Fatal(err)
		}
	}
	for range 200 {
		for _, tenant := range []string{"a", "b"} {
			if a := r.admit(deferrable(tenant, 100, 10)); a.Decision.Reason != admission.ReasonDomainDraining {
				t.Fatalf("while drained: %v %v, want DEFERRED DOMAIN_DRAINING", a.Decision.Outcome, a.Decision.Reason)
			}
		}
	}
	for _, d := range []string{"d1", "d2"} {
		if err := r.e.Undrain(d); err != nil {
			t.Fatal(err)
		}
	}
	w := r.worker(deferral.ClaimOptions{MaxInFlight: 100})
	got := w.take(t, r, 100)
	share := map[string]int{}
	for _, d := range got {
		share[d.Record.Work.Tenant]++
	}
	if a := float64(share["a"]) / 100; a < 0.70 || a > 0.80 {
		t.Fatalf("gold's share of the first 100 deliveries %.2f (%v), want 0.75 ± 0.05", a, share)
	}
}

// A deferrable request that could fit a domain only inside the headroom
// deferred work leaves is refused at once: deferred, it would never run.
func TestTooLargeForTheHeadroomIsRefused(t *testing.T) {
	cfg := quotaConfig(1e9)
	cfg.Deferral.Headroom = 0.95
	r := newRig(t, cfg, deferral.NewMemStore())
	req := admission.Request{Tenant: "a", Model: "medium", PromptTokens: 30000, MaxOutputTokens: 1000}
	if d, err := r.e.Explain(context.Background(), req); err != nil || d.Outcome != "ADMITTED" {
		t.Fatalf("as interactive: %v %v, want ADMITTED", d.Outcome, err)
	}
	req.Deferrable = true
	a := r.admit(req)
	if a.Decision.Outcome != admission.Rejected || a.Decision.Reason != admission.ReasonCapacityExceeded || a.Ticket != "" {
		t.Fatalf("deferrable: %v %v ticket %q, want REJECTED CAPACITY_EXCEEDED", a.Decision.Outcome, a.Decision.Reason, a.Ticket)
	}
}

// Over its own quota, deferred work waits with QUOTA_EXCEEDED (no credit
// is lent to it, and no freeze is in force).
func TestOverQuotaReasonIsQuota(t *testing.T) {
	r := newRig(t, quotaConfig(100), deferral.NewMemStore())
	r.admit(deferrable("b", 1000, 10))
	if a := r.admit(deferrable("b", 1000, 10)); a.Decision.Reason != admission.ReasonQuotaExceeded {
		t.Fatalf("reason %v, want QUOTA_EXCEEDED", a.Decision.Reason)
	}
}
