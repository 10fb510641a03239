package admission

import (
	"context"
	"time"

	"github.com/sluice-sched/sluice/pd"
)

// commitStrict confirms a local admission with the shared store (strict
// mode): one atomic call takes the tenant's and the domain's amounts or
// refuses them all. A refusal undoes the local admission and answers
// REJECTED with the store's reason and Retry-After. When the store cannot
// be reached, fail-open tiers keep the local admission (decided from the
// local slice) and fail-closed tiers are refused with STATE_UNAVAILABLE.
//
// Callers of the same admission (idempotent duplicates) wait for the one
// commit and get its outcome. The call runs on its own deadline, not the
// caller's: a caller giving up must neither leave the store's answer
// unknown nor count against the store's breaker.
func (e *Engine) commitStrict(ctx context.Context, requestID string, d Decision) Decision {
	if d.LeaseID == 0 || (d.Outcome != Admitted && d.Outcome != Degraded) {
		return d
	}
	s := e.shared
	e.mu.Lock()
	if pending, ok := e.mu.commits[d.LeaseID]; ok {
		e.mu.Unlock()
		select {
		case <-pending:
		case <-ctx.Done():
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		if ent, ok := e.mu.idem[requestID]; ok && requestID != "" {
			return ent.decision
		}
		return d
	}
	l, ok := e.mu.leases.get(d.LeaseID)
	if !ok || l.committed { // released already, or confirmed for an earlier caller
		e.mu.Unlock()
		return d
	}
	charge, tenantTakes := e.strictChargeLocked(l, d.LeaseID)
	failClosed := l.tenant.policy.FailMode == FailClosed
	var v StrictVerdict
	err := errBreakerOpen
	if s.br.allow(e.clk.Now()) {
		// From here the store may hold the charge: Release settles it
		// (Settle refunds only what the store holds for the lease).
		l.committed = true
		done := make(chan struct{})
		e.mu.commits[d.LeaseID] = done
		defer func() {
			e.mu.Lock()
			delete(e.mu.commits, d.LeaseID)
			e.mu.Unlock()
			close(done)
		}()
		e.mu.Unlock()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.Timeout)
		v, err = s.store.Commit(cctx, charge)
		cancel()
		s.calls.Add(1)
	} else {
		e.mu.Unlock()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case err != nil:
		if err != errBreakerOpen {
			e.storeFailedLocked()
		}
		if !failClosed {
			return d
		}
		if err != errBreakerOpen {
			// The store may have taken it before the error: give it back
			// (a no-op if it did not).
			go e.settleStrict(context.Background(), refundAll(charge), nil)
		}
		return e.undoStrictLocked(requestID, d, ReasonStateUnavailable, s.opts.Cooldown)
	case !v.Admitted:
		e.storeOKLocked()
		reason := ReasonCapacityExceeded
		if v.Refused < tenantTakes {
			reason = ReasonQuotaExceeded
		}
		return e.undoStrictLocked(requestID, d, reason, v.RetryAfter)
	}
	e.storeOKLocked()
	return d
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

// undoStrictLocked revokes an admission the store did not confirm. Its
// request id now answers the refusal, so that duplicates that waited for
// the commit get the same answer as the caller.
func (e *Engine) undoStrictLocked(requestID string, d Decision, reason Reason, retry time.Duration) Decision {
	now := e.nowLocked()
	e.revokeLeaseLocked(now, d.LeaseID)
	out := rejected(reason, retry)
	out.Trace = d.Trace
	if ent, ok := e.mu.idem[requestID]; ok && requestID != "" {
		ent.decision = out
		e.mu.idem[requestID] = ent
	}
	e.finish(e.dispatchLocked(now, nil)) // closing channels never blocks: fine under the lock
	return out
}

// strictChargeLocked lists what a lease takes in the store: the tenant's
// RPS and token (or critical) bucket, its floor bucket if it was admitted
// within its floor, the domain's prefill and decode buckets and its KV. It
// also returns how many of the takes are the tenant's.
func (e *Engine) strictChargeLocked(l *lease, id uint64) (*StrictCharge, int) {
	t := l.tenant
	c := &StrictCharge{Takes: make([]StrictTake, 0, 5)}
	add := func(key string, rate, burst, amount, floor int64) {
		sc := scaleFor(rate, burst)
		c.Takes = append(c.Takes, StrictTake{Key: key, Rate: rate / sc, Burst: burst / sc, Amount: ceilDiv(amount, sc), Min: floor / sc})
	}
	rate, burst := t.globalLimits(kindRPS)
	add(tenantKey(t.name, kindRPS), rate, burst, rpsUnit, 0)
	if l.gates.critical {
		rate, burst = t.globalLimits(kindCritical)
		add(tenantKey(t.name, kindCritical), rate, burst, l.weighted, 0)
	} else {
		rate, burst = t.globalLimits(kindTokens)
		credit := int64(0)
		if t.breaker == breakerClosed {
			credit = creditLimit(t.policy)
		}
		add(tenantKey(t.name, kindTokens), rate, burst, l.weighted, -credit)
	}
	if l.floor {
		rate, burst = t.globalLimits(kindFloor)
		add(tenantKey(t.name, kindFloor), rate, burst, l.weighted, 0)
	}
	tenantTakes := len(c.Takes)
	pr, dr, kvLimit := l.dom.cap.FullLimits()
	add(domainKey(l.dom.ID(), kindPrefill), pr, l.dom.cap.PrefillBurst(), l.cost.PrefillFLOP, 0)
	add(domainKey(l.dom.ID(), kindDecode), dr, l.dom.cap.DecodeBurst(), l.cost.DecodeBytes, 0)
	sc := scaleFor(kvLimit, kvLimit)
	c.KV = KVHold{
		Key: kvKey(l.dom.ID()), Lease: replicaLease(e.shared.opts.Replica, id),
		Limit: kvLimit / sc, Bytes: ceilDiv(l.cost.KVBytes, sc), TTL: time.Duration(l.expires - l.granted),
	}
	return c, tenantTakes
}

// strictSettleLocked lists what a released lease gives back to the store:
// tokens it did not use (or takes an overrun), the domain's prefill and
// decode difference, and its KV hold. nil when the lease was never
// committed there.
func (e *Engine) strictSettleLocked(l *lease, id uint64, actualWeighted int64, actual pd.Cost) *StrictSettle {
	if !l.committed {
		return nil
	}
	t := l.tenant
	st := &StrictSettle{KVKey: kvKey(l.dom.ID()), Lease: replicaLease(e.shared.opts.Replica, id)}
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
	rate, burst := t.globalLimits(kind)
	add(tenantKey(t.name, kind), rate, burst, l.weighted-actualWeighted)
	if l.floor && l.weighted > actualWeighted {
		rate, burst = t.globalLimits(kindFloor)
		add(tenantKey(t.name, kindFloor), rate, burst, l.weighted-actualWeighted)
	}
	pr, dr, _ := l.dom.cap.FullLimits()
	add(domainKey(l.dom.ID(), kindPrefill), pr, l.dom.cap.PrefillBurst(), l.cost.PrefillFLOP-actual.PrefillFLOP)
	add(domainKey(l.dom.ID(), kindDecode), dr, l.dom.cap.DecodeBurst(), l.cost.DecodeBytes-actual.DecodeBytes)
	return st
}

// settleStrict sends a settlement to the store, outside the lock, once the
// lease's commit (pending, when Release overtook it) has answered. A
// failure leaves the lease charged in full there (never charged twice:
// Settle refunds only while the store holds the lease) and its KV hold to
// expire with the lease TTL.
func (e *Engine) settleStrict(ctx context.Context, st *StrictSettle, pending <-chan struct{}) {
	s := e.shared
	if st == nil {
		return
	}
	if pending != nil {
		<-pending
	}
	if !s.br.allow(e.clk.Now()) {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.Timeout)
	err := s.store.Settle(cctx, st)
	cancel()
	s.calls.Add(1)
	e.storeAnswered(err)
}
