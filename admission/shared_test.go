package admission_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/admissiontest"
	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/state/memstate"
	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/topology/topologytest"
)

// The shared-state behaviours are scenarios (testdata/scenarios/shared-*,
// on the in-memory store; internal/state/redisstate's tests run engines
// against a real redis-server). What stays here is what a script cannot
// say: option checking, and callers racing on one store call.

const sharedConfig = `
output_token_weight: 1
leases: {ttl: 1m, idempotency_ttl: 1m}
tiers:
  open:
    rps: {rate: 1000, burst: 1000}
    tokens: {rate: 1000, burst: 3000}
    weight: 1
tenants:
  o: {tier: open}
`

func TestSharedOptionsAreChecked(t *testing.T) {
	cfg, _ := config.Default()
	for _, o := range []sharing.Options{{Mode: sharing.Batched}, {Replica: "r"}} {
		if _, err := admission.New(cfg, topology.Simulated(), admission.WithSharedState(memstate.New(nil), o)); err == nil {
			t.Errorf("New accepted %+v", o)
		}
	}
}

// An idempotent duplicate that arrives while the store is deciding waits
// for that one commit and gets its answer: never an admission the store
// then refuses, never a second charge.
func TestStrictDuplicateWaitsForTheCommit(t *testing.T) {
	for _, admit := range []bool{false, true} {
		name := map[bool]string{false: "refused", true: "admitted"}[admit]
		t.Run(name, func(t *testing.T) { strictDuplicate(t, admit) })
	}
}

func strictDuplicate(t *testing.T, admit bool) {
	cfg, err := config.Parse("shared.yaml", []byte(sharedConfig))
	if err != nil {
		t.Fatal(err)
	}
	counted := admissiontest.NewCounting(memstate.New(nil))
	store := admissiontest.NewGated(counted, 2)
	e, err := admission.New(cfg, topology.Simulated(),
		admission.WithSharedState(store, sharing.Options{Mode: sharing.Strict, Replica: "r", Timeout: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	req := admission.Request{Tenant: "o", Model: "small", PromptTokens: 50, MaxOutputTokens: 50, RequestID: "dup"}
	answers := make(chan admission.Decision, 2)
	go func() { d, _ := e.Admit(ctx, req); answers <- d }()
	<-store.Entered() // the first call is in the store
	go func() { d, _ := e.Admit(ctx, req); answers <- d }()
	select {
	case d := <-answers:
		t.Fatalf("answered %v while the store was still deciding", d.Outcome)
	case <-store.Entered():
		t.Fatal("the duplicate committed a second time")
	case <-time.After(50 * time.Millisecond): // a wait for absence: nothing may arrive
	}
	if !admit {
		store.Refuse(sharing.StrictVerdict{Refused: 1, RetryAfter: time.Second})
		for range 2 {
			if d := <-answers; d.Outcome != admission.Rejected || d.Reason != admission.ReasonQuotaExceeded {
				t.Errorf("answer %v %v, want both callers refused by the store", d.Outcome, d.Reason)
			}
		}
		if n := e.LeaseCount(); n != 0 {
			t.Errorf("%d leases after the refusal", n)
		}
		return
	}
	store.Pass()
	a, b := <-answers, <-answers
	if a.Outcome != admission.Admitted || b.Outcome != admission.Admitted || a.LeaseID != b.LeaseID {
		t.Errorf("answers %v lease %d and %v lease %d, want both callers given the one admission", a.Outcome, a.LeaseID, b.Outcome, b.LeaseID)
	}
	if n, c := e.LeaseCount(), counted.Commits(); n != 1 || c != 1 {
		t.Errorf("%d leases and %d commits in the store, want 1 and 1", n, c)
	}
}

// Batched replicas back from a long store outage (30 s, on a manual clock,
// the store keeping its data) resume at once: the store rebuilds the
// tenant's bucket from their levels rather than charging the outage's
// takes against a refill capped at the burst, which refused everyone for
// about as long as the outage. Over [outage start, return + 10 s] the
// tenant, held at its limit, is admitted within [99% of its quota, quota +
// (N−1)·R·W].
func TestBatchedRecoveryAfterLongOutage(t *testing.T) {
	cfg, err := config.Parse("shared.yaml", []byte(`
output_token_weight: 1
leases: {ttl: 1m, idempotency_ttl: 1m}
tiers:
  open:
    rps: {rate: 100000, burst: 100000}
    tokens: {rate: 20000, burst: 10000}
    weight: 1
tenants:
  o: {tier: open}
`))
	if err != nil {
		t.Fatal(err)
	}
	const (
		n        = 2
		rate     = 20000 // tokens/s: 200 requests/s
		burst    = 10000
		reqSize  = 100 // prompt 50 + output 50
		interval = 100 * time.Millisecond
		step     = 10 * time.Millisecond
	)
	clk := clock.NewManual(admission.Epoch)
	store := admissiontest.NewFlaky(memstate.New(clk))
	var engines []*admission.Engine
	for i := range n {
		e, err := admission.New(cfg, topologytest.HGX(t, 1), admission.WithClock(clk),
			admission.WithSharedState(store, sharing.Options{Mode: sharing.Batched, Replica: fmt.Sprintf("r%d", i), Replicas: n, Failures: 2, Cooldown: time.Second}))
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		engines = append(engines, e)
	}
	ctx := context.Background()
	last := make([]time.Time, n)        // each replica's last admission
	longest := make([]time.Duration, n) // its longest pause after the return
	var returned time.Time
	admitted := int64(0)
	// run drives every replica at its limit for d: every step each admits
	// until refused; every interval each reconciles.
	run := func(d time.Duration) {
		for end := clk.Now().Add(d); clk.Now().Before(end); {
			clk.Advance(step)
			now := clk.Now()
			for i, e := range engines {
				e.Tick()
				if now.Sub(admission.Epoch)%interval == 0 {
					_ = e.Reconcile(ctx) // fails while the store is down
				}
				for {
					dec, err := e.Admit(ctx, admission.Request{Tenant: "o", Model: "small", PromptTokens: 50, MaxOutputTokens: 50})
					if err != nil {
						t.Fatal(err)
					}
					if dec.Outcome != admission.Admitted {
						if dec.Reason != admission.ReasonQuotaExceeded {
							di := e.Domains()[0]
							t.Fatalf("refused %v at %v on r%d, want only QUOTA_EXCEEDED; prefill %d/%d at %d/s; decode %d/%d at %d/s; kv %d/%d", dec.Reason, now.Sub(admission.Epoch), i,
								di.PrefillLevel, di.PrefillBurst, di.PrefillRate, di.DecodeLevel, di.DecodeBurst, di.DecodeRate, di.KVInUse, di.KVLimit)
						}
						break
					}
					admitted += reqSize
					if _, err := e.Release(ctx, admission.Release{LeaseID: dec.LeaseID, PromptTokens: 50, OutputTokens: 50}); err != nil {
						t.Fatal(err)
					}
					if !returned.IsZero() {
						longest[i] = max(longest[i], now.Sub(last[i]))
					}
					last[i] = now
				}
			}
		}
	}
	run(2 * time.Second)
	owed := max(burst+rate*2-admitted, 0) // about 0: held at its limit
	admitted = 0
	store.SetDown(true)
	run(30 * time.Second)
	store.SetDown(false)
	returned = clk.Now()
	run(10 * time.Second)
	for i := range longest { // the silence up to the end counts too
		longest[i] = max(longest[i], clk.Now().Sub(last[i]))
	}
	quota := owed + rate*40
	bound := int64((n - 1) * rate * interval.Seconds())
	t.Logf("admitted %d over the window, quota %d (%.2f%%); longest pause per replica after the return %v", admitted, quota, 100*float64(admitted)/float64(quota), longest)
	if admitted > quota+bound || float64(admitted) < 0.99*float64(quota) {
		t.Errorf("admitted %d over [outage start, return + 10 s], want within [99%% of %d, %d]", admitted, quota, quota+bound)
	}
	for i, l := range longest {
		if l > 2*interval {
			t.Errorf("replica %d admitted nothing for %v after the store returned, want at most two intervals", i, l)
		}
	}
}

// Strict: admissions whose commits are in flight when the store goes away
// were decided on the whole local buckets, as if this replica were alone.
// Kept on a failure while the breaker is still closed, their charge is
// taken from the 1/N slices the breaker cuts (into debt: they are
// answered already); failing once it is open, they are judged against
// the slices and refused where these cannot hold them. Either way the
// replica admits no more during the outage than its slice of what the
// store last held, refilled at 1/N of the rate.
func TestStrictInFlightCommitsCountAgainstTheSlice(t *testing.T) {
	cfg, err := config.Parse("shared.yaml", []byte(sharedConfig)) // tokens 1000/s, burst 3000
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(admission.Epoch)
	mem := memstate.New(clk)
	flaky := admissiontest.NewFlaky(mem)
	gated := admissiontest.NewGated(flaky, 8)
	opts := sharing.Options{Mode: sharing.Strict, Replicas: 2, Failures: 3, Cooldown: time.Minute, Timeout: time.Minute}
	newEngine := func(id string, store sharing.Store) *admission.Engine {
		o := opts
		o.Replica = id
		e, err := admission.New(cfg, topologytest.HGX(t, 1), admission.WithClock(clk), admission.WithSharedState(store, o))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		return e
	}
	e, other := newEngine("r1", gated), newEngine("r2", mem)
	ctx := context.Background()
	req := admission.Request{Tenant: "o", Model: "small", PromptTokens: 50, MaxOutputTokens: 50} // 100 tokens
	// The other replica takes all but one request's worth of the store's
	// bucket; r1 takes the last: the store then holds 0, and r1 knows it.
	for i := range 29 {
		if d, err := other.Admit(ctx, req); err != nil || d.Outcome != admission.Admitted {
			t.Fatalf("r2's admission %d: %v %v", i, d.Outcome, err)
		}
	}
	answers := make(chan admission.Decision, 8)
	admit := func() {
		go func() {
			d, err := e.Admit(ctx, req)
			if err != nil {
				t.Error(err)
			}
			answers <- d
		}()
	}
	next := func() admission.Decision {
		t.Helper()
		select {
		case d := <-answers:
			return d
		case <-time.After(10 * time.Second):
			t.Fatal("no answer")
		}
		return admission.Decision{}
	}
	admit()
	<-gated.Entered()
	gated.Pass()
	if d := next(); d.Outcome != admission.Admitted {
		t.Fatalf("r1's admission: %v %v", d.Outcome, d.Reason)
	}
	// Five admissions in flight, decided on r1's whole local bucket (2,900
	// of 3,000: it saw only its own take); then the store goes away.
	const inFlight = 5
	for range inFlight {
		admit()
		<-gated.Entered()
	}
	clk.Advance(time.Millisecond)
	flaky.SetDown(true)
	var got []string
	kept := 0
	for i := range inFlight {
		gated.Pass() // this commit fails: the first two with the breaker closed, the third opens it
		d := next()
		got = append(got, fmt.Sprintf("%v %v", d.Outcome, d.Reason))
		if d.Outcome == admission.Admitted {
			kept++
		} else if d.Reason != admission.ReasonQuotaExceeded {
			t.Errorf("commit %d refused with %v, want QUOTA_EXCEEDED (the slice is empty)", i, d.Reason)
		}
	}
	if st, _ := e.SharedStatus(); !st.BreakerOpen {
		t.Fatalf("breaker closed after %d failures", inFlight)
	}
	if kept != opts.Failures-1 {
		t.Errorf("answers %v: %d kept, want the %d whose commits failed before the breaker opened, the rest refused by the slice", got, kept, opts.Failures-1)
	}
	// The slice started at r1's half of the store's 0 (1 ms of refill) and
	// owes the two kept: −200. Refilling at 500/s, 200 ms bring it to −100,
	// still short of a request.
	if ti, _ := e.Tenant("o"); ti.TokenLevel != -200 {
		t.Errorf("slice level %d after the outage's first commits, want −200 (the two kept, taken from an empty slice)", ti.TokenLevel)
	}
	clk.Advance(200 * time.Millisecond)
	admit()
	if d := next(); d.Outcome != admission.Rejected || d.Reason != admission.ReasonQuotaExceeded {
		t.Errorf("admission 200 ms into the outage: %v %v, want QUOTA_EXCEEDED: the slice is still in debt", d.Outcome, d.Reason)
	}
}
