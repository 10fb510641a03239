// Package server assembles sluiced: config and topology loading, the
// engine and its dispatcher, the gRPC services and the HTTP endpoints
// (/healthz, /metrics), and graceful shutdown. cmd/sluiced is a thin flag
// parser over it; the end-to-end tests start it in-process.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/deferral"
	"github.com/sluice-sched/sluice/admission/grpcserver"
	"github.com/sluice-sched/sluice/admission/rlsserver"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/dashboard"
	"github.com/sluice-sched/sluice/internal/metrics"
	"github.com/sluice-sched/sluice/topology"
)

// Options configure a Server.
type Options struct {
	GRPCAddr   string // default "127.0.0.1:7070" without Security.AuthFile, ":7070" with it
	HTTPAddr   string // default "127.0.0.1:7071" without Security.AuthFile, ":7071" with it
	ConfigPath string // "" serves the embedded default
	Topology   string // "simulated" (default here; sluiced's flag defaults to "auto"), "auto", "auto:<file>", "nvml" or a file path
	Logger     *slog.Logger
	Clock      clock.Clock   // default: real
	Grace      time.Duration // how long shutdown waits for in-flight RPCs; default 10s
	Etcd       EtcdOptions   // the etcd control plane (controlplane.go); zero: none
	Shared     SharedOptions // shared state on Redis (sharedstate.go); zero: embedded
	// RLS configures Envoy's rate-limit protocol, served beside the
	// Admission service (rls.go); zero: any domain, the default keys.
	RLS rlsserver.Options
	// Security: TLS, principals and roles, connection limits (security.go);
	// zero: everybody, on loopback only.
	Security SecurityOptions
	// Dashboard: the rack slot dashboard at "/" (dashboard.go); zero:
	// served, actions only with --auth's operator role.
	Dashboard DashboardOptions
	// Metrics bound the tenant-labelled series and set the Admit latency
	// SLA the alerts compare with; zero: the defaults.
	Metrics metrics.Options
	// Engines: reading the serving engines' metrics for the capacity
	// loop (engines.go); zero: every 100ms, vllm and sglang known.
	Engines EngineMetricsOptions
	// Deferral: where deferred tickets are kept (deferral.go); zero: in
	// Redis with --redis, else in memory.
	Deferral DeferralOptions
	// Gateway: the request lifecycle Envoy's ext_proc drives (gateway.go);
	// zero: the default headers and bounds.
	Gateway GatewayOptions
}

// Server is a running sluiced.
type Server struct {
	opts    Options
	log     *slog.Logger
	eng     *admission.Engine
	metrics *metrics.Metrics
	grpc    *grpc.Server
	health  *health.Server
	http    *http.Server
	grpcLis net.Listener
	httpLis net.Listener
	openai  *openaiFront // nil without --openai-addr (openai.go)

	grpcMetrics *grpcMetrics // calls by method and code, invalid requests by field

	backlog      *deferral.Backlog // deferrable work (deferral.go)
	backlogStore deferral.Store
	backlogRedis redis.UniversalClient // the backlog's own client with --redis, closed after its store

	reloadMu sync.Mutex
	redis    redis.UniversalClient // nil when embedded
	// relaysEngines: the shared state is batched, so it relays engine
	// readings, and each replica reads only its share of the domains
	// (engines.go).
	relaysEngines bool
	cp            controlPlane // config status and the etcd control plane (controlplane.go)
	sec           security     // auth, audit and TLS (security.go)

	// The dashboard (dashboard.go): the cluster and tenant directory it
	// reads, and its traffic counters.
	state   *serverState
	traffic *dashboard.Traffic
	dash    *dashboard.Dashboard
	// replica is this replica's id as the dashboard shows it: the etcd
	// member id, else its name in Redis, else the host name. It is set in
	// New, before Serve; nothing writes it after.
	replica string
}

// New loads config and topology, builds the engine and binds both listeners.
func New(opts Options) (*Server, error) {
	defaultAddrs(&opts)
	if opts.Topology == "" {
		opts.Topology = "simulated"
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Grace == 0 {
		opts.Grace = 10 * time.Second
	}
	cfg, cfgName, err := loadConfig(opts.ConfigPath)
	if err != nil {
		return nil, err
	}
	if opts.Metrics.MaxTenantSeries == 0 { // the flag wins over the config
		opts.Metrics.MaxTenantSeries = cfg.Metrics.MaxTenantSeries
	}
	s := &Server{opts: opts, log: opts.Logger, metrics: metrics.New(opts.Metrics), traffic: dashboard.NewTraffic()}
	s.replica, _ = os.Hostname()
	if err := s.setupSecurity(); err != nil {
		return nil, err
	}

	cluster, discovered, err := loadTopology(opts.Topology, s.log)
	if err != nil {
		return nil, err
	}
	engOpts := []admission.Option{admission.WithClock(opts.Clock), admission.WithObserver(observers{s.metrics, s.traffic})}
	shared, err := s.sharedStateOption()
	if err != nil {
		return nil, err
	}
	if shared != nil {
		engOpts = append(engOpts, shared)
	}
	s.eng, err = admission.New(cfg, cluster, engOpts...)
	var ce *admission.ConfigError
	if errors.As(err, &ce) && opts.ConfigPath == "" && discovered && strings.HasPrefix(opts.Topology, "auto") {
		// The embedded demo config is sized for the simulated cluster (its
		// floors need about 80 H200s); on a smaller GPU machine, auto
		// serves the demo on the simulated layout rather than not at all.
		s.log.Warn("the embedded default config does not fit the GPUs NVML found; serving it on the simulated cluster (pass --config sized for this machine to schedule its GPUs)",
			"gpus", cluster.GPUCount(), "reason", err.Error())
		cluster = topology.Simulated()
		s.eng, err = admission.New(cfg, cluster, engOpts...)
	}
	switch {
	case errors.As(err, &ce):
		return nil, config.Wrap(cfgName, err)
	case err != nil: // the cluster cannot serve: name the topology source
		return nil, fmt.Errorf("topology %s: %w", opts.Topology, err)
	}
	feed, err := newEngineFeed(opts.Engines, s.eng, opts.Clock.Now, s.log)
	if err != nil {
		return nil, err
	}
	s.state = &serverState{eng: s.eng, feed: feed}
	s.state.gw = s.newGateway(feed)
	s.state.configChanged(cfg)
	s.state.topologyChanged(cluster)
	// The engine and the tenant directory hold what they need of the
	// tenants; the parsed map (tens of MB at a million tenants) is given
	// back below with the parse's garbage.
	tenants := len(cfg.Tenants)
	cfg.Tenants = nil
	configStatus := s.newConfigStatus(cfgName)
	s.metrics.RegisterState(s.eng)
	if err := s.openBacklog(); err != nil {
		return nil, err
	}
	if err := s.newDashboard(configStatus); err != nil {
		return nil, err
	}
	s.registerSharedMetrics(s.metrics.Registry)
	s.state.feed.register(s.metrics.Registry)
	registerConnMetrics(s.metrics.Registry, s.sec.grpcConns, s.sec.httpConns)
	// Parsing a large config (100k tenants) peaks far above what it leaves
	// behind; give that back now rather than at the next scavenge.
	debug.FreeOSMemory()

	s.grpcMetrics = newGRPCMetrics(s.metrics.Registry)
	s.grpc = grpc.NewServer(s.grpcServerOptions()...)
	s.health = grpcserver.Register(s.grpc, s.pagedEngine(), append(append(s.registerOptions(), configStatus, grpcserver.WithBacklog(s.backlog)), s.creditFreezer()...)...)
	if err := s.registerRLS(cfg); err != nil {
		return nil, err
	}
	s.registerExtProc()
	s.grpcMetrics.calls.InitializeMetrics(s.grpc) // every method's series, at 0
	s.http = s.newHTTPServer(s.httpHandler(s.metrics.Handler()))
	if err := s.newOpenAI(); err != nil {
		return nil, err
	}

	if err := s.listen(); err != nil {
		return nil, err
	}
	if err := s.listenOpenAI(); err != nil {
		s.grpcLis.Close()
		s.httpLis.Close()
		return nil, err
	}
	if err := s.startControlPlane(); err != nil {
		s.grpcLis.Close()
		s.httpLis.Close()
		if s.openai != nil {
			s.openai.lis.Close()
		}
		return nil, err
	}
	s.log.Info("sluiced ready", "config", cfgName, "topology", opts.Topology,
		"domains", len(cluster.Domains), "gpus", cluster.GPUCount(), "tenants", tenants,
		"grpc", s.grpcLis.Addr().String(), "http", s.httpLis.Addr().String())
	return s, nil
}

func loadConfig(path string) (admission.Config, string, error) {
	if path == "" {
		cfg, err := config.Default()
		return cfg, config.DefaultName, err
	}
	cfg, err := config.Load(path)
	return cfg, path, err
}

// Engine returns the admission engine.
func (s *Server) Engine() *admission.Engine { return s.eng }

// GRPCAddr returns the bound gRPC address.
func (s *Server) GRPCAddr() net.Addr { return s.grpcLis.Addr() }

// HTTPAddr returns the bound HTTP address.
func (s *Server) HTTPAddr() net.Addr { return s.httpLis.Addr() }

// Reload re-reads the config file; a bad file is refused with file, key
// and reason, and the config in force keeps serving.
func (s *Server) Reload() error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	err := s.reloadConfig()
	s.auditConfigReload(err)
	return err
}

// reloadConfig is Reload's work, under reloadMu.
func (s *Server) reloadConfig() error {
	if s.opts.ConfigPath == "" {
		return errors.New("reload: serving the embedded default; start with --config to reload a file")
	}
	if err := s.checkReloadSource(); err != nil {
		return err
	}
	cfg, err := config.Load(s.opts.ConfigPath)
	if err == nil {
		err = config.Wrap(s.opts.ConfigPath, s.eng.Apply(cfg))
	}
	s.configReloaded(err)
	if err != nil {
		s.log.Error("config refused; the last good config keeps serving", "err", err)
		return err
	}
	s.state.configChanged(cfg)
	s.log.Info("config reloaded", "file", s.opts.ConfigPath, "tenants", len(cfg.Tenants))
	return nil
}

// Serve runs until ctx ends, then shuts down gracefully: health turns
// NOT_SERVING, every queued request is answered, in-flight RPCs finish
// (up to the grace period) and the listeners close.
func (s *Server) Serve(ctx context.Context) error {
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	go s.eng.Run(runCtx)
	s.runBacklog(runCtx)
	go s.dash.Run(runCtx)
	go s.state.feed.run(runCtx)
	go s.watchSecurity(runCtx)
	s.runControlPlane()

	errc := make(chan error, 3)
	go func() { errc <- s.grpc.Serve(s.grpcLis) }()
	go func() {
		if err := s.serveOpenAI(); err != nil {
			errc <- err
		}
	}()
	go func() {
		if err := s.serveHTTP(); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	s.shutdown()
	return serveErr
}

func (s *Server) shutdown() {
	s.log.Info("shutting down: answering queued requests")
	// Leave the membership first: routers move on at once.
	s.stopControlPlane()
	s.health.Shutdown() // NOT_SERVING: routers stop sending here
	// The backlog stops admitting before the engine closes (which refuses
	// everything): its tickets wait in the store, not refused. Workers'
	// Claim streams end, so that GracefulStop need not wait for them.
	s.backlog.Close()
	s.eng.Close() // every queued request answered SHUTTING_DOWN (retry elsewhere)
	openaiDone := s.shutdownOpenAI()
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.opts.Grace):
		s.grpc.Stop()
	}
	if err := s.backlogStore.Close(); err != nil {
		s.log.Warn("closing the deferred backlog's store", "err", err)
	}
	if s.backlogRedis != nil {
		_ = s.backlogRedis.Close()
	}
	s.dash.Close() // event streams end, so that HTTP shutdown need not wait for them
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = s.http.Shutdown(ctx)
	<-openaiDone
	s.log.Info("stopped")
}

func (s *Server) serveHealthz(w http.ResponseWriter, r *http.Request) {
	resp, err := s.health.Check(r.Context(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		http.Error(w, "not serving", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok"+s.controlPlaneHealth())
}

func (s *Server) serveDomains(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.eng.Domains())
}
