package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/grpctest"
	"github.com/sluice-sched/sluice/internal/testdep"
	"github.com/sluice-sched/sluice/internal/testwait"
)

// limiterFixture is a connLimiter over a loopback listener on a manual
// clock, served as a server would: each accepted connection is read until
// it ends, then closed.
type limiterFixture struct {
	t        *testing.T
	l        *connLimiter
	clk      *clock.Manual
	accepted chan *trackedConn
}

func newLimiterFixture(t *testing.T, lim connLimits) *limiterFixture {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &limiterFixture{t: t, clk: clock.NewManual(time.Unix(1e9, 0)), accepted: make(chan *trackedConn, 64)}
	lim.Clock = f.clk
	f.l = newConnLimiter("test", lim, slog.New(slog.DiscardHandler))
	f.l.Listener = lis
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := f.l.Accept()
			if err != nil {
				return
			}
			tc := c.(*trackedConn)
			f.accepted <- tc
			go func() { _, _ = io.Copy(io.Discard, tc); tc.Close() }()
		}
	}()
	t.Cleanup(func() { f.l.Close(); <-done })
	return f
}

// dial connects from the loopback address from (Linux routes all of
// 127.0.0.0/8) and returns the client's end and, when the limiter admitted
// it, the server's; nil when it was refused (closed at once).
func (f *limiterFixture) dial(from string) (net.Conn, *trackedConn) {
	f.t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", f.l.Addr().String())
	if err != nil {
		testdep.Missing(f.t, "dial from %s: %v (this test needs 127.0.0.0/8 routed to loopback, as Linux does)", from, err)
	}
	f.t.Cleanup(func() { c.Close() })
	// The server never writes: a read returns only when it closes c.
	closed := make(chan struct{})
	go func() { _, _ = c.Read(make([]byte, 1)); close(closed) }()
	select {
	case tc := <-f.accepted:
		_ = c.SetReadDeadline(time.Unix(1, 0)) // end the read
		<-closed
		_ = c.SetReadDeadline(time.Time{})
		return c, tc
	case <-closed:
		return c, nil
	case <-time.After(5 * time.Second):
		f.t.Fatalf("a connection from %s neither admitted nor refused within 5 s", from)
		return nil, nil
	}
}

// evicted reports whether the server closed c within 5 s.
func (f *limiterFixture) evicted(c net.Conn) bool {
	f.t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return !errors.Is(err, os.ErrDeadlineExceeded)
}

// waitOpen waits until the limiter holds n connections.
func (f *limiterFixture) waitOpen(n int) {
	f.t.Helper()
	testwait.Until(f.t, 5*time.Second, fmt.Sprintf("%d connections open", n), func() bool { return f.l.Open() == n })
}

// At the listener's bound a new connection takes the place of the least
// recently active idle one; one with a call in progress, or one that ended
// a call within EvictIdle, is never evicted, and bytes alone are not
// activity; when none may go the new one is refused, at once rather than
// left waiting for room.
func TestConnLimiterEvictsTheLeastRecentlyActive(t *testing.T) {
	f := newLimiterFixture(t, connLimits{Limit: 3, PerPeer: 3, EvictIdle: time.Second})
	a, ta := f.dial("127.0.0.2")
	f.clk.Advance(100 * time.Millisecond)
	b, tb := f.dial("127.0.0.3")
	f.clk.Advance(100 * time.Millisecond)
	c, tc := f.dial("127.0.0.4")
	if ta == nil || tb == nil || tc == nil || f.l.Open() != 3 {
		t.Fatalf("under the bound: admitted %v %v %v, open %d", ta != nil, tb != nil, tc != nil, f.l.Open())
	}
	// Nobody idle for a second yet: refused, and nobody evicted.
	if _, td := f.dial("127.0.0.5"); td != nil {
		t.Fatal("a fourth connection was admitted while every one was recent")
	}
	if f.l.refusedFull.Load() != 1 || f.l.Open() != 3 {
		t.Fatalf("refused %d, open %d", f.l.refusedFull.Load(), f.l.Open())
	}
	// a is the oldest, but busy (a call waiting in the queue sends
	// nothing); b ended a call later than c was accepted, while c only
	// sent bytes: c goes.
	f.clk.Advance(2 * time.Second)
	ta.begin()
	tb.begin()
	tb.end()
	f.clk.Advance(100 * time.Millisecond)
	if _, err := c.Write([]byte("PRI * HTTP/2.0")); err != nil {
		t.Fatal(err)
	}
	f.clk.Advance(2 * time.Second)
	d, td := f.dial("127.0.0.5")
	if td == nil || !f.evicted(c) {
		t.Fatal("the least recently active idle connection was not evicted for the new one")
	}
	if f.l.evictedFull.Load() != 1 || f.l.Open() != 3 {
		t.Fatalf("evicted %d, open %d", f.l.evictedFull.Load(), f.l.Open())
	}
	// a's call ends: it is active then, so b (read 2 s ago) goes next.
	ta.end()
	e, te := f.dial("127.0.0.6")
	if te == nil || !f.evicted(b) {
		t.Fatal("b was not evicted after a's call ended")
	}
	// Connections closed by their clients free their places.
	for _, x := range []net.Conn{a, d, e} {
		x.Close()
	}
	f.waitOpen(0)
	if n := func() int { f.l.mu.Lock(); defer f.l.mu.Unlock(); return len(f.l.mu.peers) }(); n != 0 {
		t.Errorf("%d peers left after every connection closed", n)
	}
}

// A peer at its share gives up its own least recently active idle
// connection, never another peer's, and is refused when all of its own are
// busy; other peers still connect.
func TestConnLimiterPerPeerShare(t *testing.T) {
	f := newLimiterFixture(t, connLimits{Limit: 10, PerPeer: 2, EvictIdle: time.Second})
	_, tother := f.dial("127.0.0.9")
	p1, tp1 := f.dial("127.0.0.2")
	f.clk.Advance(10 * time.Millisecond)
	_, tp2 := f.dial("127.0.0.2")
	if tother == nil || tp1 == nil || tp2 == nil {
		t.Fatal("under the bounds, a connection was refused")
	}
	tp1.begin()
	tp2.begin()
	f.clk.Advance(5 * time.Second)
	if _, tx := f.dial("127.0.0.2"); tx != nil {
		t.Fatal("a third connection from a peer whose two are busy was admitted")
	}
	if f.l.refusedPeer.Load() != 1 {
		t.Errorf("refused for the peer's share: %d", f.l.refusedPeer.Load())
	}
	tp1.end()
	f.clk.Advance(5 * time.Second)
	if _, tx := f.dial("127.0.0.2"); tx == nil || !f.evicted(p1) {
		t.Fatal("the peer's idle connection did not make room for its new one")
	}
	if f.l.evictedPeer.Load() != 1 || f.l.evictedFull.Load() != 0 {
		t.Errorf("evicted for the peer %d, for the listener %d", f.l.evictedPeer.Load(), f.l.evictedFull.Load())
	}
	// The other peer's connection, idle longest of all, stayed.
	f.l.mu.Lock()
	stayed := tother.iAll >= 0
	f.l.mu.Unlock()
	if !stayed || f.l.Open() != 3 {
		t.Fatalf("another peer's connection evicted (%v) or the count wrong: open %d", !stayed, f.l.Open())
	}
	if _, ty := f.dial("127.0.0.3"); ty == nil {
		t.Fatal("another peer was refused")
	}
}

// The HTTP server's ConnState marks a connection serving a request busy,
// over TLS too (the state names the *tls.Conn).
func TestConnLimiterHTTPConnState(t *testing.T) {
	f := newLimiterFixture(t, connLimits{Limit: 2, EvictIdle: time.Second})
	_, tc := f.dial("127.0.0.2")
	f.l.ConnState(tc, http.StateNew)
	if tc.calls() != 0 {
		t.Fatal("a new connection is busy")
	}
	f.l.ConnState(tc, http.StateActive)
	f.l.ConnState(tc, http.StateActive) // HTTP/2 may report it again
	if tc.calls() != 1 {
		t.Fatalf("active: busy %d", tc.calls())
	}
	f.clk.Advance(time.Minute)
	f.l.ConnState(tc, http.StateIdle)
	if tc.calls() != 0 || tc.last.Load() != f.l.now() {
		t.Fatalf("idle: busy %d, last %d, now %d", tc.calls(), tc.last.Load(), f.l.now())
	}
	f.l.ConnState(tc, http.StateClosed)
	if tc.calls() != 0 {
		t.Fatal("closed: busy")
	}
	over := tls.Server(tc, &tls.Config{})
	f.l.ConnState(over, http.StateActive)
	if tc.calls() != 1 {
		t.Fatal("a TLS connection serving a request is not busy")
	}
	f.l.ConnState(over, http.StateIdle)
	if tc.calls() != 0 {
		t.Fatal("a TLS connection between requests is busy")
	}
}

// holdIdle opens n connections to addr from the loopback address from and
// leaves them idle: raw (nothing sent) or, with hello, after sending it.
func holdIdle(t *testing.T, addr, from string, n int, hello string) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			testdep.Missing(t, "dial from %s: %v (this test needs 127.0.0.0/8 routed to loopback, as Linux does)", from, err)
		}
		t.Cleanup(func() { c.Close() })
		if hello != "" {
			if _, err := c.Write([]byte(hello)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// dialerFrom dials from the loopback address from.
func dialerFrom(from string) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
}

// peerConns counts the connections l holds from the address from.
func peerConns(l *connLimiter, from string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ps := l.mu.peers[netip.MustParseAddr(from)]; ps != nil {
		return len(ps.conns)
	}
	return 0
}

// The HTTP/2 client preface and an empty SETTINGS frame: all a client
// sends to be established as far as grpc-go's transport knows.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + "\x00\x00\x00\x04\x00\x00\x00\x00\x00"

// Idle connections at and beyond the gRPC listener's bound, raw and
// preface-only, from several hosts, do not lock new clients out: each new
// client's health Check succeeds within 1 s, taking the place of an idle
// connection; a host at its share makes room from its own.
func TestIdleConnectionsDoNotLockGRPCClientsOut(t *testing.T) {
	const limit = 33                   // a quarter, 8, per peer
	clk := clock.NewManual(time.Now()) // the limiter's: idleness moves with it alone
	srv, _, _, _ := start(t, Options{Clock: clk, Security: SecurityOptions{MaxConnections: limit}})
	addr := srv.GRPCAddr().String()
	lim := srv.sec.grpcConns
	// The oldest connection has a call in progress that sends nothing (a
	// health Watch): it is busy, never evicted.
	watcher, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		return dialerFrom("127.0.0.7").DialContext(ctx, "tcp", addr)
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { watcher.Close() })
	wctx, wcancel := context.WithCancel(context.Background())
	t.Cleanup(wcancel)
	watch, err := healthpb.NewHealthClient(watcher).Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 5; i++ {
		from := fmt.Sprintf("127.0.0.%d", i)
		holdIdle(t, addr, from, 4, "")
		holdIdle(t, addr, from, 4, h2Preface)
	}
	testwait.Until(t, 10*time.Second, "the listener full of idle connections", func() bool { return lim.Open() == limit })
	holdIdle(t, addr, "127.0.0.6", 4, h2Preface)         // beyond the bound
	clk.Advance(defaultEvictIdle + 100*time.Millisecond) // every held connection idle past EvictIdle
	for i := range 3 {
		conn := grpctest.Dial(t, addr)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err != nil {
			t.Fatalf("new client %d with the listener full of idle connections: %v", i, err)
		}
	}
	if lim.evictedFull.Load() < 3 || lim.Open() > limit {
		t.Errorf("evicted for the listener %d (want at least 3), open %d (bound %d)", lim.evictedFull.Load(), lim.Open(), limit)
	}
	if n := peerConns(lim, "127.0.0.7"); n != 1 {
		t.Errorf("the connection with a call in progress: %d open, want 1 (it was evicted)", n)
	}
	if m := get(t, srv, "/metrics"); !strings.Contains(m, `sluice_connections_evicted_total{bound="listener",listener="grpc"} `+fmt.Sprint(lim.evictedFull.Load())) ||
		!strings.Contains(m, `sluice_connections_open{listener="grpc"}`) {
		t.Error("/metrics lacks the gRPC listener's evictions or open connections")
	}
	// A host that still holds its share: its next connection replaces one
	// of its own.
	var full netip.Addr
	lim.mu.Lock()
	for p, ps := range lim.mu.peers {
		if len(ps.conns) == lim.perPeer {
			full = p
		}
	}
	lim.mu.Unlock()
	if !full.IsValid() {
		t.Fatal("no host holds its share")
	}
	before := lim.evictedPeer.Load()
	holdIdle(t, addr, full.String(), 1, "")
	testwait.Until(t, 5*time.Second, "a peer at its share evicting its own", func() bool { return lim.evictedPeer.Load() == before+1 })
}

// Idle connections at the HTTP listener's bound, raw and with half a
// request, do not lock probes out: each new GET /healthz answers within 1 s.
func TestIdleConnectionsDoNotLockHTTPClientsOut(t *testing.T) {
	const limit = 17
	clk := clock.NewManual(time.Now())
	srv, _, _, _ := start(t, Options{Clock: clk, Security: SecurityOptions{MaxConnections: limit}})
	addr := srv.HTTPAddr().String()
	lim := srv.sec.httpConns
	// The oldest connection reads an event stream and sends nothing: it is
	// busy, never evicted.
	sse := &http.Client{Transport: &http.Transport{DialContext: dialerFrom("127.0.0.7").DialContext}}
	t.Cleanup(sse.CloseIdleConnections)
	ectx, ecancel := context.WithCancel(context.Background())
	t.Cleanup(ecancel)
	req, _ := http.NewRequestWithContext(ectx, "GET", "http://"+addr+"/api/v1/events", nil)
	events, err := sse.Do(req)
	if err != nil || events.StatusCode != http.StatusOK {
		t.Fatalf("event stream: %v %v", events, err)
	}
	t.Cleanup(func() { events.Body.Close() })
	if _, err := events.Body.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 5; i++ {
		from := fmt.Sprintf("127.0.0.%d", i)
		holdIdle(t, addr, from, 2, "")
		holdIdle(t, addr, from, 2, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
	}
	testwait.Until(t, 10*time.Second, "the listener full of idle connections", func() bool { return lim.Open() == limit })
	clk.Advance(defaultEvictIdle + 100*time.Millisecond)
	for i := range 3 {
		hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := hc.Get("http://" + addr + "/healthz")
		if err != nil {
			t.Fatalf("probe %d with the listener full of idle connections: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("probe %d: %d", i, resp.StatusCode)
		}
	}
	if lim.evictedFull.Load() == 0 { // a probe's connection ends with its answer, making room for the next
		t.Error("no connection evicted for the listener")
	}
	if n := peerConns(lim, "127.0.0.7"); n != 1 {
		t.Errorf("the event stream's connection: %d open, want 1 (it was evicted)", n)
	}
}

// An eviction and a call that begins on its victim at the same instant
// never both happen: a call that begins between the evictor's choice and
// its claim keeps the connection, and a call that begins after the claim
// is answered UNAVAILABLE without running, since its answer would be lost
// with the connection.
func TestEvictionClaimsItsVictimAgainstABeginningCall(t *testing.T) {
	f := newLimiterFixture(t, connLimits{Limit: 2, EvictIdle: time.Second})
	_, ta := f.dial("127.0.0.2")
	_, tb := f.dial("127.0.0.3")
	f.clk.Advance(2 * time.Second)
	choose := func() (*trackedConn, uint64) {
		f.l.mu.Lock()
		defer f.l.mu.Unlock()
		return f.l.leastRecentLocked(&f.l.mu.all, f.l.now())
	}
	// A call begins on the chosen connection, or begins and ends, before
	// the claim: the claim fails.
	c, seen := choose()
	if c == nil {
		t.Fatal("no idle connection chosen")
	}
	if !c.begin() {
		t.Fatal("a call could not begin on a connection not yet claimed")
	}
	if c.claim(seen) {
		t.Fatal("claimed a connection with a call in progress")
	}
	c.end()
	f.clk.Advance(2 * time.Second)
	c, seen = choose()
	c.begin()
	c.end()
	if c.claim(seen) {
		t.Fatal("claimed a connection whose call began and ended since it was chosen")
	}
	// A call whose connection is claimed before it begins is refused, and
	// its handler never runs.
	f.clk.Advance(2 * time.Second)
	f.l.mu.Lock()
	victim := f.l.victimLocked(&f.l.mu.all, f.l.now())
	f.l.mu.Unlock()
	if victim != ta && victim != tb {
		t.Fatalf("victim %v, want one of the two idle connections", victim)
	}
	ran := false
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: victim.RemoteAddr()})
	_, err := f.l.UnaryServerInterceptor()(ctx, nil, nil, func(context.Context, any) (any, error) { ran = true; return nil, nil })
	if status.Code(err) != codes.Unavailable || ran {
		t.Fatalf("a call on a claimed connection: %v, handler ran %v; want UNAVAILABLE and no run", err, ran)
	}
	stream := f.l.StreamServerInterceptor()
	if err := stream(nil, fakeServerStream{ctx}, nil, func(any, grpc.ServerStream) error { ran = true; return nil }); status.Code(err) != codes.Unavailable || ran {
		t.Fatalf("a stream on a claimed connection: %v, handler ran %v; want UNAVAILABLE and no run", err, ran)
	}
	// The HTTP server's hook neither counts nor ends a request on it.
	f.l.ConnState(victim, http.StateActive)
	f.l.ConnState(victim, http.StateClosed)
	if victim.state.Load()&connEvicted == 0 {
		t.Fatal("the claim was undone")
	}
}

// fakeServerStream is a server stream with a context and nothing else.
type fakeServerStream struct{ ctx context.Context }

func (s fakeServerStream) Context() context.Context   { return s.ctx }
func (fakeServerStream) SetHeader(metadata.MD) error  { return nil }
func (fakeServerStream) SendHeader(metadata.MD) error { return nil }
func (fakeServerStream) SetTrailer(metadata.MD)       {}
func (fakeServerStream) SendMsg(any) error            { return nil }
func (fakeServerStream) RecvMsg(any) error            { return nil }

// BenchmarkConnBusyMark is what the gRPC interceptor adds to each call:
// finding the call's connection and marking it busy, from every CPU at
// once on one connection (a router's usual shape).
func BenchmarkConnBusyMark(b *testing.B) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	l := newConnLimiter("bench", connLimits{Limit: 16}, slog.New(slog.DiscardHandler))
	l.Listener = lis
	defer l.Close()
	go func() {
		c, err := net.Dial("tcp", lis.Addr().String())
		if err == nil {
			b.Cleanup(func() { c.Close() })
		}
	}()
	c, err := l.Accept()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: c.RemoteAddr()})
	intercept := l.UnaryServerInterceptor()
	handler := func(context.Context, any) (any, error) { return nil, nil }
	if l.connOf(ctx) == nil {
		b.Fatal("the connection is not found")
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, _ = intercept(ctx, nil, nil, handler)
		}
	})
}

func TestConnLimiterDefaults(t *testing.T) {
	for _, c := range []struct{ limit, perPeer, want int }{
		{100, 0, 25}, {20, 0, minPerPeer}, {3, 0, 3}, {10, 50, 10}, {10, 2, 2}, {0, 0, 1},
	} {
		l := newConnLimiter("test", connLimits{Limit: c.limit, PerPeer: c.perPeer}, slog.New(slog.DiscardHandler))
		if l.perPeer != c.want || l.evictIdle != defaultEvictIdle {
			t.Errorf("limit %d, per peer %d: per peer %d (want %d), evict idle %v", c.limit, c.perPeer, l.perPeer, c.want, l.evictIdle)
		}
	}
}

// A per-peer bound counts an IPv6 peer by its /64: one host holds a
// whole /64, so counting each of its addresses would let it pass as
// 2^64 peers. IPv4 addresses, mapped or not, count one by one.
func TestPeerOfCountsIPv6ByItsSlash64(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"192.0.2.7", "192.0.2.7"},
		{"::ffff:192.0.2.7", "192.0.2.7"},
		{"2001:db8:1:2:aaaa::1", "2001:db8:1:2::"},
		{"2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::"},
		{"::1", "::"},
	} {
		if got := peerOf(netip.MustParseAddr(c.in)); got != netip.MustParseAddr(c.want) {
			t.Errorf("peerOf(%s) = %s, want %s", c.in, got, c.want)
		}
	}
	if peerOf(netip.MustParseAddr("2001:db8:1:2::1")) == peerOf(netip.MustParseAddr("2001:db8:1:3::1")) {
		t.Error("two /64s counted as one peer")
	}
}
