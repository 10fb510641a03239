package sharing

import (
	"context"
	"time"

	"github.com/sluice-sched/sluice/pd"
)

// Strategy is how decisions use the state this replica shares with
// others. The engine calls it at these hooks and nowhere else asks which
// mode it runs in. Methods ending in Locked run under the engine's lock.
type Strategy interface {
	// TenantReadyLocked follows a tenant's state built from config
	// (reloaded false) or re-limited by a reload (reloaded true).
	TenantReadyLocked(t Tenant, now int64, reloaded bool)
	// CapacityRebuiltLocked follows a domain whose capacity a reload or a
	// topology change rebuilt (old nil: a domain new to the cluster).
	CapacityRebuiltLocked(now int64, d Domain, old *pd.DomainCapacity)
	// GateLocked is the store's own gate, screened after the burst-credit
	// breaker: a fail-closed tier is refused while the store is unreachable.
	GateLocked(t Tenant) Refusal
	// QuotaRefusedLocked follows a quota refusal and returns the
	// Retry-After to answer for the bucket's own estimate.
	QuotaRefusedLocked(t Tenant, retry time.Duration) time.Duration
	// Decided sees every answer before it is returned, outside the lock
	// (leaseID 0: not an admission). A refusal it returns turns the
	// admission into that refusal: a store that refused it. (Not the
	// decision itself: through an interface, a pointer would move every
	// answer to the heap.)
	Decided(ctx context.Context, requestID string, leaseID uint64) Refusal
	// ReleasedLocked follows a settled lease and returns the store work to
	// do outside the lock, or nil.
	ReleasedLocked(id uint64, c Charge, actualWeighted int64, actual pd.Cost) func(context.Context)
	// Run is the background work (reconciling, probing an open breaker)
	// until ctx ends.
	Run(ctx context.Context)
	// Reconcile runs one round of store upkeep now: batched, a reconcile;
	// strict, renewing this replica's liveness on the KV gauges it holds
	// leases in, where due.
	Reconcile(ctx context.Context) error
	// SetReplicasLocked sets N, the live replicas sharing the quotas.
	SetReplicasLocked(n int)
	// Status describes the link; ok is false for a strategy without one.
	Status() (st Status, ok bool)
	// OverageByKind is the units given up to overages, per Kind.
	OverageByKind() [NumKinds]int64
}

// New returns the strategy of o.Mode (batched or strict) sharing state
// through store, for the engine seen through v, relaying its engine
// readings through r (nil: none relayed). It fails on invalid options.
func New(v View, r Readings, store Store, o Options) (Strategy, error) {
	if err := o.setDefaults(); err != nil {
		return nil, err
	}
	link := newStoreLink(v, r, store, o)
	if o.Mode == Strict {
		return newStrictState(link), nil
	}
	return newBatchedState(link), nil
}

var (
	_ Strategy = (*batchedState)(nil)
	_ Strategy = (*strictState)(nil)
)
