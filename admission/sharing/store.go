package sharing

import (
	"context"
	"time"
)

// Store is the port to state that several sluiced replicas share
// (internal/state/redisstate implements it on Redis, internal/state/memstate
// in memory for one process and for tests). Every amount is in the bucket's units scaled to stay below
// CumModulus; the strategies do the scaling.
//
// Batched mode calls only Reconcile; strict mode calls Commit and Settle.
type Store interface {
	// Reconcile reports what this replica took from each bucket since it
	// started and what it would take, and returns its grants.
	Reconcile(ctx context.Context, req *ReconcileRequest) (*ReconcileReply, error)
	// Commit checks and takes every amount of one decision atomically:
	// all or nothing. A lease whose KV hold the store holds already takes
	// nothing again, and renews its replica's liveness (KVHold.Alive).
	Commit(ctx context.Context, c *StrictCharge) (StrictVerdict, error)
	// Settle gives back (or takes, for an overrun) what a finished lease
	// was charged beyond its use, and frees its KV hold.
	Settle(ctx context.Context, s *StrictSettle) error
	// Ping checks that the store answers: the probe of an open breaker
	// in strict mode, where refused requests make no other call.
	Ping(ctx context.Context) error
}

// Sharded is a Store whose keys live on shards that fail on their own (a
// Redis Cluster's masters). Batched mode sends each round one call per
// shard and keeps a breaker per shard, so that one shard's outage touches
// only the tenants and domains whose keys it holds.
type Sharded interface {
	Store
	// Shard names the shard that serves key now (keys with one owner, a
	// tenant's or a domain's, share one); "" where it is not yet known.
	Shard(key string) string
}

// CumModulus bounds cumulative counters: they count modulo 2^52 so that they
// stay exact in a Lua (double) number; the store takes differences modulo it.
const CumModulus = 1 << 52

// ReconcileRequest is one replica's report for every bucket it uses.
type ReconcileRequest struct {
	// Shard is the shard the request is for, where the store is Sharded
	// (every key is on it, as Sharded.Shard named it). A request with no
	// buckets and no gauges checks that the shard (or the store) answers:
	// each round calls every shard that holds anything of the replica's,
	// so an outage is seen while its tenants are idle too.
	Shard   string
	Replica string // this process incarnation
	// Replicas is N, the replicas expected (config or membership). Each
	// replica starts a bucket from a 1/N slice before its first report, so
	// for Stale after a bucket is created the store shares its level as
	// if N replicas were live, keeping the others' slices out of it.
	Replicas int
	Stale    time.Duration // a replica not heard from for this long drops out of the shares
	// Rejoin is how long after a bucket is rebuilt from the replicas'
	// levels (see BucketReport.Resume) a replica back from the same outage
	// still brings its level instead of its takes.
	Rejoin  time.Duration
	Buckets []BucketReport
	Gauges  []GaugeReport
	// Engines publishes the engine readings this replica made since its
	// last report, and asks for those of domains it does not report in
	// Gauges (each gauge's reply carries its domain's): a domain's engines
	// are read by a few replicas, and the store relays the newest reading
	// to the others. One entry per domain.
	Engines []EngineReport
}

// BucketReport is one bucket's use by one replica.
type BucketReport struct {
	Key   string
	Rate  int64 // the whole bucket's refill rate, units per second
	Burst int64 // the whole bucket's burst
	// Cum is what this replica took (net of refunds) in this epoch,
	// modulo CumModulus. A store that holds an earlier Cum of the same
	// epoch from the replica applies the difference, so a report repeated
	// after an ambiguous failure is not charged twice.
	Cum int64
	// Unacked is the part of Cum no reply has acknowledged: what a store
	// without a Cum of this epoch (a new epoch, a Redis restart, a counter
	// forgotten after long silence) applies instead.
	Unacked int64
	// Epoch numbers the replica's counting of this bucket: a new one
	// starts whenever the replica starts counting it afresh.
	Epoch  uint64
	Demand int64 // units per second this replica would take
	// Age is how long this replica has held the bucket. A store creating
	// the bucket counts it full since then: the quota refilled while the
	// replicas spent their starting slices.
	Age time.Duration

	// Resume says that this replica's local bucket has refilled at its
	// grant since its last acknowledged report, Span ago (it was not
	// frozen idle), so that its level, Held, already nets what it took
	// against its share of the refill. A store that heard from nobody about
	// the bucket for longer than Stale, or lost it (an outage, a restart),
	// rebuilds the level from these instead of charging the takes against
	// its own refill: that refill was capped at the burst while the
	// replicas refilled locally, and charging the outage's takes (about
	// R·T) after it would leave the level near B − R·T, refusing everyone
	// for about as long as the outage lasted. The first such report sets the level to
	// Held; each other replica whose Span began before that rebuild adds
	// its Held once, within Rejoin. Any other report is charged as usual.
	Resume bool
	Held   int64         // the local level, in the report's units (negative: a share of an overage)
	Span   time.Duration // since this replica's last acknowledged report of the bucket
}

// GaugeReport is what one replica holds of a gauge (a domain's KV bytes).
type GaugeReport struct {
	Key   string
	Limit int64         // the whole gauge's limit
	Held  int64         // what this replica holds now
	Share int64         // this replica's weight for the free part (its demand)
	TTL   time.Duration // how long the holding outlives a silent replica: then the others reclaim it
}

// EngineReport asks for the newest reading of a domain's serving engines
// (their waiting queue, running requests and KV-cache use, as the
// capacity loop takes them), and publishes one the reporting replica made.
// The store keeps the newest per domain, beside the domain's KV gauge.
type EngineReport struct {
	Key     string         // the domain's KV gauge key
	Reading *EngineReading // nil: it only asks
}

// EngineReading is what a domain's engines reported.
type EngineReading struct {
	Queue, Running, KVUsage float64
	// Age is how old the reading is: as the reporting replica sends it,
	// and, in a reply, as the store answers it (by the store's clock, so
	// that no two replicas' clocks are compared).
	Age time.Duration
	// Stamp tells one reading from another in a reply (the store sets
	// it), so that a replica takes each once. A replica is never answered
	// its own readings.
	Stamp int64
}

// ReconcileReply carries the grants, in the request's order.
type ReconcileReply struct {
	Buckets []BucketGrant
	Gauges  []int64 // this replica's limit per gauge
	// Readings is the newest engine reading any replica published of
	// each gauge's domain, then of each engine entry's, in the request's
	// order; nil where none is held (no slice at all from a store that
	// relays none).
	Readings []*EngineReading
}

// BucketGrant is one replica's slice of a bucket until its next report.
type BucketGrant struct {
	// RateMilli is the rate this replica refills at, in thousandths of a
	// unit per second (whole units would round small rates away).
	RateMilli int64
	// Level is its share of the global level; negative is its share of an
	// overage, the backpressure.
	Level int64
}

// StrictCharge is everything one decision takes, checked and taken at once.
type StrictCharge struct {
	Takes []StrictTake
	KV    KVHold
}

// StrictTake takes Amount from a bucket if its level stays at or above Min
// (negative Min lends credit).
type StrictTake struct {
	Key    string
	Rate   int64
	Burst  int64
	Amount int64
	Min    int64
}

// KVHold holds Bytes of a domain's KV gauge under a lease until it is
// settled or its TTL passes.
type KVHold struct {
	Key   string
	Lease string // Replica + "/" + a lease id unique within the replica
	Limit int64
	Bytes int64
	TTL   time.Duration
	// Replica is the committing replica. Alive, when positive, is how
	// long all its holds of the gauge outlive its silence: every Commit to
	// the gauge (a hold already held included, which takes nothing again)
	// renews it, and once it lapses the next commit frees every hold of
	// the replica, as batched mode lets a silent replica's holding go.
	// Zero: its holds lapse only at their TTL.
	Replica string
	Alive   time.Duration
}

// StrictVerdict is the answer to a Commit.
type StrictVerdict struct {
	Admitted bool
	// Refused is the index in Takes of the bucket that refused, or
	// len(Takes) for the KV gauge; meaningful when not admitted.
	Refused    int
	RetryAfter time.Duration
	// Levels are, for an admission the call took, each bucket's level
	// after the take, in Takes' order (empty when an earlier call had
	// committed it). A replica whose breaker opens cuts its fallback
	// slices from them: its share of what the store last held, not of a
	// full bucket it never saw.
	Levels []int64
}

// StrictSettle settles a finished lease: each Amount is given back
// (negative: taken, an overrun) and the KV hold freed.
type StrictSettle struct {
	Refunds []StrictTake
	KVKey   string
	Lease   string
}
