package cputime

import (
	"runtime"
	"testing"
)

// Ratio runs a benchmark of two sizes of one operation in one run, in
// alternating blocks of block ops, so that a shared machine's noise falls
// on both alike: op(0) is the small size, op(1) the large. Each block is
// timed by the thread's CPU time, which leaves out the time other processes
// held the CPU, and its first warmup ops are not timed (they bring the
// size's state back into cache after the other size evicted it). It
// reports each size's ns per op under the names small and large, and their
// ratio.
func Ratio(b *testing.B, block, warmup int, small, large string, op func(which int)) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var (
		ns, ops  [2]float64
		which, n int
		start    = Thread()
	)
	for b.Loop() {
		if n == warmup {
			start = Thread()
		}
		op(which)
		if n++; n == block {
			ns[which] += float64(Thread() - start)
			ops[which] += float64(block - warmup)
			which, n = 1-which, 0
		}
	}
	if ops[0] == 0 || ops[1] == 0 {
		return // too few ops for a block of each (b.N is still being sized)
	}
	s, l := ns[0]/ops[0], ns[1]/ops[1]
	b.ReportMetric(s, small)
	b.ReportMetric(l, large)
	b.ReportMetric(l/s, "ratio")
}
