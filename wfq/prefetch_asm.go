//go:build amd64 || arm64

package wfq

// prefetch asks the CPU to start loading the cache line at addr and goes
// on without waiting for it (PREFETCHT0, PRFM): a hint that never faults.
// A plain load would do the same, but it holds its place in the reorder
// buffer until memory answers, and at 100k flows memory answers in
// hundreds of nanoseconds.
//
//go:noescape
func prefetch(addr uintptr)

// prefetchLines is prefetch for n ≥ 1 cache lines from addr on.
//
//go:noescape
func prefetchLines(addr uintptr, n int)
