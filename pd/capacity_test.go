package pd

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/tokenbucket"
	"github.com/sluice-sched/sluice/topology"
)

const sec = int64(time.Second)

func domain(t testing.TB, c topology.Cluster, id string) *topology.Domain {
	t.Helper()
	d, ok := c.Domain(id)
	if !ok {
		t.Fatalf("no domain %s", id)
	}
	return d
}

func newCap(t testing.TB, d *topology.Domain, cat *Catalog, cfg Config) *DomainCapacity {
	t.Helper()
	c, err := NewDomainCapacity(d, cat, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Resident weights per node: 405e9·1 + 70e9·2 + 8e9·2 = 561e9 B.
func TestCapacityRates(t *testing.T) {
	cat := defaultCatalog(t)
	sim := topology.Simulated()
	for _, tc := range []struct {
		id                             string
		prefillRate, decodeRate, kvMax int64
	}{
		// 0.7·72·2.5e15·0.5; 0.7·72·8e12; 0.7·(72·186e9 − 18·561e9)
		{"nvl72-a", 63_000_000_000_000_000, 403_200_000_000_000, 2_305_800_000_000},
		// 0.7·8·989e12·0.5; 0.7·8·4.8e12; 0.7·(8·141e9 − 561e9)
		{"hgx-h200-1", 2_769_200_000_000_000, 26_880_000_000_000, 396_900_000_000},
	} {
		c := newCap(t, domain(t, sim, tc.id), cat, DefaultConfig())
		if c.PrefillRate() != tc.prefillRate || c.PrefillBurst() != 2*tc.prefillRate ||
			c.DecodeRate() != tc.decodeRate || c.DecodeBurst() != 2*tc.decodeRate {
			t.Errorf("%s: prefill %d/%d, decode %d/%d; want %d, %d (burst 2×)", tc.id,
				c.PrefillRate(), c.PrefillBurst(), c.DecodeRate(), c.DecodeBurst(), tc.prefillRate, tc.decodeRate)
		}
		if inUse, limit := c.KV(); inUse != 0 || limit != tc.kvMax {
			t.Errorf("%s: KV %d/%d, want 0/%d", tc.id, inUse, limit, tc.kvMax)
		}
		if p, d := c.Levels(0); p != c.PrefillBurst() || d != c.DecodeBurst() {
			t.Errorf("%s: starts at %d, %d, not full", tc.id, p, d)
		}
		if c.ID() != tc.id || c.ReservedFraction() != 0 {
			t.Errorf("%s: ID %q, reserved %g", tc.id, c.ID(), c.ReservedFraction())
		}
	}
	// Other knobs: 0.5 soft, mfu 0.4, 1 s burst, 2 weight copies.
	c := newCap(t, domain(t, sim, "hgx-h200-2"), cat, Config{SoftFraction: 0.5, MFU: 0.4, BurstSeconds: 1, WeightCopies: 2})
	if c.PrefillRate() != 1_582_400_000_000_000 || c.PrefillBurst() != c.PrefillRate() || c.DecodeRate() != 19_200_000_000_000 {
		t.Errorf("prefill %d burst %d decode %d", c.PrefillRate(), c.PrefillBurst(), c.DecodeRate())
	}
	if _, limit := c.KV(); limit != 3_000_000_000 { // 0.5·(1128e9 − 2·561e9)
		t.Errorf("KV limit %d", limit)
	}
}

func TestCapacityErrors(t *testing.T) {
	cat := defaultCatalog(t)
	sim := topology.Simulated()
	h200 := domain(t, sim, "hgx-h200-1")
	if _, err := NewDomainCapacity(h200, cat, Config{WeightCopies: 3}, 0); err == nil || !strings.Contains(err.Error(), "leave no HBM for KV") {
		t.Errorf("3 weight copies on 8 H200s: %v", err)
	}
	for cfg, want := range map[Config]string{
		{SoftFraction: 1.5}:  "soft_fraction",
		{MFU: -0.1}:          "mfu",
		{BurstSeconds: -1}:   "burst_seconds",
		{BurstSeconds: 1e5}:  "burst_seconds",
		{WeightCopies: -1}:   "weight_copies",
		{SoftFraction: 1e-6}: "",
		{SoftFraction: 1e-9}: "soft_fraction",
		{MFU: 4e-10}:         "mfu",
	} {
		err := cfg.Validate()
		if want == "" {
			if err != nil {
				t.Errorf("%+v: %v", cfg, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "pd: config: "+want+":") {
			t.Errorf("%+v: error %v, want it to name %s", cfg, err, want)
		}
		if _, err := NewDomainCapacity(h200, cat, cfg, 0); err == nil {
			t.Errorf("%+v: NewDomainCapacity accepted it", cfg)
		}
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero Config (all defaults): %v", err)
	}
}

func TestCalibrationReplacesFormula(t *testing.T) {
	ms := DefaultModels()
	ms[0].Calibrated = map[string]Calibration{"NVIDIA GB200": {PrefillTokensPerGPUSecond: 10_000, DecodeTokensPerGPUSecond: 500}}
	ms[1].Calibrated = map[string]Calibration{"GB200": {DecodeTokensPerGPUSecond: 2000}}
	cat, err := NewCatalog(ms)
	if err != nil {
		t.Fatal(err)
	}
	sim := topology.Simulated()
	nvl := newCap(t, domain(t, sim, "nvl72-a"), cat, DefaultConfig())
	large := get(t, cat, "large")
	got, err := nvl.Cost(large, 1000, 500)
	// 6.3e16 / (10_000·72) = 87_500_000_000 per prompt token; 4.032e14 / (500·72) = 11_200_000_000 per output token.
	want := Cost{PrefillFLOP: 87_500_000_000_000, DecodeBytes: 5_600_000_000_000, KVBytes: 387_072_000}
	if err != nil || got != want {
		t.Errorf("calibrated cost = %+v, %v; want %+v", got, err, want)
	}
	one, _ := nvl.Cost(large, 1, 1)
	if nvl.PrefillRate()/one.PrefillFLOP != 10_000*72 || nvl.DecodeRate()/one.DecodeBytes != 500*72 {
		t.Errorf("buckets admit %d prompt and %d output tokens/s, want 720000 and 36000",
			nvl.PrefillRate()/one.PrefillFLOP, nvl.DecodeRate()/one.DecodeBytes)
	}
	// Only decode calibrated: prefill keeps its formula.
	medium := get(t, cat, "medium")
	if got, _ := nvl.Cost(medium, 1000, 500); got.PrefillFLOP != 140_000_000_000_000 || got.DecodeBytes != 500*2_800_000_000 {
		t.Errorf("medium in nvl72 = %+v", got)
	}
	// An H200 domain has no calibration: the formula.
	hgx := newCap(t, domain(t, sim, "hgx-h200-1"), cat, DefaultConfig())
	formula, _ := cat.Cost(large, 1000, 500)
	if got, _ := hgx.Cost(large, 1000, 500); got != formula {
		t.Errorf("uncalibrated cost = %+v, want the formula %+v", got, formula)
	}
	// The calibrated cost scales with the domain's healthy GPUs: rate and
	// GPU count shrink together, so the per-token cost is unchanged.
	d := domain(t, sim, "nvl72-a")
	for i := range d.Nodes[0].GPUs {
		d.Nodes[0].GPUs[i].Healthy = false
	}
	if err := nvl.Resize(d); err != nil {
		t.Fatal(err)
	}
	if got, _ := nvl.Cost(large, 1000, 500); got != want {
		t.Errorf("after losing a tray: %+v, want %+v", got, want)
	}
}

func TestChargeAndRelease(t *testing.T) {
	cat := defaultCatalog(t)
	c := newCap(t, domain(t, topology.Simulated(), "hgx-h200-1"), cat, DefaultConfig())
	large := get(t, cat, "large")
	charged, _ := c.Cost(large, 1000, 500)
	p0, d0 := c.Levels(0)
	if !c.Fits(0, charged, false) {
		t.Fatal("a 1000+500 request does not fit an idle HGX")
	}
	c.Charge(0, charged)
	p1, d1 := c.Levels(0)
	if inUse, _ := c.KV(); p1 != p0-charged.PrefillFLOP || d1 != d0-charged.DecodeBytes || inUse != charged.KVBytes {
		t.Fatalf("after Charge: %d, %d, KV %d", p1, d1, inUse)
	}
	// Only 100 of 500 output tokens were generated: the decode of 400 comes back.
	actual, _ := c.Cost(large, 1000, 100)
	c.Release(0, charged, actual)
	p2, d2 := c.Levels(0)
	if inUse, _ := c.KV(); p2 != p1 || d2 != d1+charged.DecodeBytes-actual.DecodeBytes || inUse != 0 {
		t.Errorf("after Release: prefill %d (want %d), decode %d (want %d), KV %d", p2, p1, d2, d1+charged.DecodeBytes-actual.DecodeBytes, inUse)
	}
	// An overrun (900 tokens for 500 charged) is charged.
	c.Charge(0, charged)
	over, _ := c.Cost(large, 1000, 900)
	_, before := c.Levels(0)
	c.Release(0, charged, over)
	if _, after := c.Levels(0); after != before-(over.DecodeBytes-charged.DecodeBytes) {
		t.Errorf("overrun: decode %d → %d, want −%d", before, after, over.DecodeBytes-charged.DecodeBytes)
	}
	// A refund never lifts a bucket past its burst.
	c.Release(100*sec, charged, Cost{})
	if p, d := c.Levels(100 * sec); p != c.PrefillBurst() || d != c.DecodeBurst() {
		t.Errorf("levels %d, %d past bursts %d, %d", p, d, c.PrefillBurst(), c.DecodeBurst())
	}
	// Debt is bounded at one burst.
	c.Charge(100*sec, Cost{DecodeBytes: 5 * c.DecodeBurst()})
	if _, d := c.Levels(100 * sec); d != -c.DecodeBurst() {
		t.Errorf("debt %d, want −burst %d", d, c.DecodeBurst())
	}
}

func TestReserveWatermarks(t *testing.T) {
	cat := defaultCatalog(t)
	c := newCap(t, domain(t, topology.Simulated(), "hgx-h200-1"), cat, DefaultConfig())
	c.SetReserve(c.PrefillRate()/4, c.DecodeRate()/2)
	resP, resD, resKV := c.Reserves()
	_, kvLimit := c.KV()
	if resP != c.PrefillBurst()/4 || resD != c.DecodeBurst()/2 || resKV != kvLimit/4 || c.ReservedFraction() != 0.25 {
		t.Fatalf("reserves %d, %d, %d (fraction %g)", resP, resD, resKV, c.ReservedFraction())
	}
	// Shared traffic may take the prefill bucket exactly down to its reserve.
	shared := Cost{PrefillFLOP: c.PrefillBurst() - resP}
	if c.Fits(0, Cost{PrefillFLOP: shared.PrefillFLOP + 1}, false) || !c.Fits(0, shared, false) {
		t.Fatal("shared traffic's limit is not the watermark")
	}
	c.Charge(0, shared)
	one := Cost{PrefillFLOP: 1}
	if c.Fits(0, one, false) || !c.Fits(0, Cost{PrefillFLOP: resP}, true) {
		t.Error("at the watermark: shared must wait, floor must fit")
	}
	if got, want := c.RetryAfter(0, Cost{PrefillFLOP: 1000 * c.PrefillRate()}, false), tokenbucket.Never; got != want {
		t.Errorf("RetryAfter of a request past the burst = %v", got)
	}
	if got := c.RetryAfter(0, Cost{PrefillFLOP: c.PrefillRate() / 2}, false); got != 500*time.Millisecond {
		t.Errorf("RetryAfter half a second of prefill = %v", got)
	}
	if got := c.RetryAfter(0, Cost{PrefillFLOP: c.PrefillBurst() - resP + 1}, false); got != tokenbucket.Never {
		t.Errorf("shared request above burst − reserve: RetryAfter = %v, want Never", got)
	}
	if got := c.RetryAfter(0, Cost{PrefillFLOP: c.PrefillBurst() - resP + 1}, true); got == tokenbucket.Never {
		t.Error("floor request above burst − reserve: Never")
	}
	// KV: shared may fill up to limit − reserve; floor up to the limit.
	if c.Fits(0, Cost{KVBytes: kvLimit - resKV + 1}, false) || !c.Fits(0, Cost{KVBytes: kvLimit}, true) {
		t.Error("KV reserve not honoured")
	}
	c.Charge(0, Cost{KVBytes: kvLimit - resKV})
	kvOnly := Cost{KVBytes: 1}
	if c.Fits(1*sec, kvOnly, false) || c.RetryAfter(1*sec, kvOnly, false) != 0 {
		t.Errorf("short only of KV: RetryAfter %v, want 0 (wait for a release)", c.RetryAfter(sec, kvOnly, false))
	}
	// Reserve is lent: idle floors refill above the watermark, for shared use.
	if !c.Fits(10*sec, Cost{PrefillFLOP: c.PrefillBurst() - resP}, false) {
		t.Error("after refill, shared traffic cannot use capacity above the watermark")
	}
	// Capped at the rate; negative is 0.
	c.SetReserve(10*c.PrefillRate(), -1)
	if p, d, kv := c.Reserves(); p != c.PrefillBurst() || d != 0 || kv != kvLimit || c.ReservedFraction() != 1 {
		t.Errorf("capped reserves %d, %d, %d", p, d, kv)
	}
}

func TestCanEverFit(t *testing.T) {
	cat := defaultCatalog(t)
	c := newCap(t, domain(t, topology.Simulated(), "hgx-h200-1"), cat, DefaultConfig())
	_, kvLimit := c.KV()
	for cost, want := range map[Cost]bool{
		{PrefillFLOP: c.PrefillBurst(), DecodeBytes: c.DecodeBurst(), KVBytes: kvLimit}: true,
		{PrefillFLOP: c.PrefillBurst() + 1}:                                             false,
		{DecodeBytes: c.DecodeBurst() + 1}:                                              false,
		{KVBytes: kvLimit + 1}:                                                          false,
		{PrefillFLOP: -1}:                                                               false,
	} {
		if got := c.CanEverFit(cost); got != want {
			t.Errorf("CanEverFit(%+v) = %v", cost, got)
		}
		if !want && (c.Fits(0, cost, true) || c.RetryAfter(0, cost, true) != tokenbucket.Never) {
			t.Errorf("%+v never fits, yet Fits or RetryAfter says otherwise", cost)
		}
	}
}

func TestResize(t *testing.T) {
	cat := defaultCatalog(t)
	sim := topology.Simulated()
	d := domain(t, sim, "nvl72-a")
	c := newCap(t, d, cat, DefaultConfig())
	c.Charge(0, Cost{KVBytes: 1e9})
	for i := range 8 { // two trays down
		d.Nodes[i/4].GPUs[i%4].Healthy = false
	}
	if err := c.Resize(d); err != nil {
		t.Fatal(err)
	}
	// 64 GPUs on 16 trays.
	if c.PrefillRate() != 56_000_000_000_000_000 || c.DecodeRate() != 358_400_000_000_000 || c.GPUs() != 64 {
		t.Errorf("rates %d, %d, GPUs %d", c.PrefillRate(), c.DecodeRate(), c.GPUs())
	}
	if p, _ := c.Levels(0); p != c.PrefillBurst() {
		t.Errorf("level %d not cut to the new burst %d", p, c.PrefillBurst())
	}
	if inUse, limit := c.KV(); inUse != 1e9 || limit != 2_049_600_000_000 { // 0.7·(64·186e9 − 16·561e9)
		t.Errorf("KV %d/%d", inUse, limit)
	}
	other := domain(t, sim, "nvl72-b")
	if err := c.Resize(other); err == nil {
		t.Error("Resize to another domain accepted")
	}
	for i := range d.Nodes {
		for j := range d.Nodes[i].GPUs {
			d.Nodes[i].GPUs[j].Healthy = false
		}
	}
	if err := c.Resize(d); err != nil {
		t.Fatalf("all GPUs down: %v", err)
	}
	if c.PrefillRate() != 0 || c.CanEverFit(Cost{}) || c.Fits(sec, Cost{}, true) || c.RetryAfter(sec, Cost{}, true) != tokenbucket.Never {
		t.Error("a domain with no healthy GPU still admits")
	}
}

func TestCopyLevels(t *testing.T) {
	cat := defaultCatalog(t)
	d := domain(t, topology.Simulated(), "hgx-h200-1")
	old := newCap(t, d, cat, DefaultConfig())
	old.Charge(0, Cost{PrefillFLOP: 4e15, DecodeBytes: 2e13, KVBytes: 5e9})
	fresh := newCap(t, d, cat, Config{BurstSeconds: 1}) // bursts 2_769_200_000_000_000 and 26_880_000_000_000
	fresh.CopyLevels(0, old)
	if p, dec := fresh.Levels(0); p != 5_538_400_000_000_000-4e15 || dec != 26_880_000_000_000 { // decode cut to the burst
		t.Errorf("copied levels %d, %d", p, dec)
	}
	if inUse, _ := fresh.KV(); inUse != 5e9 {
		t.Errorf("copied KV %d", inUse)
	}
}

func TestHotPathDoesNotAllocate(t *testing.T) {
	cat := defaultCatalog(t)
	c := newCap(t, domain(t, topology.Simulated(), "nvl72-a"), cat, DefaultConfig())
	m := get(t, cat, "medium")
	now := int64(0)
	allocs := testing.AllocsPerRun(100, func() {
		now += 1000
		cost, err := c.Cost(m, 2000, 300)
		if err != nil || !c.Fits(now, cost, false) {
			panic("does not fit")
		}
		c.Charge(now, cost)
		c.Release(now, cost, cost)
	})
	if allocs != 0 {
		t.Errorf("%g allocations per decision", allocs)
	}
}

func BenchmarkCostFitsCharge(b *testing.B) {
	cat := defaultCatalog(b)
	c := newCap(b, domain(b, topology.Simulated(), "nvl72-a"), cat, DefaultConfig())
	m := get(b, cat, "medium")
	b.ReportAllocs()
	now := int64(0)
	for b.Loop() {
		now += 1000
		cost, _ := c.Cost(m, 2000, 300)
		if c.Fits(now, cost, false) {
			c.Charge(now, cost)
			c.Release(now, cost, cost)
		}
	}
}

// A replica's share: its rates, levels and KV limit, the reserves scaled by
// the same share, the bursts and the whole-domain limits kept; Taken counts
// charges and releases but not the share's levels; Resize restores the whole.
func TestApplyShare(t *testing.T) {
	cat := defaultCatalog(t)
	d := domain(t, topology.Simulated(), "hgx-h200-1")
	c := newCap(t, d, cat, DefaultConfig())
	pr, dr, kv := c.FullLimits()
	c.SetReserve(pr/4, dr/2)
	wholeP, wholeD, _ := c.Reserves()
	c.ApplyShare(0, ShareGrant{PrefillRate: pr / 2, PrefillLevel: 1000, DecodeRate: dr / 2, DecodeLevel: 2000, KVLimit: kv / 2})
	if c.PrefillRate() != pr/2 || c.DecodeRate() != dr/2 || c.PrefillBurst() != 2*pr || c.DecodeBurst() != 2*dr {
		t.Errorf("share rates %d, %d bursts %d, %d", c.PrefillRate(), c.DecodeRate(), c.PrefillBurst(), c.DecodeBurst())
	}
	if p, dc := c.Levels(0); p != 1000 || dc != 2000 {
		t.Errorf("share levels %d, %d, want 1000, 2000", p, dc)
	}
	if _, limit := c.KV(); limit != kv/2 {
		t.Errorf("share KV limit %d, want %d", limit, kv/2)
	}
	if p, dc, _ := c.Reserves(); p != wholeP/2 || dc != wholeD/2 {
		t.Errorf("share reserves %d, %d, want half of %d, %d", p, dc, wholeP, wholeD)
	}
	if p2, d2, kv2 := c.FullLimits(); p2 != pr || d2 != dr || kv2 != kv {
		t.Error("FullLimits changed with the share")
	}
	if p, dc := c.Taken(); p != 0 || dc != 0 {
		t.Errorf("setting the share's levels counted as taken: %d, %d", p, dc)
	}
	cost := Cost{PrefillFLOP: 300, DecodeBytes: 500, KVBytes: 10}
	c.Charge(sec, cost)
	c.Release(sec, cost, Cost{PrefillFLOP: 300, DecodeBytes: 200})
	if p, dc := c.Taken(); p != 300 || dc != 200 {
		t.Errorf("Taken after a charge and a release = %d, %d, want 300, 200", p, dc)
	}
	if err := c.Resize(d); err != nil {
		t.Fatal(err)
	}
	if c.PrefillRate() != pr {
		t.Errorf("Resize kept the share's rate %d, want the whole %d", c.PrefillRate(), pr)
	}
}

// A warm-up ramps the shared part of every limit linearly from its start
// fraction to the whole; the floor reserve is whole throughout.
func TestWarmup(t *testing.T) {
	cat := defaultCatalog(t)
	c := newCap(t, domain(t, topology.Simulated(), "hgx-h200-1"), cat, DefaultConfig())
	baseRate, baseBurst := c.PrefillRate(), c.PrefillBurst()
	_, baseKV := c.KV()
	c.SetReserve(baseRate/5, 0)
	resP, _, resKV := c.Reserves()
	resRate := baseRate / 5
	c.StartWarmup(0, WarmupFull/4, 60*sec)
	for _, tc := range []struct {
		at, frac, end int64
	}{
		{0, 250_000, 60 * sec},
		{15 * sec, 437_500, 60 * sec},
		{30 * sec, 625_000, 60 * sec},
		{60 * sec, WarmupFull, 0},
		{90 * sec, WarmupFull, 0},
	} {
		frac, end := c.Warmup(tc.at)
		if frac != tc.frac || end != tc.end {
			t.Fatalf("at %ds: warm-up %d ending %d, want %d ending %d", tc.at/sec, frac, end, tc.frac, tc.end)
		}
		want := func(res, base int64) int64 {
			shared, _ := mulDiv(uint64(base-res), uint64(tc.frac), WarmupFull)
			return res + shared
		}
		_, kv := c.KV()
		if c.PrefillRate() != want(resRate, baseRate) || c.PrefillBurst() != want(resP, baseBurst) || kv != want(resKV, baseKV) {
			t.Errorf("at %ds: rate %d burst %d kv %d; want %d, %d, %d", tc.at/sec, c.PrefillRate(), c.PrefillBurst(), kv,
				want(resRate, baseRate), want(resP, baseBurst), want(resKV, baseKV))
		}
		if p, _ := c.Levels(tc.at); p > c.PrefillBurst() {
			t.Errorf("at %ds: level %d above the ramped burst %d", tc.at/sec, p, c.PrefillBurst())
		}
	}
	if p, _ := c.Levels(90 * sec); p != baseBurst {
		t.Errorf("whole again: level %d, want the full burst %d", p, baseBurst)
	}
}

// While ramping, a request too large for the ramped domain but not for the
// whole one can still fit: it waits until the ramp ends. The ramp survives
// a rebuild (CopyLevels), and from ≥ WarmupFull is whole at once.
func TestWarmupWaitAndCarry(t *testing.T) {
	cat := defaultCatalog(t)
	d := domain(t, topology.Simulated(), "hgx-h200-1")
	c := newCap(t, d, cat, DefaultConfig())
	big := Cost{PrefillFLOP: c.PrefillBurst() / 2}
	c.StartWarmup(0, WarmupFull/4, 60*sec)
	if c.Fits(0, big, false) || !c.CanEverFit(big) {
		t.Fatal("half the whole burst: must not fit a quarter, but can ever fit")
	}
	if got := c.RetryAfter(0, big, false); got != time.Minute {
		t.Errorf("RetryAfter while ramping = %v, want the ramp's end (1m)", got)
	}
	next := newCap(t, d, cat, DefaultConfig())
	next.CopyLevels(30*sec, c)
	if frac, end := next.Warmup(30 * sec); frac != 625_000 || end != 60*sec {
		t.Errorf("after CopyLevels: %d ending %d", frac, end)
	}
	next.StartWarmup(30*sec, WarmupFull, 90*sec)
	if frac, end := next.Warmup(30 * sec); frac != WarmupFull || end != 0 {
		t.Errorf("from WarmupFull: %d ending %d, want whole", frac, end)
	}
}

// A capacity factor scales the rates from the model's, keeps the bursts,
// KV and the costs per token, keeps a replica's share in proportion, and
// travels with the levels across a reload. Reserves the corrected rates
// cannot hold are reported.
func TestSetFactor(t *testing.T) {
	cat := defaultCatalog(t)
	d := domain(t, topology.Simulated(), "hgx-h200-1")
	c := newCap(t, d, cat, DefaultConfig())
	pr, dr, kv := c.FullLimits()
	m := get(t, cat, "medium")
	before, _ := c.Cost(m, 2000, 300)
	c.SetFactor(sec, FactorFull/2)
	if c.PrefillRate() != pr/2 || c.DecodeRate() != dr/2 || c.PrefillBurst() != 2*pr || c.DecodeBurst() != 2*dr {
		t.Errorf("at factor 0.5: rates %d, %d bursts %d, %d; want half of %d, %d and the bursts kept", c.PrefillRate(), c.DecodeRate(), c.PrefillBurst(), c.DecodeBurst(), pr, dr)
	}
	if p, dc := c.Levels(sec); p != 2*pr || dc != 2*dr {
		t.Errorf("levels %d, %d: want kept full at %d, %d", p, dc, 2*pr, 2*dr)
	}
	if _, limit := c.KV(); limit != kv {
		t.Errorf("KV limit %d moved with the factor, want %d", limit, kv)
	}
	if after, _ := c.Cost(m, 2000, 300); after != before {
		t.Errorf("cost moved with the factor: %+v, was %+v", after, before)
	}
	if p, dc := c.PriorRates(); p != pr || dc != dr || c.Factor() != FactorFull/2 {
		t.Errorf("prior %d, %d factor %d", p, dc, c.Factor())
	}

	// A share keeps its part of the corrected whole.
	c.ApplyShare(sec, ShareGrant{PrefillRate: pr / 8, DecodeRate: dr / 8, KVLimit: kv / 4})
	c.SetFactor(sec, FactorFull)
	if c.PrefillRate() != pr/4 || c.DecodeRate() != dr/4 {
		t.Errorf("share after the factor doubled: %d, %d, want %d, %d", c.PrefillRate(), c.DecodeRate(), pr/4, dr/4)
	}
	if _, limit := c.KV(); limit != kv/4 {
		t.Errorf("share's KV limit %d, want %d", limit, kv/4)
	}

	// A reload carries the factor.
	c.SetFactor(sec, FactorFull/4)
	fresh := newCap(t, d, cat, DefaultConfig())
	fresh.CopyLevels(sec, c)
	if fresh.Factor() != FactorFull/4 || fresh.PrefillRate() != pr/4 {
		t.Errorf("after a reload: factor %d rate %d, want %d, %d", fresh.Factor(), fresh.PrefillRate(), FactorFull/4, pr/4)
	}

	// Floors sized for the model no longer fit a quarter of it.
	fresh.SetReserve(pr/2, dr/2)
	if !fresh.FloorsShort() {
		t.Error("reserve of half the model's rate at a quarter of it: not reported short")
	}
	fresh.SetFactor(sec, FactorFull)
	if fresh.FloorsShort() {
		t.Error("reserve of half the rate at the whole model: reported short")
	}
}

// A prompt's cached tokens cost no prefill; decode and KV see the whole
// context.
func TestCostCached(t *testing.T) {
	cat := defaultCatalog(t)
	c := newCap(t, domain(t, topology.Simulated(), "hgx-h200-1"), cat, DefaultConfig())
	m := get(t, cat, "medium")
	whole, _ := c.Cost(m, 2000, 300)
	part, _ := c.Cost(m, 500, 0)
	got, err := c.CostCached(m, 2000, 1500, 300)
	if err != nil {
		t.Fatal(err)
	}
	if got.PrefillFLOP != part.PrefillFLOP || got.DecodeBytes != whole.DecodeBytes || got.KVBytes != whole.KVBytes {
		t.Errorf("cached 1500 of 2000: %+v, want prefill %d, decode %d, KV %d", got, part.PrefillFLOP, whole.DecodeBytes, whole.KVBytes)
	}
	if got, _ := c.CostCached(m, 2000, 5000, 300); got.PrefillFLOP != 0 {
		t.Errorf("more cached than the prompt: prefill %d, want 0", got.PrefillFLOP)
	}
}
