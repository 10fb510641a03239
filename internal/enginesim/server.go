package enginesim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sluice-sched/sluice/topology"
)

// Limits of the HTTP side.
const (
	// MaxBody bounds a request body.
	MaxBody = 4 << 20
	// streamInterval is the least time between two chunks of one stream
	// while it decodes: a fast decode sends several tokens a chunk rather
	// than a chunk every few microseconds.
	streamInterval = 5 * time.Millisecond
	// prefixCacheBlocks is how many prompt blocks an engine's prefix
	// cache remembers (4 Mi tokens).
	prefixCacheBlocks = 1 << 18
	readHeaderTimeout = 10 * time.Second
)

// Simulator serves the planned engines, each on its own listener.
type Simulator struct {
	engines []*liveEngine
	servers []*http.Server
	cluster topology.Cluster
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// Start listens on every engine's address and serves until Close. cluster
// is the topology the engines were planned from (Topology writes their
// addresses into it); seed seeds the answers.
func Start(engines []EngineConfig, cluster topology.Cluster, seed uint64, log *slog.Logger) (*Simulator, error) {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Simulator{cluster: cluster.Clone(), cancel: cancel}
	var lns []net.Listener
	for _, ec := range engines {
		eng, err := NewEngine(ec.Spec)
		if err != nil {
			cancel()
			closeAll(lns)
			return nil, fmt.Errorf("domain %s engine %d: %w", ec.Domain, ec.Index, err)
		}
		ln, err := net.Listen("tcp", ec.Listen)
		if err != nil {
			cancel()
			closeAll(lns)
			return nil, fmt.Errorf("domain %s engine %d: %w", ec.Domain, ec.Index, err)
		}
		lns = append(lns, ln)
		l := newLiveEngine(ec, eng, seed, ln.Addr().String())
		s.engines = append(s.engines, l)
	}
	for i, l := range s.engines {
		srv := &http.Server{Handler: l.handler(), ReadHeaderTimeout: readHeaderTimeout,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		s.servers = append(s.servers, srv)
		s.wg.Add(2)
		go func() {
			defer s.wg.Done()
			l.pump(ctx)
		}()
		go func() {
			defer s.wg.Done()
			if err := srv.Serve(lns[i]); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("engine-sim: serve", "domain", l.cfg.Domain, "engine", l.cfg.Index, "err", err)
			}
		}()
	}
	return s, nil
}

func closeAll(lns []net.Listener) {
	for _, ln := range lns {
		_ = ln.Close()
	}
}

// Close stops every engine: open requests end with their connections.
func (s *Simulator) Close() {
	for _, srv := range s.servers {
		_ = srv.Close()
	}
	s.cancel()
	s.wg.Wait()
}

// Endpoint is one served engine, as a topology names it.
type Endpoint struct {
	Domain  string
	Index   int
	Address string // host:port, a host a client can dial
	Models  []string
}

// MetricsURL is the engine's Prometheus endpoint.
func (e Endpoint) MetricsURL() string { return "http://" + e.Address + "/metrics" }

// Endpoints lists the engines served, in plan order.
func (s *Simulator) Endpoints() []Endpoint {
	out := make([]Endpoint, len(s.engines))
	for i, l := range s.engines {
		out[i] = Endpoint{Domain: l.cfg.Domain, Index: l.cfg.Index, Address: l.addr, Models: l.cfg.Models}
	}
	return out
}

// Topology returns the cluster with each domain's engines the simulated
// ones: kind vllm, their address, their metrics URL and the models they
// serve, so that sluiced pointed at it reads and routes to them.
func (s *Simulator) Topology() topology.Cluster {
	c := s.cluster.Clone()
	byDomain := map[string][]topology.Engine{}
	for _, e := range s.Endpoints() {
		byDomain[e.Domain] = append(byDomain[e.Domain], topology.Engine{
			Metrics: e.MetricsURL(), Kind: "vllm", Address: e.Address, Models: e.Models,
		})
	}
	for i := range c.Domains {
		c.Domains[i].Engines = byDomain[c.Domains[i].ID]
	}
	return c
}

// liveEngine is an Engine in wall-clock time, behind one HTTP listener.
type liveEngine struct {
	cfg   EngineConfig
	seed  uint64
	addr  string
	start time.Time // the engine's time 0
	kick  chan struct{}

	mu struct {
		sync.Mutex
		eng *Engine
		// changed is closed, and replaced, at each change of the engine:
		// every waiting handler looks again.
		changed                              chan struct{}
		cache                                *prefixCache
		seq                                  uint64
		promptTotal, generatedTotal, success int64
	}
}

func newLiveEngine(ec EngineConfig, eng *Engine, seed uint64, bound string) *liveEngine {
	l := &liveEngine{cfg: ec, seed: seed, addr: dialable(bound), start: time.Now(), kick: make(chan struct{}, 1)}
	l.mu.eng = eng
	l.mu.changed = make(chan struct{})
	l.mu.cache = newPrefixCache(prefixCacheBlocks)
	return l
}

// dialable is a bound address with an unspecified host (0.0.0.0, ::)
// replaced by loopback, so that the topology names a host to dial.
func dialable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}

// nowLocked is the engine's time now; under the lock, so that the
// engine's times never go back.
func (l *liveEngine) nowLocked() int64 { return time.Since(l.start).Nanoseconds() }

// advanceLocked runs the engine's events up to now and wakes the handlers
// when any happened.
func (l *liveEngine) advanceLocked() int64 {
	now := l.nowLocked()
	if l.mu.eng.Advance(now) {
		l.changedLocked()
	}
	return now
}

func (l *liveEngine) changedLocked() {
	close(l.mu.changed)
	l.mu.changed = make(chan struct{})
}

// wake makes the pump look at the engine again.
func (l *liveEngine) wake() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// pump runs the engine's events at their times, so that requests move
// through prefill and decode whether or not anyone is looking.
func (l *liveEngine) pump(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		l.mu.Lock()
		now := l.advanceLocked()
		next := l.mu.eng.Next()
		l.mu.Unlock()
		var fire <-chan time.Time
		if next >= 0 {
			timer.Reset(time.Duration(next - now))
			fire = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-l.kick:
		case <-fire:
		}
	}
}

// requestID is a deterministic id: the seed, the engine and its count of
// requests.
func (l *liveEngine) requestID(seq uint64) string {
	h := fnv.New64a()
	var b [8]byte
	for _, v := range []uint64{l.seed, uint64(l.cfg.Index), seq} {
		binary.LittleEndian.PutUint64(b[:], v)
		_, _ = h.Write(b[:])
	}
	_, _ = h.Write([]byte(l.cfg.Domain))
	return fmt.Sprintf("%016x", h.Sum64())
}
