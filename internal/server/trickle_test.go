package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/grpctest"
	"github.com/sluice-sched/sluice/internal/testdep"
	"github.com/sluice-sched/sluice/internal/testwait"
)

// HTTP/2 frames a trickling client sends on stream 0, 13 and 17 bytes:
// a WINDOW_UPDATE of one byte and a PING.
const (
	h2WindowUpdate = "\x00\x00\x04\x08\x00\x00\x00\x00\x00" + "\x00\x00\x00\x01"
	h2Ping         = "\x00\x00\x08\x06\x00\x00\x00\x00\x00" + "trickle!"
)

// trickler is a connection that sends a little now and then and never
// completes a call or a request.
type trickler struct {
	c    net.Conn
	next func() string // what it sends next
}

// trickle sends the next bit; a connection the server closed takes no
// more, and that is not the test's business.
func (tr *trickler) trickle() { _, _ = tr.c.Write([]byte(tr.next())) }

// trickleKinds are the ways a client trickles: to the gRPC port, the
// preface then a WINDOW_UPDATE or a PING at a time, or the preface a byte
// at a time; to the HTTP port, a request's headers a byte at a time.
var trickleKinds = map[string][]func() func() string{
	"grpc": {
		func() func() string { return repeatAfter(h2Preface, h2WindowUpdate) },
		func() func() string { return repeatAfter(h2Preface, h2Ping) },
		func() func() string { return byteAtATime(h2Preface, h2WindowUpdate) },
	},
	"http": {
		func() func() string {
			return byteAtATime("GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Trickle: ", "a")
		},
	},
}

// repeatAfter sends first, then then each time.
func repeatAfter(first, then string) func() string {
	sent := false
	return func() string {
		if !sent {
			sent = true
			return first
		}
		return then
	}
}

// byteAtATime sends s a byte at a time, then then each time.
func byteAtATime(s, then string) func() string {
	i := 0
	return func() string {
		if i < len(s) {
			i++
			return s[i-1 : i]
		}
		return then
	}
}

// dialTricklers opens n trickling connections of the listener's kinds to
// addr from the loopback address from, each having sent its first bit.
func dialTricklers(t *testing.T, listener, addr, from string, n int) []*trickler {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	kinds := trickleKinds[listener]
	trs := make([]*trickler, 0, n)
	for i := range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			testdep.Missing(t, "dial from %s: %v (this test needs 127.0.0.0/8 routed to loopback, as Linux does)", from, err)
		}
		t.Cleanup(func() { c.Close() })
		tr := &trickler{c: c, next: kinds[i%len(kinds)]()}
		tr.trickle()
		trs = append(trs, tr)
	}
	return trs
}

// floodWithTricklers fills a listener bounded at 100 connections with 100
// trickling ones from four hosts (a quarter each, the per-peer share);
// once the limiter's clock has moved past EvictIdle and every one has
// trickled again, 50 more from two other hosts; then every one trickles
// once more. A byte read is no activity, so the 50 take the places of
// the oldest, and the rest stay evictable for new clients.
func floodWithTricklers(t *testing.T, listener, addr string, lim *connLimiter, clk *clock.Manual) {
	t.Helper()
	var all []*trickler
	for i := 2; i <= 5; i++ {
		all = append(all, dialTricklers(t, listener, addr, fmt.Sprintf("127.0.0.%d", i), 25)...)
	}
	testwait.Until(t, 10*time.Second, "the listener full of trickling connections", func() bool { return lim.Open() == 100 })
	clk.Advance(defaultEvictIdle + 100*time.Millisecond)
	for _, tr := range all {
		tr.trickle()
	}
	for i := 6; i <= 7; i++ {
		all = append(all, dialTricklers(t, listener, addr, fmt.Sprintf("127.0.0.%d", i), 25)...)
	}
	for _, tr := range all {
		tr.trickle()
	}
}

// 150 connections trickling frames, or the preface a byte at a time, at
// a gRPC listener bounded at 100 do not hold it: at least 9 of 10 new
// clients' health Checks succeed within 1 s each.
func TestTricklingConnectionsDoNotLockGRPCClientsOut(t *testing.T) {
	clk := clock.NewManual(time.Now()) // the limiter's: idleness moves with it alone
	srv, _, _, _ := start(t, Options{Clock: clk, Security: SecurityOptions{MaxConnections: 100}})
	addr := srv.GRPCAddr().String()
	floodWithTricklers(t, "grpc", addr, srv.sec.grpcConns, clk)
	served := 0
	for range 10 {
		conn := grpctest.Dial(t, addr)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil {
			served++
		}
	}
	if served < 9 {
		t.Errorf("%d of 10 new gRPC clients served beside 150 trickling connections, want at least 9 (evicted %d, refused %d)",
			served, srv.sec.grpcConns.evictedFull.Load(), srv.sec.grpcConns.refusedFull.Load())
	}
}

// 150 connections trickling a request's headers a byte at a time at an
// HTTP listener bounded at 100 do not hold it: at least 9 of 10 new
// /healthz probes answer within 1 s each.
func TestTricklingConnectionsDoNotLockHTTPClientsOut(t *testing.T) {
	clk := clock.NewManual(time.Now())
	srv, _, _, _ := start(t, Options{Clock: clk, Security: SecurityOptions{MaxConnections: 100}})
	addr := srv.HTTPAddr().String()
	floodWithTricklers(t, "http", addr, srv.sec.httpConns, clk)
	served := 0
	for range 10 {
		hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := hc.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				served++
			}
		}
	}
	if served < 9 {
		t.Errorf("%d of 10 /healthz probes answered beside 150 trickling connections, want at least 9 (evicted %d, refused %d)",
			served, srv.sec.httpConns.evictedFull.Load(), srv.sec.httpConns.refusedFull.Load())
	}
}
