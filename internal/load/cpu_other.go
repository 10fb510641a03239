//go:build !unix

package load

import "time"

// ProcessCPU is unknown here: CPU per call is reported as 0.
func ProcessCPU() time.Duration { return 0 }
