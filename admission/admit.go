package admission

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/sluice-sched/sluice/internal/tokenbucket"
	"github.com/sluice-sched/sluice/pd"
)

// maxLowerTiers bounds accept_downgrade; catalogs are a few tiers deep.
const maxLowerTiers = 7

// maxNameLen bounds tenant, model and request id names, which errors echo.
const maxNameLen = 128

// pending is one request on its way through the engine, and its charge.
type pending struct {
	charge
	tierBuf  [maxLowerTiers + 1]*modelState // requested model first, then accepted lower tiers in chain order
	ntiers   int
	prompt   int64
	cached   int64 // prompt tokens the router expects a prefix cache to serve
	output   int64
	weighted int64
	price    int64 // micro-USD at the requested model, charged to the budget
	critical bool
	// With a request id: its idempotency key and the hash of its body.
	hasID    bool
	idem     idemKey
	idemBody uint32
}

// tiers returns the models to try, requested first. (An index, not a slice
// into tierBuf, so that a pending on the stack does not point into itself
// and escape.)
func (r *pending) tiers() []*modelState { return r.tierBuf[:r.ntiers] }

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
	e.answer(ctx, &req, &d)
	return d, nil
}

// Ticket is a request Submit left waiting in the fair queue.
type Ticket struct {
	w   *waiter
	req Request
}

// Done is closed once the request has its answer (Await then returns it
// at once).
func (tk *Ticket) Done() <-chan struct{} { return tk.w.done }

// Submit decides a request as Admit does without waiting in the queue: it
// returns the answer, or a Ticket when the request was queued, which Await
// answers. It is how a caller that drives the clock itself (a replay on a
// manual clock) admits without a goroutine per queued request.
func (e *Engine) Submit(ctx context.Context, req Request) (Decision, *Ticket, error) {
	if err := validateRequest(&req); err != nil {
		return Decision{}, nil, err
	}
	d, w, err := e.admit(ctx, &req)
	if err != nil {
		return Decision{}, nil, err
	}
	if w != nil {
		return Decision{}, &Ticket{w: w, req: req}, nil
	}
	e.answer(ctx, &req, &d)
	return d, nil, nil
}

// Await waits for a queued request's answer, or for ctx to end: then the
// caller gives up and the request leaves the queue, its charge cancelled.
func (e *Engine) Await(ctx context.Context, tk *Ticket) Decision {
	d := e.wait(ctx, tk.w)
	e.answer(ctx, &tk.req, &d)
	return d
}

// answer is the way out of every decision: the shared strategy confirms an
// admission (or turns it into the store's refusal), then the observer
// sees it.
func (e *Engine) answer(ctx context.Context, req *Request, d *Decision) {
	if why := e.shared.Decided(ctx, req.RequestID, d.LeaseID); why.Refused() {
		*d = refused(*d, refusalOf(why))
	}
	// A deferred answer is the backlog's to count (package deferral): the
	// engine gives one for every try of a waiting ticket.
	if e.observer != nil && d.Outcome != Deferred {
		e.observer.ObserveDecision(*req, *d)
	}
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
	case r.ExpectedCachedTokens < 0 || r.ExpectedCachedTokens > r.PromptTokens:
		return &InvalidArgumentError{Field: "expected_cached_tokens", Reason: fmt.Sprintf("must be in [0, prompt_tokens %d], got %d", r.PromptTokens, r.ExpectedCachedTokens)}
	case r.Priority != 0 && r.Priority != PriorityNormal && r.Priority != PriorityCritical:
		return &InvalidArgumentError{Field: "priority", Reason: fmt.Sprintf("unknown priority %d", r.Priority)}
	case r.DeferWithin < 0 || (r.DeferWithin > 0 && !r.Deferrable):
		return &InvalidArgumentError{Field: "defer_within", Reason: fmt.Sprintf("must be ≥ 0 and only on a deferrable request, got %v", r.DeferWithin)}
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

// validateLimits checks the token counts against the config's limits,
// and a deferrable request's wait against deferral.max_within.
func validateLimits(req *Request, lim *RequestLimits, df *DeferralConfig) error {
	if req.DeferWithin > df.MaxWithin.Duration {
		return &InvalidArgumentError{Field: "defer_within", Reason: fmt.Sprintf("%v exceeds deferral.max_within %v", req.DeferWithin, df.MaxWithin.Duration)}
	}
	if req.PromptTokens > lim.MaxPromptTokens {
		return &InvalidArgumentError{Field: "prompt_tokens", Reason: fmt.Sprintf("%d exceeds the limit of %d", req.PromptTokens, lim.MaxPromptTokens), Limit: lim.MaxPromptTokens}
	}
	if req.MaxOutputTokens > lim.MaxOutputTokens {
		return &InvalidArgumentError{Field: "max_output_tokens", Reason: fmt.Sprintf("%d exceeds the limit of %d", req.MaxOutputTokens, lim.MaxOutputTokens), Limit: lim.MaxOutputTokens}
	}
	return nil
}

func rejected(reason Reason, retry time.Duration) Decision {
	return Decision{Outcome: Rejected, Reason: reason, RetryAfter: durationUntil(retry)}
}

// durationUntil converts a wait into a Retry-After in [0, 24h], so that
// "never" stays a usable number on the wire.
func durationUntil(d time.Duration) time.Duration {
	return min(max(d, 0), 24*time.Hour)
}

// admit runs steps 2–6 of the data flow under the lock. It returns either a
// decision or a waiter to wait on.
func (e *Engine) admit(ctx context.Context, req *Request) (Decision, *waiter, error) {
	// The monotonic clock alone (Since), the wall time derived from it, as
	// Release does: one clock read instead of two.
	now := int64(e.clk.Since(e.base))
	wall := e.base.Add(time.Duration(now))
	e.mu.Lock()
	var r pending
	if err := e.mu.place.resolve(req, &r); err != nil {
		e.mu.Unlock()
		return Decision{}, nil, err
	}
	// A request id seen before gets its answer even while shutting down: a
	// retry after a lost answer must find its lease, not be sent elsewhere.
	if req.RequestID != "" {
		if d, w, err, seen := e.repeatLocked(now, req, &r); seen {
			if w != nil {
				w.refs++ // one more caller waits on it
			}
			e.mu.Unlock()
			return d, w, err
		}
	}
	v := e.decideLocked(ctx, now, wall, req, &r, admitting())
	var d Decision
	var answered []*waiter
	switch {
	case v.placed:
		r.chargeGates(now, r.tenant, r.weighted, r.price, r.critical)
		e.grantLocked(now, &r, v.pl, 0, &d)
	case v.w != nil:
		answered = e.dispatchLocked(now, nil)
	default:
		v.refusal(&d, &r, now)
	}
	e.mu.Unlock()
	finish(answered)
	return d, v.w, nil
}

// repeatLocked notes req's request id in r and answers it if it was seen
// before (seen true): the queued request it joins, or the live lease it
// was admitted with, rebuilt as an answer. An id reused with another body
// is invalid; one whose lease has ended is ErrLeaseEnded, never a dead
// lease for free. It counts no caller on the queued request: joining it is
// the caller's to do.
func (e *Engine) repeatLocked(now int64, req *Request, r *pending) (d Decision, w *waiter, err error, seen bool) {
	idem := &e.mu.room.idem
	r.hasID, r.idem, r.idemBody = true, idem.key(req.Tenant, req.RequestID), idem.bodyHash(req)
	body := r.idemBody
	if w := idem.queued[r.idem]; w != nil {
		if w.p.idemBody != body {
			return Decision{}, nil, errReusedID, true
		}
		return Decision{}, w, nil, true
	}
	known, ok := idem.lookup(r.idem, now)
	if !ok {
		return Decision{}, nil, nil, false
	}
	if known.body != body {
		return Decision{}, nil, errReusedID, true
	}
	l, ok := e.mu.leases.get(known.lease)
	if !ok {
		return Decision{}, nil, ErrLeaseEnded, true
	}
	l.answer(&d, known.lease, r, now)
	return d, nil, nil, true
}

var errReusedID = &InvalidArgumentError{Field: "request_id", Reason: "already used with a different request"}

// verdict is what decideLocked decided: a placement to charge and grant
// (placed), a waiter queued in the waiting room (w), or else a refusal
// (why; Deferred when deferred).
type verdict struct {
	placed   bool
	pl       placement
	w        *waiter
	why      refusal
	deferred bool
	wait     time.Duration // the wait the queue predicted, for a refusal at the queue
}

// refuse is the verdict REJECTED for why.
func refuse(why refusal) verdict { return verdict{why: why} }

// deferred is the verdict DEFERRED for why: the backlog tries again.
func deferred(why refusal) verdict { return verdict{why: why, deferred: true} }

// refusal writes the answer of a refused verdict to d: REJECTED, or
// DEFERRED, with what r's tenant's gates held if it got that far.
func (v *verdict) refusal(d *Decision, r *pending, now int64) {
	*d = rejected(v.why.reason, v.why.retry)
	if v.deferred {
		d.Outcome = Deferred
	}
	if r.tenant != nil {
		tenantTrace(&d.Trace, r, now)
	}
	d.Trace.EstimatedWait = v.wait
}

// withinFloor reports whether r may be placed within its tenant's floor
// (on the floor reserve, past the capacity guard): the floor bucket holds
// its weighted tokens (all of it, for a request larger than one second of
// floor), or the tenant has been admitted less than its floor in this
// second, whatever the size of its request (tenantState.underFloor). A
// request larger than what the bucket holds takes it into debt: the
// tenant's floor is a rate whatever the size of its requests, where a
// bucket one second deep would never hold them.
func withinFloor(now int64, t *tenantState, r *pending) bool {
	return !r.critical && t.floor.Burst() > 0 && (t.floor.Fits(now, min(r.weighted, t.floor.Burst()), 0) || t.underFloor(now))
}

// decideLocked runs a new request through the tenant gates and placement:
// within the floor (reserved capacity, no queue), on shared capacity, or
// into the waiting room. m says whether the decision is Admit's or only
// explained (decisionMode); granting a placement is the caller's.
func (e *Engine) decideLocked(ctx context.Context, now int64, wall time.Time, req *Request, r *pending, m decisionMode) verdict {
	if e.mu.closed {
		return refuse(refusal{ReasonShuttingDown, time.Second})
	}
	t := m.tenantLocked(e, req.Tenant, now)
	if t == nil {
		return refuse(refusal{ReasonUnknownTenant, 0})
	}
	r.tenant = t
	r.weighted = r.prompt + e.mu.cfg.OutputTokenWeight*r.output
	r.price = e.mu.place.cat.PriceMicros(r.tierBuf[0].model, r.prompt, r.output)
	if req.Deferrable {
		r.ticketed = req.Ticketed
		return e.decideDeferrableLocked(now, wall, r, m)
	}
	s := m.screenLocked(e, now, wall, r, req.Priority == PriorityCritical, e.mu.gates.frozenLocked(now))
	if s.why.refused() {
		return refuse(s.why)
	}
	r.critical = s.critical
	place := &e.mu.place
	if withinFloor(now, t, r) {
		if pl, ok := place.findFloor(now, r, tierPlan{from: 0, upto: 1}, m); ok {
			return verdict{placed: true, pl: pl}
		}
	}
	plan := e.sharedTiersLocked(ctx, now, wall, req, r)
	if plan.notTurn {
		m.notTurnLocked(e, now, r)
	}
	pl, ok := place.find(now, r, false, plan, m)
	if ok && (pl.tier == 0 || !plan.triesOwn()) {
		return verdict{placed: true, pl: pl}
	}
	// Degraded from its own tier, or fits nowhere: the outlook, O(domains),
	// says whether some domain could hold its own tier (then that tier is
	// full for it), and how long a queued request waits.
	o := place.outlook(now, r)
	if plan.triesOwn() && o.own {
		m.tierFullLocked(e, now, r.tierBuf[0].name)
	}
	if ok {
		return verdict{placed: true, pl: pl}
	}
	room, q := &e.mu.room, &e.mu.cfg.Queue
	budget := waitBudget(ctx, wall, req, q)
	// Whether it waits for its requested tier: not when it is not its
	// tenant's turn there (and degrade_after does not say to wait anyway),
	// nor when the tier cannot serve it in time (waitsForTier).
	waits := r.ntiers == 1 || (!(plan.notTurn && q.DegradeAfter == nil) && room.waitsForTier(now, r, o, place.eligibleRates, budget))
	if !waits && plan.upto < r.ntiers && room.waitingAhead(r) == 0 {
		// Nobody waits: its lower tiers now. (With others waiting, it
		// takes its place in the fair order among the requests for its
		// lower tiers, as any request takes its turn.)
		if pl, ok := place.find(now, r, false, tierPlan{from: 1, upto: r.ntiers}, m); ok {
			return verdict{placed: true, pl: pl}
		}
	}
	return room.enqueue(now, budget, r, o, place.eligibleRates, q, m, waits)
}

// decideDeferrableLocked decides a deferrable request, which never waits
// in the queue: it runs now only on capacity interactive traffic leaves,
// or is Deferred with what keeps it, for the backlog to ticket and try
// again. Interactive first means: nothing while an interactive request
// waits in the queue; shared capacity only, above the floors' reserve and
// deferral.headroom of each bucket (so a request arriving next still
// finds room); no burst credit (debt it ran up would open the tenant's
// breaker against its interactive traffic, and it can wait for its quota
// instead); the normal band only. It is refused only for what waiting
// cannot mend: an unknown tenant, a request too large for any quota or
// any domain.
func (e *Engine) decideDeferrableLocked(now int64, wall time.Time, r *pending, m decisionMode) verdict {
	frozen := max(e.mu.gates.frozenLocked(now), 1) // no credit lent
	why := m.screenLocked(e, now, wall, r, false, frozen).why
	if why.reason == ReasonBurstCreditFrozen && e.mu.gates.frozenLocked(now) <= 0 {
		why.reason = ReasonQuotaExceeded // no freeze: only its own quota holds it
	}
	switch {
	case why.reason == ReasonRequestTooLarge:
		return refuse(why)
	case why.refused():
		return deferred(why)
	case e.mu.room.queue.Len() > 0:
		return deferred(refusal{ReasonInteractiveFirst, tickBusy})
	}
	r.deferred = true
	place := &e.mu.place
	if pl, ok := place.find(now, r, false, allTiers(r), m); ok {
		return verdict{placed: true, pl: pl}
	}
	o := place.outlook(now, r)
	switch {
	case o.drainingOnly: // the drain ends, and so may the wait
		return deferred(refusal{ReasonDomainDraining, 0})
	case !o.ever:
		return refuse(refusal{ReasonCapacityExceeded, 0})
	}
	return deferred(refusal{ReasonCapacityExceeded, o.wait})
}

// tierPlan is the run of a request's tiers placement may try: from the
// from-th up to before the upto-th (none when upto ≤ from).
type tierPlan struct {
	from, upto int
	// notTurn: the requested tier is held back because it is not the
	// tenant's turn there (the caller notes it: notTurnLocked).
	notTurn bool
}

// allTiers is every tier r accepts, the requested one first.
func allTiers(r *pending) tierPlan { return tierPlan{from: 0, upto: r.ntiers} }

// triesOwn reports whether the plan tries the requested tier.
func (p tierPlan) triesOwn() bool { return p.from == 0 && p.upto > 0 }

// sharedTiersLocked plans which of r's tiers may take shared capacity now.
//
// None while others in the same band are already waiting for it: then the
// request takes its place in the fair order, and the dispatcher gives the
// head of that order the best tier that fits, its requested tier only on
// its tenant's turn there (tierShares). So under saturation each tenant's
// share of a tier follows its weight, and low weights degrade first,
// rather than whoever arrives when capacity frees. Lower tiers are tried
// at once when it is not the tenant's turn at its tier, when the config
// says so (degrade_after 0), or when the request cannot wait for its own
// (its deadline is nearer than degrade_after: a caller that must be
// answered now) — and then, with others waiting, only the lower tiers:
// the requested one is theirs first. (A request the requested tier cannot
// serve before its deadline is sent to its lower tiers by decideLocked,
// once placement's outlook says how long the tier takes.)
func (e *Engine) sharedTiersLocked(ctx context.Context, now int64, wall time.Time, req *Request, r *pending) tierPlan {
	waiting := e.mu.room.waitingAhead(r)
	if r.ntiers == 1 { // nothing to degrade to: the requested tier, if nobody waits
		if waiting == 0 {
			return tierPlan{from: 0, upto: 1}
		}
		return tierPlan{}
	}
	q := &e.mu.cfg.Queue
	da := q.DegradeAfter
	degradeNow := da != nil && (da.Duration == 0 || waitBudget(ctx, wall, req, q) < da.Duration)
	turn := waiting == 0 && e.mu.room.tiers.turn(now, r.tierBuf[0].name, r.tenant.name)
	notTurn := waiting == 0 && !turn
	switch {
	case turn && degradeNow:
		return allTiers(r)
	case turn:
		return tierPlan{from: 0, upto: 1}
	case degradeNow:
		return tierPlan{from: 1, upto: r.ntiers, notTurn: notTurn}
	}
	return tierPlan{notTurn: notTurn}
}

// notTurnLocked notes a request kept from its own tier because it is not
// its tenant's turn there. The tier stays contended if the tenant whose
// turn it is waits for it in the queue, or if the tier would not have held
// this request anyway. A tier kept from a tenant only by the turns, with
// room on it and nobody waiting, does not: else the turns would keep
// themselves going on a tier nobody lacks.
func (e *Engine) notTurnLocked(now int64, r *pending) {
	place, tiers, model := &e.mu.place, &e.mu.room.tiers, r.tierBuf[0].name
	if tiers.leastWaiting(model) {
		tiers.full(now, model) // kept for a tenant that is waiting for it
		return
	}
	if _, fits := place.find(now, r, false, tierPlan{from: 0, upto: 1}, admitting()); !fits && place.outlook(now, r).own {
		tiers.full(now, model)
	}
}

// decisionMode is where Admit's decision and Explain's part ways, chosen
// once at the top (admitting, explaining): the steps of decideLocked are
// the same, and hand the mode what they would change. Admitting, it
// changes the engine: the live tenant, the queue and a queued request's
// charge, the tier shares. Explaining, it records each step in rec and
// changes nothing: a copy of the tenant's state, no tier marked full, the
// queue's bounds only checked (the waiter is not queued). (Asking whose
// turn it is at a tier tidies that tier's ledger; Explain holds the
// ledgers and puts them back.)
type decisionMode struct {
	rec *recorder // nil: admitting
}

// admitting is Admit's mode.
func admitting() decisionMode { return decisionMode{} }

// explaining is Explain's mode, recording in rec.
func explaining(rec *recorder) decisionMode { return decisionMode{rec: rec} }

// tenantLocked returns the state to screen the tenant with, nil if it is
// not configured: the live state (built on first use), or a copy, since
// screening moves the breaker and the budget period to now, which no
// Cancel undoes.
func (m decisionMode) tenantLocked(e *Engine, name string, now int64) *tenantState {
	if m.rec != nil {
		t := e.mu.gates.scratchLocked(name, now, e.mu.place.modelList)
		if t != nil && t.floorShare != e.mu.place.floorShare {
			// A copy: its floor bucket alone, never the shared state.
			t.floorShare = e.mu.place.floorShare
			floor := sharedFloor(t.policy.Floor, t.floorShare)
			t.floor.Level(now)
			t.floor.SetLimits(floor, floor, 0)
		}
		return t
	}
	t, fresh := e.mu.gates.lookupLocked(name, now, e.mu.place.modelList)
	switch {
	case fresh:
		if share := e.mu.place.floorShare; t.policy.Floor > 0 && t.floorShare != share {
			t.floorShare = share
			t.setPolicy(t.policy, now, false) // its full floor bucket cut to the share
		}
		e.shared.TenantReadyLocked(t, now, false)
	case t != nil:
		e.fitFloorLocked(t, now)
	}
	return t
}

// screenLocked runs r's tenant gates (tenantState.screen) with the shared
// strategy's store gate. Admit lets the strategy note a quota refusal's
// demand (which may lengthen its Retry-After); Explain records the gates
// reached.
func (m decisionMode) screenLocked(e *Engine, now int64, wall time.Time, r *pending, wantCritical bool, frozen time.Duration) screening {
	t := r.tenant
	s := t.screen(now, wall, r.weighted, r.price, wantCritical, refusalOf(e.shared.GateLocked(t)), frozen)
	if m.rec != nil {
		m.rec.screened, m.rec.screen = true, s
		return s
	}
	if s.why.reason == ReasonQuotaExceeded {
		s.why.retry = e.shared.QuotaRefusedLocked(t, s.why.retry)
	}
	return s
}

// tried takes one (tier, domain) find looked at (recorder.tried).
func (m decisionMode) tried(now int64, ms *modelState, d *domainState, floor bool, held guardHold, cost pd.Cost, err error, fits bool) {
	if m.rec != nil {
		m.rec.tried(now, ms, d, floor, held, cost, err, fits)
	}
}

// reserved takes a (tier, domain) find passed over because a queued
// request waits for the domain (recorder.reserved).
func (m decisionMode) reserved(ms *modelState, d *domainState, floor bool) {
	if m.rec != nil {
		m.rec.reserved(ms, d, floor)
	}
}

// notTurnLocked takes a request kept from its requested tier because it is
// not its tenant's turn there (Engine.notTurnLocked).
func (m decisionMode) notTurnLocked(e *Engine, now int64, r *pending) {
	if m.rec != nil {
		m.rec.notTurn(r)
		return
	}
	e.notTurnLocked(now, r)
}

// tierFullLocked takes a model tier that a request whose turn it was tried
// and did not fit, though some domain could hold it: Admit marks it full
// (tierShares.full).
func (m decisionMode) tierFullLocked(e *Engine, now int64, model string) {
	if m.rec == nil {
		e.mu.room.tiers.full(now, model)
	}
}

// queueLocked puts w, a request that fits nowhere now, into the waiting
// room and charges its gates; it fails when the queue's bounds are
// reached. Explain only checks the bounds.
func (m decisionMode) queueLocked(room *waitingRoom, now int64, w *waiter) error {
	if m.rec != nil {
		return room.queue.Check(&w.item)
	}
	if err := room.enter(w); err != nil {
		return err
	}
	r := &w.p
	r.chargeGates(now, r.tenant, r.weighted, r.price, r.critical)
	if r.hasID {
		room.idem.queued[r.idem] = w
	}
	return nil
}

// grantLocked places a request whose gates are charged, opens its lease and
// builds the answer in d, the caller's answer or the waiter's, in place (a
// Decision is large, and this is the hot path); it remembers the answer
// under the request id.
func (e *Engine) grantLocked(now int64, r *pending, pl placement, queued time.Duration, d *Decision) {
	tiers := &e.mu.room.tiers
	if pl.tier > 0 { // degraded: budget at the granted model's price; it wanted more
		r.reprice(e.mu.place.cat.PriceMicros(pl.model.model, r.prompt, r.output))
		tiers.want(now, r.tierBuf[0].name, r.tenant.name, false)
	}
	r.place(now, pl)
	tiers.charge(now, pl.model.name, r.tenant.name, r.weighted, r.tenant.policy.Weight)
	id := e.mu.leases.add(lease{
		charge: r.charge, modelName: pl.model.name, prompt: r.prompt, cached: r.cached, output: r.output,
		outWeight: e.mu.cfg.OutputTokenWeight, granted: now, expires: now + int64(e.mu.cfg.Leases.TTL.Duration),
	})
	*d = Decision{Outcome: pl.outcome(), LeaseID: id, Domain: pl.dom.ID(), Model: pl.model.name, Queued: queued}
	if pl.tier > 0 {
		d.DowngradePath = make([]string, pl.tier+1)
		for i := range d.DowngradePath {
			d.DowngradePath[i] = r.tierBuf[i].name
		}
	}
	tenantTrace(&d.Trace, r, now)
	tr := &d.Trace
	g := &r.gates
	tr.QuotaBefore, tr.QuotaAfter = g.quotaBefore, g.quotaAfter
	tr.BurstCreditBefore, tr.BurstCreditAfter = g.creditBef, g.creditAft
	tr.Floor, tr.Critical = pl.floor, r.critical
	tr.PrefillLevel, tr.DecodeLevel = pl.dom.cap.Levels(now)
	tr.KVInUse, tr.KVLimit = pl.dom.cap.KV()
	tr.EstimatedCostMicros = g.price
	if r.hasID {
		e.mu.room.idem.remember(r.idem, id, r.idemBody, now, now+int64(e.mu.cfg.Leases.IdempotencyTTL.Duration))
	}
}

// tenantTrace sets the labels known before placement.
func tenantTrace(tr *Trace, r *pending, now int64) {
	t := r.tenant
	tr.Tenant, tr.Tier, tr.Model = t.name, t.tier, r.tierBuf[0].name
	tr.WeightedTokens = r.weighted
	tr.EstimatedCostMicros = r.price
	lvl := t.tokens.Level(now)
	tr.QuotaBefore, tr.QuotaAfter = lvl, lvl
	c := availableCredit(lvl, t.tokens.Credit())
	tr.BurstCreditBefore, tr.BurstCreditAfter = c, c
}

func rejectWithTrace(why refusal, r *pending, now int64) Decision {
	d := rejected(why.reason, why.retry)
	tenantTrace(&d.Trace, r, now)
	return d
}

// addSat adds two non-negative durations, saturating at tokenbucket.Never.
func addSat(a, b time.Duration) time.Duration {
	if a > tokenbucket.Never-b {
		return tokenbucket.Never
	}
	return a + b
}

// dispatchLocked admits queued requests, smallest finish tag first among
// those that fit somewhere (critical band first), until none fits.
func (e *Engine) dispatchLocked(now int64, answered []*waiter) []*waiter {
	room, place := &e.mu.room, &e.mu.place
	defer place.endPass()
	if room.queue.Len() == 0 {
		return answered
	}
	fits := func(w *waiter) bool {
		var ok bool
		w.pl, ok = e.placeQueuedLocked(now, w)
		return ok
	}
	for {
		place.blocked, place.awaiting = place.blocked[:0], place.awaiting[:0]
		w := room.next(fits)
		if w == nil {
			return answered
		}
		e.grantQueuedLocked(now, w, w.pl)
		answered = append(answered, w)
	}
}

// grantQueuedLocked grants a request out of the queue pl, and lets it
// leave the waiting room.
func (e *Engine) grantQueuedLocked(now int64, w *waiter, pl placement) {
	e.grantLocked(now, &w.p, pl, time.Duration(now-w.enqueued), &w.decision)
	e.mu.room.leave(now, w) // after the grant, which its tier share counts
	w.decision.Trace.EstimatedWait = w.wait
}

// degradeOverdueLocked answers a queued request whose deadline has come
// with a lower tier it accepts, if one fits the shared capacity now,
// rather than refuse it: it waited for its requested tier as long as the
// tier could serve it in time, and its turn did not come (the queue's
// estimate of its wait was short, or the tier went to tenants whose turn
// it was). It reports whether it did; the caller refuses it otherwise.
func (e *Engine) degradeOverdueLocked(now int64, w *waiter) bool {
	if w.p.ntiers == 1 {
		return false
	}
	pl, ok := e.mu.place.find(now, &w.p, false, tierPlan{from: 1, upto: w.p.ntiers}, admitting())
	if !ok {
		return false
	}
	e.mu.room.queue.Remove(&w.item)
	e.grantQueuedLocked(now, w, pl)
	return true
}

// placeQueuedLocked places a queued head for the dispatcher
// (placer.fitsQueued), on its requested tier only on its tenant's turn
// there, and notes in the tier shares what the try says of that tier. A
// head whose turn it is not takes a lower tier or waits without holding a
// domain. (If the tenant whose turn it is lies further back than
// dispatchScanLimit heads, the tier waits for it until its tag comes up,
// or until the turns lapse with the contention.)
func (e *Engine) placeQueuedLocked(now int64, w *waiter) (placement, bool) {
	tiers, model := &e.mu.room.tiers, w.p.tierBuf[0].name
	if !w.p.deferred && withinFloor(now, w.p.tenant, &w.p) {
		// Its floor has refilled while it waited: it goes on the floor's
		// reserve, which the capacity guard's hold does not stop, rather
		// than wait for the shared capacity a hold or a shrinking factor
		// withholds; on a domain whose engines are clear first, on its
		// requested tier, and on its lower ones as the queue lets it take
		// them (from its degradeAt on).
		plan := queuedTiers(now, w, true)
		plan.from = 0
		if pl, ok := e.mu.place.findFloor(now, &w.p, plan, admitting()); ok {
			return pl, true
		}
	}
	turn := w.p.ntiers == 1 || w.lowerOnly || tiers.turn(now, model, w.p.tenant.name)
	pl, ok := e.mu.place.fitsQueued(now, w, turn)
	switch {
	case turn && w.contends && (!ok || pl.tier > 0):
		tiers.full(now, model) // its turn, and its own tier did not fit
	case !turn && w.contends:
		e.notTurnLocked(now, &w.p)
	}
	return pl, ok
}

// wait blocks until the waiter is answered or ctx ends. A caller that gives
// up takes its request out of the queue (its charge cancelled); if it was
// admitted in the meantime and nobody can learn the lease (no request id),
// the admission is revoked so that nothing leaks.
func (e *Engine) wait(ctx context.Context, w *waiter) Decision {
	select {
	case <-w.done:
		return w.decision
	case <-ctx.Done():
	}
	e.mu.Lock()
	now := e.nowLocked()
	w.refs--
	room := &e.mu.room
	if w.queued && w.refs > 0 { // an idempotent duplicate still waits for it
		d := rejected(ReasonDeadlineUnmeetable, room.positionWait(w, e.mu.place.eligibleRates))
		e.mu.Unlock()
		return d
	}
	if w.queued {
		room.reject(now, w, refusal{ReasonDeadlineUnmeetable, room.positionWait(w, e.mu.place.eligibleRates)})
		e.mu.place.unawait() // it may have been awaiting a domain
		e.mu.Unlock()
		close(w.done)
		return w.decision
	}
	d := w.decision
	if d.LeaseID != 0 && !w.p.hasID && w.refs == 0 {
		// Admitted just as the caller gave up, and nobody can learn the
		// lease: undo the admission entirely, as if it had been rejected.
		if l, ok := e.mu.leases.remove(d.LeaseID); ok {
			l.Cancel(now)
		}
		d = rejectWithTrace(refusal{ReasonDeadlineUnmeetable, 0}, &w.p, now)
	}
	e.mu.Unlock()
	<-w.done // answered concurrently; done is closed right after the lock is dropped
	return d
}

// revokeLocked undoes an admission the shared store did not confirm: its
// charge is cancelled and its request id forgotten (a refusal is not
// remembered: a retry decides afresh).
func (e *Engine) revokeLocked(requestID string, leaseID uint64) {
	now := e.nowLocked()
	l, ok := e.mu.leases.remove(leaseID)
	if !ok {
		return
	}
	l.Cancel(now)
	if requestID != "" {
		idem := &e.mu.room.idem
		idem.forget(idem.key(l.tenant.name, requestID))
	}
	finish(e.dispatchLocked(now, nil)) // closing channels never blocks: fine under the lock
}

// refused turns an admission into a refusal, keeping its trace.
func refused(d Decision, why refusal) Decision {
	out := rejected(why.reason, why.retry)
	out.Trace = d.Trace
	return out
}
