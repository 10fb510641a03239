package sharing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/pd"
)

// strictState is the strict strategy. The engine decides locally on whole
// buckets, as if alone, and then confirms every admission with one atomic
// store call that takes the tenant's and the domain's amounts from the
// shared buckets or refuses them all; a refusal cancels the local charge
// and answers REJECTED with the store's reason and Retry-After. Release
// settles the difference in the store. When the store cannot be reached,
// fail-open tiers keep the local admission, decided from a 1/N slice of
// every bucket while the breaker is open (an admission decided on the
// whole buckets before it opened counts against the slices: keepLocked),
// and fail-closed tiers are refused with STATE_UNAVAILABLE.
type strictState struct {
	*storeLink

	// Under the engine's lock.
	commits   map[uint64]*pendingCommit // leases whose commit is in flight
	committed map[uint64]struct{}       // leases the store may hold a charge for
	lastPrune int64
	known     map[string]knownLevel // per store key, its level after this replica's last commit
	// alive is, per KV gauge this replica holds leases in, the engine time
	// the store last heard from it there: its holds there outlive its
	// silence by KVHold.Alive, and Reconcile renews them when due.
	alive  map[string]int64
	downAt int64 // when the breaker last opened
	// unsure are the charges of fail-open admissions kept although their
	// commit failed, while the breaker was still closed: decided on the
	// whole local buckets, they are taken from the slices when the breaker
	// opens (see keepLocked). Emptied when the store answers a commit.
	unsure []Charge
	// sliced are the leases whose charge keepLocked took from the slices:
	// an idempotent duplicate of the admission asks again, and must find
	// it judged once, not charged a second time.
	sliced map[uint64]struct{}
}

// knownLevel is a store bucket's level as a commit last returned it, in
// the commit's scaled units.
type knownLevel struct {
	level, rate, burst int64
	at                 int64 // engine time
}

func newStrictState(link *storeLink) *strictState {
	s := &strictState{
		storeLink: link,
		commits:   make(map[uint64]*pendingCommit),
		committed: make(map[uint64]struct{}),
		sliced:    make(map[uint64]struct{}),
		known:     make(map[string]knownLevel),
		alive:     make(map[string]int64),
	}
	link.onDown = s.fallbackLocked
	return s
}

// fallbackLocked follows the breaker: the local buckets, whole while the
// store decides, are cut to a 1/N slice while it cannot, and made whole
// again when it returns. A slice starts from this replica's share of the
// level the store last returned (refilled since), not from a share of the
// burst: the local whole buckets know nothing of the other replicas'
// takes, and a tenant held at its limit would otherwise get a fresh burst
// at every outage.
func (s *strictState) fallbackLocked(now int64, down bool) {
	if down {
		s.downAt = now
	}
	for t := range s.v.TenantsLocked() {
		t.ResetLimits(now)
		if !down {
			continue
		}
		s.sliceTenant(t, now, true)
		for k, b := range t.Buckets() {
			rate, burst := t.Limits(Kind(k))
			if share, ok := s.knownShare(tenantKey(t.Name(), Kind(k)), scaleFor(rate, burst), now); ok && share < b.Level(now) {
				b.SetLevel(now, share)
			}
		}
	}
	for d := range s.v.DomainsLocked() {
		if !down {
			d.RestoreCapacity()
			continue
		}
		s.sliceDomain(d, now)
		n := int64(s.replicas)
		c := d.Capacity()
		pr, dr, kv := c.FullLimits()
		pb, db := c.FullBursts()
		p, dc := c.Levels(now)
		if share, ok := s.knownShare(domainKey(d.ID(), KindPrefill), scaleFor(pr, pb), now); ok {
			p = min(p, share)
		}
		if share, ok := s.knownShare(domainKey(d.ID(), KindDecode), scaleFor(dr, db), now); ok {
			dc = min(dc, share)
		}
		c.ApplyShare(now, pd.ShareGrant{PrefillRate: pr / n, PrefillLevel: p, DecodeRate: dr / n, DecodeLevel: dc, KVLimit: kv / n})
	}
	if down {
		for i := range s.unsure {
			takeSlice(now, &s.unsure[i]) // answered already: into debt if need be
		}
	}
	s.unsure = s.unsure[:0]
}

// knownShare returns this replica's 1/N share of a store bucket's level
// as its last commit returned it, refilled since, in units (the store's
// are scaled by scale).
func (s *strictState) knownShare(key string, scale, now int64) (int64, bool) {
	k, ok := s.known[key]
	if !ok {
		return 0, false
	}
	level := k.level
	if k.rate > 0 && now > k.at {
		level = min(k.burst, level+mulDiv(k.rate, now-k.at, int64(time.Second)))
	}
	return floorDiv(level*scale, int64(s.replicas)), true
}

// resumeReportLocked is what this replica holds of every shared bucket
// after an outage: its slices' levels, which refilled at 1/N of the rate
// while it admitted from them. Sent before the breaker closes, it lets a
// store that lost the buckets, or heard nothing of them for the outage,
// rebuild them from what the replicas hold instead of starting full
// (which would admit a burst on top of the outage's takes): see
// BucketReport.Resume.
func (s *strictState) resumeReportLocked(now int64) *ReconcileRequest {
	req := &ReconcileRequest{
		Replica: s.opts.Replica, Replicas: s.replicas,
		Stale: staleRounds * s.opts.Interval, Rejoin: rejoinRounds * s.opts.Interval,
	}
	add := func(key string, rate, burst, level int64) {
		sc := scaleFor(rate, burst)
		req.Buckets = append(req.Buckets, BucketReport{
			Key: key, Rate: rate / sc, Burst: burst / sc,
			Resume: true, Held: floorDiv(level, sc), Span: time.Duration(now - s.downAt),
		})
	}
	for t := range s.v.TenantsLocked() {
		for k, b := range t.Buckets() {
			if rate, burst := t.Limits(Kind(k)); rate != 0 || burst != 0 {
				add(tenantKey(t.Name(), Kind(k)), rate, burst, b.Level(now))
			}
		}
	}
	for d := range s.v.DomainsLocked() {
		if d.Removed() {
			continue
		}
		c := d.Capacity()
		pr, dr, _ := c.FullLimits()
		pb, db := c.FullBursts()
		p, dc := c.Levels(now)
		add(domainKey(d.ID(), KindPrefill), pr, pb, p)
		add(domainKey(d.ID(), KindDecode), dr, db, dc)
	}
	return req
}

// TenantReadyLocked implements Strategy: in fallback a tenant's buckets
// are a slice from the start.
func (s *strictState) TenantReadyLocked(t Tenant, now int64, _ bool) {
	if s.down {
		s.sliceTenant(t, now, true)
	}
}

// CapacityRebuiltLocked implements Strategy.
func (s *strictState) CapacityRebuiltLocked(now int64, d Domain, old *pd.DomainCapacity) {
	if s.down {
		s.keepShare(now, d, old)
	}
}

// GateLocked implements Strategy.
func (s *strictState) GateLocked(t Tenant) Refusal { return s.storeLink.gateLocked(t) }

// QuotaRefusedLocked implements Strategy.
func (s *strictState) QuotaRefusedLocked(_ Tenant, retry time.Duration) time.Duration {
	return clampRetry(retry)
}

// Reconcile implements Strategy: it renews this replica's liveness on
// each KV gauge it holds leases in and has not committed to for
// refreshEvery, by committing again the hold of one of its leases there
// (which takes nothing again). A replica that dies stops renewing, and
// the others reclaim its holds once its membership lapses (holdFor), as
// batched mode reclaims a dead replica's holding, not at the lease TTL.
func (s *strictState) Reconcile(ctx context.Context) error {
	if s.br.isOpen() {
		return nil // the probe comes first
	}
	s.v.Lock()
	renewals := s.renewalsLocked()
	s.v.Unlock()
	var errs []error
	for _, r := range renewals {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.Timeout)
		_, err := s.store.Commit(cctx, &StrictCharge{KV: r.kv})
		cancel()
		s.calls.Add(1)
		s.v.Lock()
		if err != nil {
			s.failedLocked()
			errs = append(errs, fmt.Errorf("shared state: renew KV holds of %s: %w", r.kv.Key, err))
		} else {
			s.okLocked()
			s.alive[r.kv.Key] = max(s.alive[r.kv.Key], r.at)
		}
		delete(s.commits, r.id)
		s.v.Unlock()
		close(r.pending.done)
	}
	return errors.Join(errs...)
}

// renewal is one KV gauge's liveness renewal: the hold of lease id,
// committed again.
type renewal struct {
	id      uint64
	kv      KVHold
	at      int64
	pending *pendingCommit
}

// renewalsLocked lists the renewals due. Each is registered as its
// lease's commit in flight, so that a Release of the lease settles only
// after it (a settle overtaken by the renewal would leave a hold behind).
func (s *strictState) renewalsLocked() []renewal {
	now := s.v.NowLocked()
	alive := s.holdFor(s.v.LeaseTTLLocked())
	every := int64(s.refreshEvery(alive))
	due := make(map[string]bool)
	for key, at := range s.alive {
		if now-at >= every {
			due[key] = false
		}
	}
	if len(due) == 0 {
		return nil
	}
	var out []renewal
	for id := range s.committed {
		if _, inFlight := s.commits[id]; inFlight {
			continue
		}
		l, ok := s.v.LeaseLocked(id)
		if !ok || l.Domain == nil {
			continue
		}
		key := kvKey(l.Domain.ID())
		if found, ok := due[key]; !ok || found {
			continue
		}
		due[key] = true
		kv := s.kvHoldLocked(&l, id)
		kv.TTL = time.Duration(max(l.Expires-now, 0))
		p := &pendingCommit{done: make(chan struct{})}
		s.commits[id] = p
		out = append(out, renewal{id: id, kv: kv, at: now, pending: p})
	}
	for key, found := range due {
		if !found {
			delete(s.alive, key) // no lease of this replica holds KV there
		}
	}
	return out
}

// Run probes the store while the breaker is open: fail-closed tiers are
// refused before any store call, so their traffic alone would never find
// out that the store is back. It also forgets, now and then, the commits
// of leases that expired.
func (s *strictState) Run(ctx context.Context) {
	clock.Every(ctx, probeEvery(s.opts), func() {
		s.pruneCommitted()
		now := s.v.Wall()
		if open, _ := s.br.status(now); open && s.br.allow(now) {
			s.probed(s.probe(ctx))
		}
		_ = s.Reconcile(ctx) // a failure counts against the breaker
	})
}

// probe checks that the store is back and, if it is, hands it the
// replica's slices (resumeReportLocked) before the breaker closes: only
// the prober closes it, so no commit reaches the store before the report.
func (s *strictState) probe(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	if err := s.store.Ping(cctx); err != nil {
		return err
	}
	s.v.Lock()
	req := s.resumeReportLocked(s.v.NowLocked())
	s.v.Unlock()
	if len(req.Buckets) == 0 {
		return nil
	}
	cctx, cancel = context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	_, err := s.store.Reconcile(cctx, req)
	s.calls.Add(2)
	if err != nil {
		return fmt.Errorf("shared state: resume report: %w", err)
	}
	return nil
}

// pruneCommitted forgets, every pruneEvery, committed leases that are no
// longer held (expired: the store's hold expires with the same TTL).
func (s *strictState) pruneCommitted() {
	s.v.Lock()
	defer s.v.Unlock()
	now := s.v.NowLocked()
	if now-s.lastPrune < int64(pruneEvery) {
		return
	}
	s.lastPrune = now
	for _, ids := range []map[uint64]struct{}{s.committed, s.sliced} {
		for id := range ids {
			if _, ok := s.v.LeaseLocked(id); !ok {
				delete(ids, id)
			}
		}
	}
	for k, v := range s.known {
		if now-v.at > int64(pruneEvery) { // a bucket gone, or not committed to for long
			delete(s.known, k)
		}
	}
}

// Decided confirms an admission with the store. Callers of the same
// admission (idempotent duplicates) wait for the one commit and get its
// outcome. The call runs on its own deadline, not the caller's: a caller
// giving up must neither leave the store's answer unknown nor count
// against the store's breaker.
func (s *strictState) Decided(ctx context.Context, requestID string, leaseID uint64) Refusal {
	s.decisions.Add(1)
	if leaseID == 0 {
		return Refusal{}
	}
	s.v.Lock()
	if pending, ok := s.commits[leaseID]; ok {
		s.v.Unlock()
		select {
		case <-pending.done:
			return pending.why
		case <-ctx.Done():
			return Refusal{} // gone: the answer no longer matters
		}
	}
	l, ok := s.v.LeaseLocked(leaseID)
	_, done := s.committed[leaseID]
	if !ok || done { // released already, or confirmed for an earlier caller
		s.v.Unlock()
		return Refusal{}
	}
	c, tenantTakes := s.chargeLocked(&l, leaseID)
	failClosed := l.Tenant.FailClosed()
	if s.br.isOpen() { // only the prober probes (see probe)
		s.v.Unlock()
		return s.conclude(requestID, leaseID, StrictVerdict{}, errBreakerOpen, failClosed, c, tenantTakes)
	}
	// From here the store may hold the charge: Release settles it (Settle
	// refunds only what the store holds for the lease).
	s.committed[leaseID] = struct{}{}
	pending := &pendingCommit{done: make(chan struct{})}
	s.commits[leaseID] = pending
	s.v.Unlock()

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.Timeout)
	v, err := s.store.Commit(cctx, c)
	cancel()
	s.calls.Add(1)
	pending.why = s.conclude(requestID, leaseID, v, err, failClosed, c, tenantTakes)

	s.v.Lock()
	delete(s.commits, leaseID)
	s.v.Unlock()
	close(pending.done)
	return pending.why
}

// pendingCommit is a commit in flight; duplicates of its admission wait
// for done and take why.
type pendingCommit struct {
	done chan struct{}
	why  Refusal // set before done is closed
}

// conclude applies the store's verdict (or error) to an admission and
// returns the refusal it turns into, if any.
func (s *strictState) conclude(requestID string, leaseID uint64, v StrictVerdict, err error, failClosed bool, c *StrictCharge, tenantTakes int) (why Refusal) {
	s.v.Lock()
	var refund func(context.Context)
	switch {
	case err != nil:
		if !errors.Is(err, errBreakerOpen) {
			s.failedLocked()
		}
		if failClosed {
			s.oweSliceLocked(leaseID)
			why = Refusal{Unavailable, probeEvery(s.opts)}
		} else {
			why = s.keepLocked(leaseID)
		}
		if why.Refused() && !errors.Is(err, errBreakerOpen) {
			// The store may have taken it before the error: give it back
			// (a no-op if it did not).
			refund = s.settler(refundAll(c), nil)
		}
	case !v.Admitted:
		s.okLocked()
		s.unsure = s.unsure[:0]
		why = Refusal{OverCapacity, v.RetryAfter}
		if v.Refused < tenantTakes {
			why.Cause = OverQuota
		}
	default:
		s.okLocked()
		s.unsure = s.unsure[:0]
		now := s.v.NowLocked()
		for i, t := range c.Takes {
			if i < len(v.Levels) {
				s.known[t.Key] = knownLevel{level: v.Levels[i], rate: t.Rate, burst: t.Burst, at: now}
			}
		}
		s.alive[c.KV.Key] = max(s.alive[c.KV.Key], now)
	}
	if why.Refused() {
		delete(s.committed, leaseID)
		s.v.RevokeLocked(requestID, leaseID)
	}
	s.v.Unlock()
	if refund != nil {
		s.v.Background(func() { refund(context.Background()) })
	}
	return why
}

// keepLocked decides whether a fail-open admission whose commit failed
// (or was held back by the open breaker) is kept. One decided on this
// replica's slice is: the slice is what fallback admits from. One decided
// on the whole local buckets, before the breaker opened, was judged as if
// this replica were alone: the store, which knew the other replicas'
// takes, can no longer say, and the slice cut since does not hold its
// charge (the cut sets the levels from the store's last answer). Kept as
// it is, every admission in flight when the store went away would be
// admitted on top of the slices, up to a whole burst per replica. So its
// charge is taken from the slices now, and it is refused where they
// cannot hold it (revoking it then gives back what this took). With the
// breaker still closed there is no slice yet: it is kept and its charge
// taken from the slices if the breaker opens before the store answers
// again (unsure).
func (s *strictState) keepLocked(leaseID uint64) Refusal {
	l, ok := s.v.LeaseLocked(leaseID)
	if !ok {
		return Refusal{} // released already: nothing left to decide
	}
	if !s.down {
		s.unsure = append(s.unsure, l)
		return Refusal{}
	}
	if _, done := s.sliced[leaseID]; done || l.Granted >= s.downAt {
		return Refusal{} // taken from the slices already, or decided on them
	}
	now := s.v.NowLocked()
	why := sliceRefusal(now, &l)
	takeSlice(now, &l)
	if !why.Refused() {
		s.sliced[leaseID] = struct{}{} // a refused one is revoked: nothing left to ask
	}
	return why
}

// oweSliceLocked takes from the slices the charge of a lease about to be
// revoked that was decided on the whole local buckets before the breaker
// opened: the slices were cut without it, so the revoke's refund would
// otherwise add to them what they never gave (capacity every tenant on
// the domain would then admit from). Nothing while the breaker is closed,
// for a lease decided on the slices, or one taken from them already.
func (s *strictState) oweSliceLocked(leaseID uint64) {
	l, ok := s.v.LeaseLocked(leaseID)
	if _, done := s.sliced[leaseID]; !ok || done || !s.down || l.Granted >= s.downAt {
		return
	}
	takeSlice(s.v.NowLocked(), &l)
}

// sliceRefusal is why the local buckets (the slices, in fallback) cannot
// hold a charge that is not in them, as the gates and placement would
// judge it; none when they can. The charge's KV is in the gauge already.
func sliceRefusal(now int64, c *Charge) Refusal {
	b, w := c.Tenant.Buckets(), c.Weighted
	rps, tokens, floor, critical := b[KindRPS], b[KindTokens], b[KindFloor], b[KindCritical]
	if !rps.Fits(now, RequestUnit, 0) {
		return Refusal{OverQuota, clampRetry(rps.RetryAfter(now, RequestUnit, 0))}
	}
	if c.Critical {
		if !critical.Fits(now, w, 0) {
			return Refusal{OverQuota, clampRetry(critical.RetryAfter(now, w, 0))}
		}
	} else if !tokens.Fits(now, w, -tokens.Credit()) {
		return Refusal{OverQuota, clampRetry(tokens.AllowRetryAfter(now, w))}
	}
	if c.Floor && !floor.Fits(now, w, 0) {
		return Refusal{OverQuota, clampRetry(floor.RetryAfter(now, w, 0))}
	}
	if c.Domain != nil {
		cost := pd.Cost{PrefillFLOP: c.Cost.PrefillFLOP, DecodeBytes: c.Cost.DecodeBytes}
		if cp := c.Domain.Capacity(); !cp.Fits(now, cost, c.Floor) {
			return Refusal{OverCapacity, clampRetry(cp.RetryAfter(now, cost, c.Floor))}
		}
	}
	return Refusal{}
}

// takeSlice takes a charge's buckets again from the local buckets, whose
// levels a slice cut set without it: what Cancel gives back (its KV, in
// the gauge all along, is not taken twice).
func takeSlice(now int64, c *Charge) {
	b, w := c.Tenant.Buckets(), c.Weighted
	b[KindRPS].Take(now, RequestUnit)
	if c.Critical {
		b[KindCritical].Take(now, w)
	} else {
		b[KindTokens].Take(now, w)
	}
	if c.Floor {
		b[KindFloor].Take(now, w)
	}
	if c.Domain != nil {
		c.Domain.Capacity().Charge(now, pd.Cost{PrefillFLOP: c.Cost.PrefillFLOP, DecodeBytes: c.Cost.DecodeBytes})
	}
}

// refundAll is the settlement that gives back everything a charge took.
func refundAll(c *StrictCharge) *StrictSettle {
	st := &StrictSettle{KVKey: c.KV.Key, Lease: c.KV.Lease, Refunds: make([]StrictTake, len(c.Takes))}
	for i, t := range c.Takes {
		t.Min = 0
		st.Refunds[i] = t
	}
	return st
}

// chargeLocked lists what a lease takes in the store: the tenant's RPS and
// token (or critical) bucket, its floor bucket if it was admitted within
// its floor, the domain's prefill and decode buckets and its KV. It also
// returns how many of the takes are the tenant's.
func (s *strictState) chargeLocked(l *Charge, id uint64) (*StrictCharge, int) {
	t := l.Tenant
	c := &StrictCharge{Takes: make([]StrictTake, 0, 5)}
	add := func(key string, rate, burst, amount, floor int64) {
		sc := scaleFor(rate, burst)
		c.Takes = append(c.Takes, StrictTake{Key: key, Rate: rate / sc, Burst: burst / sc, Amount: ceilDiv(amount, sc), Min: floor / sc})
	}
	name := t.Name()
	rate, burst := t.Limits(KindRPS)
	add(tenantKey(name, KindRPS), rate, burst, RequestUnit, 0)
	if l.Critical {
		rate, burst = t.Limits(KindCritical)
		add(tenantKey(name, KindCritical), rate, burst, l.Weighted, 0)
	} else {
		rate, burst = t.Limits(KindTokens)
		add(tenantKey(name, KindTokens), rate, burst, l.Weighted, -t.CreditLent())
	}
	if l.Floor {
		rate, burst = t.Limits(KindFloor)
		add(tenantKey(name, KindFloor), rate, burst, l.Weighted, 0)
	}
	tenantTakes := len(c.Takes)
	id0, cp := l.Domain.ID(), l.Domain.Capacity()
	pr, dr, _ := cp.FullLimits()
	pb, db := cp.FullBursts()
	add(domainKey(id0, KindPrefill), pr, pb, l.Cost.PrefillFLOP, 0)
	add(domainKey(id0, KindDecode), dr, db, l.Cost.DecodeBytes, 0)
	c.KV = s.kvHoldLocked(l, id)
	return c, tenantTakes
}

// kvHoldLocked is the KV hold of lease id: for the lease's life, and
// renewed with this replica's liveness on the gauge (see Reconcile).
func (s *strictState) kvHoldLocked(l *Charge, id uint64) KVHold {
	_, _, kvLimit := l.Domain.Capacity().FullLimits()
	sc := scaleFor(kvLimit, kvLimit)
	return KVHold{
		Key: kvKey(l.Domain.ID()), Lease: replicaLease(s.opts.Replica, id),
		Limit: kvLimit / sc, Bytes: ceilDiv(l.Cost.KVBytes, sc), TTL: time.Duration(l.Expires - l.Granted),
		Replica: s.opts.Replica, Alive: s.holdFor(s.v.LeaseTTLLocked()),
	}
}

// ReleasedLocked lists what a released lease gives back to the store —
// tokens it did not use (or takes an overrun), the domain's prefill and
// decode difference, and its KV hold — to be sent once the lease's commit,
// if Release overtook it, has answered. Nothing when the lease was never
// committed there.
func (s *strictState) ReleasedLocked(id uint64, l Charge, actualWeighted int64, actual pd.Cost) func(context.Context) {
	delete(s.sliced, id)
	if _, ok := s.committed[id]; !ok {
		return nil
	}
	delete(s.committed, id)
	t, name, dom := l.Tenant, l.Tenant.Name(), l.Domain.ID()
	st := &StrictSettle{KVKey: kvKey(dom), Lease: replicaLease(s.opts.Replica, id)}
	add := func(key string, rate, burst, diff int64) {
		if diff == 0 {
			return
		}
		sc := scaleFor(rate, burst)
		amount := diff / sc // refunds round down, overruns up: the store never gains units
		if diff < 0 {
			amount = -ceilDiv(-diff, sc)
		}
		st.Refunds = append(st.Refunds, StrictTake{Key: key, Rate: rate / sc, Burst: burst / sc, Amount: amount})
	}
	kind := KindTokens
	if l.Critical {
		kind = KindCritical
	}
	unused := l.Weighted - actualWeighted
	rate, burst := t.Limits(kind)
	add(tenantKey(name, kind), rate, burst, unused)
	if l.Floor && unused > 0 {
		rate, burst = t.Limits(KindFloor)
		add(tenantKey(name, KindFloor), rate, burst, unused)
	}
	cp := l.Domain.Capacity()
	pr, dr, _ := cp.FullLimits()
	pb, db := cp.FullBursts()
	add(domainKey(dom, KindPrefill), pr, pb, l.Cost.PrefillFLOP-actual.PrefillFLOP)
	add(domainKey(dom, KindDecode), dr, db, l.Cost.DecodeBytes-actual.DecodeBytes)
	var pending <-chan struct{}
	if p := s.commits[id]; p != nil {
		pending = p.done
	}
	return s.settler(st, pending)
}

// settler returns the call that sends a settlement to the store, outside
// the lock, once the lease's commit (pending, if still in flight) has
// answered. A failure leaves the lease charged in full there (never
// charged twice: Settle refunds only while the store holds the lease) and
// its KV hold to lapse with the lease TTL, or sooner with this replica's
// liveness (see Reconcile).
func (s *strictState) settler(st *StrictSettle, pending <-chan struct{}) func(context.Context) {
	return func(ctx context.Context) {
		if pending != nil {
			<-pending
		}
		if s.br.isOpen() {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.Timeout)
		err := s.store.Settle(cctx, st)
		cancel()
		s.calls.Add(1)
		s.answered(err)
	}
}
