package tokenbucket

import (
	"math"
	"math/big"
	"slices"
	"testing"
	"time"

	"golang.org/x/time/rate"
	"pgregory.net/rapid"
)

const sec = int64(time.Second)

// step is one call in a table test: at time t, Allow(t, n) must answer ok and
// leave Level(t) == level.
type step struct {
	t     int64
	n     int64
	ok    bool
	level int64
}

func run(t *testing.T, b *Bucket, steps []step) {
	t.Helper()
	for i, s := range steps {
		if ok := b.Allow(s.t, s.n); ok != s.ok {
			t.Errorf("step %d: Allow(%d, %d) = %v, want %v", i, s.t, s.n, ok, s.ok)
		}
		if got := b.Level(s.t); got != s.level {
			t.Errorf("step %d: Level(%d) = %d, want %d", i, s.t, got, s.level)
		}
	}
}

func TestAllowTable(t *testing.T) {
	tests := []struct {
		name                string
		rate, burst, credit int64
		steps               []step
	}{
		{
			name: "burst of C passes, C+1-th fails",
			rate: 10, burst: 5,
			steps: []step{
				{0, 1, true, 4}, {0, 1, true, 3}, {0, 1, true, 2}, {0, 1, true, 1},
				{0, 1, true, 0}, {0, 1, false, 0},
				{sec/10 - 1, 1, false, 0}, // one refill is 100ms away
				{sec / 10, 1, true, 0},
				{sec / 10, 1, false, 0},
			},
		},
		{
			name: "costs above one",
			rate: 10, burst: 10,
			steps: []step{
				{0, 7, true, 3},
				{0, 4, false, 3}, // a refusal takes nothing
				{0, 3, true, 0},
				{4 * sec / 10, 5, false, 4},
				{4 * sec / 10, 4, true, 0},
				{100 * sec, 11, false, 10}, // above burst: never, however long the wait
				{100 * sec, 10, true, 0},
			},
		},
		{
			name: "debt down to the credit limit, not beyond",
			rate: 10, burst: 10, credit: 5,
			steps: []step{
				{0, 10, true, 0},
				{0, 5, true, -5},
				{0, 1, false, -5},
				{sec / 2, 6, false, 0}, // the debt was repaid from refill first
				{sec / 2, 5, true, -5},
				{2 * sec, 16, false, 10},
				{2 * sec, 15, true, -5},
			},
		},
		{
			name: "clock stepping back adds nothing",
			rate: 10, burst: 10,
			steps: []step{
				{10 * sec, 10, true, 0},
				{5 * sec, 1, false, 0},                    // back 5 s: nothing refilled
				{math.MinInt64, 1, false, 0},              // back to the dawn of time
				{10 * sec, 1, false, 0},                   // the old time again: still nothing
				{10*sec + sec/10 - 1, 1, false, 0},        // forward from the old time only
				{10*sec + sec/10, 1, true, 0},             // ... where refill is exact
				{10*sec + sec/10 + sec/20, 1, false, 0},   // half a unit carried
				{10*sec + 2*sec/10 - 1, 1, false, 0},      // ... not yet whole
				{10*sec + 2*sec/10, 1, true, 0},           // whole
				{10*sec + 2*sec/10 - sec, 1, false, 0},    // back again
				{10*sec + 2*sec/10 + sec/10, 1, true, 0},  // no double count of the gap
				{10*sec + 2*sec/10 + sec/10, 1, false, 0}, //
			},
		},
		{
			name: "hours idle never exceed burst",
			rate: 1_000_000_000, burst: 100,
			steps: []step{
				{0, 100, true, 0},
				{int64(3 * time.Hour), 100, true, 0},
				{int64(3 * time.Hour), 1, false, 0},
				{int64(1000 * time.Hour), 101, false, 100},
			},
		},
		{
			name: "elapsed beyond 128-bit product and beyond int64",
			rate: math.MaxInt64, burst: math.MaxInt64 - 1, credit: 0,
			steps: []step{
				{math.MinInt64, math.MaxInt64 - 1, true, 0},
				// rate·elapsed ≈ 2¹²⁷ > 1e9·2⁶⁴: the quotient cannot fit 64 bits.
				{math.MaxInt64, math.MaxInt64, false, math.MaxInt64 - 1},
				{math.MaxInt64, math.MaxInt64 - 1, true, 0},
			},
		},
		{
			name: "huge cost in debt does not wrap",
			rate: 10, burst: 10, credit: 10,
			steps: []step{
				{0, 15, true, -5},
				{0, math.MaxInt64, false, -5},
				{0, math.MaxInt64 - 2, false, -5},
				{sec, math.MaxInt64, false, 5},
			},
		},
		{
			name: "zero rate never refills",
			rate: 0, burst: 3,
			steps: []step{
				{0, 3, true, 0},
				{1000 * sec, 1, false, 0},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := tt.steps[0].t
			b := New(tt.rate, tt.burst, tt.credit, start)
			if got := b.Level(start); got != tt.burst {
				t.Fatalf("new bucket level = %d, want full (%d)", got, tt.burst)
			}
			run(t, &b, tt.steps)
		})
	}
}

// ceilDiv returns ⌈a·b/c⌉ for the small positive operands the tests use.
func ceilDiv(a, b, c int64) int64 {
	p := new(big.Int).Mul(big.NewInt(a), big.NewInt(b))
	p.Add(p, big.NewInt(c-1))
	return p.Quo(p, big.NewInt(c)).Int64()
}

// TestExactRate asks for one unit at each instant the i-th unit is due, for
// rates that do not divide a second: every ask passes, one nanosecond earlier
// fails, and a second ask at the same instant fails. Over 100 s of refills no
// unit is lost or invented.
func TestExactRate(t *testing.T) {
	for _, r := range []int64{1, 3, 7, 1000, 999_983, 999_999_937, 1_000_000_000} {
		asks := min(r*100, 300_000) // 100 s, or as many asks as keep the test quick
		// Burst 2, drained: each due unit lifts the level to 1, never to the
		// cap, where a full bucket rightly drops the sub-unit overshoot.
		b := New(r, 2, 0, 0)
		if !b.Allow(0, 2) {
			t.Fatalf("rate %d: first ask refused", r)
		}
		for i := int64(1); i <= asks; i++ {
			due := ceilDiv(i, sec, r) // the first instant the i-th unit has refilled
			if b.Allow(due-1, 1) {
				t.Fatalf("rate %d: ask %d passed at %d, 1ns before due", r, i, due-1)
			}
			if !b.Allow(due, 1) {
				t.Fatalf("rate %d: ask %d refused at %d", r, i, due)
			}
			if b.Allow(due, 1) {
				t.Fatalf("rate %d: one more ask passed at %d", r, due)
			}
		}
	}
}

func TestSetLimitsClampsLevel(t *testing.T) {
	b := New(10, 10, 0, 0)
	b.SetLimits(10, 4, 0)
	if got := b.Level(0); got != 4 {
		t.Fatalf("after shrinking burst to 4: level %d, want 4", got)
	}
	b.SetLimits(10, 20, 3)
	if got := b.Level(0); got != 4 {
		t.Fatalf("raising burst must not refill: level %d, want 4", got)
	}
	if !b.Allow(0, 7) || b.Level(0) != -3 {
		t.Fatalf("new credit 3 not honoured: level %d", b.Level(0))
	}
	if got := b.Level(2 * sec); got != 17 {
		t.Fatalf("refill after 2 s at 10/s: level %d, want 17", got)
	}
	if got := b.Level(10 * sec); got != 20 {
		t.Fatalf("refill caps at the new burst: level %d, want 20", got)
	}
	b.SetLimits(-1, -1, -1)
	if b.Rate() != 0 || b.Burst() != 0 || b.Credit() != 0 || b.Level(11*sec) != 0 {
		t.Fatalf("negative limits not taken as 0: %+v", b)
	}
}

func TestRetryAfterTable(t *testing.T) {
	b := New(10, 10, 5, 0)
	for _, tc := range []struct {
		n, min int64
		want   time.Duration
	}{
		{10, 0, 0},
		{11, 0, Never},             // above burst
		{15, -5, 0},                // into full debt
		{16, -5, Never},            // beyond credit
		{math.MaxInt64, -5, Never}, // would wrap
		{1, 10, Never},             // watermark at burst leaves no room
		{0, 10, 0},
	} {
		if got := b.RetryAfter(0, tc.n, tc.min); got != tc.want {
			t.Errorf("RetryAfter(0, %d, %d) = %v, want %v", tc.n, tc.min, got, tc.want)
		}
	}
	// After the clock steps back the wait counts from the latest time seen.
	s := New(1, 1, 0, 10*sec)
	s.Allow(10*sec, 1)
	if got, want := s.AllowRetryAfter(7*sec, 1), 4*time.Second; got != want {
		t.Errorf("RetryAfter after a step back = %v, want %v", got, want)
	}
	z := New(0, 10, 0, 0)
	z.Allow(0, 10)
	if got := z.AllowRetryAfter(0, 1); got != Never {
		t.Errorf("zero rate: RetryAfter = %v, want Never", got)
	}
}

// op is one random operation applied to a bucket in the property tests.
type op struct {
	dt   int64 // time step; may be negative (a clock stepping back)
	kind int   // 0 Allow, 1 Take, 2 Refund, 3 Level
	n    int64
}

func drawOps(t *rapid.T, maxN int64) []op {
	return rapid.SliceOfN(rapid.Custom(func(t *rapid.T) op {
		return op{
			dt:   rapid.Int64Range(-sec, 5*sec).Draw(t, "dt"),
			kind: rapid.IntRange(0, 3).Draw(t, "kind"),
			n:    rapid.Int64Range(0, maxN).Draw(t, "n"),
		}
	}), 0, 40).Draw(t, "ops")
}

func apply(b *Bucket, now int64, o op) {
	switch o.kind {
	case 0:
		b.Allow(now, o.n)
	case 1:
		b.Take(now, o.n)
	case 2:
		b.Refund(now, o.n)
	default:
		b.Level(now)
	}
}

// TestRetryAfterExact: from any reachable state, waiting exactly RetryAfter
// makes the take succeed and waiting one nanosecond less does not.
func TestRetryAfterExact(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := rapid.OneOf(rapid.Int64Range(1, 1000), rapid.Int64Range(1, 1_000_000_000_000)).Draw(t, "rate")
		burst := rapid.Int64Range(0, 1_000_000).Draw(t, "burst")
		credit := rapid.Int64Range(0, 1_000_000).Draw(t, "credit")
		now := rapid.Int64Range(-1e12, 1e12).Draw(t, "start")
		b := New(r, burst, credit, now)
		for _, o := range drawOps(t, burst+credit+1) {
			now += o.dt
			apply(&b, now, o)
		}
		n := rapid.Int64Range(1, burst+credit+1).Draw(t, "n")
		min := rapid.OneOf(rapid.Just(-credit), rapid.Int64Range(-credit, burst)).Draw(t, "min")

		wait := b.RetryAfter(now, n, min)
		switch {
		case wait == Never:
			if n+min <= burst {
				t.Fatalf("Never for n+min = %d ≤ burst %d at rate %d", n+min, burst, r)
			}
			c := b
			if c.TakeAbove(now+int64(time.Hour)*1e6, n, min) {
				t.Fatalf("Never, yet the take passed later")
			}
		case wait == 0:
			c := b
			if !c.TakeAbove(now, n, min) {
				t.Fatalf("RetryAfter 0 but the take fails now")
			}
		default:
			early, onTime := b, b
			if early.TakeAbove(now+int64(wait)-1, n, min) {
				t.Fatalf("take passed 1ns before RetryAfter %v", wait)
			}
			if !onTime.TakeAbove(now+int64(wait), n, min) {
				t.Fatalf("take failed exactly at RetryAfter %v (level %d, n %d, min %d)", wait, b.level, n, min)
			}
		}
		if min == -credit && b.AllowRetryAfter(now, n) != wait {
			t.Fatalf("AllowRetryAfter differs from RetryAfter(-credit)")
		}
	})
}

// model is an exact rational token bucket: the level refills by
// rate·Δt/1e9 with no rounding at all and stops at burst. The integer
// bucket must always read the floor of it.
type model struct {
	rate, burst, credit int64
	level               *big.Rat
	last                int64
}

func (m *model) advance(now int64) {
	if now <= m.last {
		return
	}
	add := new(big.Rat).SetFrac(
		new(big.Int).Mul(big.NewInt(m.rate), new(big.Int).Sub(big.NewInt(now), big.NewInt(m.last))),
		big.NewInt(sec))
	m.level.Add(m.level, add)
	if b := new(big.Rat).SetInt64(m.burst); m.level.Cmp(b) > 0 {
		m.level = b
	}
	m.last = now
}

func (m *model) floor() int64 {
	return new(big.Int).Div(m.level.Num(), m.level.Denom()).Int64() // Euclidean: floor for positive denominators
}

func (m *model) apply(now int64, o op) {
	m.advance(now)
	n := new(big.Rat).SetInt64(o.n)
	switch o.kind {
	case 0:
		if m.floor()-o.n >= -m.credit {
			m.level.Sub(m.level, n)
		}
	case 1:
		m.level.Sub(m.level, n)
	case 2:
		m.level.Add(m.level, n)
		if b := new(big.Rat).SetInt64(m.burst); m.level.Cmp(b) > 0 {
			m.level = b
		}
	}
}

// TestAgainstExactModel: over random operations (including clock steps back),
// the bucket's level is the floor of an exact rational bucket, never above
// burst, and never below -credit through Allow alone.
func TestAgainstExactModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := rapid.OneOf(rapid.Int64Range(0, 100), rapid.Int64Range(0, 1e12)).Draw(t, "rate")
		burst := rapid.Int64Range(0, 1000).Draw(t, "burst")
		credit := rapid.Int64Range(0, 1000).Draw(t, "credit")
		now := rapid.Int64Range(-1e12, 1e12).Draw(t, "start")
		b := New(r, burst, credit, now)
		m := &model{rate: r, burst: burst, credit: credit, level: new(big.Rat).SetInt64(burst), last: now}
		for i, o := range drawOps(t, burst+credit+2) {
			now += o.dt
			apply(&b, now, o)
			m.apply(now, o)
			if got, want := b.Level(now), m.floor(); got != want {
				t.Fatalf("op %d %+v: level %d, exact model %d", i, o, got, want)
			}
			if b.Level(now) > burst {
				t.Fatalf("op %d: level %d above burst %d", i, b.Level(now), burst)
			}
		}
	})
}

// TestNoDrift: reading the bucket at any partition of an interval refills
// exactly what one read at the end does, floor(rate·interval/1e9): the
// sub-unit remainder is carried, so no unit is lost or made up.
func TestNoDrift(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := rapid.Int64Range(1, 1e12).Draw(t, "rate")
		start := rapid.Int64Range(-1e15, 1e15).Draw(t, "start")
		cuts := rapid.SliceOfN(rapid.Int64Range(0, 1e11), 0, 200).Draw(t, "cuts")
		end := start + rapid.Int64Range(0, 1e11).Draw(t, "interval")
		cuts = append(cuts, 0)
		slices.Sort(cuts)

		const burst = math.MaxInt64 / 2 // never reached: refill is never cut
		parts, whole := New(r, burst, 0, start), New(r, burst, 0, start)
		parts.Take(start, burst)
		whole.Take(start, burst)
		var prev int64
		for _, c := range cuts {
			at := min(start+c, end)
			got := parts.Level(at)
			if got < prev {
				t.Fatalf("level fell from %d to %d with no take", prev, got)
			}
			prev = got
			exact := new(big.Int).Mul(big.NewInt(r), big.NewInt(at-start))
			if exact.Quo(exact, big.NewInt(sec)); got != exact.Int64() {
				t.Fatalf("after %dns: refilled %d, want %d", at-start, got, exact.Int64())
			}
		}
		want := new(big.Int).Mul(big.NewInt(r), big.NewInt(end-start))
		want.Quo(want, big.NewInt(sec))
		if got := parts.Level(end); got != want.Int64() {
			t.Fatalf("partitioned refill %d, want %d", got, want.Int64())
		}
		if got := whole.Level(end); got != want.Int64() {
			t.Fatalf("single refill %d, want %d", got, want.Int64())
		}
	})
}

// BenchmarkAllow measures one decision at a fixed time beside
// golang.org/x/time/rate's AllowN, the yardstick in STYLE.md. "fixed" asks at
// one instant (every ask but the first refused, as in x/time/rate's own
// benchmark); "advancing" moves time 1µs per ask at 1e6/s so each one refills
// and passes.
func BenchmarkAllow(b *testing.B) {
	b.Run("sluice/fixed", func(b *testing.B) {
		bk := New(1, 1, 0, 0)
		b.ReportAllocs()
		for b.Loop() {
			bk.Allow(1, 1)
		}
	})
	b.Run("x-time-rate/fixed", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Every(time.Second), 1)
		now := time.Unix(0, 0)
		b.ReportAllocs()
		for b.Loop() {
			lim.AllowN(now, 1)
		}
	})
	b.Run("sluice/advancing", func(b *testing.B) {
		bk := New(1_000_000, 1, 0, 0)
		var now int64
		b.ReportAllocs()
		for b.Loop() {
			now += int64(time.Microsecond)
			if !bk.Allow(now, 1) {
				b.Fatal("refused")
			}
		}
	})
	b.Run("x-time-rate/advancing", func(b *testing.B) {
		lim := rate.NewLimiter(1_000_000, 1)
		now := time.Unix(0, 0)
		b.ReportAllocs()
		for b.Loop() {
			now = now.Add(time.Microsecond)
			lim.AllowN(now, 1) // float64 refill: may refuse now and then (drift)
		}
	})
}

func TestTakenCountsNetTakesNotRefill(t *testing.T) {
	b := New(100, 1000, 500, 0)
	b.Take(0, 300)
	if !b.TakeAbove(0, 200, 0) {
		t.Fatal("TakeAbove refused 200 of 700")
	}
	b.Refund(1e9, 50) // the refill of 100 over the second is not taken
	if got := b.Taken(); got != 450 {
		t.Errorf("Taken = %d, want 300+200-50 = 450", got)
	}
	if b.Allow(1e9, 10_000) { // refused: not taken
		t.Fatal("Allow of 10000 succeeded")
	}
	if got := b.Taken(); got != 450 {
		t.Errorf("after a refused Allow, Taken = %d, want 450", got)
	}
}

func TestSetLevelIsNotCountedAndCapsAtBurst(t *testing.T) {
	b := New(100, 1000, 0, 0)
	b.SetLevel(0, -40)
	if got := b.Level(0); got != -40 {
		t.Errorf("Level after SetLevel(-40) = %d", got)
	}
	b.SetLevel(0, 5000)
	if got := b.Level(0); got != 1000 {
		t.Errorf("Level after SetLevel(5000) = %d, want the burst 1000", got)
	}
	if got := b.Taken(); got != 0 {
		t.Errorf("SetLevel changed Taken to %d", got)
	}
}
