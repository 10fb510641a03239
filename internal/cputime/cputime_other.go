//go:build !linux

package cputime

import "time"

var processStart = time.Now()

func thread() time.Duration { return time.Since(processStart) }
