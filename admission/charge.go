package admission

import "github.com/sluice-sched/sluice/pd"

// charge is what one admission took, in the manner of x/time/rate's
// Reservation: the tenant's gates and, once placed, the domain's capacity
// (and the tenant's floor bucket for an admission within its floor). It is
// the one way a decision is undone or settled: Cancel gives back
// everything it took (a request refused after its charge, a deadline, a
// caller gone, a store refusal), Settle moves it to what the request
// actually used (Release, lease expiry).
type charge struct {
	tenant *tenantState
	gates  gateCharge
	dom    *domainState // nil until placed
	cost   pd.Cost      // what the domain was charged
	floor  bool         // also charged to the tenant's floor bucket
	// metered is what the tenant's count of the second it is served
	// (tenantState.served) took, in the second meteredIn, for Cancel to
	// take back.
	metered, meteredIn int64
	// deferred: a deferrable request's charge, which leaves
	// deferral.headroom free when placed; ticketed: a backlog ticket's
	// (Request.Ticketed), whose lease's expiry settles it as unused (the
	// ticket is delivered again and charged then; see Engine.Tick). Kept
	// here, beside floor, where they cost a lease no bytes.
	deferred, ticketed bool
	// tierShare is the share of its weighted tokens the quota is charged:
	// below wholeShare on a lower tier than the one requested (tierShare);
	// 0 until placed.
	tierShare int32
}

// chargeGates charges the tenant's gates: the first half of a charge.
func (c *charge) chargeGates(now int64, t *tenantState, weighted, price int64, critical bool) {
	c.tenant = t
	c.gates = t.chargeGates(now, weighted, price, critical)
}

// place charges a placement's domain (and the floor bucket, for a floor
// placement): the second half. The request is in flight from here.
func (c *charge) place(now int64, pl placement) {
	c.chargeAt(now, pl.tierShare)
	pl.dom.cap.Charge(now, pl.cost)
	pl.dom.inFlight++
	pl.dom.loop.place(now) // the engines' queue, as the capacity guard counts it
	c.tenant.inFlight++
	if pl.floor {
		c.tenant.floor.Take(now, c.gates.weighted)
	}
	if !c.deferred && c.tenant.floor.Burst() > 0 {
		c.metered, c.meteredIn = c.gates.weighted, c.tenant.served.add(now, c.gates.weighted)
	}
	c.dom, c.cost, c.floor = pl.dom, pl.cost, pl.floor
}

// reprice moves the budget charge to another price (a degraded admission
// pays for the tier it was granted).
func (c *charge) reprice(price int64) {
	c.tenant.budget.adjust(c.gates.day, c.gates.month, price-c.gates.price)
	c.gates.price = price
}

// chargeAt moves the quota charge to share of the weighted tokens the
// gates took (below wholeShare: a degraded admission, charged its granted
// tier's share; tierShare), before the placement takes the floor bucket,
// so that the token bucket, the floor bucket, the lease, its release and
// the shared store all count what the GPUs do for it.
func (c *charge) chargeAt(now int64, share int32) {
	c.tierShare = share
	weighted := scaleWeighted(c.gates.weighted, share)
	diff := c.gates.weighted - weighted
	if diff <= 0 {
		return
	}
	t := c.tenant
	t.quotaBucket(c.gates.critical).Refund(now, diff)
	c.gates.weighted = weighted
	if !c.gates.critical { // the answer's quota labels: what this charge took
		c.gates.quotaAfter += diff
		c.gates.creditAft = availableCredit(c.gates.quotaAfter, t.tokens.Credit())
	}
}

// scaleWeighted is weighted tokens charged at share, rounded up; a share
// of 0 (a charge never placed) or a whole one leaves them as they are.
func scaleWeighted(weighted int64, share int32) int64 {
	if share <= 0 || share >= wholeShare || weighted <= 0 {
		return weighted
	}
	return scaled(weighted, int64(share), true)
}

// tierShare is the share of a request's weighted tokens charged when it is
// granted model instead of the requested one: the granted model's prefill
// FLOPs per token over the requested one's (active parameters), at most
// whole. Its quota then pays for what the GPUs do for it, so a tenant that
// accepts a lower tier never runs out of quota sooner than one that waits.
// (A granted model of no known size is charged whole.)
func tierShare(requested, granted *pd.Model) int32 {
	if requested.ActiveParams <= 0 || granted.ActiveParams <= 0 {
		return wholeShare
	}
	return int32(shareOf(granted.ActiveParams, requested.ActiveParams))
}

// Cancel gives back everything the charge took, as if the request had
// never been admitted.
func (c *charge) Cancel(now int64) {
	if c.dom != nil {
		c.dom.cap.Release(now, c.cost, pd.Cost{})
		c.endFlight()
		if c.floor {
			c.tenant.floor.Refund(now, c.gates.weighted)
		}
		c.tenant.served.undo(now, c.meteredIn, c.metered)
	}
	c.tenant.refundGates(now, &c.gates)
}

// Settle ends a placed charge at what the request used: the domain gets
// back the capacity it did not use (or is charged an overrun) and frees
// the KV, the quota and floor buckets and the budget move to the actual
// weighted tokens and price. It returns the weighted tokens refunded
// (negative: an overrun charged).
func (c *charge) Settle(now int64, actual pd.Cost, actualWeighted, actualPrice int64) (refunded int64) {
	c.dom.cap.Release(now, c.cost, actual)
	c.endFlight()
	refunded = c.tenant.settleQuota(now, &c.gates, c.floor, actualWeighted)
	c.tenant.budget.adjust(c.gates.day, c.gates.month, actualPrice-c.gates.price)
	return refunded
}

// expire settles a charge whose lease was never released as fully used.
func (c *charge) expire(now int64) {
	c.Settle(now, c.cost, c.gates.weighted, c.gates.price)
}

func (c *charge) endFlight() {
	c.dom.inFlight--
	c.tenant.inFlight--
}
