//go:build !linux

package wfq

import "time"

var processStart = time.Now()

// threadTime stands in for the thread's CPU time where there is none to
// read: the wall clock.
func threadTime() time.Duration { return time.Since(processStart) }
