package admission

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-sched/sluice/pd"
)

// Explanation is what Admit would do with a request now, gate by gate and
// domain by domain, with nothing charged (Operator/ExplainAdmit, `sluicectl
// explain`): for an SRE asking why a tenant is refused or degraded.
type Explanation struct {
	// Outcome is ADMITTED, DEGRADED or REJECTED as Admit would answer at
	// once, or QUEUED for a request that would wait in the fair queue.
	Outcome       string
	Reason        Reason        // on REJECTED
	RetryAfter    time.Duration // on REJECTED
	Domain, Model string        // on ADMITTED and DEGRADED
	Floor         bool          // admitted within the tenant's floor
	EstimatedWait time.Duration // on QUEUED, DEADLINE_UNMEETABLE and QUEUE_FULL: the wait its place in the fair order predicts
	Gates         []GateCheck
	Placement     []PlacementCheck
}

// GateCheck is one tenant gate in the order Admit screens them.
type GateCheck struct {
	Gate    string // breaker, store, budget, rps, tokens, critical, concurrency; idempotency for a request id seen before
	Passed  bool
	Reached bool   // false: an earlier gate refused
	Before  int64  // level before the request (units of the gate; see Detail)
	After   int64  // level after it, had it been charged
	Detail  string // what was compared, in words
}

// PlacementCheck is one (model tier, domain) in the order placement tries
// them.
type PlacementCheck struct {
	Model, Domain string
	Floor         bool // tried from the floor reserve
	Fits          bool
	Detail        string
}

// Explain answers what Admit would do with req now, changing nothing. It
// runs Admit's own decision (repeatLocked, decideLocked) in the explaining
// decisionMode, which records each gate and (tier, domain) tried: the
// decision screens a copy of the tenant's state, only reads placement,
// asks the fair queue's bounds without entering it, and stops where Admit
// would charge, grant or queue: no lease, idempotency record, tier share,
// queue position or observer sees it. Invalid requests return the error
// Admit would.
//
// What it cannot foresee is the shared store, whose hooks it does not
// call: a strict-mode commit that refuses; in batched mode, the 1/N slice
// a tenant new to the replica starts from, and the reconcile interval
// that caps a quota refusal's Retry-After.
func (e *Engine) Explain(ctx context.Context, req Request) (Explanation, error) {
	if err := validateRequest(&req); err != nil {
		return Explanation{}, err
	}
	now := int64(e.clk.Since(e.base)) // as admit reads the clock
	wall := e.base.Add(time.Duration(now))
	e.mu.Lock()
	defer e.mu.Unlock()
	var r pending
	if err := e.mu.place.resolve(&req, &r); err != nil {
		return Explanation{}, err
	}
	rec := &recorder{}
	held := e.mu.room.tiers.hold(r.tiers()) // asking whose turn it is tidies the tiers' ledgers
	defer held.Cancel()
	if req.RequestID != "" {
		if seenD, seenW, err, seen := e.repeatLocked(now, &req, &r); seen {
			if err != nil {
				return Explanation{}, err
			}
			return e.repeatedLocked(seenD, seenW), nil
		}
	}
	v := e.decideLocked(ctx, now, wall, &req, &r, explaining(rec))
	x := Explanation{Placement: rec.placement}
	switch {
	case v.w != nil:
		x.Outcome, x.EstimatedWait = "QUEUED", v.w.wait
	case v.placed:
		pl := &v.pl
		x.Outcome, x.Domain, x.Model, x.Floor = pl.outcome().String(), pl.dom.ID(), pl.model.name, pl.floor
	default:
		var d Decision
		v.refusal(&d, &r, now)
		x.Outcome, x.Reason, x.RetryAfter, x.EstimatedWait = d.Outcome.String(), d.Reason, d.RetryAfter, d.Trace.EstimatedWait
	}
	if rec.screened {
		x.Gates = rec.gateChecks(now, &r, e.mu.gates.frozenLocked(now))
	}
	return x, nil
}

// repeatedLocked explains the answer to a request id seen before: the
// admission it was given (d) or the queued request it joins (w).
func (e *Engine) repeatedLocked(d Decision, w *waiter) Explanation {
	g := GateCheck{Gate: "idempotency", Reached: true, Passed: true}
	if w != nil {
		g.Detail = "request id seen before, with the same request: it joins that request, waiting in the fair queue"
		return Explanation{Outcome: "QUEUED", EstimatedWait: e.mu.room.positionWait(w, e.mu.place.eligibleRates), Gates: []GateCheck{g}}
	}
	g.Detail = fmt.Sprintf("request id seen before, with the same request: the answer is its admission's, lease on %s, charged once", d.Domain)
	return Explanation{Outcome: d.Outcome.String(), Domain: d.Domain, Model: d.Model, Floor: d.Trace.Floor, Gates: []GateCheck{g}}
}

// recorder notes what a decision tries, for Explain (decisionMode's
// explaining): the gates screen reached, and the (tier, domain) pairs find
// looks at.
type recorder struct {
	screened  bool      // screen ran: screen
	screen    screening // its verdict
	placement []PlacementCheck
}

// notTurn notes that r was kept from its requested tier because it is not
// its tenant's turn there.
func (rec *recorder) notTurn(r *pending) {
	rec.placement = append(rec.placement, PlacementCheck{Model: r.tierBuf[0].name,
		Detail: fmt.Sprintf("not tenant %s's turn at %s: others contending for it have used less of it over their weights (queue.tier_share_window); lower tiers only", r.tenant.name, r.tierBuf[0].name)})
}

// reserved notes a (tier, domain) find passed over: a queued request
// ahead of this one, or one waiting for it alone, waits for the domain.
func (rec *recorder) reserved(m *modelState, d *domainState, floor bool) {
	rec.placement = append(rec.placement, PlacementCheck{Model: m.name, Domain: d.ID(), Floor: floor,
		Detail: "reserved for a queued request that does not fit yet: its refills go to that request first, others go elsewhere if they can"})
}

// tried notes one (tier, domain) find looked at: what the request costs
// there (err: it cannot be costed) and whether it fits.
func (rec *recorder) tried(now int64, m *modelState, d *domainState, floor bool, held guardHold, cost pd.Cost, err error, fits bool) {
	c := PlacementCheck{Model: m.name, Domain: d.ID(), Floor: floor, Fits: fits}
	if err != nil {
		c.Detail = err.Error()
		rec.placement = append(rec.placement, c)
		return
	}
	pf, dc := d.cap.Levels(now)
	resP, resD, _ := d.cap.Reserves()
	kv, kvLimit := d.cap.KV()
	c.Detail = fmt.Sprintf("needs prefill %.3g of %.3g FLOP (reserve %.3g), decode %.3g of %.3g B (reserve %.3g), KV %.3g B with %.3g of %.3g in use",
		float64(cost.PrefillFLOP), float64(pf), float64(resP), float64(cost.DecodeBytes), float64(dc), float64(resD), float64(cost.KVBytes), float64(kv), float64(kvLimit))
	if w, end := d.cap.Warmup(now); end != 0 {
		c.Detail += fmt.Sprintf("; warming up: %.1f%% of its shared capacity, whole in %v", 100*float64(w)/pd.WarmupFull, time.Duration(end-now))
	}
	if f := d.loop.factor; f != 1 {
		c.Detail += fmt.Sprintf("; capacity feedback: %.2f× the model (what its engines sustain)", f)
	}
	switch {
	case floor && held != holdNone:
		c.Detail += fmt.Sprintf("; engines saturated (%.0f waiting, KV %.0f%% used): a request within its floor goes here only if no domain with clear engines holds it",
			d.loop.sig.Queue, 100*d.loop.sig.KVUsage)
	case held == holdSaturated:
		c.Detail += fmt.Sprintf("; engines saturated (%.0f waiting, KV %.0f%% used): the capacity feedback places only floor traffic here until they clear",
			d.loop.sig.Queue, 100*d.loop.sig.KVUsage)
	case held == holdFilled:
		c.Detail += fmt.Sprintf("; engines saturated (%.0f waiting at their last signal, %d placed since): the capacity feedback places only floor traffic here until they report again",
			d.loop.sig.Queue, d.loop.placed)
	}
	rec.placement = append(rec.placement, c)
}

// gateChecks describes every gate for a request screen has decided on (r,
// its tenant's state after screening): those reached, passed or the one
// that refused, with the level before the request and what it would leave,
// then those not reached. frozen is what is left of a credit freeze.
func (rec *recorder) gateChecks(now int64, r *pending, frozen time.Duration) []GateCheck {
	t := r.tenant
	last, refused := rec.screen.reached, rec.screen.why.refused()
	out := make([]GateCheck, 0, numGates)
	for g := range numGates {
		c := GateCheck{Reached: g <= last, Passed: g < last || (g == last && !refused)}
		switch g {
		case gateBreaker:
			c.Gate = "breaker"
			c.Detail = fmt.Sprintf("burst credit %s", creditStateName(t.credit.state))
		case gateStore:
			c.Gate = "store"
			c.Detail = "shared state reachable, or the tier fails open"
		case gateBudget:
			c.Gate = "budget"
			c.Before, c.After = t.budget.spentDay, t.budget.spentDay+r.price
			c.Detail = fmt.Sprintf("µ$ spent today %d + %d of a daily cap %d (0: none), this month %d of %d", t.budget.spentDay, r.price, t.budget.dailyCap, t.budget.spentMon, t.budget.monthlyCap)
		case gateRPS:
			before := t.rps.Level(now)
			c.Gate = "rps"
			c.Before, c.After = before/rpsUnit, (before-rpsUnit)/rpsUnit
			c.Detail = fmt.Sprintf("requests in the RPS bucket (burst %d)", t.rps.Burst()/rpsUnit)
		case gateTokens:
			if r.critical {
				before := t.critical.Level(now)
				c.Gate = "critical"
				c.Before, c.After = before, before-r.weighted
				c.Detail = fmt.Sprintf("weighted tokens in the critical bucket, %d asked", r.weighted)
				break
			}
			before := t.tokens.Level(now)
			c.Gate = "tokens"
			c.Before, c.After = before, before-r.weighted
			c.Detail = fmt.Sprintf("weighted tokens in the token bucket, %d asked; it may go %d into debt", r.weighted, t.tokens.Credit())
			if frozen > 0 {
				c.Detail = fmt.Sprintf("weighted tokens in the token bucket, %d asked; burst credit frozen by an operator for %v: no debt", r.weighted, frozen)
			}
		case gateConcurrency:
			c.Gate = "concurrency"
			c.Before, c.After = t.inFlight+t.queued, t.inFlight+t.queued+1
			c.Detail = fmt.Sprintf("in flight and queued, of at most %d (0: no limit)", t.policy.MaxConcurrency)
		}
		out = append(out, c)
	}
	return out
}

func creditStateName(s creditState) string {
	switch s {
	case creditBreakerOpen:
		return "breaker open"
	case creditHalfOpen:
		return "half-open (no credit)"
	}
	return "lending"
}
