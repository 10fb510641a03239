package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/sluice-sched/sluice/internal/openai"
)

// openaiFront is the OpenAI-compatible front (--openai-addr): its own
// listener, bounded as the others are, and its own HTTP server with the
// HTTP port's timeouts, serving HTTP/1.1 and h2c (HTTP/2 over TLS with
// --tls-cert).
type openaiFront struct {
	addr  string
	lis   net.Listener
	conns *connLimiter
	srv   *http.Server
}

// newOpenAI builds the front over the server's gateway when
// Gateway.OpenAIAddr is set: the same lifecycle as ext_proc, the auth
// file's API keys, the Host guard as on the HTTP port.
func (s *Server) newOpenAI() error {
	addr := s.opts.Gateway.OpenAIAddr
	if addr == "" {
		return nil
	}
	o := openai.Options{Logger: s.log}
	if !s.sec.auth.Open() {
		o.Identify = s.sec.auth.IdentifyClient
	}
	var h http.Handler = openai.New(s.state.gw, o)
	so := s.opts.Security
	if so.AuthFile == "" || len(so.HTTPAllowedHosts) > 0 {
		g, err := newHostGuard(addr, so.HTTPAllowedHosts)
		if err != nil {
			return err
		}
		h = g.wrap(h)
	}
	lims := connLimits{Limit: s.sec.httpConns.limit, PerPeer: s.sec.httpConns.perPeer, Clock: s.opts.Clock}
	f := &openaiFront{addr: addr, conns: newConnLimiter("openai", lims, s.log)}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	if s.sec.tls != nil {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetUnencryptedHTTP2(true) // h2c: prior knowledge, as gRPC-style clients and load tools speak it
	}
	// The timeouts bound the headers and the body; the front lifts them
	// per request once the body is in (openai's deadlineWriter), so that
	// a stream outlives them.
	f.srv = &http.Server{
		Handler:           h,
		Protocols:         &protocols,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       httpIdleTimeout,
		ConnState:         f.conns.ConnState,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: int(s.sec.maxStreams)},
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	if s.sec.tls != nil {
		f.srv.TLSConfig = s.sec.tls.Config("h2", "http/1.1")
	}
	registerConnMetrics(s.metrics.Registry, f.conns)
	s.openai = f
	return nil
}

// listenOpenAI binds the front's listener: beyond loopback only with an
// auth file (its API keys name the tenants) or --insecure.
func (s *Server) listenOpenAI() error {
	f := s.openai
	if f == nil {
		return nil
	}
	lis, err := net.Listen("tcp", f.addr)
	if err != nil {
		return fmt.Errorf("openai listen %s: %w", f.addr, err)
	}
	so := s.opts.Security
	switch {
	case so.AuthFile != "":
		s.log.Info("openai front", "addr", lis.Addr().String(), "api_keys", s.sec.auth.APIKeys())
	case isLoopbackAddr(lis.Addr()):
		s.log.Info("openai front without --auth: serving loopback only; the tenant header names the tenant", "addr", lis.Addr().String())
	case !so.Insecure:
		lis.Close()
		return fmt.Errorf("--openai-addr %s listens beyond loopback without --auth: give --auth FILE (its api_keys name each key's tenant), or --insecure to let anybody who can reach it spend any tenant's quota", lis.Addr())
	default:
		s.log.Warn("--insecure: the openai front listens beyond loopback without authentication; anybody who can reach it may spend any tenant's quota", "addr", lis.Addr().String())
	}
	f.conns.Listener = lis
	f.lis = f.conns
	return nil
}

// serveOpenAI serves the front until it shuts down; nil without one.
func (s *Server) serveOpenAI() error {
	f := s.openai
	if f == nil {
		return nil
	}
	var err error
	if s.sec.tls != nil {
		err = f.srv.ServeTLS(f.lis, "", "")
	} else {
		err = f.srv.Serve(f.lis)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// shutdownOpenAI stops the front: no new requests; those in flight (the
// engine answers the queued ones SHUTTING_DOWN) finish within the grace
// period, then the rest are cut (and release what they hold). The channel
// closes when it is done.
func (s *Server) shutdownOpenAI() <-chan struct{} {
	done := make(chan struct{})
	f := s.openai
	if f == nil {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.Grace)
		defer cancel()
		if err := f.srv.Shutdown(ctx); err != nil {
			_ = f.srv.Close()
		}
	}()
	return done
}

// OpenAIAddr returns the front's bound address; nil without --openai-addr.
func (s *Server) OpenAIAddr() net.Addr {
	if s.openai == nil || s.openai.lis == nil {
		return nil
	}
	return s.openai.lis.Addr()
}
