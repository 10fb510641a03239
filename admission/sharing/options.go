package sharing

import (
	"errors"
	"time"
)

// Mode selects how decisions use shared state.
type Mode int

// Shared-state modes (the zero Mode is embedded: nothing shared).
const (
	// Batched decides locally from this replica's grants and reconciles
	// every interval (the default with several replicas).
	Batched Mode = iota + 1
	// Strict confirms every admission with one atomic store call.
	Strict
)

// String names the mode as flags and logs do.
func (m Mode) String() string {
	switch m {
	case Batched:
		return "batched"
	case Strict:
		return "strict"
	}
	return "embedded"
}

// Options configure shared state.
type Options struct {
	Mode     Mode
	Replica  string        // unique per process incarnation
	Replicas int           // N until membership says otherwise; default 1
	Interval time.Duration // batched reconcile period; default 100ms
	Timeout  time.Duration // per store call; default 50ms
	// Patience is how long a batched round waits for its calls before it
	// goes on without the slow ones (their shards are left be until they
	// answer); default Interval. A simulation whose store runs on the
	// caller's goroutine in virtual time waits for them all.
	Patience time.Duration
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

func (o *Options) setDefaults() error {
	if o.Mode != Batched && o.Mode != Strict {
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
	if o.Patience <= 0 {
		o.Patience = o.Interval
	}
	if o.Failures <= 0 {
		o.Failures = 3
	}
	if o.Cooldown <= 0 {
		o.Cooldown = time.Second
	}
	return nil
}

// Status describes the shared-state link, for metrics.
type Status struct {
	Mode        Mode
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
	// Shards is each shard's state, by name, where the store is Sharded
	// (batched: a breaker per shard; BreakerOpen while any is open).
	Shards []ShardStatus
}
