package sharing_test

import (
	"context"
	"iter"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission/admissiontest"
	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/state/memstate"
	"github.com/sluice-sched/sluice/internal/testwait"
	"github.com/sluice-sched/sluice/internal/tokenbucket"
	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
)

// The strategies against a fake of the engine (fakeView) and the real
// in-memory store: what each hook reads and changes of the engine's
// buckets, capacities and leases, seen directly. The same strategies run
// through the engine in package admission's tests and scenarios and in
// internal/state/redisstate's.

// fakeTenant is a tenant of the fake engine: four buckets and their whole
// limits.
type fakeTenant struct {
	name    string
	b       [sharing.TenantKinds]tokenbucket.Bucket
	limits  [sharing.TenantKinds][2]int64 // rate, burst
	created int64
	closed  bool
}

func newTenant(name string, now int64, closed bool, rps, tokens [2]int64) *fakeTenant {
	t := &fakeTenant{name: name, created: now, closed: closed}
	t.limits[sharing.KindRPS], t.limits[sharing.KindTokens] = rps, tokens
	for k, l := range t.limits {
		t.b[k] = tokenbucket.New(l[0], l[1], 0, now)
	}
	return t
}

func (t *fakeTenant) Name() string { return t.name }
func (t *fakeTenant) Buckets() [sharing.TenantKinds]*tokenbucket.Bucket {
	return [sharing.TenantKinds]*tokenbucket.Bucket{&t.b[0], &t.b[1], &t.b[2], &t.b[3]}
}
func (t *fakeTenant) Limits(k sharing.Kind) (int64, int64) { return t.limits[k][0], t.limits[k][1] }
func (t *fakeTenant) CreditLent() int64                    { return 0 }
func (t *fakeTenant) Created() int64                       { return t.created }
func (t *fakeTenant) FailClosed() bool                     { return t.closed }
func (t *fakeTenant) ResetLimits(int64) {
	for k, l := range t.limits {
		t.b[k].SetLimits(l[0], l[1], 0)
	}
}

// fakeDomain is a domain of the fake engine, with a real capacity.
type fakeDomain struct {
	topo topology.Domain
	cap  *pd.DomainCapacity
}

func (d *fakeDomain) ID() string                   { return d.topo.ID }
func (d *fakeDomain) Removed() bool                { return false }
func (d *fakeDomain) Capacity() *pd.DomainCapacity { return d.cap }
func (d *fakeDomain) RestoreCapacity()             { _ = d.cap.Resize(&d.topo) }

// fakeView is the engine as the strategies see it: a lock, a manual
// clock, tenants, one domain, leases, and the revocations asked of it.
type fakeView struct {
	mu      sync.Mutex
	clk     *clock.Manual
	base    time.Time
	tenants map[string]*fakeTenant
	dom     *fakeDomain
	leases  map[uint64]sharing.Charge
	revoked map[uint64]string // lease id: request id
}

func newView(t *testing.T, clk *clock.Manual, tenants ...*fakeTenant) *fakeView {
	t.Helper()
	cat, err := pd.NewCatalog(pd.DefaultModels())
	if err != nil {
		t.Fatal(err)
	}
	d := topology.Simulated().Domains[0].Clone()
	c, err := pd.NewDomainCapacity(&d, cat, pd.DefaultConfig(), 0)
	if err != nil {
		t.Fatal(err)
	}
	v := &fakeView{
		clk: clk, base: clk.Now(), tenants: make(map[string]*fakeTenant),
		dom: &fakeDomain{topo: d, cap: c}, leases: make(map[uint64]sharing.Charge), revoked: make(map[uint64]string),
	}
	for _, tn := range tenants {
		v.tenants[tn.name] = tn
	}
	return v
}

func (v *fakeView) Lock()            { v.mu.Lock() }
func (v *fakeView) Unlock()          { v.mu.Unlock() }
func (v *fakeView) NowLocked() int64 { return int64(v.clk.Since(v.base)) }
func (v *fakeView) Wall() time.Time  { return v.clk.Now() }
func (v *fakeView) TenantsLocked() iter.Seq[sharing.Tenant] {
	return func(yield func(sharing.Tenant) bool) {
		for _, name := range slices.Sorted(maps.Keys(v.tenants)) {
			if !yield(v.tenants[name]) {
				return
			}
		}
	}
}
func (v *fakeView) TenantLocked(name string) sharing.Tenant {
	if t, ok := v.tenants[name]; ok {
		return t
	}
	return nil
}
func (v *fakeView) DomainsLocked() iter.Seq[sharing.Domain] {
	return func(yield func(sharing.Domain) bool) { yield(v.dom) }
}
func (v *fakeView) DomainLocked(id string) sharing.Domain {
	if id == v.dom.ID() {
		return v.dom
	}
	return nil
}
func (v *fakeView) LeaseLocked(id uint64) (sharing.Charge, bool) {
	c, ok := v.leases[id]
	return c, ok
}

// RevokeLocked gives back what the lease's admission took, as the
// engine's Cancel does, and forgets the lease.
func (v *fakeView) RevokeLocked(requestID string, id uint64) {
	v.revoked[id] = requestID
	if l, ok := v.leases[id]; ok {
		now := v.NowLocked()
		b := l.Tenant.Buckets()
		b[sharing.KindRPS].Refund(now, sharing.RequestUnit)
		b[sharing.KindTokens].Refund(now, l.Weighted)
		v.dom.cap.Release(now, l.Cost, pd.Cost{})
	}
	delete(v.leases, id)
}
func (v *fakeView) LeaseTTLLocked() time.Duration { return time.Minute }
func (v *fakeView) OwnEngineReadingLocked(sharing.Domain) (sharing.EngineReading, int64, bool) {
	return sharing.EngineReading{}, 0, false
}
func (v *fakeView) EngineReadingWantedLocked(sharing.Domain) bool                  { return false }
func (v *fakeView) RelayEngineReadingLocked(sharing.Domain, sharing.EngineReading) {}
func (v *fakeView) Background(fn func())                                           { fn() }

// admit takes a lease's charge from the local buckets, as the engine's
// decision does before the strategy sees it, and holds the lease.
func (v *fakeView) admit(id uint64, t *fakeTenant, weighted int64, cost pd.Cost) {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.NowLocked()
	t.b[sharing.KindRPS].Take(now, sharing.RequestUnit)
	t.b[sharing.KindTokens].Take(now, weighted)
	v.dom.cap.Charge(now, cost)
	v.leases[id] = sharing.Charge{Tenant: t, Domain: v.dom, Weighted: weighted, Cost: cost, Granted: now, Expires: now + int64(time.Minute)}
}

// bucket reads a tenant bucket's rate and level under the lock.
func (v *fakeView) bucket(t *fakeTenant, k sharing.Kind) (rate, level int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return t.b[k].Rate(), t.b[k].Level(v.NowLocked())
}

var (
	rps100    = [2]int64{100 * sharing.RequestUnit, 100 * sharing.RequestUnit}
	tokens1k  = [2]int64{1000, 3000} // 1000/s, burst 3000
	smallCost = pd.Cost{PrefillFLOP: 1e9, DecodeBytes: 1e6, KVBytes: 1 << 20}
)

func newStrategy(t *testing.T, v *fakeView, store sharing.Store, o sharing.Options) sharing.Strategy {
	t.Helper()
	s, err := sharing.New(v, v, store, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Batched, a tenant new to two replicas starts from a 1/N slice without
// refill; a reconcile reports what a replica took and installs the grant
// that comes back: the refill rate and its share of the store's level.
func TestBatchedReportAndGrant(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_700_000_000, 0))
	store := memstate.New(clk)
	ta, tb := newTenant("o", 0, false, rps100, tokens1k), newTenant("o", 0, false, rps100, tokens1k)
	va, vb := newView(t, clk, ta), newView(t, clk, tb)
	opts := sharing.Options{Mode: sharing.Batched, Replicas: 2}
	opts.Replica = "a"
	a := newStrategy(t, va, store, opts)
	opts.Replica = "b"
	b := newStrategy(t, vb, store, opts)
	for _, c := range []struct {
		v  *fakeView
		s  sharing.Strategy
		tn *fakeTenant
	}{{va, a, ta}, {vb, b, tb}} {
		c.v.Lock()
		c.s.TenantReadyLocked(c.tn, 0, false)
		c.s.CapacityRebuiltLocked(0, c.v.dom, nil)
		c.v.Unlock()
	}
	if rate, level := va.bucket(ta, sharing.KindTokens); rate != 0 || level != 1500 {
		t.Fatalf("before any grant: rate %d level %d, want 0 and 1500 (a 1/2 slice, no refill)", rate, level)
	}
	fullP, _, fullKV := va.dom.cap.FullLimits()
	if got, _, kv := va.dom.cap.BaseLimits(); got != fullP/2 || kv != fullKV/2 {
		t.Fatalf("new domain: prefill rate %d KV %d, want %d and %d (a 1/2 slice)", got, kv, fullP/2, fullKV/2)
	}

	va.Lock()
	ta.b[sharing.KindTokens].Take(va.NowLocked(), 1000)
	va.Unlock()
	if err := a.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The store's bucket: 3000 − 1000 = 2000, all a's rate while b has
	// not reported, its level shared as if b held its slice: 2000/2.
	if rate, level := va.bucket(ta, sharing.KindTokens); rate != 1000 || level != 1000 {
		t.Errorf("a after its grant: rate %d level %d, want 1000 and 1000", rate, level)
	}
	if lv, ok := store.Level("t/o/tok"); !ok || lv != 2000 {
		t.Errorf("store level %v (%v), want 2000", lv, ok)
	}
	if _, _, kv := va.dom.cap.BaseLimits(); kv != fullKV {
		t.Errorf("a's KV limit %d, want the whole %d: nobody else holds any", kv, fullKV)
	}

	for range 3 {
		clk.Advance(100 * time.Millisecond)
		for _, s := range []sharing.Strategy{b, a} {
			if err := s.Reconcile(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	ra, la := va.bucket(ta, sharing.KindTokens)
	rb, lb := vb.bucket(tb, sharing.KindTokens)
	if ra <= 0 || rb <= 0 || ra+rb > 1000 {
		t.Errorf("rates %d + %d: want both granted, together at most the whole 1000/s", ra, rb)
	}
	if lv, _ := store.Level("t/o/tok"); float64(la+lb) > lv+1 {
		t.Errorf("levels %d + %d above the store's %v", la, lb, lv)
	}
	_, _, kva := va.dom.cap.BaseLimits()
	_, _, kvb := vb.dom.cap.BaseLimits()
	if kva+kvb > fullKV {
		t.Errorf("KV limits %d + %d above the whole %d", kva, kvb, fullKV)
	}
	if st, ok := a.Status(); !ok || st.Calls != 4 || st.Replicas != 2 || st.Mode != sharing.Batched {
		t.Errorf("status %+v %v", st, ok)
	}
}

// Strict, the breaker opening cuts every bucket to a 1/N slice starting
// from this replica's share of the level the store last returned, and
// refuses fail-closed tiers; the store's return makes them whole again.
func TestStrictFallbackSlicesAndRestores(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_700_000_000, 0))
	store := admissiontest.NewFlaky(memstate.New(clk))
	open, closed := newTenant("open", 0, false, rps100, tokens1k), newTenant("closed", 0, true, rps100, tokens1k)
	v := newView(t, clk, open, closed)
	s := newStrategy(t, v, store, sharing.Options{
		Mode: sharing.Strict, Replica: "a", Replicas: 2, Failures: 1,
		Interval: 5 * time.Millisecond, Cooldown: 5 * time.Millisecond,
	})
	fullP, fullD, fullKV := v.dom.cap.FullLimits()
	ctx := context.Background()

	v.admit(1, open, 100, smallCost)
	if why := s.Decided(ctx, "r1", 1); why.Refused() {
		t.Fatalf("commit refused: %+v", why)
	}
	store.SetDown(true)
	v.admit(2, open, 100, smallCost)
	if why := s.Decided(ctx, "r2", 2); why.Refused() {
		t.Fatalf("fail-open admission refused while the store is down: %+v", why)
	}
	// The store last held 3000 − 100 of the token bucket: a's share is
	// 2900/2, below the local 2800 and the slice's burst/2.
	if rate, level := v.bucket(open, sharing.KindTokens); rate != 500 || level != 1450 {
		t.Errorf("fallback tokens: rate %d level %d, want 500 and 1450", rate, level)
	}
	if p, d, kv := v.dom.cap.BaseLimits(); p != fullP/2 || d != fullD/2 || kv != fullKV/2 {
		t.Errorf("fallback domain: %d %d %d, want %d %d %d", p, d, kv, fullP/2, fullD/2, fullKV/2)
	}
	v.Lock()
	why := s.GateLocked(closed)
	v.Unlock()
	if why.Cause != sharing.Unavailable {
		t.Errorf("fail-closed tier while down: %+v, want Unavailable", why)
	}

	store.SetDown(false)
	clk.Advance(time.Second) // past the breaker's cool-down
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.Run(runCtx) }()
	testwait.Until(t, 10*time.Second, "the breaker closing after the store came back", func() bool {
		st, _ := s.Status()
		return !st.BreakerOpen
	})
	cancel()
	<-done
	if rate, _ := v.bucket(open, sharing.KindTokens); rate != 1000 {
		t.Errorf("after the store's return: tokens rate %d, want the whole 1000", rate)
	}
	if p, d, kv := v.dom.cap.BaseLimits(); p != fullP || d != fullD || kv != fullKV {
		t.Errorf("after the store's return: domain %d %d %d, want whole %d %d %d", p, d, kv, fullP, fullD, fullKV)
	}
	v.Lock()
	why = s.GateLocked(closed)
	v.Unlock()
	if why.Refused() {
		t.Errorf("fail-closed tier after the store's return: %+v", why)
	}
}

// Strict, a commit the store refuses revokes the lease through the view
// (with its request id, so that a retry decides afresh) and answers the
// store's reason: the tenant's bucket, or the domain's.
func TestStrictRefusedCommitRevokes(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_700_000_000, 0))
	tn := newTenant("o", 0, false, rps100, tokens1k)
	v := newView(t, clk, tn)
	s := newStrategy(t, v, memstate.New(clk), sharing.Options{Mode: sharing.Strict, Replica: "a", Replicas: 2})
	_, _, kv := v.dom.cap.FullLimits()
	for _, c := range []struct {
		id       uint64
		weighted int64
		cost     pd.Cost
		want     sharing.Cause
	}{
		{1, 2000, smallCost, sharing.None},                                      // 3000 → 1000 in the store
		{2, 2000, smallCost, sharing.OverQuota},                                 // 1000 left
		{3, 10, pd.Cost{PrefillFLOP: 1, KVBytes: kv + 1}, sharing.OverCapacity}, // above the KV limit
	} {
		v.admit(c.id, tn, c.weighted, c.cost)
		why := s.Decided(context.Background(), "req", c.id)
		if why.Cause != c.want {
			t.Errorf("lease %d: %+v, want cause %d", c.id, why, c.want)
		}
		_, revoked := v.revoked[c.id]
		if revoked != (c.want != sharing.None) {
			t.Errorf("lease %d: revoked %v, want %v", c.id, revoked, c.want != sharing.None)
		}
		if revoked && v.revoked[c.id] != "req" {
			t.Errorf("lease %d revoked with request id %q", c.id, v.revoked[c.id])
		}
	}
}

// openedWithOneInFlight is a strict replica of two whose breaker has
// opened (Failures 1: lease 2, of the fail-open tenant open, failed its
// commit) while lease 1, of first, decided on the whole local buckets a
// millisecond before, has not asked the store yet.
func openedWithOneInFlight(t *testing.T, first, open *fakeTenant) (*fakeView, sharing.Strategy) {
	t.Helper()
	clk := clock.NewManual(time.Unix(1_700_000_000, 0))
	store := admissiontest.NewFlaky(memstate.New(clk))
	tenants := []*fakeTenant{open}
	if first != open {
		tenants = append(tenants, first)
	}
	v := newView(t, clk, tenants...)
	s := newStrategy(t, v, store, sharing.Options{Mode: sharing.Strict, Replica: "a", Replicas: 2, Failures: 1, Cooldown: time.Minute})
	v.admit(1, first, 100, smallCost)
	clk.Advance(time.Millisecond)
	store.SetDown(true)
	v.admit(2, open, 100, smallCost)
	if why := s.Decided(context.Background(), "r2", 2); why.Refused() {
		t.Fatalf("fail-open admission refused as the store went: %+v", why)
	}
	if st, _ := s.Status(); !st.BreakerOpen {
		t.Fatal("breaker closed after a failure with Failures 1")
	}
	return v, s
}

// Strict, an admission decided on the whole local buckets before the
// breaker opened and confirmed only after (its commit held back by the
// open breaker) is taken from the slices once: an idempotent duplicate,
// which asks again with the same lease, is not charged a second time.
func TestStrictDuplicateInFallbackChargedOnce(t *testing.T) {
	tn := newTenant("open", 0, false, rps100, tokens1k)
	v, s := openedWithOneInFlight(t, tn, tn)
	ctx := context.Background()
	if why := s.Decided(ctx, "r1", 1); why.Refused() {
		t.Fatalf("lease 1 refused by a slice that holds it: %+v", why)
	}
	_, once := v.bucket(tn, sharing.KindTokens)
	if why := s.Decided(ctx, "r1", 1); why.Refused() {
		t.Fatalf("duplicate of lease 1 refused: %+v", why)
	}
	if _, again := v.bucket(tn, sharing.KindTokens); again != once {
		t.Errorf("slice level %d after the duplicate, want %d: lease 1 charged twice", again, once)
	}
	if _, revoked := v.revoked[1]; revoked {
		t.Error("the duplicate revoked an admission its first caller was told was admitted")
	}
}

// Strict, a fail-closed admission decided on the whole local buckets
// before the breaker opened and refused once it is open gives back to the
// slices no more than it took from them: its revoke leaves the slices
// (the tenant's and the domain's, which every tenant there admits from)
// as the breaker cut them.
func TestStrictFailClosedRevokeAddsNothingToTheSlices(t *testing.T) {
	open, closed := newTenant("open", 0, false, rps100, tokens1k), newTenant("closed", 0, true, rps100, tokens1k)
	v, s := openedWithOneInFlight(t, closed, open)
	ctx := context.Background()
	_, tokens := v.bucket(closed, sharing.KindTokens)
	v.Lock()
	prefill, decode := v.dom.cap.Levels(v.NowLocked())
	v.Unlock()
	if why := s.Decided(ctx, "r1", 1); why.Cause != sharing.Unavailable {
		t.Fatalf("fail-closed admission while the store is down: %+v, want Unavailable", why)
	}
	if _, revoked := v.revoked[1]; !revoked {
		t.Fatal("the refused admission was not revoked")
	}
	if _, after := v.bucket(closed, sharing.KindTokens); after != tokens {
		t.Errorf("tenant slice %d after the revoke, want %d as cut", after, tokens)
	}
	v.Lock()
	p, d := v.dom.cap.Levels(v.NowLocked())
	v.Unlock()
	if p != prefill || d != decode {
		t.Errorf("domain slice prefill %d decode %d after the revoke, want %d %d as cut", p, d, prefill, decode)
	}
}
