// Package boltbacklog is the deferral.Store of a single sluiced: the
// deferred tickets in a bbolt file under the server's --data-dir, so
// that a restart, kill -9 included, takes back every ticket it answered
// DEFERRED.
//
// # Layout
//
// Three buckets:
//
//	tickets   id → the record as JSON; its NextSequence is the Seq counter
//	open      Seq (8 bytes big-endian) → id, for unfinished tickets only
//	finished  Finished (8 bytes big-endian Unix nanoseconds) ‖ id → nothing
//
// open lets Adopt walk the unfinished tickets in Seq order without reading
// the final ones; finished lets Sweep drop the records whose retention
// ran out by walking its oldest keys, not the whole file.
//
// # Group commit
//
// Every write goes through bolt's DB.Batch: concurrent calls (a burst of
// deferrals from many goroutines) share one transaction and one fsync.
// A batch starts when it holds Options.MaxBatchSize calls or when
// Options.MaxBatchDelay has passed since its first, so a lone write waits
// up to that delay; meanwhile the previous batch's fsync runs, so batches
// grow to cover it. A call's function may run twice (bolt retries the
// batch without a call that failed), so each one sets its results from
// scratch and reports "not found" through them, never as an error that
// would fail its neighbours' batch.
//
// # Adopt
//
// The Seq counter at Open divides the tickets: those at or below it were
// written by an earlier process and are returned by the first Adopt (in
// Seq order, hence in order within each tenant); those above were added
// through this instance, which holds them already. Later calls return
// nothing: no one else writes the file (bolt's file lock keeps a second
// process out).
package boltbacklog
