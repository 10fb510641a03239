// Package tokenbucket is Sluice's token bucket: lazy refill on an injected
// monotonic time, all arithmetic in integers, bounded burst, full at start,
// arbitrary costs, an optional debt (credit) limit and an exact Retry-After.
//
// The level is an int64 count of units (requests, weighted tokens, FLOPs,
// bytes). Refill is rate·elapsed/1e9 computed in 128 bits with the sub-unit
// remainder carried between calls, so no refill is ever lost or invented by
// rounding, however often the bucket is read (unlike float64 buckets, whose
// drift is golang/go#34861).
//
// Times are int64 nanoseconds on any monotonic scale chosen by the caller.
// A time earlier than the last one seen refills nothing and is otherwise
// ignored, so a clock stepping back never makes elapsed time negative.
//
// A Bucket is not safe for concurrent use; its owner serialises access.
package tokenbucket

import (
	"math"
	"math/bits"
	"time"
)

const nanosPerSecond = uint64(time.Second)

// Never is the Retry-After of a request that can never fit the bucket.
const Never = time.Duration(math.MaxInt64)

// Bucket is a token bucket with integer fixed-point refill. The zero value is
// an empty bucket with no rate; use New.
type Bucket struct {
	rate   int64  // units per second, ≥ 0
	burst  int64  // the most the level may reach, ≥ 0
	credit int64  // how far below zero Allow may take the level, ≥ 0
	level  int64  // current units; negative means debt
	rem    uint64 // refill remainder in unit·nanoseconds, < 1e9
	last   int64  // last time seen, nanoseconds
	taken  int64  // net units taken since New, wrapping: what shared state reconciles
}

// New returns a full bucket refilling rate units per second up to burst, that
// may lend up to credit units below zero. Negative arguments are taken as 0.
func New(rate, burst, credit, now int64) Bucket {
	b := Bucket{last: now}
	b.SetLimits(rate, burst, credit)
	b.level = b.burst
	return b
}

// SetLimits changes rate, burst and credit, keeping the current level (cut to
// the new burst). It is how a hot-reloaded config reaches a live bucket.
func (b *Bucket) SetLimits(rate, burst, credit int64) {
	b.rate, b.burst, b.credit = max(rate, 0), max(burst, 0), max(credit, 0)
	if b.level > b.burst {
		b.level = b.burst
		b.rem = 0
	}
}

// Taken returns the net units taken since New (takes less refunds; refill
// does not count). It wraps around: only differences between two readings
// mean anything, which is how a shared-state reconciler measures what this
// bucket consumed between two reports.
func (b *Bucket) Taken() int64 { return b.taken }

// SetLevel moves the level to level (at most the burst) without counting it
// as taken or refunded: a shared-state grant replacing this replica's view
// of the global level.
func (b *Bucket) SetLevel(now, level int64) {
	b.advance(now)
	b.level = min(level, b.burst)
	b.rem = 0
}

// Rate returns the refill rate in units per second.
func (b *Bucket) Rate() int64 { return b.rate }

// Burst returns the capacity of the bucket.
func (b *Bucket) Burst() int64 { return b.burst }

// Credit returns how far below zero Allow may take the level.
func (b *Bucket) Credit() int64 { return b.credit }

// advance refills the bucket for the time elapsed since the last call.
func (b *Bucket) advance(now int64) {
	if now <= b.last {
		return
	}
	elapsed := uint64(now - b.last)
	b.last = now
	if b.level >= b.burst {
		b.rem = 0
		return
	}
	hi, lo := bits.Mul64(elapsed, uint64(b.rate))
	lo, carry := bits.Add64(lo, b.rem, 0)
	hi += carry
	if hi >= nanosPerSecond { // the quotient would not fit 64 bits: far more than any burst
		b.level, b.rem = b.burst, 0
		return
	}
	add, rem := bits.Div64(hi, lo, nanosPerSecond)
	room := uint64(b.burst - b.level) // level < burst here
	if add >= room {
		b.level, b.rem = b.burst, 0
		return
	}
	b.level += int64(add)
	b.rem = rem
}

// Level returns the level at now (negative while in debt).
func (b *Bucket) Level(now int64) int64 {
	b.advance(now)
	return b.level
}

// Fits reports whether n units can be taken at now leaving at least min
// units behind. Allow uses min = -credit; a reserve watermark uses min > 0.
func (b *Bucket) Fits(now, n, min int64) bool {
	b.advance(now)
	return fits(b.level, n, min)
}

// fits reports whether level − n ≥ min in exact arithmetic. The plain int64
// expression wraps for large n (a bucket in debt would then let a huge n
// through); here every difference taken fits in a uint64.
func fits(level, n, min int64) bool {
	if level >= min { // level − min ∈ [0, 2⁶⁴)
		return n <= 0 || uint64(level-min) >= uint64(n)
	}
	// min − level ∈ (0, 2⁶⁴); only a negative n can make up for it.
	return n < 0 && uint64(-n) >= uint64(min-level)
}

// Allow takes n units at now if that leaves the level at or above -credit,
// and reports whether it did.
func (b *Bucket) Allow(now, n int64) bool {
	return b.TakeAbove(now, n, -b.credit)
}

// TakeAbove takes n units at now if that leaves at least min units behind,
// and reports whether it did.
func (b *Bucket) TakeAbove(now, n, min int64) bool {
	if !b.Fits(now, n, min) {
		return false
	}
	b.level -= n
	b.taken += n
	return true
}

// Take takes n units at now unconditionally; the level may fall below -credit.
// It charges work already done, such as an overrun reported at Release.
func (b *Bucket) Take(now, n int64) {
	b.advance(now)
	b.level -= n
	b.taken += n
}

// Refund returns n units taken earlier, never past burst.
func (b *Bucket) Refund(now, n int64) {
	b.advance(now)
	b.taken -= n
	b.level = min(b.level+n, b.burst)
	if b.level == b.burst {
		b.rem = 0
	}
}

// RetryAfter returns how long after now the bucket will let n units be taken
// leaving at least min behind: 0 if it already does, Never if it never will
// (n is above what the bucket can ever hold, or it does not refill).
func (b *Bucket) RetryAfter(now, n, min int64) time.Duration {
	b.advance(now)
	if fits(b.level, n, min) {
		return 0
	}
	if b.rate == 0 || !fits(b.burst, n, min) {
		return Never
	}
	// Here level < n + min ≤ burst, so the units still to refill,
	// need = n + min − level, lie in [1, burst − level] ⊂ [1, 2⁶⁴).
	need := uint64(n + min - b.level)
	// ceil((need·1e9 − rem) / rate) nanoseconds.
	hi, lo := bits.Mul64(need, nanosPerSecond)
	lo, borrow := bits.Sub64(lo, b.rem, 0)
	hi -= borrow
	if hi >= uint64(b.rate) {
		return Never
	}
	q, r := bits.Div64(hi, lo, uint64(b.rate))
	if r != 0 {
		q++
	}
	if now < b.last {
		// The clock stepped back: refill resumes only at last, not now.
		var c uint64
		q, c = bits.Add64(q, uint64(b.last-now), 0)
		if c != 0 {
			return Never
		}
	}
	if q > math.MaxInt64 {
		return Never
	}
	return time.Duration(q)
}

// AllowRetryAfter is RetryAfter for Allow's limit (min = -credit).
func (b *Bucket) AllowRetryAfter(now, n int64) time.Duration {
	return b.RetryAfter(now, n, -b.credit)
}
