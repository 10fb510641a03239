package admission

import (
	"math"
	"math/bits"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluice-sched/sluice/pd"
)

// bucketKind names the buckets that shared state keeps.
type bucketKind uint8

const (
	kindRPS bucketKind = iota
	kindTokens
	kindFloor
	kindCritical
	kindPrefill
	kindDecode
	numKinds
)

var kindSuffix = [numKinds]string{"rps", "tok", "floor", "crit", "pf", "dc"}

// KindNames are the bucket kinds as metrics label them, by kind.
var KindNames = [numKinds]string{"rps", "tokens", "floor", "critical", "prefill", "decode"}

// Store keys: "t/<tenant>/<kind>", "d/<domain>/<kind>", "d/<domain>/kv".
// The adapter adds its prefix and hash tag.
func tenantKey(name string, k bucketKind) string { return "t/" + name + "/" + kindSuffix[k] }
func domainKey(id string, k bucketKind) string   { return "d/" + id + "/" + kindSuffix[k] }
func kvKey(id string) string                     { return "d/" + id + "/kv" }

// replicaLease names a lease in the store: unique across replicas.
func replicaLease(replica string, id uint64) string {
	return replica + "/" + strconv.FormatUint(id, 10)
}

// tenantLimits returns the whole (all-replica) rate and burst of a tenant
// bucket, from its policy.
func tenantLimits(t *tenantState, k bucketKind) (rate, burst int64) {
	p := &t.policy
	switch k {
	case kindRPS:
		return roundUnits(p.RPS.Rate * rpsUnit), roundUnits(p.RPS.Burst * rpsUnit)
	case kindTokens:
		return roundUnits(p.Tokens.Rate), roundUnits(p.Tokens.Burst)
	case kindFloor:
		return p.Floor, p.Floor
	}
	return roundUnits(p.Critical.Rate), roundUnits(p.Critical.Burst)
}

// scaleFor returns the unit a bucket of this rate and burst is reported in:
// a power of two keeping both below 2^32 units, so that cumulative counters
// modulo CumModulus wrap only after days and Lua's doubles stay exact.
func scaleFor(rate, burst int64) int64 {
	n := bits.Len64(uint64(max(rate, burst, 1)))
	if n <= 32 {
		return 1
	}
	return 1 << (n - 32)
}

// mulDiv returns a·b/c for non-negative a, b and positive c, saturating.
func mulDiv(a, b, c int64) int64 {
	if a <= 0 || b <= 0 || c <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(min(q, math.MaxInt64))
}

// floorDiv is a/b rounded down (toward −∞), b positive.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return a / b
	}
	return (a + b - 1) / b
}

// storeLink is what the batched and strict strategies share: the store,
// its breaker, N, the fallback state, and the counters metrics read.
type storeLink struct {
	e     *Engine
	store SharedState
	opts  SharedOptions
	br    storeBreaker

	// Under Engine.mu.
	replicas int
	down     bool                       // the breaker is open: fail modes apply
	onDown   func(now int64, down bool) // the strategy's own fallback, on a change

	calls, decisions, failures atomic.Uint64
	lastOK                     atomic.Int64 // wall-clock unix nanoseconds of the last successful call
	overage                    [numKinds]atomic.Int64
}

func newStoreLink(e *Engine, store SharedState, o SharedOptions) *storeLink {
	return &storeLink{
		e: e, store: store, opts: o,
		br:       storeBreaker{limit: o.Failures, cooldown: probeEvery(o) / 2},
		replicas: o.Replicas,
	}
}

// probeEvery is how often the background loop calls the store while the
// breaker is open: every reconcile interval at most, so that replicas are
// all back within an interval or two of the store's return (one that
// probed only every cool-down would keep deciding on its fallback for up
// to a cool-down while the others were granted the rate it still uses).
// The breaker itself lets a probe through every half of that, so that a
// tick that fires a little early is not turned away for another period.
func probeEvery(o SharedOptions) time.Duration { return min(o.Cooldown, o.Interval) }

// answered counts the outcome of a store call made outside the lock.
func (s *storeLink) answered(err error) {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	if err != nil {
		s.failedLocked()
	} else {
		s.okLocked()
	}
}

// failedLocked counts a failed store call; the breaker may open.
func (s *storeLink) failedLocked() {
	s.failures.Add(1)
	if s.br.failure(s.e.clk.Now()) {
		s.setDownLocked(true)
	}
}

// okLocked counts a successful store call; an open breaker closes.
func (s *storeLink) okLocked() {
	wall := s.e.clk.Now()
	s.lastOK.Store(wall.UnixNano())
	if s.br.success(wall) {
		s.setDownLocked(false)
	}
}

// setDownLocked enters or leaves fallback.
func (s *storeLink) setDownLocked(down bool) {
	if s.down == down {
		return
	}
	s.down = down
	if s.opts.OnBreaker != nil {
		s.opts.OnBreaker(down)
	}
	if s.onDown != nil {
		s.onDown(s.e.nowLocked(), down)
	}
}

// gateLocked refuses a fail-closed tier while the store is unreachable.
func (s *storeLink) gateLocked(t *tenantState) refusal {
	if s.down && t.policy.FailMode == FailClosed {
		return refusal{ReasonStateUnavailable, probeEvery(s.opts)} // the next probe may find it back
	}
	return refusal{}
}

func (s *storeLink) setReplicasLocked(n int) { s.replicas = max(n, 1) }

func (s *storeLink) status() (SharedStatus, bool) {
	var st SharedStatus
	s.e.mu.Lock()
	st.Mode, st.Replicas = s.opts.Mode, s.replicas
	s.e.mu.Unlock()
	wall := s.e.clk.Now()
	st.BreakerOpen, st.FallbackSeconds = s.br.status(wall)
	if last := s.lastOK.Load(); last != 0 {
		st.ReconcileLag = wall.Sub(time.Unix(0, last))
	}
	for k := range s.overage {
		st.Overage += s.overage[k].Load()
	}
	st.Calls, st.Decisions, st.Failures = s.calls.Load(), s.decisions.Load(), s.failures.Load()
	return st, true
}

func (s *storeLink) overageByKind() (out [numKinds]int64) {
	for k := range out {
		out[k] = s.overage[k].Load()
	}
	return out
}

// sliceTenant cuts a tenant's buckets to a 1/N slice of their bursts,
// refilling at 1/N of their rates, or not at all until a grant comes
// (refill false: a tenant new to this replica, whose refill before the
// store has heard of it would be taken from nobody's quota).
func (s *storeLink) sliceTenant(t *tenantState, now int64, refill bool) {
	n := int64(s.replicas)
	for k, b := range t.buckets() {
		rate := b.Rate() / n
		if !refill {
			rate = 0
		}
		credit := int64(0)
		if bucketKind(k) == kindTokens {
			credit = b.Credit() / n
		}
		level := min(b.Level(now), b.Burst()/n)
		b.SetLimits(rate, b.Burst(), credit)
		b.SetLevel(now, level)
	}
}

// sliceDomain cuts a domain's capacity to a 1/N share.
func (s *storeLink) sliceDomain(d *domainState, now int64) {
	n := int64(s.replicas)
	pr, dr, kv := d.cap.FullLimits()
	pb, db := d.cap.FullBursts()
	p, dc := d.cap.Levels(now)
	d.cap.ApplyShare(now, pd.ShareGrant{
		PrefillRate: pr / n, PrefillLevel: min(p, pb/n),
		DecodeRate: dr / n, DecodeLevel: min(dc, db/n),
		KVLimit: kv / n,
	})
}

// keepShare gives a rebuilt capacity the share of the domain this replica
// held of the old one (scaled to the domain's new size), or a 1/N slice
// for a new domain (old nil): until a grant, N replicas together hold one
// domain's capacity, not N.
func (s *storeLink) keepShare(now int64, d *domainState, old *pd.DomainCapacity) {
	if old == nil {
		s.sliceDomain(d, now)
		return
	}
	oldP, oldD, oldKV := old.FullLimits()
	newP, newD, newKV := d.cap.FullLimits()
	shareP, shareD, shareKV := old.BaseLimits() // the share before any warm-up: the ramp carries over on its own
	p, dc := d.cap.Levels(now)
	d.cap.ApplyShare(now, pd.ShareGrant{
		PrefillRate: mulDiv(shareP, newP, oldP), PrefillLevel: p,
		DecodeRate: mulDiv(shareD, newD, oldD), DecodeLevel: dc,
		KVLimit: mulDiv(shareKV, newKV, oldKV),
	})
}
