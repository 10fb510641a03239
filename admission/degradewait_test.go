package admission

import (
	"testing"
	"time"

	"github.com/sluice-sched/sluice/pd"
)

// degradeWaitHarness is one HGX domain whose prefill bucket is empty, with
// the costs of the request the tests send (large at 4000 prompt tokens,
// 1.17 s of the domain's prefill; medium 0.2 s).
func degradeWaitHarness(t *testing.T) (h *harness, d *domainState, large, medium pd.Cost) {
	t.Helper()
	h = newHarness(t, testConfig(), hgxCluster(t, 1))
	h.e.mu.Lock()
	defer h.e.mu.Unlock()
	d = h.e.mu.place.domains[0]
	var err error
	if large, err = d.cap.CostCached(h.e.mu.place.models["large"].model, 4000, 0, 10); err != nil {
		t.Fatal(err)
	}
	if medium, err = d.cap.CostCached(h.e.mu.place.models["medium"].model, 4000, 0, 10); err != nil {
		t.Fatal(err)
	}
	now := h.e.nowLocked()
	level, _ := d.cap.Levels(now)
	d.cap.Charge(now, pd.Cost{PrefillFLOP: level})
	return h, d, large, medium
}

// degradable is the tests' request: large, medium accepted, with its
// deadline after from epoch.
func degradable(after time.Duration) Request {
	r := req("a", "large", 4000, 10)
	r.AcceptDowngrade = []string{"medium"}
	r.Deadline = epoch.Add(after)
	return r
}

// A queued request waits for its requested tier while the tier's capacity
// refills for it before its deadline, and takes a lower tier at its turn
// as soon as it does not: here work placed past the queue (as floor
// traffic is) takes what large was refilling for it.
func TestQueuedRequestDegradesOnceItsTierCannotServeItInTime(t *testing.T) {
	h, d, large, medium := degradeWaitHarness(t)
	_, w := h.submit(degradable(1300 * time.Millisecond)) // large refills in 1.17 s
	if w == nil {
		t.Fatal("not queued: large refills for it before its deadline")
	}
	h.advance(500 * time.Millisecond)
	if answered(w) {
		t.Fatalf("answered %+v at 0.5 s: large refills for it by 1.17 s, before its deadline", w.decision)
	}
	h.e.mu.Lock()
	now := h.e.nowLocked()
	level, _ := d.cap.Levels(now)
	d.cap.Charge(now, pd.Cost{PrefillFLOP: level - medium.PrefillFLOP}) // medium fits; large refills in 0.97 s, after its deadline
	h.e.mu.Unlock()
	if rate := d.cap.PrefillRate(); time.Duration(float64(large.PrefillFLOP-medium.PrefillFLOP)/float64(rate)*float64(time.Second)) < 800*time.Millisecond {
		t.Fatal("large refills in time: the test means nothing")
	}
	h.advance(time.Millisecond)
	if !answered(w) || w.decision.Outcome != Degraded || w.decision.Model != "medium" {
		t.Fatalf("at 0.5 s, large refilling after its deadline: %+v, answered %v; want DEGRADED to medium at once", w.decision, answered(w))
	}
}

// A queued request whose turn at its requested tier does not come before
// its deadline takes a lower tier there rather than be refused: here the
// domain's KV is held by running requests, which free it only as they end
// (the buckets' refill, and so the estimate of its wait, does not see it),
// and only small's KV fits what is left.
func TestQueuedRequestDegradesAtItsDeadlineRatherThanRefused(t *testing.T) {
	h, d, large, medium := degradeWaitHarness(t)
	h.e.mu.Lock()
	small, err := d.cap.CostCached(h.e.mu.place.models["small"].model, 4000, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if small.KVBytes >= min(large.KVBytes, medium.KVBytes) {
		t.Fatalf("small's KV %d, large's %d, medium's %d: the test means nothing", small.KVBytes, large.KVBytes, medium.KVBytes)
	}
	inUse, limit := d.cap.KV()
	d.cap.Charge(h.e.nowLocked(), pd.Cost{KVBytes: limit - inUse - (small.KVBytes+min(large.KVBytes, medium.KVBytes))/2})
	h.e.mu.Unlock()
	r := degradable(2 * time.Second)
	r.AcceptDowngrade = []string{"medium", "small"}
	_, w := h.submit(r)
	if w == nil {
		t.Fatal("not queued: large refills for it before its deadline")
	}
	h.advance(1900 * time.Millisecond)
	if answered(w) {
		t.Fatalf("answered %+v at 1.9 s: it waits for large until its deadline", w.decision)
	}
	h.advance(100 * time.Millisecond)
	if !answered(w) || w.decision.Outcome != Degraded || w.decision.Model != "small" {
		t.Fatalf("at its deadline: %+v, answered %v; want DEGRADED to small, not refused", w.decision, answered(w))
	}
}

// A request within its tenant's floor that accepts lower tiers waits for
// its requested tier as any such request does: its floor places it on the
// requested tier, and on a lower one only once the requested one cannot
// serve it in time. Here medium fits the floor's reserve at once and large
// refills for it within its deadline.
func TestAFloorDoesNotDegradeARequestItsTierServesInTime(t *testing.T) {
	cfg := testConfig()
	cfg.Tiers["floored"] = flooredTier(300)
	cfg.Tenants["f"] = TenantConfig{Tier: "floored"}
	h := newHarness(t, cfg, hgxCluster(t, 1))
	h.e.mu.Lock()
	d := h.e.mu.place.domains[0]
	medium, err := d.cap.CostCached(h.e.mu.place.models["medium"].model, 4000, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	now := h.e.nowLocked()
	level, _ := d.cap.Levels(now)
	d.cap.Charge(now, pd.Cost{PrefillFLOP: level - medium.PrefillFLOP}) // medium fits within the floor, large does not
	h.e.mu.Unlock()
	r := req("f", "large", 4000, 10)
	r.AcceptDowngrade = []string{"medium"}
	r.Deadline = epoch.Add(3 * time.Second) // large refills in about 1 s
	dec, w := h.submit(r)
	if w == nil {
		t.Fatalf("%v on %s floor=%v, want queued for large, which serves it before its deadline", dec.Outcome, dec.Model, dec.Trace.Floor)
	}
	for i := 0; i < 30 && !answered(w); i++ {
		h.advance(100 * time.Millisecond)
	}
	if !answered(w) {
		h.cancel(w)
		t.Fatal("still queued after 3 s")
	}
	if got := w.decision; got.Outcome != Admitted || got.Model != "large" {
		t.Errorf("%v on %s floor=%v, want admitted on large", got.Outcome, got.Model, got.Trace.Floor)
	}
}
