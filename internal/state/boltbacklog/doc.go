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
// # Verification at open
//
// bbolt maps the file into memory and follows its page ids and offsets
// as written: on a damaged file (truncated, pages overwritten) it faults,
// panics or allocates without bound, at open or at whichever later read
// first meets the damage. Open therefore checks the file, under its lock,
// before bbolt reads it. With plain reads it takes the meta page bbolt
// would use, checks the file's length against the pages that meta counts,
// the freelist (each id in range, listed once), and every page of every
// bucket's tree: each page names itself, is a branch or leaf page, is
// reached once and is not also free, keeps its elements, keys and values
// within its bytes, and keeps its keys in order within its parent's
// range; every page is in use or free. Then, through bbolt, it reads
// every record: each decodes under its own id, each unfinished one is in
// open under its Seq, each final one in finished, and the indexes hold
// nothing else. bbolt's own calls at open and during this read run with
// memory faults turned into panics and panics into errors. A file that
// fails is refused with a *DamagedError naming it and what is wrong, and
// left as it is; with Options.MoveAsideDamaged it is renamed to
// <path>.damaged-<UTC time> and the backlog starts empty. A 0-byte file
// starts an empty backlog, with a warning. The check reads the whole
// file and decodes every record: about 7 µs a ticket on 2 cores (11 ms
// for 1,500; some 7 s at deferral.max_total's million).
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
