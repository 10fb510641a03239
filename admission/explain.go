package admission

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/wfq"
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
	EstimatedWait time.Duration // on QUEUED, and DEADLINE_UNMEETABLE: the wait its place in the fair order predicts
	Gates         []GateCheck
	Placement     []PlacementCheck
}

// GateCheck is one tenant gate in the order Admit screens them.
type GateCheck struct {
	Gate    string // breaker, store, budget, rps, tokens, critical, concurrency
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

// Explain answers what Admit would do with req now, changing nothing: the
// tenant's gates are screened and charged on a copy of its state, and
// placement is only looked at. Invalid requests return the error Admit
// would.
func (e *Engine) Explain(ctx context.Context, req Request) (Explanation, error) {
	if err := validateRequest(&req); err != nil {
		return Explanation{}, err
	}
	wall := e.clk.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	now := int64(wall.Sub(e.base))
	var r pending
	if err := e.mu.place.resolve(&req, &r); err != nil {
		return Explanation{}, err
	}
	t := e.mu.gates.scratchLocked(req.Tenant, now, e.mu.place.modelList)
	if t == nil {
		return Explanation{Outcome: Rejected.String(), Reason: ReasonUnknownTenant}, nil
	}
	r.tenant = t
	r.weighted = r.prompt + e.mu.cfg.OutputTokenWeight*r.output
	r.price = e.mu.place.cat.PriceMicros(r.tierBuf[0].model, r.prompt, r.output)
	var x Explanation
	critical, why := t.screen(now, wall, r.weighted, r.price, req.Priority == PriorityCritical, e.shared.gateLocked(t), e.mu.gates.frozenLocked(now))
	x.Gates = explainGates(t, now, &r, critical, why, e.mu.gates.frozenLocked(now))
	if why.refused() {
		x.Outcome, x.Reason, x.RetryAfter = Rejected.String(), why.reason, durationUntil(why.retry)
		return x, nil
	}
	r.critical = critical
	e.explainPlacementLocked(ctx, now, wall, &req, &r, &x)
	return x, nil
}

// explainGates describes each gate for a request screen has decided on
// (why: its refusal, if any): the level before it and what it would leave.
func explainGates(t *tenantState, now int64, r *pending, critical bool, why refusal, frozen time.Duration) []GateCheck {
	order := []struct {
		gate   string
		refuse Reason
	}{
		{"breaker", ReasonBurstCreditExhausted}, {"store", ReasonStateUnavailable}, {"budget", ReasonBudgetExhausted},
		{"rps", ReasonQuotaExceeded}, {"tokens", ReasonQuotaExceeded}, {"concurrency", ReasonConcurrencyExceeded},
	}
	rpsBefore, tokBefore, critBefore := t.rps.Level(now), t.tokens.Level(now), t.critical.Level(now)
	rpsRefused := why.reason == ReasonQuotaExceeded && !t.rps.Fits(now, rpsUnit, 0)
	var out []GateCheck
	reached := true
	for _, g := range order {
		c := GateCheck{Gate: g.gate, Reached: reached, Passed: reached}
		refuse := why.reason == g.refuse || (g.gate == "tokens" && (why.reason == ReasonBurstCreditFrozen || why.reason == ReasonRequestTooLarge))
		if reached && refuse && (g.gate != "rps" || rpsRefused) && (g.gate != "tokens" || !rpsRefused) {
			c.Passed, reached = false, false
		}
		switch g.gate {
		case "breaker":
			c.Detail = fmt.Sprintf("burst credit %s", creditStateName(t.credit.state))
		case "store":
			c.Detail = "shared state reachable, or the tier fails open"
		case "budget":
			c.Before, c.After = t.budget.spentDay, t.budget.spentDay+r.price
			c.Detail = fmt.Sprintf("µ$ spent today %d + %d of a daily cap %d (0: none), this month %d of %d", t.budget.spentDay, r.price, t.budget.dailyCap, t.budget.spentMon, t.budget.monthlyCap)
		case "rps":
			c.Before, c.After = rpsBefore/rpsUnit, (rpsBefore-rpsUnit)/rpsUnit
			c.Detail = fmt.Sprintf("requests in the RPS bucket (burst %d)", t.rps.Burst()/rpsUnit)
		case "tokens":
			if critical {
				c.Gate = "critical"
				c.Before, c.After = critBefore, critBefore-r.weighted
				c.Detail = fmt.Sprintf("weighted tokens in the critical bucket, %d asked", r.weighted)
			} else {
				c.Before, c.After = tokBefore, tokBefore-r.weighted
				c.Detail = fmt.Sprintf("weighted tokens in the token bucket, %d asked; it may go %d into debt", r.weighted, t.tokens.Credit())
				if frozen > 0 {
					c.Detail = fmt.Sprintf("weighted tokens in the token bucket, %d asked; burst credit frozen by an operator for %v: no debt", r.weighted, frozen)
				}
			}
		case "concurrency":
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

// explainPlacementLocked walks placement as decideLocked does — the floor,
// then shared capacity (unless others wait), then the queue — recording
// every (tier, domain) looked at.
func (e *Engine) explainPlacementLocked(ctx context.Context, now int64, wall time.Time, req *Request, r *pending, x *Explanation) {
	place, room := &e.mu.place, &e.mu.room
	t := r.tenant
	if !r.critical && t.policy.Floor > 0 && t.floor.Fits(now, r.weighted, 0) {
		if e.mu.place.explainFind(now, r, true, 0, r.ntiers, x) {
			return
		}
	}
	from, upto, notTurn := e.sharedTiersLocked(ctx, now, wall, req, r)
	if notTurn {
		x.Placement = append(x.Placement, PlacementCheck{Model: r.tierBuf[0].name,
			Detail: fmt.Sprintf("not tenant %s's turn at %s: others contending for it have used less of it over their weights (queue.tier_share_window); lower tiers only", t.name, r.tierBuf[0].name)})
	}
	if e.mu.place.explainFind(now, r, false, from, upto, x) {
		return
	}
	o := place.outlook(now, r)
	switch {
	case !o.ever && o.drainingOnly:
		x.Outcome, x.Reason = Rejected.String(), ReasonDomainDraining
		return
	case !o.ever:
		x.Outcome, x.Reason = Rejected.String(), ReasonCapacityExceeded
		return
	}
	ahead := room.queue.WorkAhead(wfq.FlowKey{Tenant: t.name, Model: r.tierBuf[0].name}, uint64(r.weighted), uint64(t.policy.Weight), r.critical)
	x.EstimatedWait = addSat(room.workWait(ahead, place.eligibleRates), o.wait)
	if x.EstimatedWait > waitBudget(ctx, wall, req, &e.mu.cfg.Queue) {
		x.Outcome, x.Reason, x.RetryAfter = Rejected.String(), ReasonDeadlineUnmeetable, durationUntil(x.EstimatedWait)
		return
	}
	x.Outcome = "QUEUED"
}

// explainFind is find, recording each (tier, domain) it looks at.
func (p *placer) explainFind(now int64, r *pending, floor bool, from, upto int, x *Explanation) bool {
	for ti := from; ti < min(upto, r.ntiers); ti++ {
		m := r.tierBuf[ti]
		for _, di := range p.order(r.tenant, m) {
			d := p.domains[di]
			c := PlacementCheck{Model: m.name, Domain: d.ID(), Floor: floor}
			cost, ok, err := p.fits(now, r, floor, ti, d)
			if err != nil {
				c.Detail = err.Error()
				x.Placement = append(x.Placement, c)
				continue
			}
			c.Fits = ok
			pf, dc := d.cap.Levels(now)
			resP, resD, _ := d.cap.Reserves()
			kv, kvLimit := d.cap.KV()
			c.Detail = fmt.Sprintf("needs prefill %.3g of %.3g FLOP (reserve %.3g), decode %.3g of %.3g B (reserve %.3g), KV %.3g B with %.3g of %.3g in use",
				float64(cost.PrefillFLOP), float64(pf), float64(resP), float64(cost.DecodeBytes), float64(dc), float64(resD), float64(cost.KVBytes), float64(kv), float64(kvLimit))
			if w, end := d.cap.Warmup(now); end != 0 {
				c.Detail += fmt.Sprintf("; warming up: %.1f%% of its shared capacity, whole in %v", 100*float64(w)/pd.WarmupFull, time.Duration(end-now))
			}
			x.Placement = append(x.Placement, c)
			if c.Fits {
				x.Outcome, x.Domain, x.Model, x.Floor = Admitted.String(), d.ID(), m.name, floor
				if ti > 0 {
					x.Outcome = Degraded.String()
				}
				return true
			}
		}
	}
	return false
}
