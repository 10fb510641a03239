package admission

import (
	"context"
	"errors"
	"fmt"
	"time"

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

	// Under Engine.mu.
	commits   map[uint64]*pendingCommit // leases whose commit is in flight
	committed map[uint64]struct{}       // leases the store may hold a charge for
	lastPrune int64
	known     map[string]knownLevel // per store key, its level after this replica's last commit
	downAt    int64                 // when the breaker last opened
	// unsure are the charges of fail-open admissions kept although their
	// commit failed, while the breaker was still closed: decided on the
	// whole local buckets, they are taken from the slices when the breaker
	// opens (see keepLocked). Emptied by any answer from the store.
	unsure []charge
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
		known:     make(map[string]knownLevel),
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
	e := s.e
	if down {
		s.downAt = now
	}
	for _, t := range e.mu.gates.tenants {
		t.setPolicy(t.policy, now, false)
		if !down {
			continue
		}
		s.sliceTenant(t, now, true)
		for k, b := range t.buckets() {
			rate, burst := tenantLimits(t, bucketKind(k))
			if share, ok := s.knownShare(tenantKey(t.name, bucketKind(k)), scaleFor(rate, burst), now); ok && share < b.Level(now) {
				b.SetLevel(now, share)
			}
		}
	}
	for _, d := range e.mu.place.domains {
		if !down {
			_ = d.cap.Resize(&d.topo) // the same domain: cannot fail
			continue
		}
		s.sliceDomain(d, now)
		n := int64(s.replicas)
		pr, dr, kv := d.cap.FullLimits()
		pb, db := d.cap.FullBursts()
		p, dc := d.cap.Levels(now)
		if share, ok := s.knownShare(domainKey(d.ID(), kindPrefill), scaleFor(pr, pb), now); ok {
			p = min(p, share)
		}
		if share, ok := s.knownShare(domainKey(d.ID(), kindDecode), scaleFor(dr, db), now); ok {
			dc = min(dc, share)
		}
		d.cap.ApplyShare(now, pd.ShareGrant{PrefillRate: pr / n, PrefillLevel: p, DecodeRate: dr / n, DecodeLevel: dc, KVLimit: kv / n})
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
	e := s.e
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
	for name, t := range e.mu.gates.tenants {
		for k, b := range t.buckets() {
			if rate, burst := tenantLimits(t, bucketKind(k)); rate != 0 || burst != 0 {
				add(tenantKey(name, bucketKind(k)), rate, burst, b.Level(now))
			}
		}
	}
	for _, d := range e.mu.place.domains {
		if d.removed {
			continue
		}
		pr, dr, _ := d.cap.FullLimits()
		pb, db := d.cap.FullBursts()
		p, dc := d.cap.Levels(now)
		add(domainKey(d.ID(), kindPrefill), pr, pb, p)
		add(domainKey(d.ID(), kindDecode), dr, db, dc)
	}
	return req
}

func (s *strictState) tenantReadyLocked(t *tenantState, now int64, _ bool) {
	if s.down {
		s.sliceTenant(t, now, true)
	}
}

func (s *strictState) capacityRebuiltLocked(now int64, d *domainState, old *pd.DomainCapacity) {
	if s.down {
		s.keepShare(now, d, old)
	}
}

func (s *strictState) quotaRefusedLocked(_ *tenantState, retry time.Duration) time.Duration {
	return durationUntil(retry)
}

func (s *strictState) reconcile(context.Context) error { return nil }

// run probes the store while the breaker is open: fail-closed tiers are
// refused before any store call, so their traffic alone would never find
// out that the store is back. It also forgets, now and then, the commits
// of leases that expired.
func (s *strictState) run(ctx context.Context) {
	t := time.NewTicker(probeEvery(s.opts))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.pruneCommitted()
		now := s.e.clk.Now()
		if open, _ := s.br.status(now); open && s.br.allow(now) {
			s.answered(s.probe(ctx))
		}
	}
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
	e := s.e
	e.mu.Lock()
	req := s.resumeReportLocked(e.nowLocked())
	e.mu.Unlock()
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
	e := s.e
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.nowLocked()
	if now-s.lastPrune < int64(pruneEvery) {
		return
	}
	s.lastPrune = now
	for id := range s.committed {
		if _, ok := e.mu.leases.get(id); !ok {
			delete(s.committed, id)
		}
	}
	for k, v := range s.known {
		if now-v.at > int64(pruneEvery) { // a bucket gone, or not committed to for long
			delete(s.known, k)
		}
	}
}

// decided confirms an admission with the store. Callers of the same
// admission (idempotent duplicates) wait for the one commit and get its
// outcome. The call runs on its own deadline, not the caller's: a caller
// giving up must neither leave the store's answer unknown nor count
// against the store's breaker.
func (s *strictState) decided(ctx context.Context, requestID string, leaseID uint64) refusal {
	s.decisions.Add(1)
	if leaseID == 0 {
		return refusal{}
	}
	e := s.e
	e.mu.Lock()
	if pending, ok := s.commits[leaseID]; ok {
		e.mu.Unlock()
		select {
		case <-pending.done:
			return pending.why
		case <-ctx.Done():
			return refusal{} // gone: the answer no longer matters
		}
	}
	l, ok := e.mu.leases.get(leaseID)
	_, done := s.committed[leaseID]
	if !ok || done { // released already, or confirmed for an earlier caller
		e.mu.Unlock()
		return refusal{}
	}
	c, tenantTakes := s.chargeLocked(l, leaseID)
	failClosed := l.tenant.policy.FailMode == FailClosed
	if s.br.isOpen() { // only the prober probes (see probe)
		e.mu.Unlock()
		return s.conclude(requestID, leaseID, StrictVerdict{}, errBreakerOpen, failClosed, c, tenantTakes)
	}
	// From here the store may hold the charge: Release settles it (Settle
	// refunds only what the store holds for the lease).
	s.committed[leaseID] = struct{}{}
	pending := &pendingCommit{done: make(chan struct{})}
	s.commits[leaseID] = pending
	e.mu.Unlock()

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.Timeout)
	v, err := s.store.Commit(cctx, c)
	cancel()
	s.calls.Add(1)
	pending.why = s.conclude(requestID, leaseID, v, err, failClosed, c, tenantTakes)

	e.mu.Lock()
	delete(s.commits, leaseID)
	e.mu.Unlock()
	close(pending.done)
	return pending.why
}

// pendingCommit is a commit in flight; duplicates of its admission wait
// for done and take why.
type pendingCommit struct {
	done chan struct{}
	why  refusal // set before done is closed
}

// conclude applies the store's verdict (or error) to an admission and
// returns the refusal it turns into, if any.
func (s *strictState) conclude(requestID string, leaseID uint64, v StrictVerdict, err error, failClosed bool, c *StrictCharge, tenantTakes int) (why refusal) {
	e := s.e
	e.mu.Lock()
	var refund func(context.Context)
	switch {
	case err != nil:
		if !errors.Is(err, errBreakerOpen) {
			s.failedLocked()
		}
		if failClosed {
			why = refusal{ReasonStateUnavailable, probeEvery(s.opts)}
		} else {
			why = s.keepLocked(leaseID)
		}
		if why.refused() && !errors.Is(err, errBreakerOpen) {
			// The store may have taken it before the error: give it back
			// (a no-op if it did not).
			refund = s.settler(refundAll(c), nil)
		}
	case !v.Admitted:
		s.okLocked()
		s.unsure = s.unsure[:0]
		why = refusal{ReasonCapacityExceeded, v.RetryAfter}
		if v.Refused < tenantTakes {
			why.reason = ReasonQuotaExceeded
		}
	default:
		s.okLocked()
		s.unsure = s.unsure[:0]
		now := e.nowLocked()
		for i, t := range c.Takes {
			if i < len(v.Levels) {
				s.known[t.Key] = knownLevel{level: v.Levels[i], rate: t.Rate, burst: t.Burst, at: now}
			}
		}
	}
	if why.refused() {
		delete(s.committed, leaseID)
		e.revokeLocked(requestID, leaseID)
	}
	e.mu.Unlock()
	if refund != nil {
		e.background(func() { refund(context.Background()) })
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
func (s *strictState) keepLocked(leaseID uint64) refusal {
	e := s.e
	l, ok := e.mu.leases.get(leaseID)
	if !ok {
		return refusal{} // released already: nothing left to decide
	}
	if !s.down {
		s.unsure = append(s.unsure, l.charge)
		return refusal{}
	}
	if l.granted >= s.downAt {
		return refusal{} // decided on the slice
	}
	now := e.nowLocked()
	why := sliceRefusal(now, &l.charge)
	takeSlice(now, &l.charge)
	return why
}

// sliceRefusal is why the local buckets (the slices, in fallback) cannot
// hold a charge that is not in them, as the gates and placement would
// judge it; none when they can. The charge's KV is in the gauge already.
func sliceRefusal(now int64, c *charge) refusal {
	t, w := c.tenant, c.gates.weighted
	if !t.rps.Fits(now, rpsUnit, 0) {
		return refusal{ReasonQuotaExceeded, durationUntil(t.rps.RetryAfter(now, rpsUnit, 0))}
	}
	if c.gates.critical {
		if !t.critical.Fits(now, w, 0) {
			return refusal{ReasonQuotaExceeded, durationUntil(t.critical.RetryAfter(now, w, 0))}
		}
	} else if !t.tokens.Fits(now, w, -t.tokens.Credit()) {
		return refusal{ReasonQuotaExceeded, durationUntil(t.tokens.AllowRetryAfter(now, w))}
	}
	if c.floor && !t.floor.Fits(now, w, 0) {
		return refusal{ReasonQuotaExceeded, durationUntil(t.floor.RetryAfter(now, w, 0))}
	}
	if c.dom != nil {
		cost := pd.Cost{PrefillFLOP: c.cost.PrefillFLOP, DecodeBytes: c.cost.DecodeBytes}
		if !c.dom.cap.Fits(now, cost, c.floor) {
			return refusal{ReasonCapacityExceeded, durationUntil(c.dom.cap.RetryAfter(now, cost, c.floor))}
		}
	}
	return refusal{}
}

// takeSlice takes a charge's buckets again from the local buckets, whose
// levels a slice cut set without it: what Cancel gives back (its KV, in
// the gauge all along, is not taken twice).
func takeSlice(now int64, c *charge) {
	t, w := c.tenant, c.gates.weighted
	t.rps.Take(now, rpsUnit)
	t.quotaBucket(c.gates.critical).Take(now, w)
	if c.floor {
		t.floor.Take(now, w)
	}
	if c.dom != nil {
		c.dom.cap.Charge(now, pd.Cost{PrefillFLOP: c.cost.PrefillFLOP, DecodeBytes: c.cost.DecodeBytes})
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
func (s *strictState) chargeLocked(l *lease, id uint64) (*StrictCharge, int) {
	t := l.tenant
	c := &StrictCharge{Takes: make([]StrictTake, 0, 5)}
	add := func(key string, rate, burst, amount, floor int64) {
		sc := scaleFor(rate, burst)
		c.Takes = append(c.Takes, StrictTake{Key: key, Rate: rate / sc, Burst: burst / sc, Amount: ceilDiv(amount, sc), Min: floor / sc})
	}
	rate, burst := tenantLimits(t, kindRPS)
	add(tenantKey(t.name, kindRPS), rate, burst, rpsUnit, 0)
	if l.gates.critical {
		rate, burst = tenantLimits(t, kindCritical)
		add(tenantKey(t.name, kindCritical), rate, burst, l.gates.weighted, 0)
	} else {
		rate, burst = tenantLimits(t, kindTokens)
		credit := int64(0)
		if t.credit.lending() {
			credit = creditLimit(t.policy)
		}
		add(tenantKey(t.name, kindTokens), rate, burst, l.gates.weighted, -credit)
	}
	if l.floor {
		rate, burst = tenantLimits(t, kindFloor)
		add(tenantKey(t.name, kindFloor), rate, burst, l.gates.weighted, 0)
	}
	tenantTakes := len(c.Takes)
	pr, dr, kvLimit := l.dom.cap.FullLimits()
	pb, db := l.dom.cap.FullBursts()
	add(domainKey(l.dom.ID(), kindPrefill), pr, pb, l.cost.PrefillFLOP, 0)
	add(domainKey(l.dom.ID(), kindDecode), dr, db, l.cost.DecodeBytes, 0)
	sc := scaleFor(kvLimit, kvLimit)
	c.KV = KVHold{
		Key: kvKey(l.dom.ID()), Lease: replicaLease(s.opts.Replica, id),
		Limit: kvLimit / sc, Bytes: ceilDiv(l.cost.KVBytes, sc), TTL: time.Duration(l.expires - l.granted),
	}
	return c, tenantTakes
}

// releasedLocked lists what a released lease gives back to the store —
// tokens it did not use (or takes an overrun), the domain's prefill and
// decode difference, and its KV hold — to be sent once the lease's commit,
// if Release overtook it, has answered. Nothing when the lease was never
// committed there.
func (s *strictState) releasedLocked(id uint64, l lease, actualWeighted int64, actual pd.Cost) func(context.Context) {
	if _, ok := s.committed[id]; !ok {
		return nil
	}
	delete(s.committed, id)
	t := l.tenant
	st := &StrictSettle{KVKey: kvKey(l.dom.ID()), Lease: replicaLease(s.opts.Replica, id)}
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
	kind := kindTokens
	if l.gates.critical {
		kind = kindCritical
	}
	unused := l.gates.weighted - actualWeighted
	rate, burst := tenantLimits(t, kind)
	add(tenantKey(t.name, kind), rate, burst, unused)
	if l.floor && unused > 0 {
		rate, burst = tenantLimits(t, kindFloor)
		add(tenantKey(t.name, kindFloor), rate, burst, unused)
	}
	pr, dr, _ := l.dom.cap.FullLimits()
	pb, db := l.dom.cap.FullBursts()
	add(domainKey(l.dom.ID(), kindPrefill), pr, pb, l.cost.PrefillFLOP-actual.PrefillFLOP)
	add(domainKey(l.dom.ID(), kindDecode), dr, db, l.cost.DecodeBytes-actual.DecodeBytes)
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
// its KV hold to expire with the lease TTL.
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
