//go:build !unix

package server

import "time"

// processCPU is 0 where getrusage is missing: the CPU ratios then read NaN.
func processCPU() time.Duration { return 0 }
