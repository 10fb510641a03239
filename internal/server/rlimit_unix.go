//go:build unix

package server

import "syscall"

// defaultMaxConnections sizes each listener's connection limit from the
// process's file-descriptor limit (which Go raises to the hard limit at
// start): half of what is left after a reserve for files, Redis and etcd,
// so that the two listeners together cannot exhaust it (accept would fail
// with EMFILE); at the limit connLimiter makes room from idle connections.
func defaultMaxConnections() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return fallbackMaxConnections
	}
	return connectionsFor(rl.Cur)
}
