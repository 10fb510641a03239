package admission

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-sched/sluice/pd"
)

// SharedMode selects how decisions use shared state.
type SharedMode int

// Shared-state modes.
const (
	// SharedBatched decides locally from this replica's grants and
	// reconciles every interval (the default with several replicas).
	SharedBatched SharedMode = iota + 1
	// SharedStrict confirms every admission with one atomic store call.
	SharedStrict
)

// String names the mode as flags and logs do.
func (m SharedMode) String() string {
	switch m {
	case SharedBatched:
		return "batched"
	case SharedStrict:
		return "strict"
	}
	return "embedded"
}

// SharedOptions configure shared state.
type SharedOptions struct {
	Mode     SharedMode
	Replica  string        // unique per process incarnation
	Replicas int           // N until membership says otherwise; default 1
	Interval time.Duration // batched reconcile period; default 100ms
	Timeout  time.Duration // per store call; default 50ms
	// The breaker opens after Failures consecutive store errors and probes
	// again after Cooldown.
	Failures int           // default 3
	Cooldown time.Duration // default 1s
	// MemberExpiry, if set, returns when this replica's membership lapses
	// should it renew it no more (its member lease's expiry as of its
	// last keepalive; zero without one). Batched, a replica's holding of
	// a domain's KV outlives its last report until then, so that a dead
	// replica's capacity comes back to the others when its member lease
	// expires; without it, SilentHoldRounds intervals after its last
	// report. It is called under the engine's lock: it must not call the
	// engine.
	MemberExpiry func() time.Time
	// OnBreaker, if set, is told when the breaker opens (true) and closes
	// (false). It is called under the engine's lock: it must only note the
	// change (a log line, a metric), never call the engine.
	OnBreaker func(open bool)
}

func (o *SharedOptions) setDefaults() error {
	if o.Mode != SharedBatched && o.Mode != SharedStrict {
		return errors.New("admission: shared state: mode must be batched or strict")
	}
	if o.Replica == "" {
		return errors.New("admission: shared state: replica id must not be empty")
	}
	o.Replicas = max(o.Replicas, 1)
	if o.Interval <= 0 {
		o.Interval = 100 * time.Millisecond
	}
	if o.Timeout <= 0 {
		o.Timeout = 50 * time.Millisecond
	}
	if o.Failures <= 0 {
		o.Failures = 3
	}
	if o.Cooldown <= 0 {
		o.Cooldown = time.Second
	}
	return nil
}

// WithSharedState makes the engine one of several replicas sharing quotas
// and domain capacity through store. New fails on invalid options.
func WithSharedState(store SharedState, o SharedOptions) Option {
	return func(e *Engine) {
		if err := o.setDefaults(); err != nil {
			e.optErr = err
			return
		}
		e.shared = newSharedStrategy(e, store, o)
	}
}

// SharedStatus describes the shared-state link, for metrics.
type SharedStatus struct {
	Mode        SharedMode
	Replicas    int
	BreakerOpen bool
	// FallbackSeconds is the total time the breaker has been open.
	FallbackSeconds float64
	// ReconcileLag is how long ago the last successful reconcile (or
	// strict call) completed.
	ReconcileLag time.Duration
	// Overage is the total of units this replica gave up to overages.
	Overage int64
	// Calls and Decisions count store calls and decisions, so that
	// Calls/Decisions is the store calls per decision.
	Calls, Decisions uint64
	Failures         uint64
}

// sharedStrategy is how decisions use the state this replica shares with
// others: not at all (embedded), through local grants reconciled in the
// background (batched), or confirmed by one store call per admission
// (strict). The engine calls it at these hooks and nowhere else asks which
// mode it runs in. Methods ending in Locked run under Engine.mu.
type sharedStrategy interface {
	// tenantReadyLocked follows a tenant's state built from config
	// (reloaded false) or re-limited by a reload (reloaded true).
	tenantReadyLocked(t *tenantState, now int64, reloaded bool)
	// capacityRebuiltLocked follows a domain whose capacity a reload or a
	// topology change rebuilt (old nil: a domain new to the cluster).
	capacityRebuiltLocked(now int64, d *domainState, old *pd.DomainCapacity)
	// gateLocked is the store's own gate, screened after the burst-credit
	// breaker: a fail-closed tier is refused while the store is unreachable.
	gateLocked(t *tenantState) refusal
	// quotaRefusedLocked follows a quota refusal and returns the
	// Retry-After to answer for the bucket's own estimate.
	quotaRefusedLocked(t *tenantState, retry time.Duration) time.Duration
	// decided sees every answer before it is returned, outside the lock
	// (leaseID 0: not an admission). A refusal it returns turns the
	// admission into that refusal: a store that refused it. (Not the
	// Decision itself: through an interface, a pointer would move every
	// answer to the heap, and a copy costs more than the rest of the hook.)
	decided(ctx context.Context, requestID string, leaseID uint64) refusal
	// releasedLocked follows a settled lease and returns the store work to
	// do outside the lock, or nil. (The lease by value: a pointer through
	// the interface would move every released lease to the heap.)
	releasedLocked(id uint64, l lease, actualWeighted int64, actual pd.Cost) func(context.Context)
	// run is the background work (reconciling, probing an open breaker)
	// until ctx ends.
	run(ctx context.Context)
	// reconcile runs one batched reconcile now.
	reconcile(ctx context.Context) error
	setReplicasLocked(n int)
	status() (SharedStatus, bool)
	overageByKind() [numKinds]int64
}

func newSharedStrategy(e *Engine, store SharedState, o SharedOptions) sharedStrategy {
	link := newStoreLink(e, store, o)
	if o.Mode == SharedStrict {
		return newStrictState(link)
	}
	return newBatchedState(link)
}

// embedded is the strategy of a replica that shares nothing: every hook
// is a no-op and its buckets are whole.
type embedded struct{}

func (embedded) tenantReadyLocked(*tenantState, int64, bool)                   {}
func (embedded) capacityRebuiltLocked(int64, *domainState, *pd.DomainCapacity) {}
func (embedded) gateLocked(*tenantState) refusal                               { return refusal{} }
func (embedded) quotaRefusedLocked(_ *tenantState, retry time.Duration) time.Duration {
	return durationUntil(retry)
}
func (embedded) decided(context.Context, string, uint64) refusal { return refusal{} }
func (embedded) releasedLocked(uint64, lease, int64, pd.Cost) func(context.Context) {
	return nil
}
func (embedded) run(context.Context)                  {}
func (embedded) reconcile(context.Context) error      { return nil }
func (embedded) setReplicasLocked(int)                {}
func (embedded) status() (SharedStatus, bool)         { return SharedStatus{}, false }
func (embedded) overageByKind() (out [numKinds]int64) { return out }

// SetReplicas sets N, the number of live replicas sharing the quotas (from
// membership). The next reconcile re-slices; nothing already reported is
// counted again.
func (e *Engine) SetReplicas(n int) {
	e.mu.Lock()
	e.shared.setReplicasLocked(n)
	e.mu.Unlock()
}

// SharedStatus describes the shared-state link; ok is false when the engine
// runs embedded.
func (e *Engine) SharedStatus() (st SharedStatus, ok bool) { return e.shared.status() }

// SharedOverage returns the units given up to overages, per bucket kind
// (in KindNames order).
func (e *Engine) SharedOverage() [numKinds]int64 { return e.shared.overageByKind() }

// Reconcile runs one batched reconcile now: it reports what this replica
// took from every shared bucket and applies the grants that come back. Run
// calls it every interval; tests call it directly. While the breaker is
// open it returns an error without calling the store, until the cool-down
// lets a probe through. It does nothing unless the engine runs batched.
func (e *Engine) Reconcile(ctx context.Context) error { return e.shared.reconcile(ctx) }
