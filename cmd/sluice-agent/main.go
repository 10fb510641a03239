// Command sluice-agent is Sluice's node agent: it discovers its node's GPUs
// and NVLink domain and publishes them in etcd under a lease, so that every
// sluiced replica builds its cluster from the agents (see package
// internal/controlplane). When the agent dies its lease expires and its
// GPUs leave capacity; when it returns they come back.
//
//	sluice-agent --etcd http://etcd:2379 [--node NAME] [--topology auto]
//
// Every flag can also be set from the environment: --etcd is SLUICE_ETCD,
// and so on (upper case, dashes as underscores). SIGINT/SIGTERM revoke the
// lease before exit, so that the node leaves capacity at once.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-sched/sluice/internal/cli"
	"github.com/sluice-sched/sluice/internal/controlplane"
	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/topology/nvml"
)

// stdout is where --version prints (the logs go to run's logw).
var stdout io.Writer = os.Stdout

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nvml.Discover); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-agent:", err)
		os.Exit(1)
	}
}

// run parses args and publishes until ctx ends, discovering the node
// through discover (nvml.Discover; the tests' fake NVML) where --topology
// says NVML.
func run(ctx context.Context, args []string, logw io.Writer, discover func(node string) (topology.NodeDiscovery, error)) error {
	fs := flag.NewFlagSet("sluice-agent", flag.ContinueOnError)
	fs.SetOutput(logw)
	var co controlplane.ClientOptions
	fs.StringVar(&co.Endpoints, "etcd", "", "etcd endpoints, comma-separated URLs (required)")
	fs.StringVar(&co.CAFile, "etcd-ca", "", "CA bundle for etcd's TLS certificates")
	fs.StringVar(&co.CertFile, "etcd-cert", "", "client certificate for etcd")
	fs.StringVar(&co.KeyFile, "etcd-key", "", "client key for etcd")
	prefix := fs.String("etcd-prefix", controlplane.DefaultPrefix, "key prefix of the control plane in etcd")
	host, _ := os.Hostname()
	node := fs.String("node", host, "this node's name, unique in the cluster (default: the host name)")
	spec := fs.String("topology", nvml.SpecAuto, `where the GPUs come from: "auto" (NVML, else this node in the simulated cluster), "auto:<file>" (NVML, else this node in the file), "nvml", "simulated" or a topology file`)
	ttl := fs.Duration("ttl", 10*time.Second, "lease TTL: a dead agent's GPUs leave capacity this long after its last keepalive")
	rediscover := fs.Duration("rediscover", 30*time.Second, "how often the node is discovered again and a changed record (GPU health) republished; 0 never")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	var engines engineFlags
	fs.Var(&engines, "engine", "a serving engine on this node, kind=metrics-URL (vllm=http://localhost:8000/metrics, sglang=…); repeatable: the replicas read their metrics to correct the domain's capacity")
	printVersion := fs.Bool("version", false, "print the version (module version, VCS revision) and exit")
	if err := cli.EnvFlags(fs); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *printVersion {
		_, err := fmt.Fprintln(stdout, cli.Version("sluice-agent"))
		return err
	}
	log, err := cli.NewLogger(logw, "text", *logLevel)
	if err != nil {
		return err
	}
	if co.Endpoints == "" {
		return errors.New("--etcd (or SLUICE_ETCD) is required")
	}
	if *node == "" {
		return errors.New("--node: empty, and the host name is unknown")
	}
	// Discover once before connecting: a node that cannot say what it has
	// should fail loudly at start, not publish later. RunAgent discovers
	// again before each publication and every --rediscover; the loader logs
	// an auto fallback once, not at each discovery, and once NVML has
	// answered it reports the node's GPUs unhealthy if NVML goes away,
	// rather than falling back to healthy ones.
	loader := nvml.NewNodeLoaderWith(*spec, *node, log, discover)
	if _, err := loader.Load(ctx); err != nil {
		return err
	}
	every := *rediscover
	if every <= 0 {
		every = -1 // the flag's 0 is never; RunAgent's 0 is its default
	}
	cli, err := controlplane.NewClient(co)
	if err != nil {
		return err
	}
	defer cli.Close()
	return controlplane.RunAgent(ctx, controlplane.AgentOptions{
		Client: cli, Prefix: *prefix, TTL: *ttl, Logger: log, RediscoverEvery: every,
		Discover: func(ctx context.Context) (topology.NodeDiscovery, error) {
			nd, err := loader.Load(ctx)
			nd.Engines = engines
			return nd, err
		},
	})
}

// engineFlags are the --engine flags: kind=metrics-URL each.
type engineFlags []topology.Engine

func (f *engineFlags) String() string {
	parts := make([]string, len(*f))
	for i, e := range *f {
		parts[i] = e.Kind + "=" + e.Metrics
	}
	return strings.Join(parts, ",")
}

func (f *engineFlags) Set(v string) error {
	kind, url, ok := strings.Cut(v, "=")
	if !ok || kind == "" || url == "" {
		return fmt.Errorf("want kind=metrics-URL (vllm=http://localhost:8000/metrics), got %q", v)
	}
	e := topology.Engine{Kind: kind, Metrics: url}
	if err := e.Validate(); err != nil {
		return err
	}
	*f = append(*f, e)
	return nil
}
