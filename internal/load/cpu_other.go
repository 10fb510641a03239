//go:build !unix

package load

import "time"

// selfCPU is unknown here: CPU per call is reported as 0.
func selfCPU() time.Duration { return 0 }
