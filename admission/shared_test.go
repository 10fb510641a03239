package admission_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/state/memstate"
	"github.com/sluice-sched/sluice/topology"
)

// These tests drive the engine's shared-state side on a manual clock
// against the in-memory store (internal/state/redisstate's tests do the
// same against a real redis-server).

const sharedConfig = `
output_token_weight: 1
leases: {ttl: 1m, idempotency_ttl: 1m}
tiers:
  open:
    rps: {rate: 1000, burst: 1000}
    tokens: {rate: 1000, burst: 3000}
    weight: 1
  closed:
    rps: {rate: 1000, burst: 1000}
    tokens: {rate: 1000, burst: 3000}
    weight: 1
    fail_mode: closed
tenants:
  o: {tier: open}
  c: {tier: closed}
`

// flaky is a store that can be taken down.
type flaky struct {
	admission.SharedState
	down            atomic.Bool
	commits, settle atomic.Int64
	transitions     []bool // OnBreaker calls, under the engine's lock
}

var errDown = errors.New("store down")

func (f *flaky) Reconcile(ctx context.Context, r *admission.ReconcileRequest) (*admission.ReconcileReply, error) {
	if f.down.Load() {
		return nil, errDown
	}
	return f.SharedState.Reconcile(ctx, r)
}

func (f *flaky) Commit(ctx context.Context, c *admission.StrictCharge) (admission.StrictVerdict, error) {
	if f.down.Load() {
		return admission.StrictVerdict{}, errDown
	}
	f.commits.Add(1)
	return f.SharedState.Commit(ctx, c)
}

func (f *flaky) Settle(ctx context.Context, s *admission.StrictSettle) error {
	if f.down.Load() {
		return errDown
	}
	f.settle.Add(1)
	return f.SharedState.Settle(ctx, s)
}

func sharedEngine(t *testing.T, mode admission.SharedMode, replicas int) (*admission.Engine, *flaky, *clock.Manual) {
	t.Helper()
	clk := clock.NewManual(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	store := &flaky{SharedState: memstate.New(clk)}
	cfg, err := config.Parse("shared.yaml", []byte(sharedConfig))
	if err != nil {
		t.Fatal(err)
	}
	e, err := admission.New(cfg, topology.Simulated(), admission.WithClock(clk), admission.WithSharedState(store, admission.SharedOptions{
		Mode: mode, Replica: "r1", Replicas: replicas, Failures: 2, Cooldown: time.Second,
		OnBreaker: func(open bool) { store.transitions = append(store.transitions, open) },
	}))
	if err != nil {
		t.Fatal(err)
	}
	return e, store, clk
}

func small(tenant string, tokens int64) admission.Request {
	return admission.Request{Tenant: tenant, Model: "small", PromptTokens: tokens / 2, MaxOutputTokens: tokens / 2}
}

func TestSharedOptionsAreChecked(t *testing.T) {
	cfg, _ := config.Default()
	for _, o := range []admission.SharedOptions{{Mode: admission.SharedBatched}, {Replica: "r"}} {
		if _, err := admission.New(cfg, topology.Simulated(), admission.WithSharedState(memstate.New(nil), o)); err == nil {
			t.Errorf("New accepted %+v", o)
		}
	}
}

// A tenant new to a replica starts from a 1/N slice of its burst, with no
// refill until its first grant; the grant then gives it the whole rate
// when it is the only replica asking.
func TestBatchedNewTenantStartsFromASlice(t *testing.T) {
	e, _, clk := sharedEngine(t, admission.SharedBatched, 3)
	ctx := context.Background()
	admitted := 0
	for range 20 {
		d, _ := e.Admit(ctx, small("o", 100))
		if d.Outcome == admission.Admitted {
			admitted++
		} else if d.Reason != admission.ReasonQuotaExceeded || d.RetryAfter > 100*time.Millisecond {
			t.Fatalf("refused with %v after %v, want QUOTA_EXCEEDED within one reconcile interval", d.Reason, d.RetryAfter)
		}
	}
	if admitted != 10 { // burst 3000 / 3 replicas / 100 tokens
		t.Errorf("a new tenant admitted %d of 20 before any grant, want its slice of 10", admitted)
	}
	clk.Advance(time.Second)
	if info, _ := e.Tenant("o"); info.TokenLevel != 0 || info.TokenRate != 0 {
		t.Errorf("level %d, rate %d a second after spending the slice, want 0 and 0: no refill before a grant", info.TokenLevel, info.TokenRate)
	}
	if err := e.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	info, _ := e.Tenant("o")
	if info.TokenRate != 1000 {
		t.Errorf("granted rate %d, want the whole 1000 for the only replica", info.TokenRate)
	}
	st, _ := e.SharedStatus()
	if st.Calls != 1 || st.Decisions != 20 || st.BreakerOpen {
		t.Errorf("status %+v, want 1 call for 20 decisions, breaker closed", st)
	}
}

// Store failures open the breaker: fail-closed tiers are refused with
// STATE_UNAVAILABLE, fail-open ones keep admitting from their slice; a
// probe after the cool-down closes it and the fallback time is counted.
func TestBatchedBreakerAndFailModes(t *testing.T) {
	e, store, clk := sharedEngine(t, admission.SharedBatched, 1)
	ctx := context.Background()
	for _, tenant := range []string{"o", "c"} {
		if d, _ := e.Admit(ctx, small(tenant, 100)); d.Outcome != admission.Admitted {
			t.Fatalf("%s: %v", tenant, d.Reason)
		}
	}
	if err := e.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	store.down.Store(true)
	for range 2 {
		if err := e.Reconcile(ctx); !errors.Is(err, errDown) {
			t.Fatalf("reconcile with the store down: %v", err)
		}
	}
	if st, _ := e.SharedStatus(); !st.BreakerOpen || st.Failures != 2 {
		t.Fatalf("after 2 failures: %+v, want the breaker open", st)
	}
	if d, _ := e.Admit(ctx, small("c", 100)); d.Outcome != admission.Rejected || d.Reason != admission.ReasonStateUnavailable || d.RetryAfter != time.Second {
		t.Errorf("fail-closed tier: %v %v retry %v, want STATE_UNAVAILABLE retry 1s", d.Outcome, d.Reason, d.RetryAfter)
	}
	if d, _ := e.Admit(ctx, small("o", 100)); d.Outcome != admission.Admitted {
		t.Errorf("fail-open tier refused: %v", d.Reason)
	}
	calls := func() uint64 { st, _ := e.SharedStatus(); return st.Calls }
	before := calls()
	if err := e.Reconcile(ctx); err == nil || calls() != before {
		t.Errorf("reconcile during the cool-down: err %v, calls %d → %d; want refused without calling the store", err, before, calls())
	}
	clk.Advance(1500 * time.Millisecond)
	store.down.Store(false)
	if err := e.Reconcile(ctx); err != nil {
		t.Fatalf("probe after the cool-down: %v", err)
	}
	st, _ := e.SharedStatus()
	if st.BreakerOpen || st.FallbackSeconds != 1.5 {
		t.Errorf("after the probe: %+v, want closed after 1.5 s of fallback", st)
	}
	if d, _ := e.Admit(ctx, small("c", 100)); d.Outcome != admission.Admitted {
		t.Errorf("fail-closed tier after recovery: %v", d.Reason)
	}
	if len(store.transitions) != 2 || !store.transitions[0] || store.transitions[1] {
		t.Errorf("OnBreaker calls %v, want [true false]", store.transitions)
	}
}

// Strict: a commit the store refuses undoes the local admission; Release
// settles in the store; with the store down the tiers' fail modes apply.
func TestStrictCommitRefusalSettleAndFailModes(t *testing.T) {
	e, store, _ := sharedEngine(t, admission.SharedStrict, 1)
	other, _ := admission.New(mustConfig(t), topology.Simulated(), admission.WithSharedState(store, admission.SharedOptions{Mode: admission.SharedStrict, Replica: "r2"}))
	ctx := context.Background()
	// The other replica takes the whole burst in the store.
	for range 30 {
		if d, _ := other.Admit(ctx, small("o", 100)); d.Outcome != admission.Admitted {
			t.Fatalf("other replica: %v", d.Reason)
		}
	}
	req := small("o", 100)
	req.RequestID = "x"
	d, err := e.Admit(ctx, req)
	if err != nil || d.Outcome != admission.Rejected || d.Reason != admission.ReasonQuotaExceeded || d.RetryAfter <= 0 {
		t.Fatalf("admit past the shared burst: %+v %v, want QUOTA_EXCEEDED with a retry", d, err)
	}
	if n := e.LeaseCount(); n != 0 {
		t.Errorf("%d local leases after the store refused", n)
	}
	if info, _ := e.Tenant("o"); info.InFlight != 0 || info.TokenLevel != 3000 {
		t.Errorf("tenant after the refusal: in flight %d, level %d; want 0 and the untouched 3000", info.InFlight, info.TokenLevel)
	}
	// Release on the other replica settles in the store: 100 unused tokens
	// come back, so this replica's retry fits.
	d2, _ := other.Admit(ctx, small("c", 100))
	if _, err := other.Release(ctx, admission.Release{LeaseID: d2.LeaseID, PromptTokens: 50, OutputTokens: 0}); err != nil {
		t.Fatal(err)
	}
	if store.settle.Load() != 1 {
		t.Errorf("%d settle calls, want 1", store.settle.Load())
	}
	store.down.Store(true)
	if d, _ := e.Admit(ctx, small("c", 100)); d.Reason != admission.ReasonStateUnavailable {
		t.Errorf("fail-closed with the store down: %v", d.Reason)
	}
	if d, _ := e.Admit(ctx, small("o", 100)); d.Outcome != admission.Admitted {
		t.Errorf("fail-open with the store down: %v", d.Reason)
	}
}

func mustConfig(t *testing.T) admission.Config {
	t.Helper()
	cfg, err := config.Parse("shared.yaml", []byte(sharedConfig))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// Changing N re-slices at the next round without charging anything again:
// the store's level moves only by what was taken, and the replicas' rates
// never add up to more than the tenant's.
func TestBatchedReplicaCountChangeDoesNotDoubleCount(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	store := memstate.New(clk)
	var engines []*admission.Engine
	for _, id := range []string{"a", "b"} {
		e, err := admission.New(mustConfig(t), topology.Simulated(), admission.WithClock(clk),
			admission.WithSharedState(store, admission.SharedOptions{Mode: admission.SharedBatched, Replica: id, Replicas: 2}))
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, e)
	}
	ctx := context.Background()
	round := func() {
		t.Helper()
		for _, e := range engines {
			if err := e.Reconcile(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, e := range engines {
		for range 3 {
			if d, _ := e.Admit(ctx, small("o", 100)); d.Outcome != admission.Admitted {
				t.Fatalf("admit: %v", d.Reason)
			}
		}
	}
	round()
	level, _ := store.Level("t/o/tok")
	if level != 3000-600 {
		t.Fatalf("store level %v after 6 admissions of 100, want 2400", level)
	}
	for _, n := range []int{3, 1, 2} {
		for _, e := range engines {
			e.SetReplicas(n)
		}
		round()
		if got, _ := store.Level("t/o/tok"); got != level {
			t.Errorf("N=%d: store level %v, want it unchanged at %v", n, got, level)
		}
		var rates int64
		for _, e := range engines {
			info, _ := e.Tenant("o")
			rates += info.TokenRate
			if st, _ := e.SharedStatus(); st.Replicas != n {
				t.Errorf("status says %d replicas, want %d", st.Replicas, n)
			}
		}
		if rates > 1000 {
			t.Errorf("N=%d: granted rates add up to %d > 1000", n, rates)
		}
	}
}

// A config reload rebuilds the domains' capacities (levels carried over):
// carrying a level over is not a take, and what the old capacity took
// since the last report is still reported, once. The same admissions with
// and without a reload leave the store in the same state.
func TestBatchedReloadReportsEverythingOnce(t *testing.T) {
	levels := func(reload bool) (map[string]float64, string) {
		clk := clock.NewManual(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
		store := memstate.New(clk)
		e, err := admission.New(mustConfig(t), topology.Simulated(), admission.WithClock(clk),
			admission.WithSharedState(store, admission.SharedOptions{Mode: admission.SharedBatched, Replica: "a"}))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		d, _ := e.Admit(ctx, small("o", 1000))
		if d.Outcome != admission.Admitted {
			t.Fatalf("admit: %v", d.Reason)
		}
		if err := e.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		e.Admit(ctx, small("o", 1000)) // taken on the capacity a reload replaces
		if reload {
			if err := e.Apply(mustConfig(t)); err != nil {
				t.Fatal(err)
			}
		}
		for range 2 {
			if err := e.Reconcile(ctx); err != nil {
				t.Fatal(err)
			}
		}
		out := map[string]float64{}
		for _, k := range []string{"t/o/tok", "d/" + d.Domain + "/pf", "d/" + d.Domain + "/dc"} {
			l, ok := store.Level(k)
			if !ok {
				t.Fatalf("no bucket %s in the store", k)
			}
			out[k] = l
		}
		return out, d.Domain
	}
	want, _ := levels(false)
	got, _ := levels(true)
	for k, l := range want {
		if got[k] != l {
			t.Errorf("%s: store level %v with a reload, %v without", k, got[k], l)
		}
	}
	if want["t/o/tok"] != 3000-2000 {
		t.Errorf("tokens: store level %v, want 1000 after two admissions of 1000", want["t/o/tok"])
	}
}

// gated holds Commit calls until released, then refuses or admits them.
type gated struct {
	admission.SharedState
	entered chan struct{}
	release chan bool // true: admit
}

func (g *gated) Commit(ctx context.Context, c *admission.StrictCharge) (admission.StrictVerdict, error) {
	g.entered <- struct{}{}
	if <-g.release {
		return admission.StrictVerdict{Admitted: true}, nil
	}
	return admission.StrictVerdict{Refused: 1, RetryAfter: time.Second}, nil
}

// An idempotent duplicate that arrives while the store is deciding waits
// for that one commit and gets its answer: never an admission the store
// then refuses, never a second charge.
func TestStrictDuplicateWaitsForTheCommit(t *testing.T) {
	store := &gated{SharedState: memstate.New(nil), entered: make(chan struct{}, 2), release: make(chan bool)}
	e, err := admission.New(mustConfig(t), topology.Simulated(),
		admission.WithSharedState(store, admission.SharedOptions{Mode: admission.SharedStrict, Replica: "r", Timeout: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := small("o", 100)
	req.RequestID = "dup"
	answers := make(chan admission.Decision, 2)
	go func() { d, _ := e.Admit(ctx, req); answers <- d }()
	<-store.entered // the first call is in the store
	go func() { d, _ := e.Admit(ctx, req); answers <- d }()
	select {
	case d := <-answers:
		t.Fatalf("answered %v while the store was still deciding", d.Outcome)
	case <-store.entered:
		t.Fatal("the duplicate committed a second time")
	case <-time.After(50 * time.Millisecond): // a wait for absence: nothing may arrive
	}
	store.release <- false
	for range 2 {
		if d := <-answers; d.Outcome != admission.Rejected || d.Reason != admission.ReasonQuotaExceeded {
			t.Errorf("answer %v %v, want both callers refused by the store", d.Outcome, d.Reason)
		}
	}
	if n := e.LeaseCount(); n != 0 {
		t.Errorf("%d leases after the refusal", n)
	}
}

// counting records how many tenant buckets each reconcile reports.
type counting struct {
	admission.SharedState
	tenantBuckets []int
}

func (c *counting) Reconcile(ctx context.Context, r *admission.ReconcileRequest) (*admission.ReconcileReply, error) {
	n := 0
	for _, b := range r.Buckets {
		if b.Key[0] == 't' {
			n++
		}
	}
	c.tenantBuckets = append(c.tenantBuckets, n)
	return c.SharedState.Reconcile(ctx, r)
}

// A tenant idle for ten intervals is no longer reported, and its buckets
// stop refilling at their grant (keeping their level); its next refusal
// brings it back with a fresh grant.
func TestBatchedIdleTenantIsNotReported(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	store := &counting{SharedState: memstate.New(clk)}
	e, err := admission.New(mustConfig(t), topology.Simulated(), admission.WithClock(clk),
		admission.WithSharedState(store, admission.SharedOptions{Mode: admission.SharedBatched, Replica: "a"}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	round := func() {
		t.Helper()
		clk.Advance(100 * time.Millisecond)
		if err := e.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if d, _ := e.Admit(ctx, small("o", 1000)); d.Outcome != admission.Admitted {
		t.Fatal(d.Reason)
	}
	for range 25 { // new for a second, then idle for one
		round()
	}
	last := store.tenantBuckets[len(store.tenantBuckets)-1]
	if store.tenantBuckets[0] != 2 || last != 0 {
		t.Fatalf("tenant buckets reported per round %v: want 2 (rps, tokens) at first, none once idle", store.tenantBuckets)
	}
	info, _ := e.Tenant("o")
	if info.TokenRate != 0 || info.TokenLevel <= 0 {
		t.Fatalf("idle tenant: rate %d level %d, want frozen (0) with its level kept", info.TokenRate, info.TokenLevel)
	}
	// Spend what is left, then be refused: the refusal asks for a grant.
	for {
		d, _ := e.Admit(ctx, small("o", 1000))
		if d.Outcome != admission.Admitted {
			break
		}
	}
	round()
	if got := store.tenantBuckets[len(store.tenantBuckets)-1]; got != 2 {
		t.Errorf("after a refusal the tenant reported %d buckets, want 2", got)
	}
	if info, _ := e.Tenant("o"); info.TokenRate != 1000 {
		t.Errorf("rate after the tenant came back: %d, want the whole 1000", info.TokenRate)
	}
}
