// Package state holds the adapters of the sharing.Store port:
// memstate (in memory: one process, and the reference the conformance
// suite checks Redis against) and redisstate (Redis: several replicas).
// statetest is the conformance suite both pass; redistest starts a real
// redis-server for tests.
//
// # Semantics both implement
//
// A bucket holds a level refilled at its rate up to its burst, on the
// store's clock (Redis server TIME). Batched Reconcile: each replica
// reports its cumulative take; the store applies the difference from the
// last cumulative it saw from that replica (or the unacknowledged part, if
// it saw none), so a repeated report is never charged twice; the replicas
// heard from within Stale share the rate by max-min fairness over their
// demands (each gets at least 1/20 of an equal share; unclaimed rate is
// split equally), and each gets the same fraction of the global level (its
// share of an overage when negative). A gauge (KV) gives each replica what
// it holds plus a demand-weighted share of what nobody holds. Strict
// Commit takes every amount or none; Settle gives amounts back and frees a
// lease's KV hold; KV holds lapse at their TTL.
package state
