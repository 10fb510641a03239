package admission

import (
	"context"
	"time"

	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/pd"
)

// WithSharedState makes the engine one of several replicas sharing quotas
// and domain capacity through store. New fails on invalid options.
func WithSharedState(store sharing.Store, o sharing.Options) Option {
	return func(e *Engine) {
		v := e.view()
		s, err := sharing.New(v, v, store, o)
		if err != nil {
			e.optErr = err
			return
		}
		e.shared = s
	}
}

// embedded is the strategy of a replica that shares nothing: every hook
// is a no-op and its buckets are whole. (Batched and strict are package
// sharing's, seeing the engine through its view: engine.go.)
type embedded struct{}

func (embedded) TenantReadyLocked(sharing.Tenant, int64, bool)                   {}
func (embedded) CapacityRebuiltLocked(int64, sharing.Domain, *pd.DomainCapacity) {}
func (embedded) GateLocked(sharing.Tenant) sharing.Refusal                       { return sharing.Refusal{} }
func (embedded) QuotaRefusedLocked(_ sharing.Tenant, retry time.Duration) time.Duration {
	return durationUntil(retry)
}
func (embedded) Decided(context.Context, string, uint64) sharing.Refusal { return sharing.Refusal{} }
func (embedded) ReleasedLocked(uint64, sharing.Charge, int64, pd.Cost) func(context.Context) {
	return nil
}
func (embedded) Run(context.Context)                          {}
func (embedded) Reconcile(context.Context) error              { return nil }
func (embedded) SetReplicasLocked(int)                        {}
func (embedded) Status() (sharing.Status, bool)               { return sharing.Status{}, false }
func (embedded) OverageByKind() (out [sharing.NumKinds]int64) { return out }

var (
	_ sharing.Strategy = embedded{}
	_ sharing.View     = engineView{}
	_ sharing.Tenant   = (*tenantState)(nil)
	_ sharing.Domain   = (*domainState)(nil)
)

// refusalOf is a strategy's refusal as the engine answers it.
func refusalOf(r sharing.Refusal) refusal {
	switch r.Cause {
	case sharing.Unavailable:
		return refusal{ReasonStateUnavailable, r.Retry}
	case sharing.OverQuota:
		return refusal{ReasonQuotaExceeded, r.Retry}
	case sharing.OverCapacity:
		return refusal{ReasonCapacityExceeded, r.Retry}
	}
	return refusal{}
}

// sharedCharge is what a lease charged, as the strategies see it.
func (l *lease) sharedCharge() sharing.Charge {
	c := sharing.Charge{
		Tenant: l.tenant, Weighted: l.gates.weighted, Critical: l.gates.critical,
		Floor: l.floor, Cost: l.cost, Granted: l.granted, Expires: l.expires,
	}
	if l.dom != nil {
		c.Domain = l.dom
	}
	return c
}

// SetReplicas sets N, the number of live replicas sharing the quotas (from
// membership). The next reconcile re-slices; nothing already reported is
// counted again.
func (e *Engine) SetReplicas(n int) {
	e.mu.Lock()
	e.shared.SetReplicasLocked(n)
	e.mu.Unlock()
}

// SharedStatus describes the shared-state link; ok is false when the engine
// runs embedded.
func (e *Engine) SharedStatus() (st sharing.Status, ok bool) { return e.shared.Status() }

// SharedOverage returns the units given up to overages, per bucket kind
// (in sharing.KindNames order).
func (e *Engine) SharedOverage() [sharing.NumKinds]int64 { return e.shared.OverageByKind() }

// Reconcile runs one batched reconcile now: it reports what this replica
// took from every shared bucket and applies the grants that come back. Run
// calls it every interval; tests call it directly. While the breaker is
// open it returns an error without calling the store, until the cool-down
// lets a probe through. It does nothing unless the engine runs batched.
func (e *Engine) Reconcile(ctx context.Context) error { return e.shared.Reconcile(ctx) }
