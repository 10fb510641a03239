package sharing

import (
	"iter"
	"time"

	"github.com/sluice-sched/sluice/internal/tokenbucket"
	"github.com/sluice-sched/sluice/pd"
)

// View is what a strategy may see and change of the engine: the engine's
// lock, its clock, its tenants' buckets, its domains' capacities and its
// leases. The engine implements it; the strategies hold nothing else of
// it. Methods ending in Locked expect the lock held (Lock).
type View interface {
	// Lock and Unlock take and give back the engine's lock.
	Lock()
	Unlock()
	// NowLocked is the engine's monotonic time in nanoseconds, the scale
	// of every bucket.
	NowLocked() int64
	// Wall is the engine clock's wall time; it needs no lock.
	Wall() time.Time
	// TenantsLocked yields every tenant the engine holds state for.
	TenantsLocked() iter.Seq[Tenant]
	// TenantLocked returns the tenant of that name, or nil.
	TenantLocked(name string) Tenant
	// DomainsLocked yields every domain, in cluster order (a removed one
	// too, while leases still hold it).
	DomainsLocked() iter.Seq[Domain]
	// DomainLocked returns the domain with that id, or nil.
	DomainLocked(id string) Domain
	// LeaseLocked returns what the live lease with that id charged.
	LeaseLocked(id uint64) (Charge, bool)
	// RevokeLocked takes back a lease the store refused: its charge is
	// cancelled and its request id forgotten.
	RevokeLocked(requestID string, id uint64)
	// LeaseTTLLocked is the configured lease TTL.
	LeaseTTLLocked() time.Duration
	// Background runs fn in a goroutine the engine's Close waits for. It
	// takes the lock: never call it with the lock held.
	Background(fn func())
}

// Readings is the port of the capacity loop's engine-reading relay, beside
// View: the readings of its domains' serving engines this replica made,
// the domains whose readings placement wants, and where a reading another
// replica made goes. Batched mode relays them in its reconcile round (one
// round trip carries the quotas and the readings: the Store's
// ReconcileRequest.Engines and ReconcileReply.Readings); strict mode relays
// none. The engine implements it. Methods expect the engine's lock held.
type Readings interface {
	// OwnEngineReadingLocked is the newest reading of d's serving engines
	// that this replica made itself (none relayed from another), with the
	// engine time it was made at; false when it has none.
	OwnEngineReadingLocked(d Domain) (r EngineReading, at int64, ok bool)
	// EngineReadingWantedLocked reports whether placement has weighed d
	// lately: its capacity loop wants the newest reading of its engines,
	// whoever made it.
	EngineReadingWantedLocked(d Domain) bool
	// RelayEngineReadingLocked hands d's capacity loop a reading of its
	// engines that another replica made.
	RelayEngineReadingLocked(d Domain, r EngineReading)
}

// Tenant is one tenant's state as the strategies see it. Its buckets are
// the engine's own: a strategy cuts them to this replica's share and
// applies grants to them.
type Tenant interface {
	Name() string
	// Buckets are the tenant's buckets in Kind order: RPS (in
	// RequestUnit per request), tokens, floor, critical.
	Buckets() [TenantKinds]*tokenbucket.Bucket
	// Limits is the whole (all-replica) rate and burst of a bucket, from
	// the tenant's policy.
	Limits(k Kind) (rate, burst int64)
	// CreditLent is the credit the whole token bucket lends (0 while the
	// tenant's burst credit does not lend).
	CreditLent() int64
	// Created is the engine time the tenant's state was built.
	Created() int64
	// FailClosed reports whether the tenant's tier is refused while the
	// store is unreachable.
	FailClosed() bool
	// ResetLimits gives every bucket its whole limits again, keeping its
	// level.
	ResetLimits(now int64)
}

// Domain is one NVLink domain as the strategies see it.
type Domain interface {
	ID() string
	// Removed reports whether the domain has left the cluster (only its
	// leases still refer to it).
	Removed() bool
	// Capacity is the domain's soft capacity; a reload or a topology
	// change may replace it.
	Capacity() *pd.DomainCapacity
	// RestoreCapacity makes the capacity whole again: its limits from
	// the domain's topology, its levels kept.
	RestoreCapacity()
}

// Charge is what one lease took locally: what the store is told to take
// (strict) and what a fallback slice must hold.
type Charge struct {
	Tenant   Tenant
	Domain   Domain  // where it was placed
	Weighted int64   // weighted tokens charged to the quota bucket
	Critical bool    // charged to the critical bucket instead of the token bucket
	Floor    bool    // also charged to the floor bucket
	Cost     pd.Cost // what the domain was charged
	Granted  int64   // engine time of the admission
	Expires  int64   // engine time the lease expires
}

// Cause is why a strategy turns an answer into a refusal.
type Cause uint8

// Causes of a strategy's refusal.
const (
	// None lets the answer stand.
	None Cause = iota
	// Unavailable: the store cannot be reached and the tier fails closed.
	Unavailable
	// OverQuota: a tenant bucket refused (the store's, or a fallback slice).
	OverQuota
	// OverCapacity: a domain bucket or the KV gauge refused.
	OverCapacity
)

// Refusal is a strategy's refusal and when to retry; the zero value
// refuses nothing.
type Refusal struct {
	Cause Cause
	Retry time.Duration
}

// Refused reports whether r refuses.
func (r Refusal) Refused() bool { return r.Cause != None }

// clampRetry is a wait as a Retry-After: in [0, 24h].
func clampRetry(d time.Duration) time.Duration { return min(max(d, 0), 24*time.Hour) }
