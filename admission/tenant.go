package admission

import (
	"math"
	"time"

	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/tokenbucket"
)

// rpsUnit is one request in the RPS bucket: milli-requests, so that
// fractional rates such as 0.5 requests/s stay integers (the shared
// store's unit too).
const rpsUnit = sharing.RequestUnit

// tenantState is an active tenant: its buckets, burst credit, budget and
// what it holds. Tenants that have been idle long enough to hold nothing
// are dropped and rebuilt from config on their next request, so an idle
// tenant costs only its config entry.
type tenantState struct {
	name   string
	tier   string
	policy TierPolicy

	rps      tokenbucket.Bucket // milli-requests
	tokens   tokenbucket.Bucket // weighted tokens, may go into debt
	floor    tokenbucket.Bucket // weighted tokens within the guaranteed floor
	critical tokenbucket.Bucket // weighted tokens for priority=CRITICAL
	// served counts what the tenant is admitted in the current second,
	// shared capacity included (interactive placements; underFloor). It is
	// local, as the capacity guard is.
	served secondMeter
	// floorShare is the share of the policy's floor the floor bucket
	// refills at, in parts per million: all of it unless the capacity
	// measured cannot carry the floors (placer.floorShare).
	floorShare int64

	credit burstCredit
	budget budget

	created  int64 // engine time the state was built (shared state credits a new bucket for its age)
	inFlight int64 // leases held
	queued   int64 // waiting in the fair queue

	orders orderCache // placement's first choices for this tenant
	slot   int        // index in tenantGates.active
}

// refusal is why a gate turned a request away and when to retry; the zero
// value lets it pass.
type refusal struct {
	reason Reason
	retry  time.Duration
}

func (r refusal) refused() bool { return r.reason != ReasonNone }

// newTenantState builds a tenant with full buckets from its policy.
func newTenantState(name, tier string, p TierPolicy, now int64) *tenantState {
	t := &tenantState{name: name, tier: tier, created: now, floorShare: wholeShare}
	t.setPolicy(p, now, true)
	return t
}

// setPolicy (re)applies a policy; fresh buckets start full, live ones keep
// their level.
func (t *tenantState) setPolicy(p TierPolicy, now int64, fresh bool) {
	t.policy = p
	credit := int64(0)
	if t.credit.lending() {
		credit = creditLimit(p)
	}
	floor := sharedFloor(p.Floor, t.floorShare)
	limits := [4][3]int64{
		{roundUnits(p.RPS.Rate * rpsUnit), roundUnits(p.RPS.Burst * rpsUnit), 0},
		{roundUnits(p.Tokens.Rate), roundUnits(p.Tokens.Burst), credit},
		{floor, floor, 0}, // one second of the floor the capacity carries
		{roundUnits(p.Critical.Rate), roundUnits(p.Critical.Burst), 0},
	}
	for i, b := range t.Buckets() {
		l := limits[i]
		if fresh {
			*b = tokenbucket.New(l[0], l[1], l[2], now)
		} else {
			b.SetLimits(l[0], l[1], l[2])
		}
	}
	t.budget.dailyCap = usdToMicros(p.Budget.DailyUSD)
	t.budget.monthlyCap = usdToMicros(p.Budget.MonthlyUSD)
}

// Buckets returns the tenant's four buckets: RPS, tokens, floor,
// critical (sharing's Kind order).
func (t *tenantState) Buckets() [sharing.TenantKinds]*tokenbucket.Bucket {
	return [sharing.TenantKinds]*tokenbucket.Bucket{&t.rps, &t.tokens, &t.floor, &t.critical}
}

// The tenant as the shared-state strategies see it (sharing.Tenant).

// Name returns the tenant's name.
func (t *tenantState) Name() string { return t.name }

// Created returns the engine time the state was built.
func (t *tenantState) Created() int64 { return t.created }

// FailClosed reports whether the tier is refused while the shared store
// is unreachable.
func (t *tenantState) FailClosed() bool { return t.policy.FailMode == FailClosed }

// CreditLent returns the credit the whole token bucket lends: none unless
// the burst credit is lending.
func (t *tenantState) CreditLent() int64 {
	if t.credit.lending() {
		return creditLimit(t.policy)
	}
	return 0
}

// ResetLimits gives every bucket its policy's whole limits, keeping its
// level.
func (t *tenantState) ResetLimits(now int64) { t.setPolicy(t.policy, now, false) }

// Limits returns the whole (all-replica) rate and burst of a bucket, from
// the policy (the floor's scaled to the share the capacity carries).
func (t *tenantState) Limits(k sharing.Kind) (rate, burst int64) {
	p := &t.policy
	switch k {
	case sharing.KindRPS:
		return roundUnits(p.RPS.Rate * rpsUnit), roundUnits(p.RPS.Burst * rpsUnit)
	case sharing.KindTokens:
		return roundUnits(p.Tokens.Rate), roundUnits(p.Tokens.Burst)
	case sharing.KindFloor:
		floor := sharedFloor(p.Floor, t.floorShare)
		return floor, floor
	}
	return roundUnits(p.Critical.Rate), roundUnits(p.Critical.Burst)
}

// idle reports whether the tenant holds nothing a rebuild from config
// would not recreate.
func (t *tenantState) idle(now int64) bool {
	if t.inFlight != 0 || t.queued != 0 || !t.credit.settled() || t.budget.spentMon != 0 {
		return false
	}
	for _, b := range t.Buckets() {
		if b.Level(now) != b.Burst() {
			return false
		}
	}
	return true
}

// screen runs every gate in order — burst-credit breaker, the
// store's fail mode (store, from the shared-state strategy), budget, RPS,
// tokens with credit, concurrency — and charges nothing. It does move the
// breaker and the budget period to now. frozen is what is left of an
// operator's credit freeze (0: none): while it lasts the token bucket lends
// nothing.
func (t *tenantState) screen(now int64, wall time.Time, weighted, price int64, wantCritical bool, store refusal, frozen time.Duration) screening {
	if wait := t.credit.advance(now, &t.tokens, &t.policy); wait > 0 {
		return screening{why: refusal{ReasonBurstCreditExhausted, wait}, reached: gateBreaker}
	}
	if store.refused() {
		return screening{why: store, reached: gateStore}
	}
	t.budget.roll(wall)
	if wait := t.budget.wait(wall, price); wait > 0 {
		return screening{why: refusal{ReasonBudgetExhausted, wait}, reached: gateBudget}
	}
	if !t.rps.Fits(now, rpsUnit, 0) {
		return screening{why: refusal{ReasonQuotaExceeded, t.rps.RetryAfter(now, rpsUnit, 0)}, reached: gateRPS}
	}
	critical := wantCritical && t.critical.Fits(now, weighted, 0)
	if !critical {
		if t.tooLarge(weighted, wantCritical) {
			return screening{why: refusal{ReasonRequestTooLarge, 0}, reached: gateTokens}
		}
		if why := t.tokenGate(now, weighted, frozen); why.refused() {
			return screening{why: why, reached: gateTokens}
		}
	}
	if t.policy.MaxConcurrency > 0 && t.inFlight+t.queued >= t.policy.MaxConcurrency {
		return screening{why: refusal{ReasonConcurrencyExceeded, time.Second}, reached: gateConcurrency}
	}
	return screening{reached: gateConcurrency, critical: critical}
}

// screening is screen's verdict: its refusal (none: passed), the gate it
// stopped at (the one that refused; the last on a pass), and on a pass
// whether the request goes to the critical band.
type screening struct {
	why      refusal
	reached  gate
	critical bool
}

// gate is one of screen's gates, in the order screen tries them.
type gate uint8

const (
	gateBreaker gate = iota
	gateStore
	gateBudget
	gateRPS
	gateTokens // or the critical bucket, for a request in the critical band
	gateConcurrency
	numGates
)

// tooLarge reports whether a request of weighted tokens can never pass the
// token gate: it is above the bucket's burst plus the credit the policy
// lends (whatever the breaker or a freeze lends now, both pass), and, for a
// critical request, above the critical bucket's burst too. Its answer is
// REQUEST_TOO_LARGE without a Retry-After, not a QUOTA_EXCEEDED whose wait
// never ends.
func (t *tenantState) tooLarge(weighted int64, wantCritical bool) bool {
	if weighted <= t.tokens.Burst()+creditLimit(t.policy) {
		return false
	}
	return !wantCritical || weighted > t.critical.Burst()
}

// tokenGate is the token bucket's gate: the request fits, down to the
// credit, or down to 0 while burst credit is frozen. A request only the
// freeze refuses is BURST_CREDIT_FROZEN; either way Retry-After is the
// earliest time it passes: when the quota has refilled for it, or when the
// freeze ends and the credit it would then borrow is there.
func (t *tenantState) tokenGate(now, weighted int64, frozen time.Duration) refusal {
	if frozen <= 0 {
		if t.tokens.Fits(now, weighted, -t.tokens.Credit()) {
			return refusal{}
		}
		return refusal{ReasonQuotaExceeded, t.tokens.AllowRetryAfter(now, weighted)}
	}
	if t.tokens.Fits(now, weighted, 0) {
		return refusal{}
	}
	inQuota := t.tokens.RetryAfter(now, weighted, 0)
	withCredit := max(t.tokens.AllowRetryAfter(now, weighted), frozen)
	if t.tokens.Fits(now, weighted, -t.tokens.Credit()) {
		return refusal{ReasonBurstCreditFrozen, min(inQuota, withCredit)}
	}
	return refusal{ReasonQuotaExceeded, min(inQuota, withCredit)}
}

// gateCharge is what the tenant gates took for one request, so that it can
// be given back exactly, and the quota labels of its answer.
type gateCharge struct {
	weighted    int64
	critical    bool // charged to the critical bucket rather than the token bucket
	price       int64
	day, month  int64 // the budget periods price was charged to
	quotaBefore int64
	quotaAfter  int64
	creditBef   int64
	creditAft   int64
}

// chargeGates takes what screen let pass.
func (t *tenantState) chargeGates(now, weighted, price int64, critical bool) gateCharge {
	g := gateCharge{weighted: weighted, critical: critical, price: price, day: t.budget.day, month: t.budget.month}
	t.rps.Take(now, rpsUnit)
	g.quotaBefore = t.tokens.Level(now)
	g.creditBef = availableCredit(g.quotaBefore, t.tokens.Credit())
	t.quotaBucket(critical).Take(now, weighted)
	g.quotaAfter = t.tokens.Level(now)
	g.creditAft = availableCredit(g.quotaAfter, t.tokens.Credit())
	t.credit.noteTake(g.quotaBefore, g.quotaAfter, now)
	t.budget.spend(price)
	return g
}

// refundGates gives back a gate charge entirely.
func (t *tenantState) refundGates(now int64, g *gateCharge) {
	t.rps.Refund(now, rpsUnit)
	t.quotaBucket(g.critical).Refund(now, g.weighted)
	t.budget.adjust(g.day, g.month, -g.price)
}

// quotaBucket is the bucket a request's weighted tokens are charged to.
func (t *tenantState) quotaBucket(critical bool) *tokenbucket.Bucket {
	if critical {
		return &t.critical
	}
	return &t.tokens
}

// settleQuota moves the quota charge from admitted to actual weighted
// tokens: unused ones go back (to the floor bucket too, when the request
// was admitted within its floor), an overrun is taken and may start a debt.
func (t *tenantState) settleQuota(now int64, g *gateCharge, floor bool, actual int64) (refunded int64) {
	diff := g.weighted - actual
	b := t.quotaBucket(g.critical)
	switch {
	case diff > 0:
		b.Refund(now, diff)
		if floor {
			t.floor.Refund(now, diff)
		}
	case diff < 0:
		before := b.Level(now)
		b.Take(now, -diff)
		if !g.critical {
			t.credit.noteTake(before, b.Level(now), now)
		}
	}
	return diff
}

func roundUnits(v float64) int64 {
	if v <= 0 || math.IsNaN(v) {
		return 0
	}
	return int64(math.Min(math.Round(v), math.MaxInt64/4))
}

// underFloor reports whether the tenant has been admitted less than its
// floor (this replica's slice of it) in the current second of the engine's
// clock, on shared capacity or within the floor. Its next request is then
// within its floor, whatever its size. A floor is owed in every second, so
// what the tenant had in the second before does not count against it: a
// tenant admitted three times its floor in one second, mostly small
// requests on shared capacity, still has its floor in the next, where a
// meter carrying that debt over would leave the next with nothing while
// its large requests wait for shared capacity.
func (t *tenantState) underFloor(now int64) bool {
	return t.floor.Burst() > 0 && t.served.at(now) < t.floor.Rate()
}

// secondMeter counts the weighted tokens admitted in one second of the
// engine's clock, a fixed window as a rate limiter keeps one: it starts
// again from zero each second.
type secondMeter struct {
	second int64 // the engine's seconds since it started
	served int64
}

// at returns what was admitted in now's second.
func (m *secondMeter) at(now int64) int64 {
	if s := now / int64(time.Second); s != m.second {
		m.second, m.served = s, 0
	}
	return m.served
}

// add counts n admitted at now and returns the second it counted them in.
func (m *secondMeter) add(now, n int64) (second int64) {
	m.at(now)
	m.served += n
	return m.second
}

// undo takes back n counted in second: nothing once that second is over.
func (m *secondMeter) undo(now, second, n int64) {
	if m.at(now); second == m.second {
		m.served = max(m.served-n, 0)
	}
}
