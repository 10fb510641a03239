// Package cputime reads the CPU time of the calling OS thread, for
// benchmarks that compare two sizes in one run on a shared machine: unlike
// the wall clock, it leaves out the time other processes held the CPU.
package cputime

import "time"

// Thread returns the CPU time the calling thread has used, or the wall
// clock's time since the process started where the system has no such
// clock. The caller must hold its OS thread (runtime.LockOSThread) between
// two readings it subtracts.
func Thread() time.Duration { return thread() }
