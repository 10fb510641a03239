package wfq

import (
	"syscall"
	"time"
	"unsafe"
)

// threadTime returns the CPU time the calling thread has used. On a shared
// machine it leaves out the time other processes held the CPU, which the
// wall clock counts; the caller must hold its OS thread (LockOSThread).
func threadTime() time.Duration {
	const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID
	var ts syscall.Timespec
	_, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0)
	if errno != 0 {
		panic(errno)
	}
	return time.Duration(ts.Nano())
}
