// Package etcdtest runs a real etcd server in-process for tests, started
// by internal/etcdembed (go.etcd.io/etcd/server/v3/embed): a temporary data
// directory, free loopback ports and a silent logger. The control plane's
// tests (and any other package's) use it instead of a fake, so that leases,
// watches, compaction and outages behave as they do in production.
package etcdtest

import (
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/sluice-sched/sluice/internal/etcdembed"
)

// startTimeout bounds how long a start waits for the server to be ready; it
// is generous because the machine running the tests may be busy.
const startTimeout = 60 * time.Second

// Server is an etcd server running in-process. Stop and Restart simulate an
// outage: the data directory and the ports are kept, so clients reconnect to
// the same endpoint and find the same data.
type Server struct {
	t         testing.TB
	dir       string
	clientURL url.URL
	peerURL   url.URL
	mu        sync.Mutex
	etcd      *embed.Etcd // nil while stopped
}

// Start starts an etcd server and stops it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, dir: t.TempDir()}
	s.clientURL = url.URL{Scheme: "http", Host: freeAddr(t)}
	s.peerURL = url.URL{Scheme: "http", Host: freeAddr(t)}
	if err := s.start(); err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// freeAddr returns a loopback address whose port was free a moment ago: the
// kernel picks it for a listener that is closed at once.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("etcdtest: pick a free port: %v", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatalf("etcdtest: pick a free port: %v", err)
	}
	return addr
}

func (s *Server) start() error {
	e, err := etcdembed.Start(etcdembed.Options{Name: "etcdtest", Dir: s.dir, Listen: s.clientURL, Peer: s.peerURL, Ready: startTimeout})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.etcd = e
	s.mu.Unlock()
	return nil
}

// Endpoint returns the client URL, e.g. "http://127.0.0.1:41234".
func (s *Server) Endpoint() string { return s.clientURL.String() }

// Client returns a client of the server, closed when the test ends.
func (s *Server) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{s.Endpoint()},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop stops the server, keeping its data. It is safe to call twice.
func (s *Server) Stop() {
	s.mu.Lock()
	e := s.etcd
	s.etcd = nil
	s.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart starts a stopped server again on the same ports and data. The
// ports were released by Stop; if another process took one meanwhile the
// start fails, and it is retried a few times for ports still in TIME_WAIT.
func (s *Server) Restart() {
	s.t.Helper()
	var err error
	for range 50 {
		if err = s.start(); err == nil {
			return
		}
		<-time.After(100 * time.Millisecond)
	}
	s.t.Fatalf("etcdtest: restart: %v", err)
}
