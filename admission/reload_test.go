package admission

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
)

// R1: Apply swaps in new domainState objects; leases keep pointers to the old
// ones, so their Release frees KV / inFlight on an orphan.
func TestRegressionApplyLeaksKV(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	d := h.admit(req("a", "medium", 1000, 100))
	if err := h.e.Apply(testConfig()); err != nil {
		t.Fatal(err)
	}
	h.release(d.LeaseID, 1000, 100)
	if got := h.domain("d1"); got.KVInUse != 0 || got.InFlight != 0 {
		t.Fatalf("after release: KV %d in flight %d, want 0 0", got.KVInUse, got.InFlight)
	}
}

// R2: lease.model is a pointer into the old catalog; PriceMicros returns 0
// for it, so Release refunds the whole budget charge.
func TestRegressionApplyRefundsBudget(t *testing.T) {
	cfg := testConfig()
	p := cfg.Tiers["gold"]
	p.Budget = Budget{DailyUSD: 1000}
	cfg.Tiers["gold"] = p
	h := newHarness(t, cfg, hgxCluster(t, 1))
	d := h.admit(req("a", "large", 4000, 100))
	spent := h.tenant("a").SpentTodayMicros
	if err := h.e.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	h.release(d.LeaseID, 4000, 100) // used exactly what was admitted
	if got := h.tenant("a").SpentTodayMicros; got != spent {
		t.Fatalf("spent %d before reload, %d after release; want unchanged", spent, got)
	}
}

// R3: SetTopology rebuilds the catalog but reuses old DomainCapacity (old
// catalog): Cost() fails with ErrUnknownModel on every surviving domain.
func TestRegressionSetTopologyStopsPlacement(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 2))
	if err := h.e.SetTopology(hgxCluster(t, 2)); err != nil {
		t.Fatal(err)
	}
	if d := h.admit(req("a", "small", 10, 10)); d.Outcome != Admitted {
		t.Fatalf("after SetTopology(same cluster): %+v", d)
	}
}

// R4: a request queued before Apply holds old-catalog models: it never fits again.
func TestRegressionApplyStrandsQueued(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	ds := h.saturate("a", "large", 4000, 10)
	_, w := h.submit(req("b", "large", 4000, 10))
	if w == nil {
		t.Fatal("not queued")
	}
	if err := h.e.Apply(testConfig()); err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		h.release(d.LeaseID, 4000, 10)
	}
	for i := 0; i < 20 && !answered(w); i++ {
		h.advance(100 * time.Millisecond)
	}
	if !answered(w) || w.decision.Outcome != Admitted {
		t.Fatalf("queued request after reload and a freed domain: answered=%v %+v", answered(w), w.decision)
	}
}

// R5: Apply shrinking the catalog while a request waits: index out of range.
func TestRegressionApplyShrinkCatalogPanics(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	h.saturate("a", "small", 100000, 10)
	_, w := h.submit(req("b", "small", 100000, 10))
	if w == nil {
		t.Fatal("not queued")
	}
	cfg := testConfig()
	cfg.Models = pd.DefaultModels()[2:] // only "small": index 0 now
	cfg.Models[0].DegradeTo = ""
	if err := h.e.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	h.advance(time.Second) // Tick → dispatch → orderLocked(t, m.idx=2) on len-1 slices
}

// R6: a tenant removed from config while it holds a lease keeps being admitted.
func TestRegressionRemovedTenantStillAdmitted(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	h.admit(req("b", "small", 10, 10))
	cfg := testConfig()
	delete(cfg.Tenants, "b")
	if err := h.e.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	if d := h.admit(req("b", "small", 10, 10)); d.Reason != ReasonUnknownTenant {
		t.Fatalf("removed tenant: %+v, want UNKNOWN_TENANT", d)
	}
}

// R8: a far-future deadline overflows now+dl.Sub(wall) and is rejected.
func TestRegressionFarDeadlineOverflow(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	h.advance(time.Second)
	h.saturate("a", "large", 4000, 10)
	r := req("b", "large", 4000, 10)
	r.Deadline = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	d, w := h.submit(r)
	if w == nil {
		t.Fatalf("far-future deadline (should wait default_wait): %+v", d)
	}
}

// R6b: removed tenant kept in e.mu.tenants keeps the old model-cache size: a grown catalog panics.
func TestRegressionRemovedTenantGrownCatalogPanics(t *testing.T) {
	cfg := testConfig()
	cfg.Models = pd.DefaultModels()[2:]
	h := newHarness(t, cfg, hgxCluster(t, 1))
	h.admit(req("b", "small", 10, 10)) // lease keeps b in e.mu.tenants
	cfg2 := testConfig()               // three models now: small is idx 2
	delete(cfg2.Tenants, "b")
	if err := h.e.Apply(cfg2); err != nil {
		t.Fatal(err)
	}
	h.admit(req("b", "small", 10, 10))
}

// R9: SetTopology resizes reused domains before later checks fail: an error
// is returned but the change half-applied.
func TestRegressionSetTopologyPartialOnError(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	before := h.domain("d1")
	c, err := topology.Parse([]byte("domains:\n  - {id: d1, kind: hgx, gpu: H200, nodes: 1, gpus_per_node: 4, node_prefix: d1-node}\n  - {id: d2, kind: hgx, gpu: H100, nodes: 1, gpus_per_node: 1, node_prefix: d2-node}\n"))
	if err != nil {
		t.Fatal(err)
	}
	// d2's single H100 cannot hold the catalog's resident weights: refused.
	if err := h.e.SetTopology(c); err == nil {
		t.Fatal("SetTopology with a domain too small for the weights was accepted")
	}
	if got := h.domain("d1"); got.PrefillRate != before.PrefillRate || got.GPUs != before.GPUs {
		t.Fatalf("refused SetTopology changed d1: rate %d→%d gpus %d→%d", before.PrefillRate, got.PrefillRate, before.GPUs, got.GPUs)
	}
}

// R10: a caller whose ctx ends just as its request is dispatched gets
// ADMITTED with a lease id that wait() has already released.
func TestRegressionCancelAfterDispatchReturnsDeadLease(t *testing.T) {
	for i := 0; i < 50; i++ {
		h := newHarness(t, testConfig(), hgxCluster(t, 1))
		ds := h.saturate("a", "large", 4000, 10)
		_, w := h.submit(req("b", "large", 4000, 10))
		if w == nil {
			t.Fatal("not queued")
		}
		for _, d := range ds {
			h.release(d.LeaseID, 4000, 10)
		}
		for k := 0; k < 50 && !answered(w); k++ {
			h.advance(100 * time.Millisecond)
		}
		if !answered(w) {
			t.Fatal("not dispatched")
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		d := h.e.wait(ctx, w) // select picks ctx.Done half the time
		if d.Outcome == Admitted {
			if _, err := h.e.Release(context.Background(), Release{LeaseID: d.LeaseID, OutputTokens: 10}); err != nil {
				t.Fatalf("wait returned ADMITTED lease %d but it is gone: %v", d.LeaseID, err)
			}
		}
	}
}

// R11: Release's overrun leaves a stale debtSince: the breaker opens at once on fresh debt.
func TestRegressionStaleDebtSinceOpensBreaker(t *testing.T) {
	cfg := testConfig()
	cfg.Tiers["bronze"] = TierPolicy{
		RPS: Limit{Rate: 1000, Burst: 1000}, Tokens: Limit{Rate: 5, Burst: 1000}, Weight: 1,
		BurstCredit: BurstCredit{Multiple: 100, Window: Duration{10 * time.Second}, BreakerOpen: Duration{60 * time.Second}},
	}
	h := newHarness(t, cfg, hgxCluster(t, 1))
	var last Decision
	for i := 0; i < 6; i++ { // 1200 weighted: level -200, inDebt at t=0
		last = h.admit(req("b", "small", 100, 25))
	}
	h.advance(100 * time.Second)      // repaid long ago (level 300), no Admit clears inDebt
	h.release(last.LeaseID, 100, 125) // overrun 400: level -100, fresh debt within credit
	if d := h.admit(req("b", "small", 1, 1)); d.Outcome != Admitted {
		t.Fatalf("fresh 100-token debt within a 500 credit: %+v", d)
	}
}

// R12: the floor bucket is charged max output and never refunded at Release.
func TestRegressionFloorNotRefunded(t *testing.T) {
	cfg := testConfig()
	p := cfg.Tiers["gold"]
	p.Floor = 1000
	cfg.Tiers["gold"] = p
	h := newHarness(t, cfg, hgxCluster(t, 1))
	d := h.admit(req("a", "small", 100, 200)) // 900 weighted, within floor
	if !d.Trace.Floor {
		t.Fatalf("first not on floor: %+v", d.Trace)
	}
	h.release(d.LeaseID, 100, 0) // used 100 weighted
	if d := h.admit(req("a", "small", 100, 100)); !d.Trace.Floor {
		t.Fatalf("500 more within a 1000 floor after using 100: not floor")
	}
}

// R13: Apply keeps the caller's Tenants map (and Config() hands out the live
// maps): mutating them changes the live config without validation or lock.
func TestRegressionConfigAliasing(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	c := h.e.Config()
	c.Tenants["x"] = TenantConfig{Tier: "gold"}
	if _, ok := h.e.Tenant("x"); ok {
		t.Fatal("editing the map Config() returned added a live tenant without Apply")
	}
}

// R14: Release recomputes weighted tokens with the *current* output weight.
func TestRegressionOutputWeightChangeMisrefunds(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	before := h.tenant("a").TokenLevel
	d := h.admit(req("a", "small", 100, 100)) // 500 weighted at weight 4
	cfg := testConfig()
	cfg.OutputTokenWeight = 1
	if err := h.e.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	res, err := h.e.Release(context.Background(), Release{LeaseID: d.LeaseID, PromptTokens: 100, OutputTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	if res.RefundedTokens != 0 || h.tenant("a").TokenLevel != before-500 {
		t.Fatalf("used every admitted token, yet refunded %d (level %d, want %d)", res.RefundedTokens, h.tenant("a").TokenLevel, before-500)
	}
}

// A drained domain that leaves the cluster and comes back (its node agent
// restarted) is still drained, with no window for a placement there; an
// undrain while it is away lets it come back undrained.
func TestDrainSurvivesADomainLeavingAndReturning(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 2))
	if err := h.e.Drain("d2", "rack swap"); err != nil {
		t.Fatal(err)
	}
	if err := h.e.SetTopology(hgxCluster(t, 1)); err != nil {
		t.Fatal(err)
	}
	if err := h.e.SetTopology(hgxCluster(t, 2)); err != nil {
		t.Fatal(err)
	}
	if d := h.domain("d2"); !d.Draining || d.DrainReason != "rack swap" {
		t.Fatalf("d2 came back as %+v, want still draining for a rack swap", d)
	}
	if err := h.e.SetTopology(hgxCluster(t, 1)); err != nil {
		t.Fatal(err)
	}
	if err := h.e.Undrain("d2"); err != nil {
		t.Fatalf("undrain while away: %v", err)
	}
	if err := h.e.Drain("d9", "typo"); err == nil {
		t.Error("drained a domain that never existed")
	}
	if err := h.e.SetTopology(hgxCluster(t, 2)); err != nil {
		t.Fatal(err)
	}
	if d := h.domain("d2"); d.Draining {
		t.Errorf("d2 came back drained after an undrain while away: %+v", d)
	}
}

// Losing hardware is not refused for the floors it can no longer hold (a
// config is): the domain leaves, and floors get what remains.
func TestSetTopologyAcceptsAClusterShortOfTheFloors(t *testing.T) {
	withFloor := func(f int64) Config {
		c := testConfig()
		c.Tenants["a"] = TenantConfig{Tier: "gold", Floor: &f}
		return c
	}
	// The least floor one domain cannot hold (two can: it is at most twice
	// one domain's limit).
	floor := int64(1000)
	for {
		if _, err := New(withFloor(floor), hgxCluster(t, 1)); err != nil {
			break
		}
		floor *= 2
	}
	cfg := withFloor(floor)
	h := newHarness(t, cfg, hgxCluster(t, 2))
	if err := h.e.SetTopology(hgxCluster(t, 1)); err != nil {
		t.Fatalf("SetTopology refused losing a domain: %v", err)
	}
	if ds := h.e.Domains(); len(ds) != 1 || ds[0].ID != "d1" {
		t.Fatalf("domains after the loss: %+v", ds)
	}
	if d := h.admit(req("a", "small", 10, 10)); d.Outcome != Admitted {
		t.Errorf("the floor tenant on what remains: %+v", d)
	}
	if err := h.e.Apply(cfg); err == nil {
		t.Error("Apply accepted a config whose floors the cluster cannot hold")
	}
}

// A drain marked ahead of a domain's arrival holds from its first moment.
func TestDrainAheadOfArrival(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	h.e.DrainAhead("d2", "not racked yet")
	h.e.DrainAhead("d1", "maintenance")
	if d := h.domain("d1"); !d.Draining {
		t.Error("DrainAhead of a present domain did not drain it")
	}
	if err := h.e.SetTopology(hgxCluster(t, 2)); err != nil {
		t.Fatal(err)
	}
	if d := h.domain("d2"); !d.Draining || d.DrainReason != "not racked yet" {
		t.Errorf("d2 arrived as %+v, want drained", d)
	}
}
