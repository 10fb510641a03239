package admission

import "time"

// tenantGates is the first room a request passes through: per tenant, the
// burst-credit breaker, the cost budget, the RPS and token buckets and the
// concurrency limit; for all of them, an operator's credit freeze
// (creditfreeze.go). It owns the configured tenants (index) and the active
// tenants' state; an idle tenant lives only in the index until its next
// request.
type tenantGates struct {
	cfg     *Config      // tiers and knobs; its Tenants map is nil, the index holds them
	index   *tenantIndex // every configured tenant
	tenants map[string]*tenantState
	active  []*tenantState // the same tenants, in slot order: what the idle sweep walks
	// The idle sweep's pass: when it began, over how many tenants, how
	// many it has visited, and the slot it goes on from.
	passAt               int64
	passLen, visited, at int
	freeze               creditFreeze // an operator's freeze of every tenant's burst credit
}

// lookupLocked returns the tenant's state, building it from config on first
// use (fresh is then true); nil if the tenant is not configured.
func (g *tenantGates) lookupLocked(name string, now int64, models []*modelState) (t *tenantState, fresh bool) {
	if t, ok := g.tenants[name]; ok {
		return t, false
	}
	p, tier, ok := g.policy(name)
	if !ok {
		return nil, false
	}
	t = newTenantState(name, tier, p, now)
	t.orders.reset(name, models)
	g.tenants[name] = t
	t.slot = len(g.active)
	g.active = append(g.active, t)
	return t, true
}

// policy returns a configured tenant's effective policy and its tier.
func (g *tenantGates) policy(name string) (TierPolicy, string, bool) {
	tc, ok := g.index.get(name)
	if !ok {
		return TierPolicy{}, "", false
	}
	p, ok := g.cfg.policyOf(tc)
	return p, tc.Tier, ok
}

// forgetLocked drops an active tenant's state: the last slot's tenant
// moves into its slot.
func (g *tenantGates) forgetLocked(t *tenantState) {
	delete(g.tenants, t.name)
	last := len(g.active) - 1
	moved := g.active[last]
	g.active[t.slot], moved.slot = moved, t.slot
	g.active[last] = nil
	g.active = g.active[:last]
}

// reconfigureLocked re-applies a new config to the active tenants, keeping
// their levels, and calls each for every tenant that stays. A tenant removed
// from config is forgotten: new requests are UNKNOWN_TENANT, while its
// leases and queued requests keep their own pointer to it until they end.
func (g *tenantGates) reconfigureLocked(cfg *Config, index *tenantIndex, now int64, models []*modelState, each func(*tenantState)) {
	g.cfg, g.index = cfg, index
	for name := range g.tenants {
		g.reconfigureTenantLocked(name, now, models, each)
	}
}

// reconfigureTenantLocked re-applies the config to one tenant, if active,
// as reconfigureLocked does to each.
func (g *tenantGates) reconfigureTenantLocked(name string, now int64, models []*modelState, each func(*tenantState)) {
	t, ok := g.tenants[name]
	if !ok {
		return // idle: its state is built from the config when it next asks
	}
	t.orders.reset(name, models) // its queued requests may still be placed
	p, tier, ok := g.policy(name)
	if !ok {
		g.forgetLocked(t)
		return
	}
	t.tier = tier
	t.setPolicy(p, now, false)
	each(t)
}

// scratchLocked returns a copy of the tenant's state (built from config for
// an idle one) that may be screened and charged freely: Explain's; nil for
// a tenant not configured.
func (g *tenantGates) scratchLocked(name string, now int64, models []*modelState) *tenantState {
	if live, ok := g.tenants[name]; ok {
		cp := *live
		return &cp
	}
	p, tier, ok := g.policy(name)
	if !ok {
		return nil
	}
	t := newTenantState(name, tier, p, now)
	t.orders.reset(name, models)
	return t
}

// sweepIdleLocked drops the tenants that hold nothing a rebuild would not
// recreate. A pass over every active tenant takes sweepEvery: each call
// goes on from where the last stopped, as far as the pass should be by now
// (a pass over a hundred thousand tenants at once would hold the engine's
// lock for milliseconds). A dropped tenant's slot takes the last slot's
// tenant, not yet visited, which is visited next.
func (g *tenantGates) sweepIdleLocked(now int64) {
	if g.visited >= g.passLen || g.at >= len(g.active) {
		g.passAt, g.passLen, g.visited, g.at = now, len(g.active), 0, 0
	}
	part := min(float64(now-g.passAt)/float64(sweepEvery), 1)
	for ; g.at < len(g.active) && float64(g.visited) < part*float64(g.passLen); g.visited++ {
		if t := g.active[g.at]; t.idle(now) {
			g.forgetLocked(t)
		} else {
			g.at++
		}
	}
}

// infoLocked describes a configured tenant; base turns engine time into
// wall time.
func (g *tenantGates) infoLocked(name string, now int64, base time.Time) TenantInfo {
	t, ok := g.tenants[name]
	if !ok {
		// Idle: describe it as a fresh state would be, without keeping one.
		p, tier, _ := g.policy(name)
		t = newTenantState(name, tier, p, now)
	}
	info := TenantInfo{
		Name:             name,
		Tier:             t.tier,
		Weight:           t.policy.Weight,
		FloorTokens:      t.policy.Floor,
		TokenRate:        t.tokens.Rate(),
		TokenBurst:       t.tokens.Burst(),
		TokenLevel:       t.tokens.Level(now),
		Credit:           t.tokens.Credit(),
		RPSLevel:         t.rps.Level(now) / rpsUnit,
		InFlight:         int(t.inFlight),
		Queued:           int(t.queued),
		BreakerOpen:      t.credit.open(now),
		SpentTodayMicros: t.budget.spentDay,
		SpentMonthMicros: t.budget.spentMon,
	}
	if info.BreakerOpen {
		info.BreakerUntil = base.Add(time.Duration(t.credit.openUntil))
	}
	return info
}
