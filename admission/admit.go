package admission

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/sluice-sched/sluice/internal/tokenbucket"
	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/wfq"
)

// maxLowerTiers bounds accept_downgrade; catalogs are a few tiers deep.
const maxLowerTiers = 7

// maxNameLen bounds tenant, model and request id names, which errors echo.
const maxNameLen = 128

// pending is one request on its way through the engine.
type pending struct {
	tenant   *tenantState
	tierBuf  [maxLowerTiers + 1]*modelState // requested model first, then accepted lower tiers in chain order
	ntiers   int
	prompt   int64
	output   int64
	weighted int64
	price    int64 // micro-USD at the requested model, charged to the budget
	critical bool
	gates    gateCharge
}

// tiers returns the models to try, requested first. (An index, not a slice
// into tierBuf, so that a pending on the stack does not point into itself
// and escape.)
func (r *pending) tiers() []*modelState { return r.tierBuf[:r.ntiers] }

// waiter is a request waiting in the fair queue.
type waiter struct {
	p         pending
	requestID string
	item      wfq.Item
	enqueued  int64
	deadline  int64
	heapIdx   int
	estimate  [2]int64 // backlog contribution: prefill FLOPs, decode bytes
	pl        placement
	queued    bool
	refs      int           // callers waiting on it: the first plus idempotent duplicates
	done      chan struct{} // closed once decision is set
	decision  Decision
}

// Admit decides one request: admitted now (on the requested model or a lower
// tier it accepts), queued until capacity frees and then admitted, or
// rejected with a reason and Retry-After. Invalid requests return an
// *InvalidArgumentError and change nothing; every other outcome is a
// Decision with a nil error.
func (e *Engine) Admit(ctx context.Context, req Request) (Decision, error) {
	if err := validateRequest(&req); err != nil {
		return Decision{}, err
	}
	d, w, err := e.admit(ctx, &req)
	if err != nil {
		return Decision{}, err
	}
	if w != nil {
		d = e.wait(ctx, w)
	}
	if e.shared != nil {
		e.shared.decisions.Add(1)
		if e.shared.opts.Mode == SharedStrict {
			d = e.commitStrict(ctx, req.RequestID, d)
		}
	}
	if e.observer != nil {
		e.observer.ObserveDecision(req, d)
	}
	return d, nil
}

// validateRequest checks what needs no state.
func validateRequest(r *Request) error {
	switch {
	case r.Tenant == "":
		return &InvalidArgumentError{Field: "tenant", Reason: "must not be empty"}
	case len(r.Tenant) > maxNameLen || !utf8.ValidString(r.Tenant):
		return &InvalidArgumentError{Field: "tenant", Reason: fmt.Sprintf("must be valid UTF-8 of at most %d bytes", maxNameLen)}
	case r.Model == "":
		return &InvalidArgumentError{Field: "model", Reason: "must not be empty"}
	case len(r.Model) > maxNameLen:
		return &InvalidArgumentError{Field: "model", Reason: fmt.Sprintf("must be at most %d bytes", maxNameLen)}
	case len(r.RequestID) > maxNameLen:
		return &InvalidArgumentError{Field: "request_id", Reason: fmt.Sprintf("must be at most %d bytes", maxNameLen)}
	case r.PromptTokens <= 0:
		return &InvalidArgumentError{Field: "prompt_tokens", Reason: fmt.Sprintf("must be positive, got %d", r.PromptTokens)}
	case r.MaxOutputTokens <= 0:
		return &InvalidArgumentError{Field: "max_output_tokens", Reason: fmt.Sprintf("must be positive, got %d", r.MaxOutputTokens)}
	case r.Priority != 0 && r.Priority != PriorityNormal && r.Priority != PriorityCritical:
		return &InvalidArgumentError{Field: "priority", Reason: fmt.Sprintf("unknown priority %d", r.Priority)}
	case len(r.AcceptDowngrade) > maxLowerTiers:
		return &InvalidArgumentError{Field: "accept_downgrade", Reason: fmt.Sprintf("at most %d tiers", maxLowerTiers)}
	}
	for i, name := range r.AcceptDowngrade {
		if name == "" || len(name) > maxNameLen {
			return &InvalidArgumentError{Field: fmt.Sprintf("accept_downgrade[%d]", i), Reason: fmt.Sprintf("must be 1 to %d bytes", maxNameLen)}
		}
	}
	return nil
}

func rejected(reason Reason, retry time.Duration) Decision {
	return Decision{Outcome: Rejected, Reason: reason, RetryAfter: durationUntil(retry)}
}

// admit runs steps 2–6 of the data flow under the lock. It returns either a
// decision or a waiter to wait on.
func (e *Engine) admit(ctx context.Context, req *Request) (Decision, *waiter, error) {
	wall := e.clk.Now()
	e.mu.Lock()
	now := int64(wall.Sub(e.base))
	var r pending
	if err := e.resolveLocked(req, &r); err != nil {
		e.mu.Unlock()
		return Decision{}, nil, err
	}
	// A request id seen before gets its answer even while shutting down: a
	// retry after a lost answer must find its lease, not be sent elsewhere.
	if req.RequestID != "" {
		if ent, ok := e.mu.idem[req.RequestID]; ok {
			if ent.w != nil && ent.tenant == req.Tenant {
				ent.w.refs++
			}
			e.mu.Unlock()
			if ent.tenant != req.Tenant {
				return Decision{}, nil, &InvalidArgumentError{Field: "request_id", Reason: "already used by another tenant"}
			}
			return ent.decision, ent.w, nil
		}
	}
	if e.mu.closed {
		e.mu.Unlock()
		return rejected(ReasonShuttingDown, time.Second), nil, nil
	}
	t := e.tenantLocked(req.Tenant, now)
	if t == nil {
		e.mu.Unlock()
		return rejected(ReasonUnknownTenant, 0), nil, nil
	}
	r.tenant = t
	r.weighted = r.prompt + e.mu.cfg.OutputTokenWeight*r.output
	r.price = e.mu.cat.PriceMicros(r.tierBuf[0].model, r.prompt, r.output)

	critical, reason, retry := e.checkGatesLocked(t, now, wall, r.weighted, r.price, req.Priority == PriorityCritical)
	if reason != ReasonNone {
		d := e.rejectWithTrace(reason, retry, t, &r, now)
		e.mu.Unlock()
		return d, nil, nil
	}
	r.critical = critical

	// Within the floor: reserved capacity, no queue.
	if !critical && t.policy.Floor > 0 && t.floor.Fits(now, r.weighted, 0) {
		if pl, ok := e.placeLocked(now, t, &r, true); ok {
			d := e.admitNowLocked(now, req, &r, pl)
			e.mu.Unlock()
			return d, nil, nil
		}
	}
	// Shared capacity, unless others in the same band are already waiting for it.
	waiting := e.mu.queue.Len()
	if critical {
		waiting = e.mu.queue.CriticalLen()
	}
	// With others waiting, the requested tier is theirs first; a request
	// that accepts lower tiers is degraded at once rather than wait (the
	// point of degradation under saturation).
	first := 0
	if waiting > 0 {
		first = 1
	}
	if first < r.ntiers {
		if pl, ok := e.placeFromLocked(now, t, &r, false, first); ok {
			d := e.admitNowLocked(now, req, &r, pl)
			e.mu.Unlock()
			return d, nil, nil
		}
	}
	d, w := e.enqueueLocked(ctx, now, wall, req, &r)
	var answered []*waiter
	if w != nil {
		answered = e.dispatchLocked(now, nil)
	}
	e.mu.Unlock()
	e.finish(answered)
	return d, w, nil
}

// resolveLocked looks up the model and accepted lower tiers.
func (e *Engine) resolveLocked(req *Request, r *pending) error {
	m, ok := e.mu.models[req.Model]
	if !ok {
		return &InvalidArgumentError{Field: "model", Reason: fmt.Sprintf("unknown model %q (known: %v)", req.Model, e.mu.cat.Names())}
	}
	lim := &e.mu.cfg.Limits
	if req.PromptTokens > lim.MaxPromptTokens {
		return &InvalidArgumentError{Field: "prompt_tokens", Reason: fmt.Sprintf("%d exceeds the limit of %d", req.PromptTokens, lim.MaxPromptTokens)}
	}
	if req.MaxOutputTokens > lim.MaxOutputTokens {
		return &InvalidArgumentError{Field: "max_output_tokens", Reason: fmt.Sprintf("%d exceeds the limit of %d", req.MaxOutputTokens, lim.MaxOutputTokens)}
	}
	r.prompt, r.output = req.PromptTokens, req.MaxOutputTokens
	r.tierBuf[0] = m
	n := 1
	for i, name := range req.AcceptDowngrade {
		lower, ok := e.mu.models[name]
		if !ok {
			return &InvalidArgumentError{Field: fmt.Sprintf("accept_downgrade[%d]", i), Reason: fmt.Sprintf("unknown model %q", name)}
		}
		if !contains(m.chain, lower.idx) {
			return &InvalidArgumentError{Field: fmt.Sprintf("accept_downgrade[%d]", i), Reason: fmt.Sprintf("%q is not a lower tier of %q", name, m.name)}
		}
	}
	// Keep chain order whatever order the caller listed them in.
	for _, li := range m.chain {
		for _, name := range req.AcceptDowngrade {
			if e.mu.modelList[li].name == name && !containsModel(r.tierBuf[:n], li) {
				r.tierBuf[n] = e.mu.modelList[li]
				n++
			}
		}
	}
	r.ntiers = n
	return nil
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func containsModel(ms []*modelState, idx int) bool {
	for _, m := range ms {
		if m.idx == idx {
			return true
		}
	}
	return false
}

// admitNowLocked charges the gates and the placement and answers.
func (e *Engine) admitNowLocked(now int64, req *Request, r *pending, pl placement) Decision {
	r.gates = e.chargeGatesLocked(r.tenant, now, r.weighted, r.price, r.critical)
	return e.grantLocked(now, req.RequestID, r, pl, 0)
}

// grantLocked opens the lease for a placement whose gates are charged and
// builds the answer (and remembers it under the request id).
func (e *Engine) grantLocked(now int64, requestID string, r *pending, pl placement, queued time.Duration) Decision {
	t := r.tenant
	if pl.tier > 0 { // degraded: budget at the granted model's price
		granted := e.mu.cat.PriceMicros(pl.model.model, r.prompt, r.output)
		e.adjustSpendLocked(t, r.gates.day, r.gates.month, granted-r.gates.budget)
		r.gates.budget = granted
	}
	id := e.chargePlacementLocked(now, t, r, pl)
	d := Decision{Outcome: Admitted, LeaseID: id, Domain: pl.dom.ID(), Model: pl.model.name, Queued: queued}
	if pl.tier > 0 {
		d.Outcome = Degraded
		d.DowngradePath = make([]string, pl.tier+1)
		for i := range d.DowngradePath {
			d.DowngradePath[i] = r.tierBuf[i].name
		}
	}
	e.fillTenantTrace(&d.Trace, t, r, now)
	tr := &d.Trace
	tr.QuotaBefore, tr.QuotaAfter = r.gates.quotaBefore, r.gates.quotaAfter
	tr.BurstCreditBefore, tr.BurstCreditAfter = r.gates.creditBef, r.gates.creditAft
	tr.Floor, tr.Critical = pl.floor, r.critical
	tr.PrefillLevel, tr.DecodeLevel = pl.dom.cap.Levels(now)
	tr.KVInUse, tr.KVLimit = pl.dom.cap.KV()
	tr.EstimatedCostMicros = r.gates.budget
	if requestID != "" {
		e.rememberLocked(now, requestID, t.name, d)
	}
	return d
}

// fillTenantTrace sets the labels known before placement.
func (e *Engine) fillTenantTrace(tr *Trace, t *tenantState, r *pending, now int64) {
	tr.Tenant, tr.Tier, tr.Model = t.name, t.tier, r.tierBuf[0].name
	tr.WeightedTokens = r.weighted
	tr.EstimatedCostMicros = r.price
	lvl := t.tokens.Level(now)
	tr.QuotaBefore, tr.QuotaAfter = lvl, lvl
	c := availableCredit(lvl, t.tokens.Credit())
	tr.BurstCreditBefore, tr.BurstCreditAfter = c, c
}

// enqueueLocked puts a request that fits nowhere now into the fair queue,
// or rejects it at once when it never could fit, when its deadline cannot
// be met or when the queue is full.
func (e *Engine) enqueueLocked(ctx context.Context, now int64, wall time.Time, req *Request, r *pending) (Decision, *waiter) {
	t := r.tenant
	ever, drainingOnly, wait, first := e.capacityOutlookLocked(now, r)
	if !ever {
		if drainingOnly {
			return e.rejectWithTrace(ReasonDomainDraining, 0, t, r, now), nil
		}
		return e.rejectWithTrace(ReasonCapacityExceeded, 0, t, r, now), nil
	}
	estimate := addSat(e.backlogWaitLocked(), wait)
	// The deadline: the earliest of the caller's (gRPC or request field,
	// less the answer margin) and the default wait, clamped so that far-off
	// deadlines cannot overflow.
	maxWait := e.mu.cfg.Queue.DefaultWait.Duration
	margin := e.mu.cfg.Queue.DeadlineMargin.Duration
	if dl, ok := ctx.Deadline(); ok {
		maxWait = min(maxWait, dl.Sub(wall)-margin)
	}
	if !req.Deadline.IsZero() {
		maxWait = min(maxWait, req.Deadline.Sub(wall)-margin)
	}
	deadline := now + int64(maxWait)
	if estimate > time.Duration(deadline-now) {
		return e.rejectWithTrace(ReasonDeadlineUnmeetable, estimate, t, r, now), nil
	}
	w := &waiter{p: *r, requestID: req.RequestID, enqueued: now, deadline: deadline, refs: 1, done: make(chan struct{})}
	w.item = wfq.Item{
		Flow:     wfq.FlowKey{Tenant: t.name, Model: r.tierBuf[0].name},
		Cost:     uint64(r.weighted),
		Weight:   uint64(t.policy.Weight),
		Critical: r.critical,
		Value:    w,
	}
	if err := e.mu.queue.Enqueue(&w.item); err != nil {
		return e.rejectWithTrace(ReasonQueueFull, estimate, t, r, now), nil
	}
	w.queued = true
	w.p.gates = e.chargeGatesLocked(t, now, r.weighted, r.price, r.critical)
	t.queued++
	w.estimate = [2]int64{first.PrefillFLOP, first.DecodeBytes}
	e.mu.backlogPrefill += first.PrefillFLOP
	e.mu.backlogDecode += first.DecodeBytes
	e.mu.deadlines.push(w)
	if req.RequestID != "" {
		e.mu.idem[req.RequestID] = idemEntry{tenant: t.name, w: w, expires: deadline}
	}
	e.wakeDispatcher()
	return Decision{}, w
}

func (e *Engine) rejectWithTrace(reason Reason, retry time.Duration, t *tenantState, r *pending, now int64) Decision {
	d := rejected(reason, retry)
	e.fillTenantTrace(&d.Trace, t, r, now)
	return d
}

// backlogWaitLocked estimates how long the queued work takes to drain at the
// eligible domains' combined soft capacity.
func (e *Engine) backlogWaitLocked() time.Duration {
	var prefillRate, decodeRate int64
	for _, d := range e.mu.domains {
		if d.eligible() {
			prefillRate += d.cap.PrefillRate()
			decodeRate += d.cap.DecodeRate()
		}
	}
	if prefillRate <= 0 || decodeRate <= 0 {
		return tokenbucket.Never
	}
	p := float64(e.mu.backlogPrefill) / float64(prefillRate)
	d := float64(e.mu.backlogDecode) / float64(decodeRate)
	return time.Duration(max(p, d) * float64(time.Second))
}

// dispatchLocked admits queued requests, smallest finish tag first among
// those that fit somewhere (critical band first), until none fits.
func (e *Engine) dispatchLocked(now int64, answered []*waiter) []*waiter {
	if e.mu.queue.Len() == 0 {
		return answered
	}
	// A head that does not fit reserves the domain it waits for: requests
	// behind it (larger finish tags) may be placed only elsewhere. Without
	// this, small requests would take every refill and starve a large one
	// at the head; with it, one domain serves strictly in tag order and
	// several domains backfill around the waiting head (EASY backfilling).
	fits := func(it *wfq.Item) bool {
		w := it.Value.(*waiter)
		pl, ok := e.placeLocked(now, w.p.tenant, &w.p, false)
		if !ok {
			if d := e.reservedDomainLocked(now, w); d != nil {
				e.mu.blocked = append(e.mu.blocked, d)
			}
			return false
		}
		w.pl = pl
		return true
	}
	defer func() { e.mu.blocked = e.mu.blocked[:0] }()
	for {
		e.mu.blocked = e.mu.blocked[:0]
		it := e.mu.queue.Dequeue(fits, 8)
		if it == nil {
			return answered
		}
		w := it.Value.(*waiter)
		e.unqueueLocked(w)
		w.decision = e.grantLocked(now, w.requestID, &w.p, w.pl, time.Duration(now-w.enqueued))
		answered = append(answered, w)
	}
}

// reservedDomainLocked is the domain a queued request that does not fit
// waits for: the first in its rendezvous order for its requested model that
// could ever hold it.
func (e *Engine) reservedDomainLocked(now int64, w *waiter) *domainState {
	m := w.p.tierBuf[0]
	for _, di := range e.orderLocked(w.p.tenant, m) {
		d := e.mu.domains[di]
		if cost, err := d.cap.Cost(m.model, w.p.prompt, w.p.output); err == nil && d.cap.RetryAfter(now, cost, false) != tokenbucket.Never {
			return d
		}
	}
	return nil
}

// unqueueLocked takes a waiter out of the queue's bookkeeping (the item
// itself has been dequeued or removed by the caller).
func (e *Engine) unqueueLocked(w *waiter) {
	w.queued = false
	w.p.tenant.queued--
	e.mu.backlogPrefill -= w.estimate[0]
	e.mu.backlogDecode -= w.estimate[1]
	e.mu.deadlines.remove(w)
}

// rejectQueuedLocked answers a queued request with a rejection and gives
// back everything its gates took. The caller closes w.done.
func (e *Engine) rejectQueuedLocked(now int64, w *waiter, reason Reason, retry time.Duration) {
	e.mu.queue.Remove(&w.item)
	e.unqueueLocked(w)
	e.refundGatesLocked(w.p.tenant, now, &w.p.gates)
	w.decision = rejected(reason, retry)
	w.decision.Queued = time.Duration(now - w.enqueued)
	e.fillTenantTrace(&w.decision.Trace, w.p.tenant, &w.p, now)
	if ent, ok := e.mu.idem[w.requestID]; ok && ent.w == w {
		delete(e.mu.idem, w.requestID) // rejections are not remembered: a retry decides afresh
	}
}

// expireDeadlinesLocked rejects queued requests whose deadline has come.
func (e *Engine) expireDeadlinesLocked(now int64, answered []*waiter) []*waiter {
	for len(e.mu.deadlines) > 0 && e.mu.deadlines[0].deadline <= now {
		w := e.mu.deadlines[0]
		e.rejectQueuedLocked(now, w, ReasonDeadlineUnmeetable, e.backlogWaitLocked())
		answered = append(answered, w)
	}
	return answered
}

// wait blocks until the waiter is answered or ctx ends. A caller that gives
// up takes its request out of the queue (refunded); if it was admitted in
// the meantime and nobody can learn the lease (no request id), the lease is
// released at once so that nothing leaks.
func (e *Engine) wait(ctx context.Context, w *waiter) Decision {
	select {
	case <-w.done:
		return w.decision
	case <-ctx.Done():
	}
	e.mu.Lock()
	now := e.nowLocked()
	w.refs--
	if w.queued && w.refs > 0 { // an idempotent duplicate still waits for it
		d := rejected(ReasonDeadlineUnmeetable, e.backlogWaitLocked())
		e.mu.Unlock()
		return d
	}
	if w.queued {
		e.rejectQueuedLocked(now, w, ReasonDeadlineUnmeetable, e.backlogWaitLocked())
		e.mu.Unlock()
		close(w.done)
		return w.decision
	}
	d := w.decision
	if d.LeaseID != 0 && w.requestID == "" && w.refs == 0 {
		// Admitted just as the caller gave up, and nobody can learn the
		// lease: undo the admission entirely, as if it had been rejected.
		e.revokeLeaseLocked(now, d.LeaseID)
		d = rejected(ReasonDeadlineUnmeetable, 0)
		e.fillTenantTrace(&d.Trace, w.p.tenant, &w.p, now)
	}
	e.mu.Unlock()
	<-w.done // answered concurrently; done is closed right after the lock is dropped
	return d
}

// revokeLeaseLocked undoes an admission entirely, as if it had been
// rejected: the domain and the tenant's gates get everything back.
func (e *Engine) revokeLeaseLocked(now int64, id uint64) {
	l, ok := e.mu.leases.remove(id)
	if !ok {
		return
	}
	l.dom.cap.Release(now, l.cost, pd.Cost{})
	e.closeLeaseLocked(&l)
	if l.floor {
		l.tenant.floor.Refund(now, l.weighted)
	}
	e.refundGatesLocked(l.tenant, now, &l.gates)
}
