package redistest

import (
	"testing"

	"github.com/sluice-sched/sluice/internal/testdep"
)

// StartDurable starts redis-server with the append-only file on and
// fsynced before each write is answered (appendonly yes, appendfsync
// always): a write a client saw acknowledged survives a kill -9 (Stop),
// and Restart, on the same directory, loads it back.
func StartDurable(t testing.TB) *Server {
	t.Helper()
	testdep.Binary(t, "apt-get install -y redis-server", "redis-server")
	s := &Server{t: t, port: freePort(t), dir: t.TempDir(),
		extra: []string{"--appendonly", "yes", "--appendfsync", "always"}}
	s.start()
	t.Cleanup(s.Stop)
	return s
}
