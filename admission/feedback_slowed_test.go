package admission

import (
	"math"
	"testing"
	"time"
)

// A queue at the threshold, not only one past it, saturates: the guard
// keeps the engines' queue within queue_threshold. A reading of 5 waiting
// (the threshold) holds the domain at once, DomainInfo says saturated
// from the next step, and a queue that stands there for cut_after is cut
// for as one past it is.
func TestAQueueAtTheThresholdSaturates(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	atThreshold := func() {
		t.Helper()
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: 5}}); err != nil {
			t.Fatal(err)
		}
	}
	atThreshold()
	if x, named := h.explainsUnfit(req("a", "medium", 1000, 100), "d1", "engines saturated (5 waiting, KV 0% used)"); !named {
		t.Errorf("5 waiting of a threshold of 5: Explain does not name the engines' saturation: %+v", x.Placement)
	}
	d, w := h.submit(req("a", "medium", 1000, 100))
	if w == nil {
		t.Fatalf("5 waiting of a threshold of 5: %v %v on %s, want held in the queue", d.Outcome, d.Reason, d.Domain)
	}
	h.cancel(w)
	h.advance(period)
	if info := h.domain("d1"); !info.EngineSaturated || info.CapacityFactor != 1 {
		t.Errorf("one period at the threshold: saturated %v, factor %g; want saturated, factor 1 (less than cut_after)", info.EngineSaturated, info.CapacityFactor)
	}
	atThreshold()
	h.advance(period) // 500ms at the threshold: cut_after
	if got := h.domain("d1").CapacityFactor; got != 0.8 {
		t.Errorf("factor %g after the queue stood at the threshold for cut_after, want 0.8", got)
	}
}

// Engines that slow to half of what the model says: one window busy by
// their queue (1 waiting in every reading, within the threshold) in which
// they serve half the model's peak takes the factor, and the calibrated
// value the guard's cuts recover to, to what they sustained (0.5) at
// once, not one calibration_step (0.1) toward it. Once the guard has cut
// the factor and the readings clear, it recovers to 0.5, where the
// engines keep up, not to 0.9, where they would saturate again.
func TestEnginesThatSlowAreCalibratedToWhatTheySustainInOneWindow(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	const prompt = 2472 // a period's release is half the model's peak prefill for a period
	m := h.e.mu.place.models["medium"].model
	cost, err := h.e.mu.place.domains[0].cap.Cost(m, prompt, 1)
	if err != nil {
		t.Fatal(err)
	}
	window := h.e.mu.place.cfg.Feedback.Window.Duration
	periods := int(window / period)
	// What the engines sustained, as a factor of the model: the prefill
	// served per second over the model's soft prefill rate.
	sustained := float64(periods) * float64(cost.PrefillFLOP) / window.Seconds() / float64(h.domain("d1").PriorPrefillRate)
	if math.Abs(sustained-0.5) > 0.01 {
		t.Fatalf("premise: the window serves %g of the model, want about half", sustained)
	}
	for range periods {
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: 1}}); err != nil {
			t.Fatal(err)
		}
		d := h.admit(req("a", "medium", prompt, 1))
		if d.Outcome != Admitted {
			t.Fatalf("%v %v, want admitted", d.Outcome, d.Reason)
		}
		h.release(d.LeaseID, prompt, 1)
		h.advance(period)
	}
	if got := h.domain("d1").CapacityFactor; math.Abs(got-sustained) > 1e-9 {
		t.Fatalf("factor %g after a busy window that served %g of the model, want %g", got, sustained, sustained)
	}
	for range 8 { // 2 s saturated: the guard cuts
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: 12}}); err != nil {
			t.Fatal(err)
		}
		h.advance(period)
	}
	if got := h.domain("d1").CapacityFactor; got >= sustained {
		t.Fatalf("factor %g after 2 s saturated, want cut below %g", got, sustained)
	}
	for range 5 * time.Second / period {
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1"}}); err != nil {
			t.Fatal(err)
		}
		h.advance(period)
	}
	if got := h.domain("d1").CapacityFactor; math.Abs(got-sustained) > 1e-9 {
		t.Errorf("factor %g 5 s after the readings cleared, want back at the calibrated %g", got, sustained)
	}
}
