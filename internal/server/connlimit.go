package server

import (
	"context"
	"crypto/tls"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluice-sched/sluice/internal/clock"
)

// Connection admission on each listener. Defaults and why:
const (
	// defaultEvictIdle: a connection that has ended no call or request for
	// this long (since it was accepted, for one that has ended none), with
	// none in progress, gives its place to a new one when the listener (or
	// its peer's share) is full. A router under load ends a call every few
	// milliseconds; one that waits longer between calls loses its
	// connection only while the listener is full, and redials.
	defaultEvictIdle = time.Second
	// perPeerShare, minPerPeer: by default one peer address may hold a
	// quarter of a listener, so that one host (or one NAT) cannot take it
	// all, and at least 8 (or the whole of a smaller listener): a router
	// needs a few connections, a browser six.
	perPeerShare = 4
	minPerPeer   = 8
	// evictSample bounds the connections looked at to choose one to evict:
	// all of them up to this many, else this many at random, the least
	// recently active evictable one among them (as Redis's approximated
	// LRU does), so that a full listener of a million costs an accept no
	// more than one of a hundred.
	evictSample = 64
	// warnEvery bounds the log lines that say a listener is full.
	warnEvery = 10 * time.Second
)

// The gRPC transport's limits: a client has grpcHandshakeTimeout to finish
// the TLS handshake and send the HTTP/2 preface (grpc-go's default is
// 120 s); a connection with no RPC for grpcMaxIdle is closed with a GOAWAY
// (a router redials on its next call); one silent for grpcPingAfter is
// pinged and closed when the ack does not come within grpcPingTimeout (a
// client that sent the preface and nothing since); clients may ping every
// grpcMinClientPing, with or without calls in flight (grpc-go clients
// cannot ping more often), and one that pings more often is sent away.
const (
	grpcHandshakeTimeout = 5 * time.Second
	grpcMaxIdle          = 5 * time.Minute
	grpcPingAfter        = 30 * time.Second
	grpcPingTimeout      = 10 * time.Second
	grpcMinClientPing    = 10 * time.Second
)

// connLimiter is a listener that bounds its open connections, in all and
// per peer address, and keeps room for new clients: when a bound is
// reached, the new connection takes the place of the least recently active
// idle one (no call or request in progress, and none ended for EvictIdle),
// and it is refused (closed at once) only when every connection is busy. A
// listener that blocks its Accept instead, as netutil.LimitListener does,
// lets idle connections lock every new client out: they are established
// before any credential is checked, and a client that sent only the
// HTTP/2 preface is established as far as the transport knows.
//
// Activity is the calls and requests the servers report, in progress and
// ended: the gRPC interceptors, from the moment a call passes
// authentication until its handler returns (a call waiting in the fair
// queue sends nothing, yet must not lose its answer), and the HTTP
// server's ConnState, from a request's complete headers until its answer
// (an event stream sends nothing either). Bytes alone are not activity: a
// client that sends a WINDOW_UPDATE, a PING or one byte of its preface or
// headers now and then makes no progress, and must not hold its place.
type connLimiter struct {
	net.Listener
	name      string // "grpc" or "http", for the log and the metrics
	limit     int
	perPeer   int
	evictIdle time.Duration
	clock     clock.Clock
	epoch     time.Time // activity is stored as nanoseconds since epoch
	log       *slog.Logger

	// byAddr finds a call's connection for the interceptors: its key is
	// the connection's RemoteAddr, the very value grpc-go puts in the
	// call's peer.Addr, so that the lookup hashes a pointer.
	byAddr sync.Map // net.Addr → *trackedConn

	mu struct {
		sync.Mutex
		all      connSet
		peers    map[netip.Addr]*connSet
		lastWarn time.Time
	}
	// Counts since start, by the bound that was reached.
	evictedFull, evictedPeer, refusedFull, refusedPeer atomic.Uint64
}

// connLimits configure a connLimiter.
type connLimits struct {
	Limit     int           // open connections at most; at least 1
	PerPeer   int           // from one peer address at most; 0: Limit/perPeerShare, at least minPerPeer
	EvictIdle time.Duration // 0: defaultEvictIdle
	Clock     clock.Clock   // nil: the real clock
}

// newConnLimiter returns a limiter named name; it serves once its Listener
// is set.
func newConnLimiter(name string, lim connLimits, log *slog.Logger) *connLimiter {
	l := &connLimiter{name: name, limit: max(lim.Limit, 1), perPeer: lim.PerPeer, evictIdle: lim.EvictIdle, clock: lim.Clock, log: log}
	if l.perPeer <= 0 {
		l.perPeer = max(l.limit/perPeerShare, minPerPeer)
	}
	l.perPeer = min(l.perPeer, l.limit)
	if l.evictIdle <= 0 {
		l.evictIdle = defaultEvictIdle
	}
	if l.clock == nil {
		l.clock = clock.Real{}
	}
	l.epoch = l.clock.Now()
	l.mu.peers = make(map[netip.Addr]*connSet)
	return l
}

// registerConnMetrics exports the limiters' counts.
func registerConnMetrics(reg prometheus.Registerer, ls ...*connLimiter) {
	for _, l := range ls {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_connections_open", Help: "Open connections of the listener.",
			ConstLabels: prometheus.Labels{"listener": l.name},
		}, func() float64 { return float64(l.Open()) }))
		const (
			evicted = "Idle connections closed to make room for a new one, by the bound reached (listener or peer)."
			refused = "New connections closed at once: the bound was reached and every connection under it was busy."
		)
		for _, c := range []struct {
			name, help, bound string
			n                 *atomic.Uint64
		}{
			{"sluice_connections_evicted_total", evicted, "listener", &l.evictedFull},
			{"sluice_connections_evicted_total", evicted, "peer", &l.evictedPeer},
			{"sluice_connections_refused_total", refused, "listener", &l.refusedFull},
			{"sluice_connections_refused_total", refused, "peer", &l.refusedPeer},
		} {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: c.name, Help: c.help, ConstLabels: prometheus.Labels{"listener": l.name, "bound": c.bound},
			}, func() float64 { return float64(c.n.Load()) }))
		}
	}
}

// trackedConn is an accepted connection as the limiter sees it.
type trackedConn struct {
	net.Conn
	l    *connLimiter
	addr net.Addr   // RemoteAddr, byAddr's key; nil unless TCP
	peer netip.Addr // the peer: its IPv4 address, or its IPv6 /64 (peerOf)
	// last is when it was accepted or last ended a call, in nanoseconds
	// since l.epoch; state counts its calls in progress and ended, and
	// marks it evicted (connState).
	last  atomic.Int64
	state atomic.Uint64
	// Under l.mu: its positions in the limiter's sets, -1 once removed.
	iAll, iPeer int
}

// connSet is a set of connections with O(1) add and remove; each conn
// knows its index (iAll or iPeer, chosen by peer).
type connSet struct {
	conns []*trackedConn
	peer  bool
}

func (s *connSet) index(c *trackedConn) *int {
	if s.peer {
		return &c.iPeer
	}
	return &c.iAll
}

func (s *connSet) add(c *trackedConn) {
	*s.index(c) = len(s.conns)
	s.conns = append(s.conns, c)
}

func (s *connSet) remove(c *trackedConn) {
	i := *s.index(c)
	last := s.conns[len(s.conns)-1]
	s.conns[i] = last
	*s.index(last) = i
	s.conns[len(s.conns)-1] = nil
	s.conns = s.conns[:len(s.conns)-1]
	*s.index(c) = -1
}

// now is the limiter's time in nanoseconds since its epoch.
func (l *connLimiter) now() int64 { return int64(l.clock.Since(l.epoch)) }

// Accept returns the next connection the bounds admit; it never waits for
// room.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if tc := l.admit(c); tc != nil {
			return tc, nil
		}
	}
}

// peerOf is the peer a per-peer bound counts an address under: an IPv4
// address as it is (unmapped from IPv6), an IPv6 one by its /64, the
// smallest prefix a site is given, so that one host cannot pass as
// 2^64 peers.
func peerOf(a netip.Addr) netip.Addr {
	if a = a.Unmap(); a.Is4() {
		return a
	}
	p, err := a.Prefix(64)
	if err != nil {
		return a
	}
	return p.Addr()
}

// admit tracks c, first evicting what the bounds require; it closes c and
// returns nil when nothing can be evicted.
func (l *connLimiter) admit(c net.Conn) *trackedConn {
	tc := &trackedConn{Conn: c, l: l, iAll: -1, iPeer: -1}
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		tc.addr = a
		tc.peer = peerOf(a.AddrPort().Addr())
	}
	now := l.now()
	tc.last.Store(now)
	var victim *trackedConn
	refused := false
	l.mu.Lock()
	// A peer at its share gives up one of its own, which makes room in the
	// listener too; otherwise a full listener gives up its least recently
	// active.
	if ps := l.mu.peers[tc.peer]; ps != nil && len(ps.conns) >= l.perPeer {
		if victim = l.victimLocked(ps, now); victim != nil {
			l.evictedPeer.Add(1)
		} else {
			refused = true
			l.refusedPeer.Add(1)
		}
	} else if len(l.mu.all.conns) >= l.limit {
		if victim = l.victimLocked(&l.mu.all, now); victim != nil {
			l.evictedFull.Add(1)
		} else {
			refused = true
			l.refusedFull.Add(1)
		}
	}
	if victim != nil {
		l.removeLocked(victim)
	}
	if !refused {
		ps := l.mu.peers[tc.peer]
		if ps == nil {
			ps = &connSet{peer: true}
			l.mu.peers[tc.peer] = ps
		}
		ps.add(tc)
		l.mu.all.add(tc)
		if tc.addr != nil {
			l.byAddr.Store(tc.addr, tc)
		}
	}
	warn := (refused || victim != nil) && l.clock.Since(l.mu.lastWarn) >= warnEvery
	if warn {
		l.mu.lastWarn = l.clock.Now()
	}
	open := len(l.mu.all.conns)
	l.mu.Unlock()
	if victim != nil {
		_ = victim.Conn.Close()
	}
	if warn {
		l.log.Warn("connection bound reached: connections idle for a while are closed to make room, and new ones refused while every connection is busy",
			"listener", l.name, "open", open, "limit", l.limit, "per_peer", l.perPeer, "peer", tc.peer.String(),
			"evicted", l.evictedFull.Load()+l.evictedPeer.Load(), "refused", l.refusedFull.Load()+l.refusedPeer.Load())
	}
	if refused {
		_ = c.Close()
		return nil
	}
	return tc
}

// victimLocked chooses the connection of s to evict and claims it (no
// call begins on it after): the least recently active of those idle for
// evictIdle with no call in progress, among all of s or a sample of it;
// nil when none is. A call that begins or ends between the choice and the
// claim keeps its connection: the claim fails and the choice is made
// again, evictClaimTries times at most.
func (l *connLimiter) victimLocked(s *connSet, now int64) *trackedConn {
	for range evictClaimTries {
		c, seen := l.leastRecentLocked(s, now)
		if c == nil {
			return nil
		}
		if c.claim(seen) {
			return c
		}
	}
	return nil
}

// evictClaimTries bounds the choices an admission makes when calls keep
// beginning on the connections it chooses: past it the new connection is
// refused, as when every connection is busy.
const evictClaimTries = 4

// leastRecentLocked returns the least recently active connection of s (or
// of a sample of it) idle for evictIdle with no call in progress, and the
// state it was seen idle in; nil when none is.
func (l *connLimiter) leastRecentLocked(s *connSet, now int64) (*trackedConn, uint64) {
	var best *trackedConn
	var bestLast int64
	var bestState uint64
	consider := func(c *trackedConn) {
		st := c.state.Load()
		if st&(connCalls|connEvicted) != 0 {
			return
		}
		// Read after the state: an end stores last before it counts, so a
		// state with the call ended comes with its time.
		if last := c.last.Load(); now-last >= int64(l.evictIdle) && (best == nil || last < bestLast) {
			best, bestLast, bestState = c, last, st
		}
	}
	if n := len(s.conns); n <= evictSample {
		for _, c := range s.conns {
			consider(c)
		}
	} else {
		for range evictSample {
			consider(s.conns[rand.IntN(n)])
		}
	}
	return best, bestState
}

// removeLocked forgets c; a second call does nothing.
func (l *connLimiter) removeLocked(c *trackedConn) {
	if c.iAll < 0 {
		return
	}
	l.mu.all.remove(c)
	ps := l.mu.peers[c.peer]
	ps.remove(c)
	if len(ps.conns) == 0 {
		delete(l.mu.peers, c.peer)
	}
	if c.addr != nil {
		l.byAddr.CompareAndDelete(c.addr, c)
	}
}

// Open returns the connections the limiter holds.
func (l *connLimiter) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.mu.all.conns)
}

// activityGrain is the precision of a connection's last activity: within
// it the time is not stored again, so that calls in flight on one
// connection from many CPUs mostly read its cache line rather than write it.
const activityGrain = int64(time.Millisecond)

// touch records activity now.
func (c *trackedConn) touch() {
	if now := c.l.now(); now-c.last.Load() >= activityGrain {
		c.last.Store(now)
	}
}

// Close closes the connection and frees its place.
func (c *trackedConn) Close() error {
	c.l.mu.Lock()
	c.l.removeLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// A connection's state word: its calls in progress in the low 31 bits,
// the evicted mark above them, and its ended calls (a count that wraps) in
// the high 32 bits. An evictor claims a connection by setting the mark on
// the very word it saw idle, so that the claim fails if any call began or
// ended since; a call that begins after the claim sees the mark.
const (
	connCalls   = 1<<31 - 1
	connEvicted = 1 << 31
	connEnded   = 1 << 32
)

// begin records a call in progress; false when the connection is evicted
// (it is closing, and the call must not run: its answer would be lost).
// Each begin that returns true is followed by one end.
func (c *trackedConn) begin() bool { return c.state.Add(1)&connEvicted == 0 }

// end records a call's end: the connection's latest activity.
func (c *trackedConn) end() {
	c.touch() // first: an evictor that sees it idle sees it recent
	c.state.Add(connEnded - 1)
}

// claim marks the connection evicted if its state is still seen, the
// state it was chosen in: no call began or ended since.
func (c *trackedConn) claim(seen uint64) bool {
	return c.state.CompareAndSwap(seen, seen|connEvicted)
}

// calls returns the calls in progress.
func (c *trackedConn) calls() int { return int(c.state.Load() & connCalls) }

// errEvicted answers a call that begins on a connection closing to make
// room for a new one.
var errEvicted = status.Error(codes.Unavailable, "the connection is closing to make room for a new one: retry on a new connection")

// connOf returns the tracked connection an RPC came in on, or nil.
func (l *connLimiter) connOf(ctx context.Context) *trackedConn {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return nil
	}
	if v, ok := l.byAddr.Load(p.Addr); ok {
		return v.(*trackedConn)
	}
	return nil
}

// UnaryServerInterceptor marks the call's connection busy while it runs;
// it goes after authentication, so that only a call allowed to run holds
// its connection.
func (l *connLimiter) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if c := l.connOf(ctx); c != nil {
			if !c.begin() {
				return nil, errEvicted
			}
			defer c.end()
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor marks the stream's connection busy while it
// runs, after authentication as UnaryServerInterceptor does.
func (l *connLimiter) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if c := l.connOf(ss.Context()); c != nil {
			if !c.begin() {
				return errEvicted
			}
			defer c.end()
		}
		return handler(srv, ss)
	}
}

// ConnState is the HTTP server's hook: a connection serving a request is
// busy, one between requests idle. The server reports a connection active
// once a request's headers are complete (HTTP/1) or a stream is open
// (HTTP/2): a client trickling its headers is idle. Its calls for one
// connection come one at a time.
func (l *connLimiter) ConnState(nc net.Conn, st http.ConnState) {
	if t, ok := nc.(*tls.Conn); ok {
		nc = t.NetConn()
	}
	c, ok := nc.(*trackedConn)
	if !ok {
		return
	}
	switch st {
	case http.StateActive:
		if c.calls() == 0 {
			_ = c.begin() // false: evicted, and closing under the request
		}
	case http.StateIdle, http.StateHijacked, http.StateClosed:
		if st := c.state.Load(); st&connCalls > 0 && st&connEvicted == 0 {
			c.end()
		}
	}
}
