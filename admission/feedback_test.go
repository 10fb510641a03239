package admission

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/topology/topologytest"
	"pgregory.net/rapid"
)

const period = 250 * time.Millisecond // the default feedback period

// firstDomain is where tenant's medium requests go while every domain is
// open: its first choice by rendezvous.
func firstDomain(h *harness, tenant string) string {
	h.t.Helper()
	d := h.admit(req(tenant, "medium", 1000, 100))
	if d.Outcome != Admitted {
		h.t.Fatalf("%s: %v %v", tenant, d.Outcome, d.Reason)
	}
	h.release(d.LeaseID, 1000, 100)
	return d.Domain
}

// drain admits and releases medium requests of tenant a until the
// domain's buckets hold no more: each takes what it was charged.
func drain(h *harness) {
	h.t.Helper()
	for range 100000 {
		d, w := h.submit(req("a", "medium", 400, 10))
		if w != nil {
			h.cancel(w)
			return
		}
		if d.Outcome == Rejected {
			return
		}
		h.release(d.LeaseID, 400, 10)
	}
	h.t.Fatalf("drain: the buckets never ran dry")
}

// Engines past the queue threshold: nothing but floor traffic is placed
// on their domain at once; once they have stood saturated for cut_after
// its capacity factor shrinks, Explain says why, and DomainInfo shows the
// signals. Once they clear, placement comes back.
func TestSaturatedEnginesKeepTheirDomainToFloors(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 2))
	first := firstDomain(h, "a")
	saturated := func() {
		t.Helper()
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: first, Queue: 12, KVUsage: 0.5}}); err != nil {
			t.Fatal(err)
		}
		h.advance(period)
	}
	saturated()
	info := h.domain(first)
	if !info.EngineSaturated || info.EngineQueue != 12 || info.EngineKVUsage != 0.5 || info.EngineMetricsStale {
		t.Errorf("domain info %+v, want saturated with queue 12, KV 0.5, fresh", info)
	}
	if info.CapacityFactor != 1 {
		t.Errorf("saturated for one period, less than cut_after: factor %g, want 1", info.CapacityFactor)
	}
	saturated() // 500ms saturated: cut
	info = h.domain(first)
	if info.CapacityFactor != 0.8 || info.EffectivePrefillRate != int64(math.Round(0.8*float64(info.PriorPrefillRate))) {
		t.Errorf("factor %g, effective prefill %d of prior %d: want 0.8 of it", info.CapacityFactor, info.EffectivePrefillRate, info.PriorPrefillRate)
	}
	for range 20 {
		d := h.admit(req("a", "medium", 1000, 100))
		if d.Outcome != Admitted || d.Domain == first {
			t.Fatalf("while %s's engines are saturated: %v on %s, want admitted elsewhere", first, d.Outcome, d.Domain)
		}
		h.release(d.LeaseID, 1000, 100)
	}

	if err := h.e.ObserveEngines([]EngineSignal{{Domain: first, Queue: 0, KVUsage: 0.2}}); err != nil {
		t.Fatal(err)
	}
	h.advance(period)
	if d := h.admit(req("a", "medium", 1000, 100)); d.Domain != first {
		t.Errorf("engines clear: placed on %s, want back on %s", d.Domain, first)
	}
	if err := h.e.ObserveEngines([]EngineSignal{{Domain: "nowhere"}}); !errors.Is(err, ErrUnknownDomain) {
		t.Errorf("signal for an unknown domain: %v, want ErrUnknownDomain", err)
	}
}

// Queues that pass the threshold and clear within cut_after (a burst's,
// or one long prompt's) hold the domain to its floors while they last but
// never cut its factor.
func TestPassingQueuesDoNotCutTheFactor(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	for i := range 8 {
		queue := 12.0
		if i%2 == 1 {
			queue = 0
		}
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: queue}}); err != nil {
			t.Fatal(err)
		}
		h.advance(period)
		if info := h.domain("d1"); info.EngineSaturated != (queue > 0) || info.CapacityFactor != 1 {
			t.Fatalf("period %d, queue %g: saturated %v, factor %g; want saturated while past the threshold, factor 1", i, queue, info.EngineSaturated, info.CapacityFactor)
		}
	}
}

// Between two signals the requests placed since the last count as
// waiting: with 3 reported of the threshold's 5, the second placement is
// the last (it takes the count to the threshold; the next would take the
// queue past it), Explain says why, and the next signal opens the domain
// again.
func TestRequestsPlacedSinceASignalCountAsWaiting(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: 3}}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		d := h.admit(req("a", "medium", 1000, 100))
		if d.Outcome != Admitted {
			t.Fatalf("placement %d with %d waiting: %v %v, want admitted", i+1, 3+i, d.Outcome, d.Reason)
		}
		h.release(d.LeaseID, 1000, 100)
	}
	if x, named := h.explainsUnfit(req("a", "medium", 1000, 100), "d1", "2 placed since"); !named {
		t.Errorf("Explain does not name the requests placed since the signal: %+v", x.Placement)
	}
	d, w := h.submit(req("a", "medium", 1000, 100))
	if w == nil && d.Outcome == Admitted {
		t.Fatalf("3 waiting and 2 placed since, of a threshold of 5: admitted, want held")
	}
	if h.domain("d1").EngineSaturated {
		t.Errorf("the domain reports saturated engines; only the count since their signal holds it")
	}
	h.advance(time.Millisecond)
	if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: 1}}); err != nil {
		t.Fatal(err)
	}
	h.advance(time.Millisecond)
	if w != nil {
		if !answered(w) {
			t.Fatal("held request unanswered after the engines reported 1 waiting")
		}
		if got := h.e.wait(context.Background(), w); got.Outcome != Admitted {
			t.Fatalf("held request after the engines reported 1 waiting: %v %v, want admitted", got.Outcome, got.Reason)
		}
	} else if d := h.admit(req("a", "medium", 1000, 100)); d.Outcome != Admitted {
		t.Fatalf("after the engines reported 1 waiting: %v %v, want admitted", d.Outcome, d.Reason)
	}
}

// A fresh signal past a threshold holds the domain at once, not from the
// next control step: the first request after it waits, and Explain names
// the engines' saturation.
func TestASignalPastAThresholdHoldsAtOnce(t *testing.T) {
	for _, c := range []struct {
		sig     EngineSignal
		explain string
	}{
		{EngineSignal{Domain: "d1", Queue: 6}, "engines saturated (6 waiting, KV 0% used)"},
		{EngineSignal{Domain: "d1", KVUsage: 0.9}, "engines saturated (0 waiting, KV 90% used)"},
	} {
		h := newHarness(t, testConfig(), hgxCluster(t, 1))
		if err := h.e.ObserveEngines([]EngineSignal{c.sig}); err != nil {
			t.Fatal(err)
		}
		if x, named := h.explainsUnfit(req("a", "medium", 1000, 100), "d1", c.explain); !named {
			t.Errorf("%+v: Explain does not say %q: %+v", c.sig, c.explain, x.Placement)
		}
		d, w := h.submit(req("a", "medium", 1000, 100))
		if w == nil {
			t.Errorf("%+v before the next step: %v %v on %s, want held in the queue", c.sig, d.Outcome, d.Reason, d.Domain)
			continue
		}
		h.cancel(w)
	}
}

// A reading made before some placements (relayed from another replica,
// or read a while ago) does not count them as served: they still wait as
// far as the guard knows. One made after them does.
func TestAReadingOlderThanPlacementsLeavesThemCounted(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	observe := func(queue float64, age time.Duration) {
		t.Helper()
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: queue, Age: age}}); err != nil {
			t.Fatal(err)
		}
	}
	place := func() Decision {
		t.Helper()
		d := h.admit(req("a", "medium", 1000, 100))
		if d.Outcome == Admitted {
			h.release(d.LeaseID, 1000, 100)
		}
		return d
	}
	observe(3, 0)
	h.advance(100 * time.Millisecond)
	for i := range 2 {
		if d := place(); d.Outcome != Admitted {
			t.Fatalf("placement %d with 3 waiting: %v %v, want admitted", i+1, d.Outcome, d.Reason)
		}
	}
	h.advance(100 * time.Millisecond)
	observe(4, 150*time.Millisecond) // made before the two placements
	if x, named := h.explainsUnfit(req("a", "medium", 1000, 100), "d1", "2 placed since"); !named {
		t.Errorf("4 waiting read before 2 placements, threshold 5: Explain does not name the 2: %+v", x.Placement)
	}
	observe(4, 0) // made after them: they are in it
	if d := place(); d.Outcome != Admitted {
		t.Errorf("4 waiting read after the placements: %v %v, want admitted", d.Outcome, d.Reason)
	}
}

// The guard's count after a reading is the placements made after the
// reading was (all of them since the last reading, where the ring no
// longer holds the oldest): never fewer, so it never lets a burst pass.
// The first reading is taken to hold every placement before it.
func TestPlacedAfterAReadingIsCounted(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		l := newCapacityLoop(0)
		cfg := testConfig().Feedback
		now := int64(0)
		var since []int64 // placement times since the last new reading
		for range rapid.IntRange(1, 200).Draw(t, "steps") {
			now += rapid.Int64Range(0, int64(50*time.Millisecond)).Draw(t, "gap")
			if !rapid.Bool().Draw(t, "reading") {
				l.place(now)
				since = append(since, now)
				continue
			}
			age := time.Duration(rapid.Int64Range(0, int64(time.Second)).Draw(t, "age"))
			at := now - int64(age)
			if l.hasSig && at <= l.sigAt {
				continue // not newer: it leaves the count alone
			}
			var want []int64
			for _, p := range since {
				if p > at {
					want = append(want, p)
				}
			}
			first := !l.hasSig // it is taken to hold every placement before it
			l.observe(now, EngineSignal{Queue: 1, Age: age}, &cfg)
			if first && l.placed != 0 {
				t.Fatalf("the first reading leaves %d placed, want 0", l.placed)
			}
			if !first && (len(since) <= recentPlacements && l.placed != len(want) || l.placed < len(want)) {
				t.Fatalf("%d placed since the last reading, %d after the new one: counted %d", len(since), len(want), l.placed)
			}
			since = since[len(since)-l.placed:]
		}
	})
}

// A domain placement keeps weighing with no fresh reading for the stale
// bound is starved (its readers do not relay); a fresh reading, or
// placement looking elsewhere, ends it.
func TestDomainsWithoutFreshReadingsAreStarved(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	h.e.RelayEngineReadings(true)
	stale := 500 * time.Millisecond // the default feedback.stale
	starved := func() []string { return h.e.StarvedEngineDomains(nil) }
	for range 6 { // placement weighs d1 every 100 ms
		h.admit(req("a", "medium", 1000, 100))
		h.advance(100 * time.Millisecond)
	}
	if got := starved(); !slices.Equal(got, []string{"d1"}) {
		t.Fatalf("weighed for %v with no reading: starved %v, want [d1]", stale+100*time.Millisecond, got)
	}
	if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: 1}}); err != nil {
		t.Fatal(err)
	}
	if got := starved(); len(got) != 0 {
		t.Errorf("with a fresh reading: starved %v, want none", got)
	}
	h.advance(stale + 100*time.Millisecond) // the reading ages, and placement looks no more
	if got := starved(); len(got) != 0 {
		t.Errorf("not weighed for %v: starved %v, want none", stale+100*time.Millisecond, got)
	}
}

// A reading marked for relay is published as the loop took it; one that
// is no reading (a NaN or negative number) is neither taken nor
// published, so the last sane one stays the one to relay; one not marked
// is not published.
func TestRelayedReadingsAreSane(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 2))
	if err := h.e.ObserveEngines([]EngineSignal{
		{Domain: "d1", Queue: 2, Running: 3, KVUsage: 0.5, Relay: true},
		{Domain: "d2", Queue: 4},
	}); err != nil {
		t.Fatal(err)
	}
	if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: math.NaN(), Running: -3, KVUsage: 0.5, Relay: true}}); !errors.Is(err, ErrInvalidEngineSignal) {
		t.Errorf("a NaN and a negative reading: %v, want ErrInvalidEngineSignal", err)
	}
	v := h.e.view()
	v.Lock()
	r, _, ok := v.OwnEngineReadingLocked(v.DomainLocked("d1"))
	_, _, ok2 := v.OwnEngineReadingLocked(v.DomainLocked("d2"))
	v.Unlock()
	if !ok || r.Queue != 2 || r.Running != 3 || r.KVUsage != 0.5 {
		t.Errorf("d1's reading to relay = %+v (%v), want the last sane one: queue 2, running 3, KV 0.5", r, ok)
	}
	if ok2 {
		t.Error("d2's reading, not marked for relay, is to be published")
	}
}

// KV use past its threshold saturates as a queue does; Explain names it.
func TestKVUsageSaturates(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", KVUsage: 0.95}}); err != nil {
		t.Fatal(err)
	}
	h.advance(period)
	if !h.domain("d1").EngineSaturated {
		t.Fatal("KV 0.95 past the 0.8 threshold: not saturated")
	}
	d, w := h.submit(req("a", "medium", 1000, 100))
	if w == nil && d.Outcome == Admitted {
		t.Errorf("admitted on the only domain while its engines are saturated")
	}
	if w != nil {
		h.cancel(w)
	}
	if x, named := h.explainsUnfit(req("a", "medium", 1000, 100), "d1", "engines saturated"); !named {
		t.Errorf("Explain does not name the saturated engines: %+v", x.Placement)
	}
}

// explainsUnfit explains r and reports whether it finds domain not fitting
// with a detail that contains text.
func (h *harness) explainsUnfit(r Request, domain, text string) (Explanation, bool) {
	h.t.Helper()
	x, err := h.e.Explain(context.Background(), r)
	if err != nil {
		h.t.Fatalf("Explain(%+v): %v", r, err)
	}
	for _, c := range x.Placement {
		if c.Domain == domain && !c.Fits && strings.Contains(c.Detail, text) {
			return x, true
		}
	}
	return x, false
}

// Signals older than feedback.stale are not acted on: the guard lifts,
// the factor holds, and the domain says its metrics are stale.
func TestStaleSignalsAreNotActedOn(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: 50}}); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		h.advance(period)
	}
	info := h.domain("d1")
	if info.EngineSaturated || !info.EngineMetricsStale || info.EngineMetricsAge < 4*period {
		t.Errorf("after %v without signals: %+v, want the guard off and the metrics stale", 4*period, info)
	}
	// Read at 0: fresh at the steps of 250ms and 500ms (stale: 500ms), not
	// after; saturated for cut_after (500ms) at the second.
	if math.Abs(info.CapacityFactor-0.8) > 1e-9 {
		t.Errorf("factor %g, want one cut (0.8) and held since", info.CapacityFactor)
	}
	if d := h.admit(req("a", "medium", 1000, 100)); d.Outcome != Admitted {
		t.Errorf("stale signals still keep the domain: %v %v", d.Outcome, d.Reason)
	}
}

// Clear signals and a domain whose buckets bound what it runs: the factor
// grows additively after the clear periods, to what an engine faster than
// the model sustains; with no demand it holds.
func TestClearEnginesInDemandGrowTheFactor(t *testing.T) {
	cfg := testConfig()
	cfg.Feedback.QueueThreshold = 1e6 // drain's placements are not a queue here
	h := newHarness(t, cfg, hgxCluster(t, 1))
	const rounds = 20
	for range rounds {
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", KVUsage: 0.3}}); err != nil {
			t.Fatal(err)
		}
		drain(h) // the buckets, not the traffic, bound it
		h.advance(period)
	}
	info := h.domain("d1")
	// Clear from the first step: it grows from the 5th (4 clear periods), by 0.02.
	if want := 1 + 0.02*float64(rounds-4); math.Abs(info.CapacityFactor-want) > 1e-9 {
		t.Errorf("factor %g after %d clear periods in demand, want %g", info.CapacityFactor, rounds, want)
	}
	if info.EffectiveDecodeRate <= info.PriorDecodeRate {
		t.Errorf("effective decode rate %d not above the model's %d", info.EffectiveDecodeRate, info.PriorDecodeRate)
	}
	grown := info.CapacityFactor
	for range 10 {
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1"}}); err != nil {
			t.Fatal(err)
		}
		h.advance(period)
	}
	if got := h.domain("d1").CapacityFactor; got != grown {
		t.Errorf("factor moved to %g with no demand, want it held at %g", got, grown)
	}
}

// Without engine signals, Release reports of a slow time to first token
// mark a busy window: what the domain served in it is what it sustains,
// and the factor moves toward it by at most calibration_step per window.
// Releases that report no times move nothing.
func TestReleasesCalibrateABusyDomain(t *testing.T) {
	for _, ttft := range []time.Duration{3 * time.Second, 0} {
		h := newHarness(t, testConfig(), hgxCluster(t, 1))
		for range 2 * 5 * time.Second / period { // two windows
			d := h.admit(req("a", "medium", 1000, 100))
			if _, err := h.e.Release(context.Background(), Release{LeaseID: d.LeaseID, PromptTokens: 1000, OutputTokens: 100, TTFT: ttft, Duration: 2 * ttft}); err != nil {
				t.Fatal(err)
			}
			h.advance(period)
		}
		got := h.domain("d1").CapacityFactor
		switch {
		case ttft > 0 && math.Abs(got-0.8) > 1e-9: // served far less than the model: two steps of 0.1
			t.Errorf("TTFT %v: factor %g after two busy windows, want 0.8", ttft, got)
		case ttft == 0 && got != 1:
			t.Errorf("no times reported: factor %g, want 1", got)
		}
	}
}

// A factor so low that the floors reserved on the domain no longer fit is
// reported, not silently broken. The guard's cut alone never goes that
// low: it stops at the floors' reserve; the windows that measure the
// engines busy and serving nothing take the calibrated value there.
func TestFloorsTheMeasuredCapacityCannotHoldAreReported(t *testing.T) {
	cfg := testConfig()
	cfg.Tiers["floored"] = TierPolicy{RPS: Limit{Rate: 1e6, Burst: 1e6}, Tokens: Limit{Rate: 1e9, Burst: 1e9}, Floor: 1709, Weight: 1}
	cfg.Tenants["f"] = TenantConfig{Tier: "floored"}
	h := newHarness(t, cfg, hgxCluster(t, 1))
	if h.domain("d1").FloorsShort {
		t.Fatal("floors short at the model's capacity")
	}
	saturated := func(periods int) {
		for range periods {
			if err := h.e.ObserveEngines([]EngineSignal{{Domain: "d1", Queue: 100}}); err != nil {
				t.Fatal(err)
			}
			h.advance(period)
		}
	}
	saturated(10)
	if info := h.domain("d1"); info.CapacityFactor <= 0.25 || info.FloorsShort {
		t.Errorf("after 10 saturated periods: factor %g floors short %v, want the guard's cut stopped at the floors' reserve", info.CapacityFactor, info.FloorsShort)
	}
	saturated(200) // ten windows
	info := h.domain("d1")
	if info.CapacityFactor != 0.25 || !info.FloorsShort {
		t.Errorf("after ten busy windows: factor %g floors short %v, want the 0.25 bound and short", info.CapacityFactor, info.FloorsShort)
	}
	if d := h.admit(req("f", "medium", 100, 10)); d.Outcome != Admitted || !d.Trace.Floor {
		t.Errorf("a floor request on the saturated domain: %v %v floor=%v, want admitted from the floor", d.Outcome, d.Reason, d.Trace.Floor)
	}
}

// The factor stays within its bounds whatever the engines say, and the
// rates are always the model's times the factor.
func TestFactorStaysWithinBounds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := newHarness(t, testConfig(), hgxCluster(t, 1))
		for range rapid.IntRange(1, 60).Draw(t, "steps") {
			sig := EngineSignal{Domain: "d1", Queue: rapid.Float64Range(0, 20).Draw(t, "queue"), KVUsage: rapid.Float64Range(0, 1).Draw(t, "kv")}
			if rapid.Bool().Draw(t, "observe") {
				if err := h.e.ObserveEngines([]EngineSignal{sig}); err != nil {
					t.Fatal(err)
				}
			}
			if rapid.Bool().Draw(t, "load") {
				drain(h)
			}
			h.advance(time.Duration(rapid.Int64Range(0, int64(time.Second)).Draw(t, "ns")))
			info := h.domain("d1")
			if info.CapacityFactor < 0.25 || info.CapacityFactor > 2 {
				t.Fatalf("factor %g outside [0.25, 2]", info.CapacityFactor)
			}
			want := math.Round(info.CapacityFactor*1e6) / 1e6 * float64(info.PriorPrefillRate)
			if d := float64(info.EffectivePrefillRate) - want; math.Abs(d) > want*1e-9 {
				t.Fatalf("effective prefill %d, want %.0f (%g of %d)", info.EffectivePrefillRate, want, info.CapacityFactor, info.PriorPrefillRate)
			}
		}
	})
}

// A prompt the router expects a prefix cache to serve is charged prefill
// on its other tokens only; Release settles on the tokens it reports.
func TestExpectedCachedTokensCostNoPrefill(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	m := h.e.mu.place.models["medium"].model
	cap := h.e.mu.place.domains[0].cap
	before := h.domain("d1").PrefillLevel
	r := req("a", "medium", 8000, 10)
	r.ExpectedCachedTokens = 6000
	d := h.admit(r)
	uncached, _ := cap.Cost(m, 2000, 0)
	if got := before - h.domain("d1").PrefillLevel; got != uncached.PrefillFLOP {
		t.Errorf("prefill charged %d, want %d (2,000 uncached tokens)", got, uncached.PrefillFLOP)
	}
	// The router measured fewer cached tokens: the rest is charged.
	if _, err := h.e.Release(context.Background(), Release{LeaseID: d.LeaseID, OutputTokens: 10, CachedPromptTokens: 4000}); err != nil {
		t.Fatal(err)
	}
	more, _ := cap.Cost(m, 4000, 0)
	if got := before - h.domain("d1").PrefillLevel; got != more.PrefillFLOP {
		t.Errorf("prefill after release %d, want %d (4,000 uncached tokens)", got, more.PrefillFLOP)
	}
}

// Bad feedback fields are refused with the field named.
func TestFeedbackFieldsAreValidated(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	r := req("a", "medium", 100, 10)
	r.ExpectedCachedTokens = 101
	var inv *InvalidArgumentError
	if _, err := h.e.Admit(context.Background(), r); !errors.As(err, &inv) || inv.Field != "expected_cached_tokens" {
		t.Errorf("expected_cached_tokens past the prompt: %v", err)
	}
	d := h.admit(req("a", "medium", 100, 10))
	for field, rel := range map[string]Release{
		"time_to_first_token":  {LeaseID: d.LeaseID, TTFT: -time.Second},
		"duration":             {LeaseID: d.LeaseID, TTFT: 2 * time.Second, Duration: time.Second},
		"cached_prompt_tokens": {LeaseID: d.LeaseID, CachedPromptTokens: -1},
	} {
		if _, err := h.e.Release(context.Background(), rel); !errors.As(err, &inv) || inv.Field != field {
			t.Errorf("%s: %v", field, err)
		}
	}
	cfg := testConfig()
	cfg.Feedback.KVThreshold = 1.5
	if _, err := New(cfg, hgxCluster(t, 1)); err == nil || !strings.Contains(err.Error(), "feedback.kv_threshold") {
		t.Errorf("kv_threshold 1.5: %v, want refused naming feedback.kv_threshold", err)
	}
	cfg = testConfig()
	cfg.Feedback.SpreadChoices = MaxSpreadChoices + 1
	if _, err := New(cfg, hgxCluster(t, 1)); err == nil || !strings.Contains(err.Error(), "feedback.spread_choices") {
		t.Errorf("spread_choices %d: %v, want refused naming feedback.spread_choices", MaxSpreadChoices+1, err)
	}
	cfg = testConfig()
	cfg.Feedback.SpreadMargin = 1.5
	if _, err := New(cfg, hgxCluster(t, 1)); err == nil || !strings.Contains(err.Error(), "feedback.spread_margin") {
		t.Errorf("spread_margin 1.5: %v, want refused naming feedback.spread_margin (a share of a load)", err)
	}
	cfg = testConfig()
	cfg.Feedback.LoadSmoothing = 1.5
	if _, err := New(cfg, hgxCluster(t, 1)); err == nil || !strings.Contains(err.Error(), "feedback.load_smoothing") {
		t.Errorf("load_smoothing 1.5: %v, want refused naming feedback.load_smoothing", err)
	}
}

// With spread_choices 3, the least loaded of a tenant's first three
// domains goes first once the first is loaded past it by the margin; the
// fourth, however idle, is not weighed. With the load gone (the queue,
// and the placed requests' use) the first is first again.
func TestLoadSpreadsOverTheFirstThreeDomains(t *testing.T) {
	cfg := testConfig()
	cfg.Feedback.SpreadChoices = 3
	h := newHarness(t, cfg, hgxCluster(t, 4))
	h.e.mu.Lock()
	tenant, _ := h.e.mu.gates.lookupLocked("a", h.e.nowLocked(), h.e.mu.place.modelList)
	h.e.mu.place.walk(tenant, h.e.mu.place.models["medium"])
	var order []string
	for d := h.e.mu.place.next(); d != nil; d = h.e.mu.place.next() {
		order = append(order, d.ID())
	}
	h.e.mu.Unlock()
	if got := firstDomain(h, "a"); got != order[0] {
		t.Fatalf("idle: placed on %s, want the first choice %s of %v", got, order[0], order)
	}
	// The first two are loaded (3 of the threshold's 5 waiting, not
	// saturated); the third and the fourth are idle.
	signal := func(queue float64) {
		t.Helper()
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: order[0], Queue: queue}, {Domain: order[1], Queue: queue}}); err != nil {
			t.Fatal(err)
		}
		h.advance(period)
	}
	signal(3)
	if got := firstDomain(h, "a"); got != order[2] {
		t.Errorf("first two loaded: placed on %s, want the third choice %s of %v", got, order[2], order)
	}
	signal(0)
	settle(h)
	if got := firstDomain(h, "a"); got != order[0] {
		t.Errorf("load gone: placed on %s, want the first choice %s of %v", got, order[0], order)
	}
}

// Of a tenant's first two domains the less loaded goes first, once the
// first's load passes the second's by the margin; with the load gone (the
// queue, and the placed requests' use) the first is first again.
// spread_choices 1 is first fit.
func TestLoadSpreadsOverTheFirstTwoDomains(t *testing.T) {
	for _, choices := range []int{2, 1} {
		cfg := testConfig()
		cfg.Feedback.SpreadChoices = choices
		h := newHarness(t, cfg, hgxCluster(t, 4))
		first := firstDomain(h, "a")
		h.e.mu.Lock()
		tenant, _ := h.e.mu.gates.lookupLocked("a", h.e.nowLocked(), h.e.mu.place.modelList)
		_, second := h.e.mu.place.firstTwo(tenant, h.e.mu.place.models["medium"])
		h.e.mu.Unlock()
		if choices == 1 {
			if second != nil {
				t.Fatalf("spread_choices 1: a second choice %s", second.ID())
			}
			if err := h.e.ObserveEngines([]EngineSignal{{Domain: first, Queue: 3}}); err != nil {
				t.Fatal(err)
			}
			h.advance(period)
			if got := firstDomain(h, "a"); got != first {
				t.Errorf("spread_choices 1, first loaded: placed on %s, want %s (first fit)", got, first)
			}
			continue
		}
		// A waiting queue of 3 of the threshold's 5: loaded, not saturated.
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: first, Queue: 3}}); err != nil {
			t.Fatal(err)
		}
		h.advance(period)
		if h.domain(first).EngineSaturated {
			t.Fatal("queue 3 of 5 saturates")
		}
		if got := firstDomain(h, "a"); got != second.ID() {
			t.Errorf("first domain %s loaded: placed on %s, want the second choice %s", first, got, second.ID())
		}
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: first, Queue: 0}}); err != nil {
			t.Fatal(err)
		}
		h.advance(period)
		settle(h)
		if got := firstDomain(h, "a"); got != first {
			t.Errorf("load gone: placed on %s, want the first choice %s", got, first)
		}
	}
}

// settle steps the capacity loops until the use of the requests placed
// has left the domains' loads (each period keeps 0.7 of it).
func settle(h *harness) {
	for range 20 {
		h.advance(period)
	}
}

// rendezvousOrder is tenant's rendezvous order of the domains for medium.
func rendezvousOrder(h *harness, tenant string) []string {
	h.t.Helper()
	h.e.mu.Lock()
	defer h.e.mu.Unlock()
	t, _ := h.e.mu.gates.lookupLocked(tenant, h.e.nowLocked(), h.e.mu.place.modelList)
	h.e.mu.place.walk(t, h.e.mu.place.models["medium"])
	var order []string
	for d := h.e.mu.place.next(); d != nil; d = h.e.mu.place.next() {
		order = append(order, d.ID())
	}
	return order
}

// loadDomains gives each domain of loads that load, through its engines'
// KV use (load is KV use over the threshold, 0.8), and steps the loops.
func loadDomains(h *harness, loads map[string]float64) {
	h.t.Helper()
	var sigs []EngineSignal
	for d, l := range loads {
		sigs = append(sigs, EngineSignal{Domain: d, KVUsage: l * 0.8})
	}
	if err := h.e.ObserveEngines(sigs); err != nil {
		h.t.Fatalf("%v", err)
	}
	h.advance(period)
}

// The spread margin is relative to the first's load: at loads 0.3 and
// 0.24 (0.06 apart, a fifth of the first's load, past the margin of a
// tenth) the second goes first, where an absolute margin of 0.1 would
// keep twice the load on the first; within a tenth of its load (0.3 and
// 0.28) the first stays first, and so it does on nearly idle domains,
// where the margin is of a load of 0.1.
func TestTheSpreadMarginIsRelativeToTheLoad(t *testing.T) {
	for _, tc := range []struct {
		first, second float64
		moves         bool // the second goes first
	}{
		{0.3, 0.24, true},
		{0.3, 0.28, false},
		{0.008, 0, false},
	} {
		h := newHarness(t, testConfig(), hgxCluster(t, 4))
		o := rendezvousOrder(h, "a")
		want := o[0]
		if tc.moves {
			want = o[1]
		}
		// The domains further are busier: only the two choices weigh.
		loadDomains(h, map[string]float64{o[0]: tc.first, o[1]: tc.second, o[2]: 0.6, o[3]: 0.6})
		if got := firstDomain(h, "a"); got != want {
			t.Errorf("first at %.3f, second at %.3f: placed on %s, want %s (order %v)", tc.first, tc.second, got, want, o)
		}
	}
}

// When both choices are loaded past domains further down the order, the
// least loaded of those goes first, not the first of them found: the
// third at 0.35 is past the choices' 0.5 by the margin, and the fourth,
// idle, is further still and taken.
func TestLookingFurtherTakesTheLeastLoaded(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 4))
	o := rendezvousOrder(h, "a")
	loadDomains(h, map[string]float64{o[0]: 0.5, o[1]: 0.5, o[2]: 0.35, o[3]: 0})
	if got := firstDomain(h, "a"); got != o[3] {
		t.Errorf("choices at 0.5, third at 0.35, fourth idle: placed on %s, want the fourth %s (order %v)", got, o[3], o)
	}
	// Within the margin of the choices, no domain further is weighed.
	loadDomains(h, map[string]float64{o[0]: 0.5, o[1]: 0.5, o[2]: 0.47, o[3]: 0.47})
	if got := firstDomain(h, "a"); got != o[0] {
		t.Errorf("choices at 0.5, the others at 0.47: placed on %s, want the first %s (order %v)", got, o[0], o)
	}
}

// Looking further weighs each domain with the request on it: on two racks
// and four nodes a twentieth of a rack's size, with the racks at 0.5 and
// the nodes at 0.3 (past the racks by the margin), a small request goes to
// a node, but one whose share of a node's next reading would take it past
// the racks stays on a rack, where a node would take every request alike
// and a burst of them would land on it before its load moved.
func TestLookingFurtherWeighsWhatTheRequestAdds(t *testing.T) {
	cluster := topologytest.NVL72(t, 2) // rack-1, rack-2
	cluster.Domains = append(cluster.Domains, hgxCluster(t, 4).Domains...)
	h := newHarness(t, testConfig(), cluster)
	tenant := ""
	for _, name := range []string{"a", "b", "c"} {
		if o := rendezvousOrder(h, name); strings.HasPrefix(o[0], "rack") && strings.HasPrefix(o[1], "rack") {
			tenant = name
			break
		}
	}
	if tenant == "" {
		t.Fatal("no tenant has both racks as its choices")
	}
	loadDomains(h, map[string]float64{"rack-1": 0.5, "rack-2": 0.5, "d1": 0.3, "d2": 0.3, "d3": 0.3, "d4": 0.3})
	place := func(prompt int64) string {
		t.Helper()
		d := h.admit(req(tenant, "medium", prompt, 10))
		if d.Outcome != Admitted {
			t.Fatalf("%d-token request: %v %v", prompt, d.Outcome, d.Reason)
		}
		h.release(d.LeaseID, prompt, 10)
		return d.Domain
	}
	if got := place(200); strings.HasPrefix(got, "rack") {
		t.Errorf("a 200-token request went to %s, want a node: the nodes are past the racks by the margin", got)
	}
	// Its share of each one's next reading: its prefill over a period of
	// the model's rate, weighed load_smoothing.
	with := func(i int, load float64) float64 {
		h.e.mu.Lock()
		defer h.e.mu.Unlock()
		d := h.e.mu.place.domains[i]
		cost, err := d.cap.CostCached(h.e.mu.place.models["medium"].model, 6000, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		rate, _ := d.cap.PriorRates()
		return load + 0.3*float64(cost.PrefillFLOP)/(float64(rate)*period.Seconds())
	}
	withRack, withNode := with(0, 0.5), with(2, 0.3)
	if withRack-withNode > 0.05 {
		t.Fatalf("a 6000-token request: a node at %.2f with it, a rack at %.2f: the test means nothing", withNode, withRack)
	}
	if got := place(6000); !strings.HasPrefix(got, "rack") {
		t.Errorf("a 6000-token request went to %s (with it a node's load is %.2f, a rack's %.2f), want a rack", got, withNode, withRack)
	}
}

// BenchmarkCapacityLoop measures the capacity loop's background work on
// 1,400 NVL72 domains beside the default cluster's 6 in the same run: one
// ObserveEngines of every domain's signals (a pass of the engine reader)
// and one step of every domain's loop, per domain.
func BenchmarkCapacityLoop(b *testing.B) {
	run := func(b *testing.B, cluster topology.Cluster) (observe, step float64) {
		h := newHarness(b, testConfig(), cluster)
		sigs := make([]EngineSignal, len(cluster.Domains))
		for i, d := range cluster.Domains {
			sigs[i] = EngineSignal{Domain: d.ID, Queue: float64(i % 7), KVUsage: float64(i%10) / 10}
		}
		start := time.Now()
		for range b.N {
			if err := h.e.ObserveEngines(sigs); err != nil {
				b.Fatal(err)
			}
		}
		observe = float64(time.Since(start).Nanoseconds()) / float64(b.N*len(sigs))
		start = time.Now()
		for range b.N {
			h.clk.Advance(period)
			h.e.mu.Lock()
			h.e.mu.place.stepFeedback(h.e.nowLocked())
			h.e.mu.Unlock()
		}
		step = float64(time.Since(start).Nanoseconds()) / float64(b.N*len(sigs))
		return observe, step
	}
	fo, fs := run(b, fleet())
	do, ds := run(b, topology.Simulated())
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(fo, "observe-ns/domain")
	b.ReportMetric(fs, "step-ns/domain")
	b.ReportMetric(fo/do, "observe-fleet/default")
	b.ReportMetric(fs/ds, "step-fleet/default")
}

// Readings that are not numbers ≥ 0 are not taken: ObserveEngines names
// their domains, a domain with no reading before has none, and the
// domains neither saturate nor lose their placement.
func TestBadEngineReadingsAreNotTaken(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 2))
	for _, d := range []string{"d1", "d2"} {
		if err := h.e.ObserveEngines([]EngineSignal{{Domain: d, Queue: math.NaN(), KVUsage: math.Inf(1), Running: -3}}); !errors.Is(err, ErrInvalidEngineSignal) || !strings.Contains(err.Error(), d) {
			t.Errorf("NaN, +Inf and negative readings for %s: %v, want ErrInvalidEngineSignal naming it", d, err)
		}
	}
	h.advance(period)
	for _, d := range []string{"d1", "d2"} {
		if info := h.domain(d); info.EngineSaturated || info.EngineQueue != 0 || info.EngineKVUsage != 0 || info.EngineMetricsAge != 0 {
			t.Errorf("%s after NaN, +Inf and negative readings: %+v, want no reading", d, info)
		}
	}
	if got := firstDomain(h, "a"); got == "" {
		t.Error("no placement")
	}
}

// A domain's use is the share of its whole rate taken of late, per phase:
// half its prefill rate taken every period reads about a half, and it
// falls back to nothing once nothing is taken, where its bucket level
// (how much of a burst is spent) says nothing of how busy it is.
func TestDomainUseIsTheShareOfItsRateTaken(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	take := func() {
		h.e.mu.Lock()
		defer h.e.mu.Unlock()
		d := h.e.mu.place.domains[0]
		full, _, _ := d.cap.FullLimits()
		d.cap.Charge(h.e.nowLocked(), pd.Cost{PrefillFLOP: full / 2 / int64(time.Second/period)})
	}
	for range 40 {
		take()
		h.advance(period)
	}
	d := h.domain("d1")
	if d.PrefillUse < 0.45 || d.PrefillUse > 0.55 || d.DecodeUse != 0 {
		t.Fatalf("half the prefill rate taken each period: use prefill %.3f decode %.3f, want about 0.5 and 0", d.PrefillUse, d.DecodeUse)
	}
	if d.Load < d.PrefillUse {
		t.Errorf("load %.3f below the use %.3f it is the larger of", d.Load, d.PrefillUse)
	}
	if level := float64(d.PrefillLevel) / float64(d.PrefillBurst); level < 0.9 {
		t.Errorf("prefill bucket at %.2f of its burst: the test means its level says nothing of the use", level)
	}
	for range 40 {
		h.advance(period)
	}
	if d := h.domain("d1"); d.PrefillUse > 0.01 {
		t.Errorf("nothing taken for 10 s: prefill use %.3f, want about 0", d.PrefillUse)
	}
}
