package admission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission/sharing"
)

// A reading that is no reading (what a sum over a broken engine gives)
// does not lift a guard the last sane one holds: it is skipped, from
// ObserveEngines and from the relay alike, and the domain stays held on
// the reading of 50 waiting.
func TestAnInvalidReadingLeavesTheGuardHolding(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: 50}}); err != nil {
		t.Fatal(err)
	}
	held := func(after string) {
		t.Helper()
		if info := h.domain("d1"); info.EngineQueue != 50 || info.EngineMetricsStale {
			t.Errorf("after %s: queue %g (stale %v), want the last sane reading's 50", after, info.EngineQueue, info.EngineMetricsStale)
		}
		d, w := h.submit(req("a", "medium", 1000, 100))
		if w == nil {
			t.Errorf("after %s: %v %v on %s, want held in the queue", after, d.Outcome, d.Reason, d.Domain)
			return
		}
		h.cancel(w)
	}
	for _, bad := range []EngineSignal{
		{Domain: "d1", Queue: -950},        // -1000 beside an honest 50
		{Domain: "d1", Queue: math.Inf(1)}, // two series of 1e308
		{Domain: "d1", Queue: math.NaN(), KVUsage: 0.1},
		{Domain: "d1", Queue: 1, KVUsage: -0.5},
	} {
		h.advance(time.Millisecond)
		if err := h.e.ObserveEngines([]EngineSignal{bad}); !errors.Is(err, ErrInvalidEngineSignal) {
			t.Errorf("ObserveEngines(%+v) = %v, want ErrInvalidEngineSignal", bad, err)
		}
		held(fmt.Sprintf("an observed reading of queue %g, KV %g", bad.Queue, bad.KVUsage))
	}
	h.advance(time.Millisecond)
	v := h.e.view()
	v.Lock()
	v.RelayEngineReadingLocked(v.DomainLocked("d1"), sharing.EngineReading{Queue: -950})
	v.Unlock()
	held("a relayed reading of queue -950")
}

// recoveryConfig is testConfig with the KV-use threshold the one that
// saturates: drain's placements are not a queue here.
func recoveryConfig() Config {
	cfg := testConfig()
	cfg.Feedback.QueueThreshold = 1e6
	return cfg
}

// observeFor feeds d1 the KV use kv each period for n periods, draining
// its buckets each period when load is set.
func observeFor(h *harness, n int, kv float64, load bool, each func(i int)) {
	h.t.Helper()
	for i := range n {
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", KVUsage: kv}}); err != nil {
			h.t.Fatalf("ObserveEngines: %v", err)
		}
		if load {
			drain(h)
		}
		h.advance(period)
		if each != nil {
			each(i + 1)
		}
	}
}

// A factor the guard alone cut (4 s of readings that said saturated, no
// calibration behind them) returns to the model's 1 once the readings
// are clear, with load and without: after clear_periods (4), each period
// undoes one cut (divides by decrease, 0.8), up to 1. Without load it
// stays there; with load it then grows as a clear domain in demand does.
func TestAGuardCutRecoversOnceTheSignalsClear(t *testing.T) {
	for _, load := range []bool{false, true} {
		h := newHarness(t, recoveryConfig(), hgxCluster(t, 1))
		observeFor(h, 16, 0.95, load, nil)
		if got := h.domain("d1").CapacityFactor; got != 0.25 {
			t.Fatalf("load %v: factor %g after 4 s saturated, want the 0.25 bound", load, got)
		}
		observeFor(h, 11, 0.3, load, func(k int) {
			want := min(1, 0.25/math.Pow(0.8, float64(max(k-4, 0))))
			if got := h.domain("d1").CapacityFactor; math.Abs(got-want) > 1e-9 {
				t.Errorf("load %v: factor %g after %d clear periods, want %g", load, got, k, want)
			}
		})
		observeFor(h, 8, 0.3, load, nil)
		switch got := h.domain("d1").CapacityFactor; {
		case !load && got != 1:
			t.Errorf("no load: factor %g 19 clear periods on, want it held at 1", got)
		case load && got <= 1:
			t.Errorf("load: factor %g 19 clear periods on, want it grown past 1", got)
		}
	}
}

// A guard's cut recovers to the calibrated factor, not past it: a domain
// calibrated to 0.8 (two busy windows of slow first tokens), cut to 0.25
// by saturated readings, comes back to 0.8 once they clear, and without
// demand stays there.
func TestAGuardCutRecoversToTheCalibratedFactor(t *testing.T) {
	h := newHarness(t, recoveryConfig(), hgxCluster(t, 1))
	for range 2 * 5 * time.Second / period {
		d := h.admit(req("a", "medium", 1000, 100))
		if _, err := h.e.Release(context.Background(), Release{LeaseID: d.LeaseID, PromptTokens: 1000, OutputTokens: 100, TTFT: 3 * time.Second, Duration: 6 * time.Second}); err != nil {
			t.Fatal(err)
		}
		h.advance(period)
	}
	if got := h.domain("d1").CapacityFactor; math.Abs(got-0.8) > 1e-9 {
		t.Fatalf("factor %g after two busy windows, want calibrated to 0.8", got)
	}
	observeFor(h, 8, 0.95, false, nil)
	if got := h.domain("d1").CapacityFactor; got != 0.25 {
		t.Fatalf("factor %g after 2 s saturated, want the 0.25 bound", got)
	}
	observeFor(h, 20, 0.3, false, func(k int) {
		if got := h.domain("d1").CapacityFactor; got > 0.8+1e-9 {
			t.Errorf("factor %g after %d clear periods, past the calibrated 0.8", got, k)
		}
	})
	if got := h.domain("d1").CapacityFactor; math.Abs(got-0.8) > 1e-9 {
		t.Errorf("factor %g after 5 s clear, want back at the calibrated 0.8", got)
	}
}

// A window the guard held to its floors throughout, on readings of a
// standing queue that lied, serves next to nothing: it moves the
// calibrated factor one calibration_step (0.1), not down to the guard's
// cut, so once the readings clear the factor returns to 0.9.
func TestAWindowHeldByTheGuardMovesTheCalibrationOneStep(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	for range 24 { // 6 s: the first window (5 s) saw a queue in every reading
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: 12}}); err != nil {
			t.Fatal(err)
		}
		h.advance(period)
	}
	if got := h.domain("d1").CapacityFactor; got != 0.25 {
		t.Fatalf("factor %g after 6 s saturated, want the 0.25 bound", got)
	}
	for range 20 {
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1"}}); err != nil {
			t.Fatal(err)
		}
		h.advance(period)
	}
	if got := h.domain("d1").CapacityFactor; math.Abs(got-0.9) > 1e-9 {
		t.Errorf("factor %g after 5 s clear, want 0.9: one calibration step below the model", got)
	}
}
