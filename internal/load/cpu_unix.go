//go:build unix

package load

import (
	"syscall"
	"time"
)

// ProcessCPU is this process's user + system CPU time (0 where getrusage
// is missing). Benchmarks in other packages read it too.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
