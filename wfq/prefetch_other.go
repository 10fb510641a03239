//go:build !amd64 && !arm64

package wfq

// prefetch is a hint with no instruction here: it does nothing.
func prefetch(addr uintptr) {}

// prefetchLines is prefetch for n lines: it does nothing.
func prefetchLines(addr uintptr, n int) {}
