package cputime

import (
	"runtime"
	"testing"
	"time"
)

// The thread's CPU time grows while it computes and hardly at all while it
// sleeps.
func TestThreadCountsWorkNotSleep(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := Thread()
	var x uint64
	for deadline := time.Now().Add(20 * time.Millisecond); time.Now().Before(deadline); {
		for i := range 1000 {
			x += uint64(i) * x
		}
	}
	busy := Thread() - start
	if busy <= 0 {
		t.Fatalf("CPU time did not grow while computing (%v)", x)
	}
	if runtime.GOOS != "linux" {
		return // the wall clock stands in: it grows while sleeping too
	}
	start = Thread()
	time.Sleep(50 * time.Millisecond)
	if slept := Thread() - start; slept >= 25*time.Millisecond {
		t.Fatalf("CPU time grew by %v during a 50ms sleep", slept)
	}
}
