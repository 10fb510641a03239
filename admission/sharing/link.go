package sharing

import (
	"sync/atomic"
	"time"

	"github.com/sluice-sched/sluice/pd"
)

// storeLink is what the batched and strict strategies share: the store,
// its breaker, N, the fallback state, and the counters metrics read.
type storeLink struct {
	v        View
	readings Readings // nil: no engine readings relayed
	store    Store
	opts     Options
	br       storeBreaker

	// Under the engine's lock.
	replicas int
	down     bool                       // the breaker is open: fail modes apply
	onDown   func(now int64, down bool) // the strategy's own fallback, on a change

	calls, decisions, failures atomic.Uint64
	lastOK                     atomic.Int64 // wall-clock unix nanoseconds of the last successful call
	overage                    [NumKinds]atomic.Int64
}

func newStoreLink(v View, r Readings, store Store, o Options) *storeLink {
	return &storeLink{
		v: v, readings: r, store: store, opts: o,
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
func probeEvery(o Options) time.Duration { return min(o.Cooldown, o.Interval) }

// answered counts the outcome of a store call made outside the lock.
func (s *storeLink) answered(err error) {
	s.v.Lock()
	defer s.v.Unlock()
	if err != nil {
		s.failedLocked()
	} else {
		s.okLocked()
	}
}

// probed counts the outcome of a probe of the open breaker: a success
// closes it.
func (s *storeLink) probed(err error) {
	s.v.Lock()
	defer s.v.Unlock()
	if err != nil {
		s.failedLocked()
		return
	}
	wall := s.v.Wall()
	s.lastOK.Store(wall.UnixNano())
	if s.br.recovered(wall) {
		s.setDownLocked(false)
	}
}

// failedLocked counts a failed store call; the breaker may open.
func (s *storeLink) failedLocked() {
	s.failures.Add(1)
	if s.br.failure(s.v.Wall()) {
		s.setDownLocked(true)
	}
}

// okLocked counts a successful store call. An open breaker stays open:
// only the prober closes it (probed), once the store has its resume
// report, so that no call that was in flight when it opened closes it
// before the store has heard what the replica took in fallback.
func (s *storeLink) okLocked() {
	s.lastOK.Store(s.v.Wall().UnixNano())
	s.br.success()
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
		s.onDown(s.v.NowLocked(), down)
	}
}

// refreshEvery is how often a domain this replica does not use is
// reported: every half hold, so that its KV holding never lapses, and at
// least every SilentHoldRounds/2 intervals, so that the KV a dead replica
// held, which the store lets go of when its membership lapses, comes back
// to a replica that does not use the domain within a few intervals of the
// lapse (a restarted replica keeps its member key, so the membership may
// never shrink).
func (s *storeLink) refreshEvery(hold time.Duration) time.Duration {
	return min(hold/2, SilentHoldRounds*s.opts.Interval/2)
}

// holdFor is how long this replica's holdings (batched: a round's;
// strict: its KV holds') outlive its silence: until its membership lapses (its member lease's expiry, were
// it renewed no more), so that the others reclaim what a dead replica's
// leases held once the membership says it is gone; SilentHoldRounds
// intervals where there is no membership, or it has lapsed (etcd
// unreachable: the reports alone say the replica lives); never past the
// lease TTL, when its leases would have expired anyway.
func (s *storeLink) holdFor(leaseTTL time.Duration) time.Duration {
	hold := SilentHoldRounds * s.opts.Interval
	if f := s.opts.MemberExpiry; f != nil {
		if until := f(); !until.IsZero() {
			hold = max(hold, until.Sub(s.v.Wall()))
		}
	}
	return min(hold, leaseTTL)
}

// gateLocked refuses a fail-closed tier while the store is unreachable.
func (s *storeLink) gateLocked(t Tenant) Refusal {
	if s.down && t.FailClosed() {
		return Refusal{Unavailable, probeEvery(s.opts)} // the next probe may find it back
	}
	return Refusal{}
}

// SetReplicasLocked implements Strategy.
func (s *storeLink) SetReplicasLocked(n int) { s.replicas = max(n, 1) }

// Status implements Strategy.
func (s *storeLink) Status() (Status, bool) {
	var st Status
	s.v.Lock()
	st.Mode, st.Replicas = s.opts.Mode, s.replicas
	s.v.Unlock()
	wall := s.v.Wall()
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

// OverageByKind implements Strategy.
func (s *storeLink) OverageByKind() (out [NumKinds]int64) {
	for k := range out {
		out[k] = s.overage[k].Load()
	}
	return out
}

// sliceTenant cuts a tenant's buckets to a 1/N slice of their bursts,
// refilling at 1/N of their rates, or not at all until a grant comes
// (refill false: a tenant new to this replica, whose refill before the
// store has heard of it would be taken from nobody's quota).
func (s *storeLink) sliceTenant(t Tenant, now int64, refill bool) {
	n := int64(s.replicas)
	for k, b := range t.Buckets() {
		rate := b.Rate() / n
		if !refill {
			rate = 0
		}
		credit := int64(0)
		if Kind(k) == KindTokens {
			credit = b.Credit() / n
		}
		level := min(b.Level(now), b.Burst()/n)
		b.SetLimits(rate, b.Burst(), credit)
		b.SetLevel(now, level)
	}
}

// sliceDomain cuts a domain's capacity to a 1/N share.
func (s *storeLink) sliceDomain(d Domain, now int64) {
	n := int64(s.replicas)
	c := d.Capacity()
	pr, dr, kv := c.FullLimits()
	pb, db := c.FullBursts()
	p, dc := c.Levels(now)
	c.ApplyShare(now, pd.ShareGrant{
		PrefillRate: pr / n, PrefillLevel: min(p, pb/n),
		DecodeRate: dr / n, DecodeLevel: min(dc, db/n),
		KVLimit: kv / n,
	})
}

// keepShare gives a rebuilt capacity the share of the domain this replica
// held of the old one (scaled to the domain's new size), or a 1/N slice
// for a new domain (old nil): until a grant, N replicas together hold one
// domain's capacity, not N.
func (s *storeLink) keepShare(now int64, d Domain, old *pd.DomainCapacity) {
	if old == nil {
		s.sliceDomain(d, now)
		return
	}
	c := d.Capacity()
	oldP, oldD, oldKV := old.FullLimits()
	newP, newD, newKV := c.FullLimits()
	shareP, shareD, shareKV := old.BaseLimits() // the share before any warm-up: the ramp carries over on its own
	p, dc := c.Levels(now)
	c.ApplyShare(now, pd.ShareGrant{
		PrefillRate: mulDiv(shareP, newP, oldP), PrefillLevel: p,
		DecodeRate: mulDiv(shareD, newD, oldD), DecodeLevel: dc,
		KVLimit: mulDiv(shareKV, newKV, oldKV),
	})
}
