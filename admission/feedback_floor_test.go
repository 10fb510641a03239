package admission

import (
	"testing"
	"time"
)

// floorConfig is testConfig with a tenant f whose floor is 1000 weighted
// tokens a second (its floor bucket holds one second of it).
func floorConfig() Config {
	cfg := testConfig()
	cfg.Tiers["floored"] = flooredTier(1000)
	cfg.Tenants["f"] = TenantConfig{Tier: "floored"}
	return cfg
}

// flooredTier is a tier of weight 1 whose quotas never bind, with a floor
// of floor weighted tokens a second.
func flooredTier(floor int64) TierPolicy {
	return TierPolicy{RPS: Limit{Rate: 1e6, Burst: 1e6}, Tokens: Limit{Rate: 1e9, Burst: 1e9}, Floor: floor, Weight: 1}
}

// admittedWithinFloorWhileHeld fails the test unless the queued request w
// (what names it) has been admitted within its tenant's floor while the
// guard still holds d1.
func admittedWithinFloorWhileHeld(t *testing.T, h *harness, w *waiter, what string) {
	t.Helper()
	if !answered(w) {
		h.cancel(w)
		t.Fatalf("%s still waits", what)
	}
	if got := w.decision; got.Outcome != Admitted || !got.Trace.Floor {
		t.Errorf("%s: %v %v floor=%v, want admitted within the floor", what, got.Outcome, got.Reason, got.Trace.Floor)
	}
	if !h.domain("d1").EngineSaturated {
		t.Error("the domain is no longer held: the test does not test the hold")
	}
}

// readSaturated gives d1 a reading past the queue threshold: the guard
// holds the domain to its floors.
func readSaturated(h *harness) {
	h.t.Helper()
	if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: 50}}); err != nil {
		h.t.Fatalf("ObserveEngines: %v", err)
	}
}

// A request queued behind a guard's hold, for want of its floor when it
// arrived, goes on the floor's reserve as soon as its tenant's floor has
// refilled, though the guard still holds the domain: a hold keeps shared
// traffic back, never a floor.
func TestAQueuedRequestTakesItsFloorOnceItRefills(t *testing.T) {
	h := newHarness(t, floorConfig(), hgxCluster(t, 1))
	readSaturated(h)
	// 960 + 4·10 = 1000 weighted tokens: the whole floor.
	if d := h.admit(req("f", "medium", 960, 10)); d.Outcome != Admitted || !d.Trace.Floor {
		t.Fatalf("first request: %v %v floor=%v, want admitted within the floor", d.Outcome, d.Reason, d.Trace.Floor)
	}
	d, w := h.submit(req("f", "medium", 900, 10))
	if w == nil {
		t.Fatalf("second request, its floor spent: %v %v, want held in the queue", d.Outcome, d.Reason)
	}
	for range 8 { // a second and more: the floor refills
		readSaturated(h)
		h.advance(period)
	}
	admittedWithinFloorWhileHeld(t, h, w, "the queued request, its floor refilled")
}

// A request larger than one second of floor is admitted within the floor
// once the floor bucket is full, past the guard's hold, and the bucket
// pays it back before the next: the floor is a rate, whatever the size of
// the tenant's requests.
func TestARequestLargerThanASecondOfFloorIsWithinIt(t *testing.T) {
	h := newHarness(t, floorConfig(), hgxCluster(t, 1))
	readSaturated(h)
	d, w := h.submit(req("f", "medium", 2400, 10))
	if w != nil {
		h.cancel(w)
		t.Fatal("a 2440-token request on a full floor of 1000 waits in the queue, want admitted within the floor")
	}
	if d.Outcome != Admitted || !d.Trace.Floor {
		t.Fatalf("a 2440-token request on a full floor of 1000: %v %v floor=%v, want admitted within the floor", d.Outcome, d.Reason, d.Trace.Floor)
	}
	d, w = h.submit(req("f", "medium", 100, 10))
	if w == nil {
		t.Fatalf("the next request, the floor in debt: %v %v floor=%v, want held in the queue", d.Outcome, d.Reason, d.Trace.Floor)
	}
	h.cancel(w)
}

// A tenant whose every request is three seconds of its floor, on a domain
// the guard holds: it is under its floor in every second in which it has
// been admitted less than its floor, so it is admitted within its floor in
// every second (each admission is more than the floor), not once every
// three seconds as the floor bucket's debt of each would have it, and
// twice in a second at most (once more when the floor bucket has refilled).
func TestATenantUnderItsFloorIsAdmittedInEverySecond(t *testing.T) {
	cfg := floorConfig()
	// The guard holds the domain and leaves its factor alone: what the
	// hold keeps back, not a cut, is under test.
	cfg.Feedback.CutAfter.Duration = time.Minute
	h := newHarness(t, cfg, hgxCluster(t, 1))
	const step, seconds = 50 * time.Millisecond, 10
	var perSecond [seconds]int
	var w *waiter
	for i := range seconds * int(time.Second/step) {
		sec := i * int(step) / int(time.Second)
		readSaturated(h)
		if w != nil && answered(w) {
			if d := w.decision; d.Outcome != Admitted || !d.Trace.Floor {
				t.Fatalf("at %v: %v %v floor=%v, want admitted within the floor", time.Duration(i)*step, d.Outcome, d.Reason, d.Trace.Floor)
			}
			perSecond[sec]++
			h.release(w.decision.LeaseID, 2960, 10) // served: the domain's capacity is not what is tested
			w = nil
		}
		if w == nil {
			// 2960 + 4·10 = 3000 weighted tokens: three seconds of floor.
			d, queued := h.submit(req("f", "medium", 2960, 10))
			switch {
			case queued != nil:
				w = queued
			case d.Outcome == Admitted && d.Trace.Floor:
				perSecond[sec]++
				h.release(d.LeaseID, 2960, 10)
			default:
				t.Fatalf("at %v: %v %v floor=%v, want admitted within the floor or queued", time.Duration(i)*step, d.Outcome, d.Reason, d.Trace.Floor)
			}
		}
		h.advance(step)
	}
	if w != nil {
		h.cancel(w)
	}
	for sec, n := range perSecond {
		if n < 1 || n > 3 {
			t.Errorf("second %d: %d admitted, want 1 to 3 (every second at least its floor; about one a half second); all: %v", sec, n, perSecond)
		}
	}
	if !h.domain("d1").EngineSaturated {
		t.Error("the domain is no longer held: the test does not test the hold")
	}
}

// A tenant admitted its floor in this second, within it, waits for the
// next while the guard holds its domain, however long before the second's
// end: its floor is owed in every second, not more often.
func TestATenantThatHadItsFloorThisSecondWaitsForTheNext(t *testing.T) {
	cfg := floorConfig()
	cfg.Feedback.CutAfter.Duration = time.Minute // the hold, not a cut, is under test
	h := newHarness(t, cfg, hgxCluster(t, 1))
	readSaturated(h)
	// 2960 + 4·10 = 3000 weighted tokens: three seconds of floor, within it
	// on the full floor bucket.
	if d := h.admit(req("f", "medium", 2960, 10)); d.Outcome != Admitted || !d.Trace.Floor {
		t.Fatalf("first request: %v %v floor=%v, want admitted within the floor", d.Outcome, d.Reason, d.Trace.Floor)
	}
	step := 100 * time.Millisecond
	h.advance(3 * step)
	d, w := h.submit(req("f", "medium", 460, 10))
	if w == nil {
		t.Fatalf("second request in the same second: %v %v floor=%v, want held in the queue", d.Outcome, d.Reason, d.Trace.Floor)
	}
	for at := 3 * step; at < time.Second; at += step {
		if answered(w) {
			t.Fatalf("the second request was answered at %v, within the second its tenant had its floor: %v floor=%v", at, w.decision.Outcome, w.decision.Trace.Floor)
		}
		readSaturated(h)
		h.advance(step)
	}
	admittedWithinFloorWhileHeld(t, h, w, "the second request, in the next second")
}

// An admission undone (the shared store did not confirm it) takes back
// what it counted as served in its second: an undone request does not
// count against the floor.
func TestAnUndoneAdmissionLeavesWhatTheSecondServedAsItWas(t *testing.T) {
	h := newHarness(t, floorConfig(), hgxCluster(t, 1))
	served := servedInSecond(h, "f")
	before := served()
	d := h.admit(req("f", "medium", 460, 10)) // 500 weighted tokens
	if d.Outcome != Admitted {
		t.Fatalf("%v %v, want admitted", d.Outcome, d.Reason)
	}
	if got := served(); got != before+500 {
		t.Fatalf("served %d in the second after a 500-token admission, want %d", got, before+500)
	}
	h.e.mu.Lock()
	h.e.revokeLocked("", d.LeaseID)
	h.e.mu.Unlock()
	if got := served(); got != before {
		t.Errorf("served %d in the second after the admission was undone, want %d as before it", got, before)
	}
}

// An admission undone after its second is over leaves the new second's
// count alone: it was never counted there.
func TestAnAdmissionUndoneInALaterSecondLeavesThatSecondAlone(t *testing.T) {
	h := newHarness(t, floorConfig(), hgxCluster(t, 1))
	served := servedInSecond(h, "f")
	first := h.admit(req("f", "medium", 460, 10))
	h.advance(time.Second)
	if d := h.admit(req("f", "medium", 260, 10)); d.Outcome != Admitted || first.Outcome != Admitted {
		t.Fatalf("%v, then %v: want both admitted", first.Outcome, d.Outcome)
	}
	if got := served(); got != 300 {
		t.Fatalf("served %d in the second second, want 300: the first second's 500 are not counted there", got)
	}
	h.e.mu.Lock()
	h.e.revokeLocked("", first.LeaseID)
	h.e.mu.Unlock()
	if got := served(); got != 300 {
		t.Errorf("served %d in the second second after undoing the first second's admission, want 300", got)
	}
}

// servedInSecond reads what tenant has been admitted in the engine's
// current second.
func servedInSecond(h *harness, tenant string) func() int64 {
	return func() int64 {
		h.e.mu.Lock()
		defer h.e.mu.Unlock()
		ts, _ := h.e.mu.gates.lookupLocked(tenant, h.e.nowLocked(), h.e.mu.place.modelList)
		return ts.served.at(h.e.nowLocked())
	}
}
