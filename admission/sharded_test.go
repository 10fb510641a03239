package admission_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/admissiontest"
	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/state/memstate"
	"github.com/sluice-sched/sluice/internal/testwait"
	"github.com/sluice-sched/sluice/topology/topologytest"
)

// shardedFleet is n batched engines sharing a store of three shards, on a
// manual clock: tenants o0…o29 fail open, c0…c29 fail closed. tune, if
// given, changes the engines' shared options.
type shardedFleet struct {
	clk      *clock.Manual
	store    *admissiontest.Sharded
	counting map[string]*admissiontest.Counting
	engines  []*admission.Engine
}

var shardNames = []string{"s0", "s1", "s2"}

func newShardedFleet(t *testing.T, n, domains int, tune ...func(*sharing.Options)) *shardedFleet {
	t.Helper()
	var b strings.Builder
	b.WriteString(`
output_token_weight: 1
leases: {ttl: 1m, idempotency_ttl: 1m}
tiers:
  open: {rps: {rate: 1000, burst: 1000}, tokens: {rate: 100000, burst: 100000}, weight: 1}
  closed: {rps: {rate: 1000, burst: 1000}, tokens: {rate: 100000, burst: 100000}, weight: 1, fail_mode: closed}
tenants:
`)
	for i := range 30 {
		fmt.Fprintf(&b, "  o%d: {tier: open}\n  c%d: {tier: closed}\n", i, i)
	}
	cfg, err := config.Parse("sharded.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	f := &shardedFleet{clk: clock.NewManual(admission.Epoch), counting: make(map[string]*admissiontest.Counting)}
	f.store = admissiontest.NewSharded(shardNames, func(name string) sharing.Store {
		f.counting[name] = admissiontest.NewCounting(memstate.New(f.clk))
		return f.counting[name]
	})
	for i := range n {
		opts := sharing.Options{Mode: sharing.Batched, Replica: fmt.Sprintf("r%d", i), Replicas: n, Failures: 2}
		for _, f := range tune {
			f(&opts)
		}
		e, err := admission.New(cfg, topologytest.HGX(t, domains), admission.WithClock(f.clk), admission.WithSharedState(f.store, opts))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		f.engines = append(f.engines, e)
	}
	return f
}

// round advances the clock an interval and reconciles every engine.
func (f *shardedFleet) round() {
	f.clk.Advance(100 * time.Millisecond)
	for _, e := range f.engines {
		e.Tick()
		_ = e.Reconcile(context.Background()) // fails while a shard is down
	}
}

func (f *shardedFleet) admit(t *testing.T, e *admission.Engine, tenant string) admission.Decision {
	t.Helper()
	d, err := e.Admit(context.Background(), admission.Request{Tenant: tenant, Model: "small", PromptTokens: 50, MaxOutputTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	if d.Outcome == admission.Admitted {
		if _, err := e.Release(context.Background(), admission.Release{LeaseID: d.LeaseID, PromptTokens: 50, OutputTokens: 50}); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// Batched rounds on a sharded store: one call per shard per round from
// each replica, each carrying only that shard's keys, and every tenant's
// buckets on the shard its name hashes to.
func TestBatchedRoundIsOneCallPerShard(t *testing.T) {
	f := newShardedFleet(t, 2, 3)
	const rounds = 10
	for range rounds {
		for _, e := range f.engines {
			for i := range 30 {
				f.admit(t, e, fmt.Sprintf("o%d", i))
			}
		}
		f.round()
	}
	for _, name := range shardNames {
		reps := f.counting[name].Reports()
		if len(reps) != rounds*len(f.engines) {
			t.Errorf("shard %s had %d calls over %d rounds of %d replicas, want one per replica per round", name, len(reps), rounds, len(f.engines))
		}
		tenants := 0
		for _, r := range reps {
			tenants += r.TenantBuckets
		}
		if tenants == 0 {
			t.Errorf("shard %s holds no tenant's buckets: the tenants are not spread", name)
		}
	}
}

// One shard down: its tenants go to their fail modes (a fail-closed one is
// refused UNAVAILABLE, a fail-open one decides on its slice); the tenants
// on the other shards see nothing; the status names the shard that is
// down. Back up, its tenants are served again.
func TestOneShardDownStaysOnItsShard(t *testing.T) {
	f := newShardedFleet(t, 2, 3)
	e := f.engines[0]
	for range 3 {
		f.round()
	}
	down := "s1"
	f.store.Of(down).SetDown(true)
	for range 3 { // the breaker opens after 2 failures
		f.round()
	}
	st, _ := e.SharedStatus()
	if !st.BreakerOpen || len(st.Shards) != len(shardNames) {
		t.Fatalf("status %+v, want the breaker open and %d shards listed", st, len(shardNames))
	}
	for _, sh := range st.Shards {
		if sh.Down != (sh.Name == down) {
			t.Errorf("shard %s down=%v, want only %s down", sh.Name, sh.Down, down)
		}
	}
	onDown := 0
	for i := range 30 {
		for _, tenant := range []string{fmt.Sprintf("o%d", i), fmt.Sprintf("c%d", i)} {
			d := f.admit(t, e, tenant)
			mine := f.store.Shard("t/"+tenant+"/rps") == down
			closed := tenant[0] == 'c'
			switch {
			case mine && closed:
				onDown++
				if d.Outcome != admission.Rejected || d.Reason != admission.ReasonStateUnavailable {
					t.Errorf("%s (fail-closed, on the down shard): %v %v, want REJECTED STATE_UNAVAILABLE", tenant, d.Outcome, d.Reason)
				}
			case d.Outcome != admission.Admitted:
				t.Errorf("%s (on shard %s): %v %v, want admitted", tenant, f.store.Shard("t/"+tenant+"/rps"), d.Outcome, d.Reason)
			}
		}
	}
	if onDown == 0 {
		t.Fatalf("no fail-closed tenant on shard %s: the test proves nothing", down)
	}
	f.store.Of(down).SetDown(false)
	for range 12 { // the breaker probes every interval
		f.round()
	}
	if st, _ := e.SharedStatus(); st.BreakerOpen {
		t.Fatalf("breaker still open with every shard up: %+v", st.Shards)
	}
	for i := range 30 {
		if d := f.admit(t, e, fmt.Sprintf("c%d", i)); d.Outcome != admission.Admitted {
			t.Errorf("c%d after the shard's return: %v %v, want admitted", i, d.Outcome, d.Reason)
		}
	}
}

// A shard that stops answering (its calls wait out a timeout longer than
// the interval) does not hold the other shards' rounds back: they are
// called every round, while the silent one has one call out and no
// other until it answers. Once it does, its rounds come back.
func TestSilentShardDoesNotHoldRoundsBack(t *testing.T) {
	f := newShardedFleet(t, 1, 3, func(o *sharing.Options) {
		o.Interval = 20 * time.Millisecond // Reconcile's patience, in real time
		o.Timeout = time.Hour
	})
	e := f.engines[0]
	f.round()
	silent := f.store.Of("s1")
	silent.SetHung(true)
	before := map[string]int{}
	for _, name := range shardNames {
		before[name] = len(f.counting[name].Reports())
	}
	const rounds = 5
	for range rounds {
		for i := range 30 {
			f.admit(t, e, fmt.Sprintf("o%d", i))
		}
		f.round()
	}
	for _, name := range []string{"s0", "s2"} {
		if got := len(f.counting[name].Reports()) - before[name]; got != rounds {
			t.Errorf("shard %s: %d calls in %d rounds while s1 is silent, want one a round", name, got, rounds)
		}
	}
	if got := silent.Hung(); got != 1 {
		t.Errorf("silent shard s1: %d calls out, want 1 (no new call while one is out)", got)
	}
	silent.SetHung(false)
	testwait.Until(t, 10*time.Second, "s1 answers again each round", func() bool {
		f.round()
		return len(f.counting["s1"].Reports())-before["s1"] >= 3
	})
}

// A domain a replica does not use is reported only every half of its KV
// holding's life (SilentHoldRounds/2 rounds without a membership), not
// every round: a round's size follows what the replica did.
func TestUnusedDomainsAreReportedEveryHalfHold(t *testing.T) {
	const domains = 8
	f := newShardedFleet(t, 1, domains)
	f.round()
	f.round() // the first reports, then the one that says nothing was taken
	counted := func() (buckets int) {
		for _, c := range f.counting {
			for _, r := range c.Reports() {
				buckets += r.DomainBuckets
			}
		}
		return buckets
	}
	before := counted()
	const rounds = 4 * sharing.SilentHoldRounds
	for range rounds {
		f.round()
	}
	got, want := counted()-before, 2*domains*rounds/(sharing.SilentHoldRounds/2)
	if got != want {
		t.Errorf("%d domain bucket reports over %d idle rounds, want %d (each domain's two buckets every %d rounds)", got, rounds, want, sharing.SilentHoldRounds/2)
	}
	// Used again, a domain is reported at the next round.
	e := f.engines[0]
	if d := f.admit(t, e, "o1"); d.Outcome != admission.Admitted {
		t.Fatalf("o1: %v %v", d.Outcome, d.Reason)
	}
	before = counted()
	f.round()
	if got := counted() - before; got < 2 {
		t.Errorf("%d domain bucket reports in the round after an admission, want the used domain's two at least", got)
	}
}

// A replica that leaves the membership lets go of its domains' KV at the
// store: the next rounds report every domain, used or not, so that the
// others take its capacity back within an interval, not at their next
// due report.
func TestShrinkingMembershipReportsEveryDomain(t *testing.T) {
	const domains = 8
	f := newShardedFleet(t, 2, domains)
	e := f.engines[0]
	for range 4 {
		f.round()
	}
	counted := func() (buckets int) {
		for _, c := range f.counting {
			for _, r := range c.Reports() {
				buckets += r.DomainBuckets
			}
		}
		return buckets
	}
	before := counted()
	f.round()
	idle := counted() - before
	e.SetReplicas(1)
	before = counted()
	f.round()
	// Both engines report in a round; the one told of the shrink reports
	// its 8 domains' 2 buckets each.
	if got := counted() - before; got < idle+2*domains {
		t.Errorf("%d domain bucket reports in the round after the membership shrank (an idle round: %d), want every domain's of the engine told", got, idle)
	}
}

// A tenant that takes a little of what it holds here each round (the
// most of a fleet's tenants) is not reported every round: its buckets
// pause at their level. Once it takes a real part of it, the next round
// reports it.
func TestQuietTenantsAreLeftOut(t *testing.T) {
	f := newShardedFleet(t, 1, 1)
	e := f.engines[0]
	tenantReports := func() (n int) {
		for _, c := range f.counting {
			for _, r := range c.Reports() {
				n += r.TenantBuckets
			}
		}
		return n
	}
	for range 12 { // past its first second
		f.admit(t, e, "o1")
		f.round()
	}
	before := tenantReports()
	for range 20 {
		if d := f.admit(t, e, "o1"); d.Outcome != admission.Admitted {
			t.Fatalf("o1: %v %v", d.Outcome, d.Reason)
		}
		f.round()
	}
	if got := tenantReports() - before; got != 0 {
		t.Errorf("%d tenant bucket reports over 20 rounds of one request each (100 of 100,000 tokens), want none: a quiet tenant is left out", got)
	}
	for range 200 { // 20,000 tokens: a fifth of its level
		if d := f.admit(t, e, "o1"); d.Outcome != admission.Admitted {
			t.Fatalf("o1: %v %v", d.Outcome, d.Reason)
		}
	}
	before = tenantReports()
	f.round()
	if got := tenantReports() - before; got != 2 {
		t.Errorf("%d tenant bucket reports in the round after o1 took a fifth of its level, want its 2 buckets", got)
	}
}
