package admission

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A queued request that does not fit and takes no lower tier waits for
// one domain, from one dispatch pass to the next. A request arriving
// within its tenant's floor, which skips the queue, goes on another
// domain's reserve rather than take that domain's refill (Explain says
// why), and the head is admitted there once the domain has refilled. With
// no other domain to hold it, it takes the awaited one: a floor waits for
// no head (TestFloorHeldUnderFifteenfoldBurst).
func TestAFloorArrivalLeavesTheRefillAQueuedHeadWaitsFor(t *testing.T) {
	cfg := testConfig()
	big := Limit{Rate: 1e9, Burst: 1e9}
	cfg.Tiers["silver"] = TierPolicy{RPS: big, Tokens: big, Weight: 1, Floor: 100}
	for i := range 8 {
		cfg.Tenants[fmt.Sprintf("f%d", i)] = TenantConfig{Tier: "silver"}
	}
	h := newHarness(t, cfg, hgxCluster(t, 2))
	h.saturate("b", "large", 4000, 10)
	hd, head := h.submit(req("a", "large", 4000, 10)) // weight 4: finish tag 4040/4
	if head == nil {
		t.Fatalf("the large request was not queued: %+v", hd)
	}
	// A floor tenant whose first domain is the one the head reserved.
	var floor Request
	var reserved string
	for i := range 8 {
		r := req(fmt.Sprintf("f%d", i), "large", 1500, 10) // weight 1: finish tag 1540, behind the head
		ex, err := h.e.Explain(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		if len(ex.Placement) > 1 && strings.Contains(ex.Placement[0].Detail, "reserved for a queued request") {
			if !ex.Placement[1].Fits || !ex.Placement[1].Floor || ex.Outcome != "ADMITTED" {
				t.Fatalf("Explain: %+v, want the other domain tried within the floor next, and admitted", ex)
			}
			floor, reserved = r, ex.Placement[0].Domain
			break
		}
	}
	if reserved == "" {
		t.Fatal("no floor tenant has the reserved domain first")
	}
	d := h.admit(floor)
	if d.Outcome != Admitted || !d.Trace.Floor || d.Domain == reserved {
		t.Fatalf("the request within its floor: %+v; want it admitted at once on the domain %s is not", d, reserved)
	}
	for i := 0; i < 200 && !answered(head); i++ {
		h.advance(10 * time.Millisecond)
	}
	if !answered(head) || head.decision.Outcome != Admitted || head.decision.Domain != reserved {
		t.Fatalf("the head: %+v, want it admitted on %s", head.decision, reserved)
	}
}

// A request within its floor passes a domain whose engines are saturated
// for one whose engines are clear: the guard's hold does not stop a floor,
// but a floor that can run elsewhere does not add to a saturated queue.
// With only held domains it takes one (TestAQueuedRequestTakesItsFloorOnceItRefills).
func TestAFloorArrivalPrefersADomainWhoseEnginesAreClear(t *testing.T) {
	cfg := eightFloorTenants()
	h := newHarness(t, cfg, hgxCluster(t, 2))
	if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: 50}, {Domain: "d2", Queue: 0}}); err != nil {
		t.Fatal(err)
	}
	var floor Request
	for i := range 8 {
		r := req(fmt.Sprintf("f%d", i), "medium", 960, 10)
		ex, err := h.e.Explain(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		if len(ex.Placement) > 0 && ex.Placement[0].Domain == "d1" {
			if ex.Placement[0].Fits || !strings.Contains(ex.Placement[0].Detail, "engines saturated") {
				t.Fatalf("Explain: %+v, want d1 passed over for its saturated engines", ex.Placement)
			}
			floor = r
			break
		}
	}
	if floor.Tenant == "" {
		t.Fatal("no floor tenant has d1 first")
	}
	if d := h.admit(floor); d.Outcome != Admitted || !d.Trace.Floor || d.Domain != "d2" {
		t.Fatalf("the request within its floor: %v on %s floor=%v, want admitted within the floor on d2", d.Outcome, d.Domain, d.Trace.Floor)
	}
}

// A queued request whose floor comes back (its tenant's next second) goes
// on a domain whose engines are clear rather than one the guard holds, as
// a request arriving within its floor does: it waits for no hold, but adds
// to no saturated engines where another domain's reserve holds it.
func TestAQueuedRequestWithinItsFloorPrefersADomainWhoseEnginesAreClear(t *testing.T) {
	cfg := eightFloorTenants()
	h := newHarness(t, cfg, hgxCluster(t, 2))
	tenant := ""
	for i := range 8 {
		ex, err := h.e.Explain(t.Context(), req(fmt.Sprintf("f%d", i), "medium", 960, 10))
		if err != nil {
			t.Fatal(err)
		}
		if len(ex.Placement) > 0 && ex.Placement[0].Domain == "d1" {
			tenant = fmt.Sprintf("f%d", i)
			break
		}
	}
	if tenant == "" {
		t.Fatal("no floor tenant has d1 first")
	}
	shared := h.saturate("b", "medium", 4000, 10)
	h.saturate("b", "medium", 460, 10) // no shared room for the second request below
	// Its floor in this second, on the full floor bucket; then a request
	// that neither its floor nor the shared capacity holds.
	if d := h.admit(req(tenant, "medium", 960, 10)); d.Outcome != Admitted || !d.Trace.Floor {
		t.Fatalf("first request: %v %v floor=%v, want admitted within the floor", d.Outcome, d.Reason, d.Trace.Floor)
	}
	d, w := h.submit(req(tenant, "medium", 460, 10))
	if w == nil {
		t.Fatalf("second request: %v %v floor=%v, want held in the queue", d.Outcome, d.Reason, d.Trace.Floor)
	}
	// The next second, without a tick (the loads stay level), d1's engines
	// saturated; a release dispatches the queue.
	h.clk.Advance(time.Second)
	if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: 50}, {Domain: "d2", Queue: 0}}); err != nil {
		t.Fatal(err)
	}
	h.release(shared[0].LeaseID, 4000, 10)
	if !answered(w) {
		h.cancel(w)
		t.Fatal("the queued request still waits in its tenant's next second")
	}
	if got := w.decision; got.Outcome != Admitted || !got.Trace.Floor || got.Domain != "d2" {
		t.Errorf("the queued request: %v on %s floor=%v, want admitted within the floor on d2", got.Outcome, got.Domain, got.Trace.Floor)
	}
}

// eightFloorTenants is testConfig with tenants f0 to f7, each with a floor
// of 300 weighted tokens a second: one of them has any given domain first.
func eightFloorTenants() Config {
	cfg := testConfig()
	cfg.Tiers["floored"] = flooredTier(300)
	for i := range 8 {
		cfg.Tenants[fmt.Sprintf("f%d", i)] = TenantConfig{Tier: "floored"}
	}
	return cfg
}
