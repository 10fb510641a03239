package admission

import "time"

// tenantGates is the first room a request passes through: per tenant, the
// burst-credit breaker, the cost budget, the RPS and token buckets and the
// concurrency limit; for all of them, an operator's credit freeze
// (creditfreeze.go). It owns the active tenants' state; an idle tenant
// lives only in the config until its next request.
type tenantGates struct {
	cfg     *Config
	tenants map[string]*tenantState
	freeze  creditFreeze // an operator's freeze of every tenant's burst credit
}

// lookupLocked returns the tenant's state, building it from config on first
// use (fresh is then true); nil if the tenant is not configured.
func (g *tenantGates) lookupLocked(name string, now int64, models []*modelState) (t *tenantState, fresh bool) {
	if t, ok := g.tenants[name]; ok {
		return t, false
	}
	p, ok := g.cfg.Policy(name)
	if !ok {
		return nil, false
	}
	t = newTenantState(name, g.cfg.Tenants[name].Tier, p, now)
	t.orders.reset(name, models)
	g.tenants[name] = t
	return t, true
}

// reconfigureLocked re-applies a new config to the active tenants, keeping
// their levels, and calls each for every tenant that stays. A tenant removed
// from config is forgotten: new requests are UNKNOWN_TENANT, while its
// leases and queued requests keep their own pointer to it until they end.
func (g *tenantGates) reconfigureLocked(cfg *Config, now int64, models []*modelState, each func(*tenantState)) {
	g.cfg = cfg
	for name, t := range g.tenants {
		t.orders.reset(name, models) // its queued requests may still be placed
		p, ok := cfg.Policy(name)
		if !ok {
			delete(g.tenants, name)
			continue
		}
		t.tier = cfg.Tenants[name].Tier
		t.setPolicy(p, now, false)
		each(t)
	}
}

// scratchLocked returns a copy of the tenant's state (built from config for
// an idle one) that may be screened and charged freely: Explain's; nil for
// a tenant not configured.
func (g *tenantGates) scratchLocked(name string, now int64, models []*modelState) *tenantState {
	if live, ok := g.tenants[name]; ok {
		cp := *live
		return &cp
	}
	p, ok := g.cfg.Policy(name)
	if !ok {
		return nil
	}
	t := newTenantState(name, g.cfg.Tenants[name].Tier, p, now)
	t.orders.reset(name, models)
	return t
}

// sweepIdleLocked drops the tenants that hold nothing a rebuild would not
// recreate.
func (g *tenantGates) sweepIdleLocked(now int64) {
	for name, t := range g.tenants {
		if t.idle(now) {
			delete(g.tenants, name)
		}
	}
}

// infoLocked describes a configured tenant; base turns engine time into
// wall time.
func (g *tenantGates) infoLocked(name string, now int64, base time.Time) TenantInfo {
	t, ok := g.tenants[name]
	if !ok {
		// Idle: describe it as a fresh state would be, without keeping one.
		p, _ := g.cfg.Policy(name)
		t = newTenantState(name, g.cfg.Tenants[name].Tier, p, now)
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
