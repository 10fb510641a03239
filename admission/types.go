package admission

import (
	"errors"
	"fmt"
	"time"
)

// Priority is a request's priority band.
type Priority int32

// Priorities. The numeric values match admission/v1's enum.
const (
	PriorityNormal   Priority = 1
	PriorityCritical Priority = 2
)

// Outcome is the decision of an Admit call.
type Outcome int32

// Outcomes. The numeric values match admission/v1's enum.
const (
	Admitted Outcome = 1 // runs now on the requested model
	Degraded Outcome = 2 // runs now on a lower tier the request accepted
	Rejected Outcome = 3 // does not run; Reason and RetryAfter say why and when to retry
	// Deferred: a deferrable request that cannot run now; Reason says
	// what keeps it (quota, capacity, the interactive queue) and the
	// backlog (package admission/deferral) gives it a ticket.
	Deferred Outcome = 4
)

// String returns the outcome's API name.
func (o Outcome) String() string {
	switch o {
	case Admitted:
		return "ADMITTED"
	case Degraded:
		return "DEGRADED"
	case Rejected:
		return "REJECTED"
	case Deferred:
		return "DEFERRED"
	}
	return fmt.Sprintf("Outcome(%d)", int32(o))
}

// Reason explains a rejection (and, on admitted answers, is ReasonNone).
type Reason int32

// Reasons. The numeric values match admission/v1's enum.
const (
	ReasonNone                 Reason = 0
	ReasonQuotaExceeded        Reason = 1  // RPS or token bucket empty (and no credit left)
	ReasonCapacityExceeded     Reason = 2  // no domain can ever hold the request, or none has room and it may not wait
	ReasonBurstCreditExhausted Reason = 3  // debt not repaid in the window: the tenant's breaker is open
	ReasonBudgetExhausted      Reason = 4  // daily or monthly cost budget spent
	ReasonQueueFull            Reason = 5  // per-flow or global queue bound reached
	ReasonDeadlineUnmeetable   Reason = 6  // the request cannot be admitted before its deadline
	ReasonDomainDraining       Reason = 7  // every domain that could hold it is draining
	ReasonUnknownTenant        Reason = 8  // the tenant is not configured
	ReasonConcurrencyExceeded  Reason = 9  // the tenant's in-flight limit is reached
	ReasonShuttingDown         Reason = 10 // the server stopped before the queued request was admitted
	ReasonStateUnavailable     Reason = 11 // shared state unreachable and the tier fails closed
	ReasonBurstCreditFrozen    Reason = 12 // over quota while an operator has frozen every tenant's burst credit
	ReasonRequestTooLarge      Reason = 13 // more weighted tokens than the tenant's burst plus credit: never passes, no Retry-After
	// ReasonInteractiveFirst: a deferrable request waits because
	// interactive requests are waiting, or because the capacity left is
	// the headroom kept for them (on DEFERRED answers only).
	ReasonInteractiveFirst Reason = 14
)

// LastReason is the highest Reason: tables indexed by reason size
// themselves by it.
const LastReason = ReasonInteractiveFirst

var reasonNames = [...]string{
	ReasonNone:                 "REASON_UNSPECIFIED",
	ReasonQuotaExceeded:        "QUOTA_EXCEEDED",
	ReasonCapacityExceeded:     "CAPACITY_EXCEEDED",
	ReasonBurstCreditExhausted: "BURST_CREDIT_EXHAUSTED",
	ReasonBudgetExhausted:      "BUDGET_EXHAUSTED",
	ReasonQueueFull:            "QUEUE_FULL",
	ReasonDeadlineUnmeetable:   "DEADLINE_UNMEETABLE",
	ReasonDomainDraining:       "DOMAIN_DRAINING",
	ReasonUnknownTenant:        "UNKNOWN_TENANT",
	ReasonConcurrencyExceeded:  "CONCURRENCY_EXCEEDED",
	ReasonShuttingDown:         "SHUTTING_DOWN",
	ReasonStateUnavailable:     "STATE_UNAVAILABLE",
	ReasonBurstCreditFrozen:    "BURST_CREDIT_FROZEN",
	ReasonRequestTooLarge:      "REQUEST_TOO_LARGE",
	ReasonInteractiveFirst:     "INTERACTIVE_FIRST",
}

// String returns the reason's API name.
func (r Reason) String() string {
	if r >= 0 && int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", int32(r))
}

// Request is one Admit call.
type Request struct {
	RequestID       string    // idempotency key; empty means none
	Tenant          string    // configured tenant name
	Model           string    // catalog model tier
	PromptTokens    int64     // > 0
	MaxOutputTokens int64     // > 0
	Priority        Priority  // PriorityNormal or PriorityCritical; 0 means normal
	AcceptDowngrade []string  // lower tiers the caller accepts, in any order
	Deadline        time.Time // zero: now + the configured default queue wait
	// ExpectedCachedTokens is how many prompt tokens the router expects
	// the engine to serve from its prefix cache (a prefix-aware router
	// knows): prefill is charged on the others. At most PromptTokens.
	ExpectedCachedTokens int64
	// Deferrable work may wait up to DeferWithin (0: the configured
	// default) in the durable backlog instead of the queue. It runs only
	// on capacity interactive traffic leaves: while no interactive
	// request waits, above the floors' reserve and deferral.headroom,
	// and without burst credit (it can wait for its quota instead).
	Deferrable  bool
	DeferWithin time.Duration
	// Ticketed marks a deferrable request admitted for a ticket of the
	// backlog (package admission/deferral), never one from a router: if
	// its lease ends unreleased the ticket is delivered again and charged
	// then, so the engine settles that lease as unused. A deferrable
	// request a router runs at once is charged as any other.
	Ticketed bool
}

// Decision is the answer to an Admit call.
type Decision struct {
	Outcome       Outcome
	Reason        Reason
	RetryAfter    time.Duration // on rejections: when a retry can succeed (0: unknown)
	LeaseID       uint64        // on admissions: the lease to Release
	Domain        string        // on admissions: the NVLink domain granted
	Model         string        // on admissions: the model tier granted
	DowngradePath []string      // on degraded admissions: requested model first, granted last
	Queued        time.Duration // time spent waiting in the fair queue
	Trace         Trace
}

// Trace holds the labels every answer carries, as numbers so that building
// one on the hot path allocates nothing; the gRPC layer renders them.
type Trace struct {
	Tenant              string
	Model               string // requested model
	Tier                string // tenant tier
	QuotaBefore         int64  // token bucket level before the charge (weighted tokens)
	QuotaAfter          int64  // and after it
	BurstCreditBefore   int64  // credit still available before the charge
	BurstCreditAfter    int64  // and after it
	Floor               bool   // admitted within the tenant's floor (from reserved capacity)
	Critical            bool   // served in the critical band
	PrefillLevel        int64  // granted domain's prefill bucket after the charge (FLOPs)
	DecodeLevel         int64  // granted domain's decode bucket after the charge (bytes)
	KVInUse             int64  // granted domain's KV gauge after the charge (bytes)
	KVLimit             int64  // the KV gauge's limit (bytes)
	WeightedTokens      int64  // prompt + output weight × max output
	EstimatedCostMicros int64  // estimated price in micro-USD charged to the budget
	// EstimatedWait is the wait the request's place in the fair order
	// predicted when it reached the queue (0 if it never did).
	EstimatedWait time.Duration
}

// ReleaseOutcome is what a router reports when a leased request finishes.
type ReleaseOutcome int32

// Release outcomes. The numeric values match admission/v1's enum, but for
// ReleaseUnobserved, which is not on the wire.
const (
	ReleaseOK    ReleaseOutcome = 1
	ReleaseError ReleaseOutcome = 2
	// ReleaseUnobserved settles a lease whose outcome nobody saw (the RLS
	// adapter settles each admission at once, and Envoy never learns how
	// the request went): the domain's health gets no sample from it, so
	// that it does not dilute the error rate routers report.
	ReleaseUnobserved ReleaseOutcome = -1
)

// Release reports the end of a leased request.
type Release struct {
	LeaseID      uint64
	PromptTokens int64 // actual prompt tokens (0: as admitted)
	OutputTokens int64 // actual output tokens generated
	Outcome      ReleaseOutcome
	// What the router measured (0: not reported): the time to first
	// token, the request's whole duration, and the prompt tokens its
	// engine served from a prefix cache (charged no prefill).
	TTFT               time.Duration
	Duration           time.Duration
	CachedPromptTokens int64
	// Authorize, if set, is asked under the engine's lock whether the
	// caller may release a lease of this tenant; an error refuses the
	// release (wrapped in ErrNotYourLease) and nothing changes. It must be
	// quick and must not call the engine.
	Authorize func(tenant string) error
}

// ReleaseResult says what Release did to the tenant's and domain's accounts.
type ReleaseResult struct {
	Tenant           string // the lease's tenant
	Domain           string
	Model            string
	RefundedTokens   int64 // weighted tokens given back (negative: overrun charged)
	ActualCostMicros int64 // the request's final price in micro-USD
	HeldFor          time.Duration
	// OverrunClamped says the Release reported more tokens than
	// limits.release_overrun_multiple times what the lease admitted (or
	// than the request limits) and was charged at that bound.
	OverrunClamped bool
	// Deferred says the lease was a backlog ticket's (Request.Ticketed):
	// the ticket is done.
	Deferred bool
}

// InvalidArgumentError is returned for a request that is malformed. Nothing
// was charged. Field names the offending field as the API spells it.
type InvalidArgumentError struct {
	Field  string
	Reason string
	// Limit, when positive, is the largest value Field may take (the
	// request limit it broke), so that an adapter that derived the field
	// from a count of its own can restate the bound in that count's terms.
	Limit int64
}

func (e *InvalidArgumentError) Error() string {
	return fmt.Sprintf("invalid %s: %s", e.Field, e.Reason)
}

// ErrLeaseNotFound is returned by Release for a lease that is unknown,
// already released or expired.
var ErrLeaseNotFound = errors.New("lease not found (unknown, already released or expired)")

// ErrNotYourLease is returned by Release when Authorize refuses the
// lease's tenant.
var ErrNotYourLease = errors.New("the lease belongs to a tenant the caller does not serve")

// ErrLeaseEnded is returned by Admit for a request id that was admitted
// before and whose lease has since been released or has expired: a repeat
// gets no dead lease for free, and a new request needs a new id.
var ErrLeaseEnded = errors.New("request_id was admitted before and its lease has ended")

// DomainInfo describes one domain for operators.
type DomainInfo struct {
	ID           string
	Kind         string // e.g. "nvl72", "hgx"
	GPUs         int
	Draining     bool
	DrainReason  string
	HealthWeight float64
	InFlight     int
	PrefillRate  int64 // FLOP/s of soft capacity
	PrefillLevel int64
	PrefillBurst int64
	DecodeRate   int64 // bytes/s of soft capacity
	DecodeLevel  int64
	DecodeBurst  int64
	KVInUse      int64
	KVLimit      int64
	ReservedFrac float64 // share of capacity reserved for floors
	// WarmupFraction is the share of its shared capacity the domain has
	// while it warms up after a return (1 when whole); WarmupLeft is how
	// long until it is whole (0 when whole).
	WarmupFraction float64
	WarmupLeft     time.Duration

	// The closed capacity loop (Config.Feedback): the whole domain's
	// rates as corrected and as the model gives them, the correction
	// (CapacityFactor, 1: the model), and the engines' last signals with
	// their age (zero when none were ever read). EngineSaturated: the
	// guard holds the domain to its floors. FloorsShort: the floor
	// reserves it was given ask more than its corrected rates hold.
	EffectivePrefillRate, EffectiveDecodeRate int64
	PriorPrefillRate, PriorDecodeRate         int64
	CapacityFactor                            float64
	EngineQueue, EngineKVUsage                float64
	EngineMetricsAge                          time.Duration
	EngineMetricsStale                        bool
	EngineSaturated                           bool
	FloorsShort                               bool
	// PrefillUse and DecodeUse are the shares of the whole domain's
	// prefill and decode rates taken of late (moving averages over the
	// loop's periods, feedback.load_smoothing each): how busy the domain
	// is, where its buckets' levels say only how much of a burst is spent.
	// Load is the placement's measure of it for spreading (the larger of
	// its use, its KV in use and its engines' signals against their
	// thresholds).
	PrefillUse, DecodeUse, Load float64
}

// TenantInfo describes one tenant for operators.
type TenantInfo struct {
	Name             string
	Tier             string
	Weight           int64
	FloorTokens      int64 // guaranteed weighted tokens per second
	TokenRate        int64
	TokenBurst       int64
	TokenLevel       int64
	Credit           int64
	RPSLevel         int64
	InFlight         int
	Queued           int
	BreakerOpen      bool
	BreakerUntil     time.Time
	SpentTodayMicros int64
	SpentMonthMicros int64
}

// ErrUnknownDomain is returned by Drain and Undrain for a domain the cluster does not have.
var ErrUnknownDomain = errors.New("unknown domain")
