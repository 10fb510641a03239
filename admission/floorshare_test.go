package admission

import (
	"testing"
	"time"
)

// Two floor tenants on one HGX node whose capacity factor the engines'
// busy windows have taken to its bound, where a quarter of the node
// carries about half of their floors: each is admitted within its floor in proportion to its floor,
// though the larger asks first in every round and could otherwise take
// the node's whole rate.
func TestFloorTenantsShareAShortDomainInProportion(t *testing.T) {
	floors := map[string]int64{"big": 1100, "small": 550}
	cfg := testConfig()
	for name, floor := range floors {
		cfg.Tiers[name] = TierPolicy{RPS: Limit{Rate: 1e6, Burst: 1e6}, Tokens: Limit{Rate: 1e9, Burst: 1e9}, Floor: floor, Weight: 1}
		cfg.Tenants[name] = TenantConfig{Tier: name}
	}
	h := newHarness(t, cfg, hgxCluster(t, 1))
	frac := h.domain("d1").ReservedFrac // of the prefill the model gives
	// The requests cost the node about what the reserve holds for them:
	// prompt tokens of the largest model.
	const prompt, output = 60, 1
	weighted := int64(prompt + 4*output)
	const step = 50 * time.Millisecond
	saturated := func() {
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: 100}}); err != nil {
			t.Fatalf("ObserveEngines: %v", err)
		}
		h.advance(step)
	}
	for range 1000 { // 50 s, ten windows: the calibrated factor falls to its bound
		saturated()
	}
	info := h.domain("d1")
	if info.CapacityFactor != 0.25 || !info.FloorsShort {
		t.Fatalf("factor %g, floors short %v: want the 0.25 bound and the floors short", info.CapacityFactor, info.FloorsShort)
	}
	share := info.CapacityFactor / frac // of every floor, as the node carries it
	// What the node's buckets held from before the fall is spent in the
	// first 15 s, which are not measured: the last 5 s are, at the rate the
	// node carries.
	const spend, measured = 300, 100
	admitted := make(map[string]int64)
	for i := range spend + measured {
		saturated()
		for _, name := range []string{"big", "small"} {
			for {
				d, w := h.submit(req(name, "large", prompt, output))
				if w != nil {
					h.cancel(w)
					break
				}
				if d.Outcome != Admitted || !d.Trace.Floor {
					break
				}
				if i >= spend {
					admitted[name] += weighted
				}
				h.release(d.LeaseID, prompt, output)
			}
		}
	}
	window := measured * step
	for name, floor := range floors {
		want := float64(floor) * share * window.Seconds()
		if got := float64(admitted[name]); got < 0.9*want-float64(weighted) || got > 1.1*want+float64(weighted) {
			t.Errorf("%s (floor %d/s) admitted %d weighted tokens within its floor over %v, want %.0f (%.0f%% of its floor, the share the node carries); all: %v",
				name, floor, admitted[name], window, want, 100*share, admitted)
		}
	}
}
