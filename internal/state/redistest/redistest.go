// Package redistest starts a real redis-server on a free loopback port for
// tests, and stops it when the test ends. Without redis-server on PATH the
// test is skipped, except under CI (CI=true), where it fails: CI installs
// redis-server, so nothing is skipped there.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-sched/sluice/internal/testdep"
)

// quiet drops go-redis's own log lines (a test that kills its server
// expects the dial failures they report).
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quiet{}) }

// Server is a running redis-server.
type Server struct {
	t       testing.TB
	port    int
	dir     string
	cmd     *exec.Cmd
	cluster bool
	extra   []string // more redis-server arguments (a sharded cluster node's)
}

// Start starts redis-server (no persistence) and registers its stop.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, false)
}

// StartCluster starts a one-node Redis Cluster (cluster mode on, every
// slot assigned to the node): a script call whose keys span two slots
// fails there with CROSSSLOT, as on a real cluster.
func StartCluster(t testing.TB) *Server {
	t.Helper()
	s := start(t, true)
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	ctx := context.Background()
	if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatalf("cluster addslotsrange: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := c.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not ok within 10s: %q %v", info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func start(t testing.TB, cluster bool) *Server {
	t.Helper()
	testdep.Binary(t, "apt-get install -y redis-server", "redis-server")
	s := &Server{t: t, port: freePort(t), dir: t.TempDir(), cluster: cluster}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (s *Server) start() {
	s.t.Helper()
	args := []string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--protected-mode", "no"}
	if s.cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", s.dir+"/nodes.conf")
	}
	args = append(args, s.extra...)
	s.cmd = exec.Command("redis-server", args...)
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		s.t.Fatalf("redis-server: %v", err)
	}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("redis-server: start: %v", err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		signalled := false
		for sc.Scan() {
			if !signalled && strings.Contains(sc.Text(), "Ready to accept connections") {
				close(ready)
				signalled = true
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		s.t.Fatalf("redis-server on port %d did not become ready in 10s", s.port)
	}
}

// Addr returns host:port.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// URL returns the redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Client returns a new client with millisecond timeouts, closed at the end
// of the test.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr:         s.Addr(),
		DialTimeout:  200 * time.Millisecond,
		ReadTimeout:  200 * time.Millisecond,
		WriteTimeout: 200 * time.Millisecond,
		MaxRetries:   -1, // the caller's breaker decides about retries
	})
	s.t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		s.t.Fatalf("redis ping: %v", err)
	}
	return c
}

// Stop kills the server (as a crash would) and waits for it to exit.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart starts the server again on the same port, with no data: what a
// crashed Redis without persistence comes back as.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}
