package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/sluice-sched/sluice/admission/grpcserver"
	"github.com/sluice-sched/sluice/internal/auth"
)

// SecurityOptions configure who may call sluiced and over what; the zero
// value serves every caller, on loopback only.
type SecurityOptions struct {
	AuthFile string // --auth: principals and roles (package auth); "" serves everybody, on loopback only
	TLSCert  string // --tls-cert: the server certificate (PEM), re-read when it changes
	TLSKey   string // --tls-key: its key
	ClientCA string // --client-ca: CA bundle client certificates are verified against (mTLS)
	// Insecure allows listening beyond loopback without AuthFile (--insecure).
	Insecure bool
	// MetricsAuth puts /metrics behind the viewer role (--metrics-auth).
	MetricsAuth bool
	// MaxConnections bounds the open connections of each listener
	// (--max-connections); 0 sizes it from the file-descriptor limit. At
	// the bound a new connection takes the place of an idle one, and is
	// refused only when every connection is busy (connLimiter).
	MaxConnections int
	// MaxConnectionsPerPeer bounds the connections of each listener from
	// one peer address (--max-connections-per-peer); 0: a quarter of
	// MaxConnections, at least 8 (a browser opens 6).
	MaxConnectionsPerPeer int
	// MaxConcurrentStreams bounds the calls (HTTP/2 streams) open at once
	// on one connection, on both listeners (--max-concurrent-streams); 0:
	// defaultMaxConcurrentStreams. A client past it waits for a stream to
	// end (grpc-go, Envoy) or opens another connection.
	MaxConcurrentStreams int
	// HTTPAllowedHosts are the names the HTTP listener answers for beside
	// its IP addresses and localhost (--http-allowed-hosts; see hostGuard):
	// "name", ".domain" (and the names under it) or "*" (any). Without
	// AuthFile the Host guard is always on; with it, only when this is set.
	HTTPAllowedHosts []string
	// ReloadEvery is how often the auth and TLS files are checked for
	// changes; default 2 s.
	ReloadEvery time.Duration
}

// Default listen addresses: with no auth file sluiced serves loopback only.
const (
	defaultGRPCPort     = "7070"
	defaultHTTPPort     = "7071"
	loopbackHost        = "127.0.0.1"
	defaultReloadPeriod = 2 * time.Second
)

// defaultMaxConcurrentStreams is each connection's bound on open calls: a
// router keeps hundreds of Admits in flight on one connection while the
// fair queue holds them, and an open call costs about 12 KB (its
// goroutine, its stream and its buffers), so that one connection cannot
// hold more than about 12 MB. HTTP/2 asks for no fewer than 100; grpc-go
// sets no bound of its own, Go's HTTP/2 server 250.
const defaultMaxConcurrentStreams = 1000

// HTTP server timeouts: a client cannot hold a connection open by sending
// its headers or body slowly, nor by reading its answer slowly.
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 10 * time.Second
	httpWriteTimeout      = 30 * time.Second
	httpIdleTimeout       = 120 * time.Second
)

// security is the server's part of the security options, built by
// setupSecurity.
type security struct {
	auth  *auth.Authenticator
	audit *auth.Auditor
	tls   *auth.ServerTLS // nil without --tls-cert
	hosts *hostGuard      // nil: every Host is answered (with --auth and no --http-allowed-hosts)
	// The listeners' connection bounds; each serves once listen sets its
	// Listener.
	grpcConns, httpConns *connLimiter
	// maxStreams bounds the calls open at once on one connection.
	maxStreams uint32
}

// defaultAddrs fills the listen addresses the user left empty: loopback
// when no auth file says who may call, every interface otherwise.
func defaultAddrs(opts *Options) {
	host := ""
	if opts.Security.AuthFile == "" {
		host = loopbackHost
	}
	if opts.GRPCAddr == "" {
		opts.GRPCAddr = net.JoinHostPort(host, defaultGRPCPort)
	}
	if opts.HTTPAddr == "" {
		opts.HTTPAddr = net.JoinHostPort(host, defaultHTTPPort)
	}
}

// setupSecurity loads the auth file and the TLS files and builds the
// auditor; any of them failing is an error that stops the start.
func (s *Server) setupSecurity() error {
	so := s.opts.Security
	var err error
	if s.sec.audit, err = auth.NewAuditor(s.log, s.metrics.Registry); err != nil {
		return err
	}
	switch {
	case so.ClientCA != "" && so.TLSCert == "":
		return errors.New("--client-ca needs --tls-cert and --tls-key: client certificates are verified in the TLS handshake")
	case so.MetricsAuth && so.AuthFile == "":
		return errors.New("--metrics-auth needs --auth: without principals nobody could read /metrics")
	}
	if s.sec.auth, err = auth.New(so.AuthFile, s.log, s.sec.audit); err != nil {
		return err
	}
	if so.MaxConnections < 0 || so.MaxConnectionsPerPeer < 0 {
		return fmt.Errorf("--max-connections %d, --max-connections-per-peer %d: want 0 (the default) or more", so.MaxConnections, so.MaxConnectionsPerPeer)
	}
	switch n := so.MaxConcurrentStreams; {
	case n < 0 || int64(n) > math.MaxInt32:
		return fmt.Errorf("--max-concurrent-streams %d: want 0 (the default, %d) to %d", n, defaultMaxConcurrentStreams, math.MaxInt32)
	case n == 0:
		s.sec.maxStreams = defaultMaxConcurrentStreams
	default:
		s.sec.maxStreams = uint32(n)
	}
	lims := connLimits{Limit: so.MaxConnections, PerPeer: so.MaxConnectionsPerPeer, Clock: s.opts.Clock}
	if lims.Limit == 0 {
		lims.Limit = defaultMaxConnections()
	}
	s.sec.grpcConns = newConnLimiter("grpc", lims, s.log)
	s.sec.httpConns = newConnLimiter("http", lims, s.log)
	if so.AuthFile == "" || len(so.HTTPAllowedHosts) > 0 {
		if s.sec.hosts, err = newHostGuard(s.opts.HTTPAddr, so.HTTPAllowedHosts); err != nil {
			return err
		}
	}
	if so.TLSCert != "" || so.TLSKey != "" {
		if s.sec.tls, err = auth.NewServerTLS(so.TLSCert, so.TLSKey, so.ClientCA, s.log, s.sec.audit); err != nil {
			return err
		}
	}
	return nil
}

// grpcServerOptions are the gRPC server's credentials, transport limits
// and interceptors. A call without a credential that names a principal is
// refused at its headers (the tap), before it costs a goroutine; then the
// metrics (they count every call that starts), recovery (a panic in any
// later interceptor is caught), auth, and last the connection's busy mark,
// so that only a call allowed to run holds its connection.
func (s *Server) grpcServerOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.InTapHandle(s.sec.auth.TapHandle()),
		grpc.ChainUnaryInterceptor(append(s.grpcMetrics.unary(), grpcserver.RecoveryUnaryInterceptor(s.log), s.sec.auth.UnaryServerInterceptor(), s.sec.grpcConns.UnaryServerInterceptor())...),
		grpc.ChainStreamInterceptor(s.grpcMetrics.stream(), s.sec.auth.StreamServerInterceptor(), s.sec.grpcConns.StreamServerInterceptor()),
		grpc.NumStreamWorkers(streamWorkers()),
		grpc.MaxConcurrentStreams(s.sec.maxStreams),
		grpc.ConnectionTimeout(grpcHandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: grpcMaxIdle, Time: grpcPingAfter, Timeout: grpcPingTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: grpcMinClientPing, PermitWithoutStream: true}),
	}
	if s.sec.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.sec.tls.Config("h2"))))
	}
	return opts
}

// registerOptions are the security parts of the services' registration.
func (s *Server) registerOptions() []grpcserver.RegisterOption {
	if s.sec.auth.Open() {
		return nil
	}
	return []grpcserver.RegisterOption{grpcserver.WithTenantGuard(auth.CheckTenant)}
}

// httpHandler is the HTTP mux: /healthz open (probes), /metrics open
// unless --metrics-auth, the JSON APIs for viewers (actions for operators),
// the dashboard's page and assets open (they hold no data); all of it but
// /healthz behind the Host guard when it is on.
func (s *Server) httpHandler(metricsHandler http.Handler) http.Handler {
	mux := http.NewServeMux()
	if s.opts.Security.MetricsAuth {
		metricsHandler = s.sec.auth.HTTP(auth.RoleViewer, metricsHandler)
	}
	mux.Handle("/metrics", metricsHandler)
	mux.HandleFunc("/healthz", s.serveHealthz)
	mux.Handle("/v1/domains", s.sec.auth.HTTP(auth.RoleViewer, http.HandlerFunc(s.serveDomains)))
	s.registerDashboard(mux) // the page at "/" and the JSON API under /api/v1/
	if s.sec.hosts != nil {
		return s.sec.hosts.wrap(mux)
	}
	return mux
}

// newHTTPServer returns the HTTP server, with timeouts, the bound on each
// HTTP/2 connection's streams and, with TLS, the reloading certificate.
func (s *Server) newHTTPServer(h http.Handler) *http.Server {
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       httpIdleTimeout,
		ConnState:         s.sec.httpConns.ConnState,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: int(s.sec.maxStreams)},
		// Accept errors, failed handshakes and handler panics go to the
		// server's log rather than the process's stderr.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	if s.sec.tls != nil {
		hs.TLSConfig = s.sec.tls.Config("h2", "http/1.1")
	}
	return hs
}

// serveHTTP serves HTTP (over TLS when configured) until the server closes.
func (s *Server) serveHTTP() error {
	if s.sec.tls != nil {
		return s.http.ServeTLS(s.httpLis, "", "")
	}
	return s.http.Serve(s.httpLis)
}

// listen binds both listeners, refuses a listener beyond loopback without an
// auth file (unless --insecure) and bounds each (connLimiter).
func (s *Server) listen() error {
	var err error
	if s.grpcLis, err = net.Listen("tcp", s.opts.GRPCAddr); err != nil {
		return fmt.Errorf("grpc listen %s: %w", s.opts.GRPCAddr, err)
	}
	if s.httpLis, err = net.Listen("tcp", s.opts.HTTPAddr); err != nil {
		s.grpcLis.Close()
		return fmt.Errorf("http listen %s: %w", s.opts.HTTPAddr, err)
	}
	if err := s.checkExposure(); err != nil {
		s.grpcLis.Close()
		s.httpLis.Close()
		return err
	}
	s.sec.grpcConns.Listener, s.sec.httpConns.Listener = s.grpcLis, s.httpLis
	s.grpcLis, s.httpLis = s.sec.grpcConns, s.sec.httpConns
	s.log.Info("connection limits", "per_listener", s.sec.grpcConns.limit, "per_peer", s.sec.grpcConns.perPeer)
	return nil
}

// checkExposure refuses to serve beyond loopback without an auth file unless
// --insecure, and says at start what the listeners expose.
func (s *Server) checkExposure() error {
	so := s.opts.Security
	if so.AuthFile != "" {
		s.log.Info("authentication on", "auth", so.AuthFile, "tls", s.sec.tls != nil,
			"mtls", s.sec.tls != nil && s.sec.tls.MutualTLS(), "metrics_auth", so.MetricsAuth)
		if s.sec.tls == nil && !(isLoopbackAddr(s.grpcLis.Addr()) && isLoopbackAddr(s.httpLis.Addr())) {
			s.log.Warn("no --tls-cert: bearer tokens are accepted over plaintext from loopback peers only; remote callers need TLS")
		}
		return nil
	}
	var exposed []string
	for _, l := range []struct {
		flag string
		lis  net.Listener
	}{{"--grpc-addr", s.grpcLis}, {"--http-addr", s.httpLis}} {
		if !isLoopbackAddr(l.lis.Addr()) {
			exposed = append(exposed, l.flag+" "+l.lis.Addr().String())
		}
	}
	switch {
	case len(exposed) == 0:
		s.log.Info("no --auth: serving loopback only; every local caller may call every RPC (see docs/security.md to serve beyond it)")
	case !so.Insecure:
		return fmt.Errorf("%v listens beyond loopback without --auth: give --auth FILE (principals and roles), or --insecure to let anybody who can reach it drain domains and admit as any tenant", exposed)
	default:
		s.log.Warn("--insecure: listening beyond loopback without authentication; anybody who can reach these addresses may drain domains and admit as any tenant", "listeners", exposed)
	}
	return nil
}

// isLoopbackAddr reports whether a bound address is a loopback IP.
func isLoopbackAddr(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// ReloadSecurity re-reads the auth file and the TLS files at once (SIGHUP);
// a bad file is refused, logged and audited, and the last good one keeps
// serving.
func (s *Server) ReloadSecurity() error {
	errs := []error{s.sec.auth.Reload()}
	if s.sec.tls != nil {
		errs = append(errs, s.sec.tls.Reload())
	}
	return errors.Join(errs...)
}

// watchSecurity polls the auth and TLS files until ctx ends.
func (s *Server) watchSecurity(ctx context.Context) {
	every := s.opts.Security.ReloadEvery
	if every <= 0 {
		every = defaultReloadPeriod
	}
	var rs []auth.Reloader
	if !s.sec.auth.Open() {
		rs = append(rs, s.sec.auth)
	}
	if s.sec.tls != nil {
		rs = append(rs, s.sec.tls)
	}
	auth.Watch(ctx, every, rs...)
}

// auditConfigReload records a config reload (SIGHUP) and its outcome.
func (s *Server) auditConfigReload(err error) {
	e := auth.Event{Principal: "sluiced", Action: auth.ActionConfigReload, Target: s.opts.ConfigPath, Outcome: auth.OutcomeOK, Err: err}
	if err != nil {
		e.Outcome = auth.OutcomeFailed
	}
	s.sec.audit.Record(context.Background(), e)
}

// Connection limits derived from the file-descriptor limit.
const (
	fdReserve              = 256     // descriptors kept for files, Redis, etcd and the runtime
	minMaxConnections      = 16      // the least a listener gets, however low the limit
	maxMaxConnections      = 1 << 20 // an unlimited descriptor limit still bounds memory
	fallbackMaxConnections = 4096    // when the limit cannot be read
)

// connectionsFor is each listener's connection limit under a descriptor
// limit of nofile: half of what the reserve leaves.
func connectionsFor(nofile uint64) int {
	if nofile > 2*maxMaxConnections+fdReserve {
		return maxMaxConnections
	}
	return max(int((int64(nofile)-fdReserve)/2), minMaxConnections)
}

// streamWorkers is the number of long-lived goroutines that serve gRPC
// streams: 8 per CPU, at least 64 (the callers a router keeps in flight).
// Without them grpc-go starts a goroutine per RPC, whose stack grows (a
// copy) when an Admit reaches the engine's frames, about 8 KB below the
// worker: over a tenth of the server's CPU. A worker's stack stays grown
// until the garbage collector halves it while idle; when every worker is
// busy, grpc-go starts a goroutine as before.
func streamWorkers() uint32 {
	return uint32(max(64, 8*runtime.GOMAXPROCS(0)))
}
