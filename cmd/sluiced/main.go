// Command sluiced is the Sluice admission server: gRPC on :7070 (Admission,
// Operator, Envoy's RateLimitService, health, reflection) and HTTP on :7071 (the rack slot
// dashboard at /, its JSON API under /api/v1/, /healthz, /metrics, /v1/domains). With no flags it serves the embedded default config on the
// simulated cluster, with no external service, on loopback only: serving
// beyond it needs --auth (principals and roles) or --insecure.
//
// Every flag can also be set from the environment: --grpc-addr is
// SLUICE_GRPC_ADDR, and so on (upper case, dashes as underscores). SIGHUP
// reloads --config, --auth and the TLS files; SIGINT/SIGTERM shut down gracefully, answering every
// queued request first.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/dustin/go-humanize"

	"github.com/sluice-sched/sluice/admission/rlsserver"
	"github.com/sluice-sched/sluice/internal/cli"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/enginemetrics"
	"github.com/sluice-sched/sluice/internal/gateway"
	"github.com/sluice-sched/sluice/internal/server"
	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/topology/nvml"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sluiced:", err)
		os.Exit(1)
	}
}

// run parses args and serves until SIGINT/SIGTERM; the print flags write
// to stdout and return.
func run(args []string, stdout io.Writer) error {
	// Take SIGHUP before anything slow: its default action would kill the
	// process during startup (a log rotation, say).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	fs := flag.NewFlagSet("sluiced", flag.ContinueOnError)
	var opts server.Options
	fs.StringVar(&opts.GRPCAddr, "grpc-addr", "", "gRPC listen address (default 127.0.0.1:7070 without --auth, :7070 with it)")
	fs.StringVar(&opts.HTTPAddr, "http-addr", "", "HTTP listen address: the dashboard (/), /api/v1/, /healthz, /metrics, /v1/domains (default 127.0.0.1:7071 without --auth, :7071 with it)")
	fs.StringVar(&opts.ConfigPath, "config", "", "config file (YAML or JSON); empty serves the embedded default")
	fs.StringVar(&opts.Topology, "topology", nvml.SpecAuto, `topology source: "auto" (NVML, else simulated), "auto:<file>" (NVML, else the file), "nvml", "simulated" or a topology file path`)
	printTopology := fs.Bool("print-topology", false, "print the topology --topology resolves to (domains, nodes, GPUs, links, peaks) and exit")
	printTopologyFormat := fs.String("print-topology-format", topology.FormatTable, "--print-topology's output format: table or json")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	printConfig := fs.Bool("print-default-config", false, "print the embedded default config and exit")
	// Shared state on Redis (several replicas).
	fs.StringVar(&opts.Shared.RedisURL, "redis", "", "redis://[user:pass@]host:port[,host:port…][/db] shares quotas and capacity with other replicas; several addresses make a Cluster client; empty runs embedded")
	fs.StringVar(&opts.Shared.SentinelMaster, "redis-sentinel-master", "", "Sentinel master name: --redis then lists the sentinels")
	fs.StringVar(&opts.Shared.Mode, "redis-mode", "", `"batched" (local grants reconciled every --redis-interval) or "strict" (one atomic script per decision); default batched with --replicas > 1 or --etcd, else strict`)
	fs.IntVar(&opts.Shared.Replicas, "replicas", 1, "N, the replicas sharing the quotas, until etcd membership gives the live count")
	fs.DurationVar(&opts.Shared.Interval, "redis-interval", 100*time.Millisecond, "batched mode: reconcile period")
	fs.DurationVar(&opts.Shared.Timeout, "redis-timeout", 50*time.Millisecond, "timeout of one Redis call; failures open the breaker")
	fs.StringVar(&opts.Shared.Prefix, "redis-prefix", "sluice", "Redis key prefix, also the hash tag every key shares")
	fs.DurationVar(&opts.Shared.BacklogTimeout, "redis-backlog-timeout", 2*time.Second, "timeout of one Redis call of the deferred backlog, on its own client: its writes are durable tickets, not decisions")
	// Control plane (etcd): config, membership, node agents, drains.
	fs.StringVar(&opts.Etcd.Endpoints, "etcd", "", "etcd endpoints (comma-separated URLs); makes etcd the source of config, topology and drains")
	fs.StringVar(&opts.Etcd.CAFile, "etcd-ca", "", "CA bundle for etcd's TLS certificates")
	fs.StringVar(&opts.Etcd.CertFile, "etcd-cert", "", "client certificate for etcd")
	fs.StringVar(&opts.Etcd.KeyFile, "etcd-key", "", "client key for etcd")
	fs.StringVar(&opts.Etcd.Prefix, "etcd-prefix", "/sluice/", "key prefix of the control plane in etcd")
	fs.StringVar(&opts.Etcd.AdvertiseAddr, "advertise-addr", "", "gRPC address routers dial, registered in etcd (default: host name and --grpc-addr's port)")
	fs.StringVar(&opts.Etcd.ReplicaID, "replica-id", "", "this replica's member id in etcd (default: the advertise address)")
	fs.DurationVar(&opts.Etcd.MemberTTL, "member-ttl", 10*time.Second, "TTL of the membership lease: a dead replica leaves the count this long after its last keepalive, and the others reclaim its share of the domains' KV (batched Redis) then")
	// Security: who may call, over what.
	fs.StringVar(&opts.Security.AuthFile, "auth", "", "auth file (YAML): principals, their bearer-token digests or mTLS SANs, roles and tenants; re-read when it changes and on SIGHUP. Without it sluiced serves loopback only")
	fs.StringVar(&opts.Security.TLSCert, "tls-cert", "", "server certificate (PEM) for gRPC and HTTP; re-read when it changes")
	fs.StringVar(&opts.Security.TLSKey, "tls-key", "", "the server certificate's key (PEM)")
	fs.StringVar(&opts.Security.ClientCA, "client-ca", "", "CA bundle (PEM) that client certificates are verified against (mTLS); needs --tls-cert")
	fs.BoolVar(&opts.Security.Insecure, "insecure", false, "allow listening beyond loopback without --auth: anybody who can reach sluiced may call every RPC")
	fs.BoolVar(&opts.Security.MetricsAuth, "metrics-auth", false, "put /metrics behind the viewer role (needs --auth); it is open otherwise")
	fs.BoolVar(&opts.Dashboard.Actions, "dashboard-actions", false, "without --auth, let the dashboard's page drain and undrain domains (with --auth the operator role may)")
	allowedHosts := fs.String("http-allowed-hosts", "", `names the HTTP port answers for beside its IP addresses, localhost and --http-addr's host, comma-separated: "name", ".domain" (it and the names under it) or "*" (any); other Hosts get 421, a guard against DNS rebinding. Without --auth the guard is always on; with it, only when this is set`)
	fs.IntVar(&opts.Security.MaxConnections, "max-connections", 0, "open connections per listener at most (0: half the file-descriptor limit less a reserve); at the bound a new connection takes the place of one with no call in progress and none ended for a second (bytes alone do not count), and is refused only when every connection is busy")
	fs.IntVar(&opts.Security.MaxConcurrentStreams, "max-concurrent-streams", 0, "calls (HTTP/2 streams) open at once on one connection, on both listeners (0: 1000); a client past it waits for one to end")
	fs.IntVar(&opts.Security.MaxConnectionsPerPeer, "max-connections-per-peer", 0, "open connections per listener from one peer address at most, the same way (0: a quarter of --max-connections, at least 8)")
	// Metrics: the bound on tenant series overrides the config's.
	fs.IntVar(&opts.Metrics.MaxTenantSeries, "metrics-max-tenant-series", 0, `tenants with metric series of their own: the busiest between scrapes; the rest are tenant="other" (0: the config's metrics.max_tenant_series, default 100)`)
	fs.DurationVar(&opts.Metrics.AdmitLatencySLA, "admit-latency-sla", 2*time.Second, "Admit latency SLA, exported as sluice_admit_latency_sla_seconds for the p99 alert")
	// Serving engines' metrics (the topology's engines), for the capacity loop.
	fs.StringVar(&opts.Deferral.DataDir, "data-dir", "", "directory of the embedded durable state: the deferred backlog's file (deferred.db); with --redis the backlog is in Redis Streams instead; empty and without --redis, deferred tickets live in memory")
	fs.BoolVar(&opts.Deferral.ResetDamaged, "deferral-reset-damaged", false, "a damaged --data-dir/deferred.db is renamed to deferred.db.damaged-<UTC time> and sluiced starts with an empty backlog, the file's tickets lost (logged at error level); without it sluiced refuses to start on a damaged file")
	fs.IntVar(&opts.Engines.Readers, "engine-readers", 2, "with --redis batched and --etcd, how many replicas read each domain's engines (the first in its rendezvous order of the members); the shared state relays their readings to the others")
	fs.DurationVar(&opts.Engines.Period, "engine-metrics-period", 100*time.Millisecond, "how often every serving engine's metrics (the topology's domains[].engines) are read; the config's feedback.stale bounds their age")
	fs.Func("engine-kind", "an engine kind beside vllm and sglang (or in their place): name=queue_metric,kv_metric[,running_metric]; repeatable", func(v string) error {
		name, names, err := server.ParseEngineKind(v)
		if err != nil {
			return err
		}
		if opts.Engines.Kinds == nil {
			opts.Engines.Kinds = make(map[string]enginemetrics.Names)
		}
		opts.Engines.Kinds[name] = names
		return nil
	})
	memoryLimit := fs.String("memory-limit", "auto", `the Go runtime's soft memory limit: "auto" (90% of the cgroup's memory limit when there is one; GOMEMLIMIT or AUTOMEMLIMIT in the environment win), "off", or a size ("460MiB")`)
	printVersion := fs.Bool("version", false, "print the version (module version, VCS revision) and exit")
	// Envoy's rate-limit protocol (RateLimitService v3) on the gRPC port.
	fs.StringVar(&opts.RLS.Domain, "rls-domain", "", "Envoy rate limit: the only RLS domain answered (others are INVALID_ARGUMENT); empty answers any")
	fs.StringVar(&opts.RLS.TenantKey, "rls-tenant-key", rlsserver.DefaultTenantKey, "Envoy rate limit: the descriptor entry naming the tenant (a descriptor without it is UNKNOWN)")
	fs.StringVar(&opts.RLS.ModelKey, "rls-model-key", rlsserver.DefaultModelKey, "Envoy rate limit: the descriptor entry naming the model")
	fs.StringVar(&opts.RLS.PromptKey, "rls-prompt-key", rlsserver.DefaultPromptKey, "Envoy rate limit: the descriptor entry with the prompt tokens (else from hits_addend)")
	fs.StringVar(&opts.RLS.OutputKey, "rls-output-key", rlsserver.DefaultOutputKey, "Envoy rate limit: the descriptor entry with the max output tokens (else 1)")
	fs.StringVar(&opts.RLS.DowngradeKey, "rls-downgrade-key", rlsserver.DefaultDowngradeKey, "Envoy rate limit: the descriptor entry listing accepted lower tiers, comma separated")
	fs.StringVar(&opts.RLS.UsageKey, "rls-usage-key", rlsserver.DefaultUsageKey, "Envoy rate limit: the descriptor entry marking tokens used, settled against the tenant and never refused (value prompt or output: what hits_addend counts)")
	fs.StringVar(&opts.RLS.DefaultModel, "rls-default-model", "", "Envoy rate limit: the model of a descriptor without a model entry (empty: such a descriptor is INVALID_ARGUMENT)")
	fs.DurationVar(&opts.RLS.MaxWait, "rls-max-wait", 0, "Envoy rate limit: how long a request may wait in the fair queue, within the call's deadline (0: answer at once)")
	fs.StringVar(&opts.Gateway.Gateway.TenantHeader, "gateway-tenant-header", gateway.DefaultTenantHeader, "Envoy ext_proc: the request header naming the tenant, set by the gateway after it authenticates the caller")
	fs.StringVar(&opts.Gateway.Gateway.DefaultTenant, "gateway-default-tenant", "", "Envoy ext_proc: the tenant of a request without the tenant header (empty: such a request is refused, 400)")
	fs.IntVar(&opts.Gateway.Gateway.MaxBody, "gateway-max-body", gateway.DefaultMaxBody, "Envoy ext_proc: the largest request body read, in bytes (larger: 413)")
	fs.StringVar(&opts.Gateway.OpenAIAddr, "openai-addr", "", "the OpenAI-compatible front's listen address (/v1/chat/completions, /v1/completions, /v1/responses, /v1/models; HTTP/1.1 and h2c), forwarding to the topology's engines; the --gateway-* flags apply to it too (empty: off)")
	if err := cli.EnvFlags(fs); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // --help asked for the usage, which flag printed
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *allowedHosts != "" {
		opts.Security.HTTPAllowedHosts = strings.Split(*allowedHosts, ",")
	}
	if *printVersion {
		_, err := fmt.Fprintln(stdout, cli.Version("sluiced"))
		return err
	}
	if opts.Metrics.MaxTenantSeries < 0 {
		return fmt.Errorf("--metrics-max-tenant-series %d: want at least 1 (0: from the config)", opts.Metrics.MaxTenantSeries)
	}
	if opts.Engines.Readers < 1 {
		return fmt.Errorf("--engine-readers %d: want at least 1", opts.Engines.Readers)
	}
	if *printConfig {
		_, err := stdout.Write(config.DefaultYAML())
		return err
	}
	logger, err := cli.NewLogger(os.Stderr, *logFormat, *logLevel)
	if err != nil {
		return err
	}
	opts.Logger = logger
	if err := setMemoryLimit(*memoryLimit, logger); err != nil {
		return err
	}
	if *printTopology {
		if *printTopologyFormat != topology.FormatTable && *printTopologyFormat != topology.FormatJSON {
			return fmt.Errorf("--print-topology-format %q: want table or json", *printTopologyFormat)
		}
		l, err := nvml.Load(opts.Topology, logger)
		if err != nil {
			return err
		}
		return topology.Write(stdout, l.Cluster, l.Source, *printTopologyFormat)
	}
	srv, err := server.New(opts)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		for range hup {
			// Each is logged and audited; a bad file leaves the last good
			// one serving.
			_ = srv.ReloadSecurity()
			if opts.ConfigPath != "" {
				_ = srv.Reload()
			}
		}
	}()
	return srv.Serve(ctx)
}

// setMemoryLimit sets the runtime's soft memory limit from --memory-limit.
// Under a limit the collector runs more often as the heap nears it, rather
// than letting the heap grow to twice the live data (GOGC=100): a replica
// holding a million tenants' config stays within its container instead of
// being killed at the next burst of garbage.
func setMemoryLimit(spec string, logger *slog.Logger) error {
	switch spec {
	case "off":
		return nil
	case "auto":
		// No cgroup limit is no limit (the library's own reading of it).
		_, err := memlimit.Set(memlimit.WithRatio(0.9), memlimit.WithProvider(memlimit.FromCgroup), memlimit.WithLogger(logger))
		if err != nil && !errors.Is(err, memlimit.ErrCgroupsNotSupported) {
			logger.Warn("--memory-limit auto: no limit set", "err", err)
		}
		return nil
	}
	n, err := humanize.ParseBytes(spec)
	if err != nil || n == 0 || n > math.MaxInt64 {
		return fmt.Errorf("--memory-limit %q: want auto, off or a size such as 460MiB", spec)
	}
	debug.SetMemoryLimit(int64(n))
	return nil
}
