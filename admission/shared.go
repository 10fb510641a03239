package admission

import "github.com/sluice-sched/sluice/admission/sharing"

// The shared-state port and its messages live in package sharing, beside
// the strategies that use them; these names keep them where the engine's
// users (the store adapters, the server, tests) find them.
type (
	// SharedState is the port to state that several replicas share:
	// sharing.Store.
	SharedState = sharing.Store
	// ShardedState is a SharedState spread over shards that fail on their
	// own: sharing.Sharded.
	ShardedState = sharing.Sharded
	// ReconcileRequest is one replica's report for every bucket it uses.
	ReconcileRequest = sharing.ReconcileRequest
	// BucketReport is one bucket's use by one replica.
	BucketReport = sharing.BucketReport
	// GaugeReport is what one replica holds of a gauge.
	GaugeReport = sharing.GaugeReport
	// ReconcileReply carries the grants, in the request's order.
	ReconcileReply = sharing.ReconcileReply
	// EngineReport is one replica's reading of a domain's serving engines.
	EngineReport = sharing.EngineReport
	// EngineReading is what a domain's serving engines reported.
	EngineReading = sharing.EngineReading
	// BucketGrant is one replica's slice of a bucket until its next report.
	BucketGrant = sharing.BucketGrant
	// StrictCharge is everything one decision takes, checked and taken at once.
	StrictCharge = sharing.StrictCharge
	// StrictTake takes an amount from a bucket if its level stays above a minimum.
	StrictTake = sharing.StrictTake
	// KVHold holds bytes of a domain's KV gauge under a lease.
	KVHold = sharing.KVHold
	// StrictVerdict is the answer to a Commit.
	StrictVerdict = sharing.StrictVerdict
	// StrictSettle settles a finished lease.
	StrictSettle = sharing.StrictSettle
	// SharedMode selects how decisions use shared state.
	SharedMode = sharing.Mode
	// SharedOptions configure shared state.
	SharedOptions = sharing.Options
	// SharedStatus describes the shared-state link, for metrics.
	SharedStatus = sharing.Status
	// SharedShard is one shard's state in SharedStatus.
	SharedShard = sharing.ShardStatus
)

// Shared-state modes.
const (
	// SharedBatched decides locally from this replica's grants and
	// reconciles every interval (the default with several replicas).
	SharedBatched = sharing.Batched
	// SharedStrict confirms every admission with one atomic store call.
	SharedStrict = sharing.Strict
)

// CumModulus bounds cumulative counters: they count modulo 2^52 so that
// they stay exact in a Lua (double) number.
const CumModulus = sharing.CumModulus

// SilentHoldRounds is how many reconcile intervals a replica's holding of
// a gauge outlives its last report where no membership says more.
const SilentHoldRounds = sharing.SilentHoldRounds

// KindNames are the bucket kinds as metrics label them, by kind.
var KindNames = sharing.KindNames
