package admission

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Explain says what Admit would do, gate by gate and domain by domain, and
// changes nothing: not the tenant's buckets, not the domains, not the queue.
func TestExplainChangesNothing(t *testing.T) {
	cfg := testConfig()
	p := cfg.Tiers["bronze"]
	p.Tokens = Limit{Rate: 100, Burst: 1000}
	cfg.Tiers["bronze"] = p
	h := newHarness(t, cfg, hgxCluster(t, 2))
	h.admit(req("b", "small", 10, 10)) // b's state is live: Explain must copy it
	state := func() (any, any, int, int) { return h.e.Tenants(), h.e.Domains(), h.e.QueueLen(), h.e.LeaseCount() }
	t1, d1, q1, l1 := state()
	ctx := context.Background()

	x, err := h.e.Explain(ctx, req("a", "medium", 1000, 100))
	if err != nil {
		t.Fatal(err)
	}
	if x.Outcome != "ADMITTED" || x.Domain == "" || x.Model != "medium" || len(x.Gates) != 6 || len(x.Placement) == 0 || !x.Placement[len(x.Placement)-1].Fits {
		t.Fatalf("a request that fits: %+v", x)
	}
	for _, g := range x.Gates {
		if !g.Passed || !g.Reached {
			t.Errorf("gate %s: %+v, want passed", g.Gate, g)
		}
	}
	// b asks more than its bucket holds now (950 of 1000): refused at the
	// token gate, the rest not reached.
	x, err = h.e.Explain(ctx, req("b", "small", 960, 5))
	if err != nil {
		t.Fatal(err)
	}
	if x.Outcome != "REJECTED" || x.Reason != ReasonQuotaExceeded || x.RetryAfter <= 0 {
		t.Fatalf("over quota: %+v", x)
	}
	passed := map[string]bool{}
	reached := map[string]bool{}
	for _, g := range x.Gates {
		passed[g.Gate], reached[g.Gate] = g.Passed, g.Reached
	}
	if !passed["rps"] || passed["tokens"] || !reached["tokens"] || reached["concurrency"] {
		t.Fatalf("over quota, gates: %+v", x.Gates)
	}
	if x, _ := h.e.Explain(ctx, req("nobody", "small", 10, 10)); x.Reason != ReasonUnknownTenant {
		t.Fatalf("unknown tenant: %+v", x)
	}
	if _, err := h.e.Explain(ctx, req("a", "no-such-model", 10, 10)); !isInvalid(err, "model") {
		t.Fatalf("unknown model: %v, want invalid model", err)
	}
	t2, d2, q2, l2 := state()
	if !reflect.DeepEqual(t1, t2) || !reflect.DeepEqual(d1, d2) || q1 != q2 || l1 != l2 {
		t.Fatalf("Explain changed the engine:\n%+v\n%+v", t1, t2)
	}
	// With the domains full, a request would queue, and says how long.
	h.saturate("a", "large", 4000, 10)
	x, _ = h.e.Explain(ctx, req("a", "large", 4000, 10))
	if x.Outcome != "QUEUED" || x.EstimatedWait <= 0 {
		t.Fatalf("on a full cluster: %+v, want QUEUED with an estimated wait", x)
	}
	for _, pc := range x.Placement {
		if pc.Fits {
			t.Errorf("on a full cluster, %s fits: %+v", pc.Domain, pc)
		}
	}
}

// Explain says when a domain it looks at is warming up after a return.
func TestExplainShowsWarmup(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	if err := h.e.Drain("d1", "swap"); err != nil {
		t.Fatal(err)
	}
	if err := h.e.Undrain("d1"); err != nil {
		t.Fatal(err)
	}
	x, err := h.e.Explain(context.Background(), req("a", "small", 10, 10))
	if err != nil {
		t.Fatal(err)
	}
	if len(x.Placement) == 0 || !strings.Contains(x.Placement[0].Detail, "warming up: 25.0% of its shared capacity, whole in 1m0s") {
		t.Fatalf("placement after an undrain: %+v, want the warm-up", x.Placement)
	}
}

// Explain names an operator's credit freeze at the token gate.
func TestExplainShowsCreditFreeze(t *testing.T) {
	cfg := testConfig()
	p := cfg.Tiers["bronze"]
	p.Tokens = Limit{Rate: 100, Burst: 1000}
	p.BurstCredit = BurstCredit{Multiple: 10}
	cfg.Tiers["bronze"] = p
	h := newHarness(t, cfg, hgxCluster(t, 1))
	h.e.FreezeCreditFor(time.Minute, "incident")
	x, err := h.e.Explain(context.Background(), req("b", "small", 1500, 10))
	if err != nil {
		t.Fatal(err)
	}
	if x.Outcome != "REJECTED" || x.Reason != ReasonBurstCreditFrozen || x.RetryAfter != time.Minute {
		t.Fatalf("over quota while frozen: %+v, want BURST_CREDIT_FROZEN until the freeze ends", x)
	}
	for _, g := range x.Gates {
		if g.Gate == "tokens" && (g.Passed || !strings.Contains(g.Detail, "frozen by an operator")) {
			t.Fatalf("token gate: %+v", g)
		}
	}
}

// Explain says when a degradable request is kept from its tier because it
// is not its tenant's turn there, and leaves the tier's contention as it
// was (a request not on its turn marks a full tier contended again).
func TestExplainShowsNotItsTurn(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	now := h.e.nowLocked()
	tiers := &h.e.mu.room.tiers
	tiers.full(now, "large")
	tiers.want(now, "large", "b", false)     // b wants large, at the least use
	tiers.charge(now, "large", "a", 1000, 1) // a has had some
	full := tiers.models["large"].full
	r := req("a", "large", 10, 10)
	r.AcceptDowngrade = []string{"medium"}
	x, err := h.e.Explain(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	// It would wait its turn in the fair order (queue.degrade_after), then
	// take medium.
	if x.Outcome != "QUEUED" || len(x.Placement) == 0 || !strings.Contains(x.Placement[0].Detail, "not tenant a's turn at large") {
		t.Fatalf("a, not its turn at large: %+v, want QUEUED and the reason", x)
	}
	if tiers.models["large"].full != full {
		t.Fatal("Explain marked large full")
	}
}
