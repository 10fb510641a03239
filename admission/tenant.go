package admission

import (
	"math"
	"time"

	"github.com/sluice-sched/sluice/internal/rendezvous"
	"github.com/sluice-sched/sluice/internal/tokenbucket"
)

// rpsUnit is one request in the RPS bucket: milli-requests, so that
// fractional rates such as 0.5 requests/s stay integers.
const rpsUnit = 1000

// breaker states of a tenant's burst credit.
const (
	breakerClosed   = iota
	breakerOpen     // debt not repaid in the window: BURST_CREDIT_EXHAUSTED until `until`
	breakerHalfOpen // reopened without credit until the debt is repaid
)

// tenantState is an active tenant. Tenants that have been idle long enough
// to hold nothing (full buckets, no leases, no queue, no debt, nothing spent
// this month) are dropped and rebuilt from config on their next request, so
// an idle tenant costs only its config entry.
type tenantState struct {
	name   string
	tier   string
	policy TierPolicy

	rps      tokenbucket.Bucket // milli-requests
	tokens   tokenbucket.Bucket // weighted tokens, may go into debt
	floor    tokenbucket.Bucket // weighted tokens within the guaranteed floor
	critical tokenbucket.Bucket // weighted tokens for priority=CRITICAL

	inDebt     bool
	debtSince  int64
	breaker    int
	breakerEnd int64

	created int64 // engine time the state was built (shared state credits a new bucket for its age)

	// Batched shared state: the last round with activity, whether the
	// buckets are frozen as idle, and whether a quota refusal since the
	// last round asks for a grant.
	sharedActiveAt int64
	sharedFrozen   bool
	sharedWant     bool

	inFlight int64 // leases held
	queued   int64 // waiting in the fair queue

	// Budgets, in micro-USD, for the current UTC day and month.
	day, month           int64
	spentDay, spentMon   int64
	dailyCap, monthlyCap int64

	// Rendezvous order cache per model index, valid for placeGen.
	keyHash  []uint64
	orders   [][]int
	orderGen []uint64
}

// tenantLocked returns the tenant's state, building it from config on first
// use; nil if the tenant is not configured.
func (e *Engine) tenantLocked(name string, now int64) *tenantState {
	if t, ok := e.mu.tenants[name]; ok {
		return t
	}
	p, ok := e.mu.cfg.Policy(name)
	if !ok {
		return nil
	}
	t := &tenantState{name: name, tier: e.mu.cfg.Tenants[name].Tier, created: now}
	t.setPolicy(p, now, true)
	if s := e.shared; s != nil && (s.opts.Mode == SharedBatched || s.down) {
		s.sliceTenant(t, now, s.down)
	}
	t.resetModelCache(e.mu.modelList)
	e.mu.tenants[name] = t
	return t
}

func (t *tenantState) resetModelCache(models []*modelState) {
	n := len(models)
	t.keyHash = make([]uint64, n)
	t.orders = make([][]int, n)
	t.orderGen = make([]uint64, n)
	for i, m := range models {
		t.keyHash[i] = rendezvous.Hash(t.name + "/" + m.name)
	}
}

// setPolicy (re)applies a policy; fresh buckets start full, live ones keep
// their level.
func (t *tenantState) setPolicy(p TierPolicy, now int64, fresh bool) {
	t.policy = p
	tokRate := roundUnits(p.Tokens.Rate)
	credit := int64(0)
	if t.breaker == breakerClosed {
		credit = creditLimit(p)
	}
	floorBurst := p.Floor // one second of floor
	if fresh {
		t.rps = tokenbucket.New(roundUnits(p.RPS.Rate*rpsUnit), roundUnits(p.RPS.Burst*rpsUnit), 0, now)
		t.tokens = tokenbucket.New(tokRate, roundUnits(p.Tokens.Burst), credit, now)
		t.floor = tokenbucket.New(p.Floor, floorBurst, 0, now)
		t.critical = tokenbucket.New(roundUnits(p.Critical.Rate), roundUnits(p.Critical.Burst), 0, now)
	} else {
		t.rps.SetLimits(roundUnits(p.RPS.Rate*rpsUnit), roundUnits(p.RPS.Burst*rpsUnit), 0)
		t.tokens.SetLimits(tokRate, roundUnits(p.Tokens.Burst), credit)
		t.floor.SetLimits(p.Floor, floorBurst, 0)
		t.critical.SetLimits(roundUnits(p.Critical.Rate), roundUnits(p.Critical.Burst), 0)
	}
	t.dailyCap = usdToMicros(p.Budget.DailyUSD)
	t.monthlyCap = usdToMicros(p.Budget.MonthlyUSD)
}

// refreshTenantsLocked re-applies config to active tenants after Apply.
func (e *Engine) refreshTenantsLocked(now int64) {
	for name, t := range e.mu.tenants {
		t.resetModelCache(e.mu.modelList) // its queued requests may still be placed
		p, ok := e.mu.cfg.Policy(name)
		if !ok {
			// Removed from config: new requests are UNKNOWN_TENANT. Its
			// leases and queued requests keep the state alive until they end.
			delete(e.mu.tenants, name)
			continue
		}
		t.tier = e.mu.cfg.Tenants[name].Tier
		t.setPolicy(p, now, false)
		if s := e.shared; s != nil && (s.opts.Mode == SharedBatched || s.down) {
			s.sliceTenant(t, now, true) // until the next reconcile grants the new limits
			t.sharedFrozen = false      // an idle tenant freezes again at the next round
		}
	}
}

// sweepIdleTenantsLocked drops tenants that hold nothing a rebuild would not
// recreate.
func (e *Engine) sweepIdleTenantsLocked(now int64) {
	for name, t := range e.mu.tenants {
		if t.inFlight == 0 && t.queued == 0 && !t.inDebt && t.breaker == breakerClosed &&
			t.spentMon == 0 && t.rps.Level(now) == t.rps.Burst() && t.tokens.Level(now) == t.tokens.Burst() &&
			t.floor.Level(now) == t.floor.Burst() && t.critical.Level(now) == t.critical.Burst() {
			delete(e.mu.tenants, name)
		}
	}
}

// creditLimit is how far below zero a policy lets the token bucket go.
func creditLimit(p TierPolicy) int64 { return roundUnits(p.BurstCredit.Multiple * p.Tokens.Rate) }

func roundUnits(v float64) int64 {
	if v <= 0 || math.IsNaN(v) {
		return 0
	}
	return int64(math.Min(math.Round(v), math.MaxInt64/4))
}

func usdToMicros(usd float64) int64 { return roundUnits(usd * 1e6) }

// gateCharge is what the tenant gates took for one request, so that it can
// be given back exactly if the request is not admitted after all.
type gateCharge struct {
	weighted    int64
	critical    bool // charged to the critical bucket rather than the token bucket
	budget      int64
	day, month  int64
	quotaBefore int64
	quotaAfter  int64
	creditBef   int64
	creditAft   int64
}

// availableCredit is how much of its credit a bucket still has to lend.
func availableCredit(level, credit int64) int64 {
	if level >= 0 {
		return credit
	}
	return max(credit+level, 0)
}

// checkGatesLocked runs every tenant gate in DESIGN order (breaker, budget,
// RPS, tokens with burst credit, concurrency) without charging; on a refusal
// it returns the reason and exact Retry-After.
func (e *Engine) checkGatesLocked(t *tenantState, now int64, wall time.Time, weighted, priceMicros int64, wantCritical bool) (critical bool, reason Reason, retry time.Duration) {
	// Breaker: open → refuse; when the open period ends, half-open (no credit).
	if t.breaker == breakerOpen {
		if now < t.breakerEnd {
			return false, ReasonBurstCreditExhausted, time.Duration(t.breakerEnd - now)
		}
		t.breaker = breakerHalfOpen
	}
	if t.inDebt {
		if t.tokens.Level(now) >= 0 {
			t.inDebt = false
			if t.breaker == breakerHalfOpen { // repaid: close and lend again
				t.breaker = breakerClosed
				t.tokens.SetLimits(t.tokens.Rate(), t.tokens.Burst(), creditLimit(t.policy))
			}
		} else if t.breaker == breakerClosed && now-t.debtSince > int64(t.policy.BurstCredit.Window.Duration) {
			t.breaker = breakerOpen
			t.breakerEnd = now + int64(t.policy.BurstCredit.BreakerOpen.Duration)
			t.tokens.SetLimits(t.tokens.Rate(), t.tokens.Burst(), 0)
			return false, ReasonBurstCreditExhausted, time.Duration(t.breakerEnd - now)
		}
	}
	if s := e.shared; s != nil && s.down && t.policy.FailMode == FailClosed {
		return false, ReasonStateUnavailable, s.opts.Cooldown
	}
	// Budgets.
	e.rollBudgetLocked(t, wall)
	var budgetWait time.Duration
	if t.dailyCap > 0 && t.spentDay+priceMicros > t.dailyCap {
		y, m, d := wall.UTC().Date()
		budgetWait = time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC).Sub(wall)
	}
	if t.monthlyCap > 0 && t.spentMon+priceMicros > t.monthlyCap {
		y, m, _ := wall.UTC().Date()
		budgetWait = max(budgetWait, time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC).Sub(wall))
	}
	if budgetWait > 0 {
		return false, ReasonBudgetExhausted, budgetWait
	}
	if !t.rps.Fits(now, rpsUnit, 0) {
		t.sharedWant = true
		return false, ReasonQuotaExceeded, e.quotaRetry(t.rps.RetryAfter(now, rpsUnit, 0))
	}
	critical = wantCritical && t.critical.Fits(now, weighted, 0)
	if !critical && !t.tokens.Fits(now, weighted, -t.tokens.Credit()) {
		t.sharedWant = true
		return false, ReasonQuotaExceeded, e.quotaRetry(t.tokens.AllowRetryAfter(now, weighted))
	}
	if t.policy.MaxConcurrency > 0 && t.inFlight+t.queued >= t.policy.MaxConcurrency {
		return false, ReasonConcurrencyExceeded, time.Second
	}
	return critical, ReasonNone, 0
}

// quotaRetry bounds a tenant bucket's Retry-After. With shared state the
// local grant changes at every reconcile (a new tenant has no refill until
// its first), so a wait longer than that is not known: answer the interval.
func (e *Engine) quotaRetry(d time.Duration) time.Duration {
	if s := e.shared; s != nil && s.opts.Mode == SharedBatched && d > s.opts.Interval {
		return s.opts.Interval
	}
	return durationUntil(d)
}

// chargeGatesLocked takes what checkGatesLocked allowed.
func (e *Engine) chargeGatesLocked(t *tenantState, now int64, weighted, priceMicros int64, critical bool) gateCharge {
	g := gateCharge{weighted: weighted, critical: critical, budget: priceMicros, day: t.day, month: t.month}
	t.rps.Take(now, rpsUnit)
	g.quotaBefore = t.tokens.Level(now)
	g.creditBef = availableCredit(g.quotaBefore, t.tokens.Credit())
	if critical {
		t.critical.Take(now, weighted)
	} else {
		t.tokens.Take(now, weighted)
	}
	g.quotaAfter = t.tokens.Level(now)
	g.creditAft = availableCredit(g.quotaAfter, t.tokens.Credit())
	t.noteDebt(g.quotaBefore, now)
	t.spentDay += priceMicros
	t.spentMon += priceMicros
	return g
}

// noteDebt starts the repay window when a take moved the token bucket from
// a level of before (≥ 0) into debt; debt that had been repaid in the
// meantime does not count against the new window.
func (t *tenantState) noteDebt(before, now int64) {
	if before >= 0 && t.tokens.Level(now) < 0 {
		t.inDebt, t.debtSince = true, now
	}
}

// refundGatesLocked gives back a charge for a request that was never admitted.
func (e *Engine) refundGatesLocked(t *tenantState, now int64, g *gateCharge) {
	t.rps.Refund(now, rpsUnit)
	if g.critical {
		t.critical.Refund(now, g.weighted)
	} else {
		t.tokens.Refund(now, g.weighted)
	}
	e.adjustSpendLocked(t, g.day, g.month, -g.budget)
}

// adjustSpendLocked moves spend charged in (day, month) by delta, if that
// period is still current.
func (e *Engine) adjustSpendLocked(t *tenantState, day, month, delta int64) {
	if t.day == day {
		t.spentDay = max(t.spentDay+delta, 0)
	}
	if t.month == month {
		t.spentMon = max(t.spentMon+delta, 0)
	}
}

// rollBudgetLocked starts a new day or month of spending when the UTC date turns.
func (e *Engine) rollBudgetLocked(t *tenantState, wall time.Time) {
	u := wall.UTC()
	day := u.Unix() / 86400
	if day == t.day {
		return
	}
	y, m, _ := u.Date()
	month := int64(y)*12 + int64(m)
	t.day, t.spentDay = day, 0
	if month != t.month {
		t.month, t.spentMon = month, 0
	}
}

// Tenants describes every configured tenant, sorted by name.
func (e *Engine) Tenants() []TenantInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.nowLocked()
	names := sortedKeys(e.mu.cfg.Tenants)
	out := make([]TenantInfo, 0, len(names))
	for _, n := range names {
		out = append(out, e.tenantInfoLocked(n, now))
	}
	return out
}

// Tenant describes one tenant.
func (e *Engine) Tenant(name string) (TenantInfo, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.mu.cfg.Tenants[name]; !ok {
		return TenantInfo{}, false
	}
	return e.tenantInfoLocked(name, e.nowLocked()), true
}

func (e *Engine) tenantInfoLocked(name string, now int64) TenantInfo {
	t, ok := e.mu.tenants[name]
	if !ok {
		// Idle: describe it as a fresh state would be, without keeping one.
		p, _ := e.mu.cfg.Policy(name)
		t = &tenantState{name: name, tier: e.mu.cfg.Tenants[name].Tier}
		t.setPolicy(p, now, true)
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
		BreakerOpen:      t.breaker == breakerOpen && now < t.breakerEnd,
		SpentTodayMicros: t.spentDay,
		SpentMonthMicros: t.spentMon,
	}
	if info.BreakerOpen {
		info.BreakerUntil = e.base.Add(time.Duration(t.breakerEnd))
	}
	return info
}
