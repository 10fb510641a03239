package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/drill"
	"github.com/sluice-sched/sluice/internal/load"
	"github.com/sluice-sched/sluice/internal/replay"
)

// errPromiseBroken makes the exit status non-zero after the report.
var errPromiseBroken = errors.New("a promise broke (see the report)")

// newDrillCmd is `sluicectl drill NAME [TARGET]`: one drill (or all) on
// the fleet the flags name, or on a self-contained one it starts, and the
// report; the exit status is non-zero when a promise broke.
func newDrillCmd(g *globals) *cobra.Command {
	df := drillFlags{d: drill.Defaults()}
	c := &cobra.Command{
		Use:   "drill NAME [TARGET]",
		Short: "A chaos drill under live load (" + strings.Join(drill.Names, ", ") + ", all, soak): what held",
		Long: `Run a chaos drill under a live load it generates itself, and report which
promises held (the exit status is 1 when one broke).

NAME: ` + strings.Join(drill.Names, ", ") + `, all (each once), or soak (random drills
for --duration).
TARGET: drain-domain's DOMAIN, kill-agent's NODE, kill-replica's ID (default:
the busiest domain, its node, the first tenant's replica).

The fleet: --etcd (its replicas registered there), --server ADDR[,ADDR…]
(without --etcd: the fleet's replicas, drained through the Operator API), or
--self-contained (redis-server, an embedded etcd, node agents and sluiced
replicas started as child processes on free ports, stopped at the end).`,
		Example: `  sluicectl drill all --self-contained
  sluicectl drill drain-domain nvl72-a --etcd http://etcd:2379 --tenants acme:small:0.5,globex:small:0.5`,
		Args:      args(1, 2, "a drill NAME and at most one TARGET"),
		ValidArgs: append(slices.Clone(drill.Names), "all", "soak"),
		RunE:      func(c *cobra.Command, a []string) error { return runDrill(g, c, &df, a) },
	}
	df.register(c)
	return c
}

// drillFlags are drill's own flags.
type drillFlags struct {
	d                                          drill.Options
	self, fleetLog                             bool
	replicas                                   int
	sluiced, agent, fault, stopCmd, startCmd   string
	tenants, quotaTenant, creditTenant, config string
	duration, memberTTL                        time.Duration
	tracePath, redisMode                       string
	redisInterval                              time.Duration
	burstTenants                               string
}

// register adds the flags to c.
func (df *drillFlags) register(c *cobra.Command) {
	fs := c.Flags()
	d := &df.d
	fs.BoolVar(&df.self, "self-contained", false, "start a fleet for the drill: redis-server, an embedded etcd, node agents and --replicas sluiced (child processes on free ports), stopped at the end")
	fs.IntVar(&df.replicas, "replicas", 2, "--self-contained: sluiced replicas; else N for the quota bound (0: the replicas found)")
	fs.StringVar(&df.sluiced, "sluiced", "", "--self-contained: the sluiced binary (default: beside sluicectl, else go build)")
	fs.StringVar(&df.agent, "agent", "", "--self-contained: the sluice-agent binary (default: beside sluicectl, else go build)")
	fs.BoolVar(&df.fleetLog, "fleet-log", false, "--self-contained: copy the children's logs to stderr")
	fs.StringVar(&df.fault, "fault", "", `for tests: break a promise on purpose to show the drill catches it; "ignore-drains" starts replica-1 on a control-plane prefix of its own (it never sees a drain mark) and registers it in the fleet's membership`)
	fs.StringVar(&df.stopCmd, "stop", "", "a fleet the drill did not start: shell command that stops the part (env DRILL_PART redis|etcd|agent|replica, DRILL_NAME the node or replica id)")
	fs.StringVar(&df.redisMode, "redis-mode", drill.ModeBatched, `a fleet the drill did not start: its replicas' shared-state mode, "batched", "strict" or "embedded" (the quota promise's bound: (N−1)·R·W batched, exact up to one request otherwise)`)
	fs.DurationVar(&df.redisInterval, "redis-interval", 100*time.Millisecond, "a fleet the drill did not start, batched: its replicas' --redis-interval (W in the quota bound)")
	fs.DurationVar(&df.memberTTL, "member-ttl", 10*time.Second, "a fleet the drill did not start, with etcd: its replicas' --member-ttl (kill-replica's promise: a dead replica's capacity is back within it)")
	fs.StringVar(&df.startCmd, "start", "", "a fleet the drill did not start: shell command that starts it again (same environment)")
	fs.DurationVar(&d.Before, "before", d.Before, "steady load before the fault")
	fs.DurationVar(&d.During, "during", d.During, "the fault's length, from when it took effect (its stop returned, the agent's record left etcd); deferred-burst's burst lasts 30s unless it is given")
	fs.DurationVar(&d.After, "after", d.After, "load after the recovery action")
	fs.Float64Var(&d.Rate, "rate", d.Rate, "Admits per second (Poisson arrivals)")
	fs.StringVar(&df.tenants, "tenants", "", "the load's tenant:model:share,… (default: the self-contained fleet's gold:small:0.3,silver:small:0.2,bronze:small:0.5; else sluicectl load's demo mix)")
	fs.Int64Var(&d.Prompt, "prompt", d.Prompt, "prompt tokens per request")
	fs.Int64Var(&d.Output, "output", d.Output, "max output tokens per request (each Release reports them all)")
	fs.Int64Var(&d.OutputWeight, "output-weight", d.OutputWeight, "the fleet's output_token_weight: a request costs prompt + weight × output weighted tokens")
	fs.DurationVar(&d.Deadline, "deadline", d.Deadline, "each Admit's deadline")
	fs.DurationVar(&d.Hold, "hold", d.Hold, "how long each lease is held before its Release")
	fs.Uint64Var(&d.Seed, "seed", d.Seed, "seed of the arrivals and tenant draws")
	fs.StringVar(&df.quotaTenant, "quota-tenant", "", "the tenant driven past its quota whose admitted tokens are checked (default: bronze self-contained, else none)")
	fs.Float64Var(&d.Undershoot, "undershoot", d.Undershoot, "the quota tenant may fall this share under its quota in a phase")
	fs.DurationVar(&d.Grace, "grace", d.Grace, "how long after a drain mark (or a node's departure) a placement there is still allowed: one watch round-trip")
	fs.DurationVar(&d.RecoverWithin, "recover-within", d.RecoverWithin, "bound on the time to recover: from the fault's end to the first second of the load back within the promise")
	fs.Float64Var(&d.LateBudget, "late-budget", d.LateBudget, "share of a phase's Admits that may end past their deadline")
	fs.StringVar(&df.creditTenant, "credit-tenant", "", "credit-exhaustion's tenant (default: spiky self-contained; required otherwise)")
	fs.DurationVar(&d.BreakerOpen, "breaker-open", d.BreakerOpen, "credit-exhaustion: the tenant's burst_credit.breaker_open, where the fleet's config is unknown")
	fs.StringVar(&df.burstTenants, "burst-tenants", "", "deferred-burst: the bursting tenant:model:share,… (their shares of --burst-rate; default: corpus:large:0.5,labels:large:0.5 self-contained; required otherwise), at least two of different weights on one replica for the fair order to show")
	fs.Float64Var(&d.BurstRate, "burst-rate", d.BurstRate, "deferred-burst: the bursting tenants' Admits/s before and after the burst (Poisson, interactive)")
	fs.Float64Var(&d.BurstFactor, "burst-factor", d.BurstFactor, "deferred-burst: the burst is this many times --burst-rate, every other request deferrable")
	fs.IntVar(&d.Workers, "workers", d.Workers, "deferred-burst: the worker pool's Claim streams on each replica")
	fs.IntVar(&d.WorkerInFlight, "worker-in-flight", d.WorkerInFlight, "deferred-burst: each Claim stream's max_in_flight")
	fs.DurationVar(&d.WorkerRun, "worker-run", d.WorkerRun, "deferred-burst: how long a worker runs each ticket before its Release")
	fs.DurationVar(&d.DrainWithin, "drain-within", d.DrainWithin, "deferred-burst: bound on the time from the burst's end until every ticket is done")
	fs.Float64Var(&d.ShareTolerance, "share-tolerance", d.ShareTolerance, "deferred-burst: a backlogged tenant's share of a second's claimed work may differ from its weight's share by this much")
	fs.StringVar(&df.config, "config", "", "a fleet the drill did not start: its config file, where the tenants' floors, quotas and breaker are read (default: the config in etcd, else each tenant's replica is asked, which in batched mode knows only its share)")
	fs.DurationVar(&df.duration, "duration", 30*time.Minute, "soak: how long to run random drills back to back")
	fs.StringVar(&df.tracePath, "trace", "", "play a trace's arrivals and token counts instead of Poisson arrivals (a trace file as replay's --trace, e.g. testdata/traces/AzureLLMInferenceTrace_code.csv): an azure trace's rows are given the --tenants mix; its times are scaled to a mean of --rate; each drill starts at another offset into it")
}

// runDrill runs drill.
func runDrill(g *globals, c *cobra.Command, df *drillFlags, pos []string) error {
	// The fleet's children and the drill's watchers write progress from
	// their own goroutines.
	errw := io.Writer(&lockedWriter{w: g.stderr})
	d := df.d
	set := map[string]bool{}
	c.Flags().Visit(func(f *pflag.Flag) { set[f.Name] = true })
	var err error
	name, target := pos[0], ""
	if len(pos) == 2 {
		target = pos[1]
	}
	if name != "all" && name != "soak" && !slices.Contains(drill.Names, name) {
		return fmt.Errorf("drill %q: want one of %s, all or soak", name, strings.Join(drill.Names, ", "))
	}
	if (name == "all" || name == "soak") && target != "" {
		return fmt.Errorf("drill %s picks its own targets: no TARGET", name)
	}
	if set["duration"] && name != "soak" {
		return errors.New("--duration is the soak's")
	}
	if df.duration <= 0 {
		return fmt.Errorf("--duration %v: want a positive duration", df.duration)
	}
	if df.fault != "" && (df.fault != "ignore-drains" || !df.self) {
		return fmt.Errorf("--fault %q: the only fault is ignore-drains, with --self-contained", df.fault)
	}
	switch df.redisMode {
	case drill.ModeBatched, drill.ModeStrict, drill.ModeEmbedded:
	default:
		return fmt.Errorf("--redis-mode %q: want batched, strict or embedded", df.redisMode)
	}
	if df.redisInterval <= 0 {
		return fmt.Errorf("--redis-interval %v: want a positive duration", df.redisInterval)
	}
	if df.self {
		for _, f := range []string{"etcd", "server", "stop", "start", "config", "redis-mode", "redis-interval"} {
			if set[f] {
				return fmt.Errorf("--%s names a fleet the drill did not start: not with --self-contained", f)
			}
		}
	} else {
		for _, f := range []string{"sluiced", "agent", "fleet-log", "fault"} {
			if set[f] {
				return fmt.Errorf("--%s is for --self-contained", f)
			}
		}
		d.Tenants, _ = load.ParseTenants(defaultLoadTenants)
		d.QuotaTenant, d.CreditTenant, d.BurstTenants = "", "", nil
		if !set["breaker-open"] {
			d.BreakerOpen = 60e9 // the config's default breaker_open
		}
	}
	if df.tenants != "" {
		if d.Tenants, err = load.ParseTenants(df.tenants); err != nil {
			return err
		}
	}
	if set["quota-tenant"] {
		d.QuotaTenant = df.quotaTenant
	}
	if set["credit-tenant"] {
		d.CreditTenant = df.creditTenant
	}
	if name == drill.CreditExhaustion && d.CreditTenant == "" {
		return errors.New("credit-exhaustion: give --credit-tenant (a tenant whose tier lends burst credit) and --breaker-open")
	}
	if df.burstTenants != "" {
		if d.BurstTenants, err = load.ParseTenants(df.burstTenants); err != nil {
			return fmt.Errorf("--burst-tenants: %w", err)
		}
	}
	if name == drill.DeferredBurst && len(d.BurstTenants) == 0 {
		return errors.New("deferred-burst: give --burst-tenants (tenants whose workers claim their deferred work), at least two of different weights")
	}
	if set["during"] {
		d.BurstFor = d.During // the burst is deferred-burst's fault
	}
	if !(d.BurstRate > 0) || !(d.BurstFactor >= 1) || d.Workers < 1 || d.WorkerInFlight < 1 || d.WorkerRun < 0 || d.DrainWithin <= 0 {
		return errors.New("--burst-rate and --drain-within must be positive, --burst-factor at least 1, --workers and --worker-in-flight at least 1, --worker-run not negative")
	}
	if d.Rate <= 0 || d.Before <= 0 || d.During <= 0 || d.After <= 0 {
		return errors.New("--rate, --before, --during and --after must be positive")
	}
	if df.tracePath != "" {
		if d.Arrivals, err = drillTrace(df.tracePath, d.Tenants, d.Rate, d.Seed); err != nil {
			return err
		}
	}
	if df.fleetLog {
		d.Log = errw
	}
	progress := errw

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var fleet *drill.Fleet
	if df.self {
		fmt.Fprintln(progress, "sluicectl drill: starting the self-contained fleet…")
		var logw io.Writer
		if df.fleetLog {
			logw = errw
		}
		fleet, err = drill.StartLocal(ctx, drill.LocalOptions{Replicas: df.replicas, Sluiced: df.sluiced, Agent: df.agent,
			Log: logw, IgnoreDrains: df.fault == "ignore-drains"})
		if err != nil {
			return fmt.Errorf("self-contained fleet: %w", err)
		}
	} else {
		co := drill.ConnectOptions{Prefix: g.etcdPrefix(), Sec: g.sec, Timeout: g.timeout, MemberTTL: df.memberTTL,
			Mode: df.redisMode, Interval: df.redisInterval}
		if set["replicas"] {
			co.Replicas = df.replicas
		}
		if df.stopCmd != "" || df.startCmd != "" {
			co.Faults = drill.ShellFaults{StopCmd: df.stopCmd, StartCmd: df.startCmd, Log: errw}
		}
		switch {
		case g.etcd.endpoints != "":
			cli, err := g.etcdClient()
			if err != nil {
				return err
			}
			defer cli.Close()
			co.Etcd = cli
		case g.server != "":
			co.Servers = strings.Split(g.server, ",")
		default:
			return errors.New("which fleet? --etcd (or SLUICE_ETCD), --server ADDR[,ADDR…], or --self-contained")
		}
		if df.config != "" {
			c, err := config.Load(df.config)
			if err != nil {
				return err
			}
			d.Config = &c
		} else if co.Etcd != nil {
			cctx, cancel := context.WithTimeout(ctx, g.timeout)
			d.Config, err = drill.EtcdConfig(cctx, co.Etcd, co.Prefix)
			cancel()
			if err != nil {
				return err
			}
		}
		if fleet, err = drill.Connect(ctx, co); err != nil {
			return err
		}
	}
	defer fleet.Close()
	if df.self {
		if d.Config, err = drill.FleetPolicy(); err != nil {
			return err
		}
	}
	d.Log = progress
	names := []string{name}
	if name == "all" {
		names = drill.Names
	}
	sum := &drill.Summary{Held: true}
	if name == "soak" {
		names = nil
		if sum = drill.Soak(ctx, fleet, df.duration, d, d.Seed); ctx.Err() != nil {
			return fmt.Errorf("drill soak: interrupted: %w", ctx.Err())
		}
	}
	for _, n := range names {
		rep, err := drill.Run(ctx, fleet, n, target, d)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("drill %s: interrupted: %w", n, ctx.Err())
			}
			sum.Held = false
			sum.Errors = append(sum.Errors, fmt.Sprintf("%s: %v", n, err))
			fmt.Fprintf(errw, "sluicectl drill %s: not run: %v\n", n, err)
			continue
		}
		sum.Reports = append(sum.Reports, rep)
		sum.Held = sum.Held && rep.Held
	}
	if err := g.out().write(sum.WriteJSON, sum.WriteTable); err != nil {
		return err
	}
	if !sum.Held {
		return errPromiseBroken
	}
	return nil
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// Write implements io.Writer.
func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// drillTrace reads a trace for a drill's load: an azure trace's rows get
// the mix's tenants and models (drawn by seed); the times are scaled so
// that the mean rate is rate.
func drillTrace(path string, mix []load.Mix, rate float64, seed uint64) ([]load.Arrival, error) {
	entries := make([]replay.MixEntry, len(mix))
	for i, m := range mix {
		entries[i] = replay.MixEntry{Tenant: m.Tenant, Model: m.Model, Share: m.Share}
	}
	rows, err := replay.LoadTrace(path, replay.TraceOptions{Mix: entries, Seed: seed, Speed: 1})
	if err != nil {
		return nil, err
	}
	if len(rows) < 2 || rows[len(rows)-1].At <= rows[0].At {
		return nil, fmt.Errorf("--trace %s: want at least two rows at different times", path)
	}
	scale := float64(len(rows)) / (rate * (rows[len(rows)-1].At - rows[0].At).Seconds())
	out := make([]load.Arrival, len(rows))
	for i, r := range rows {
		out[i] = load.Arrival{At: time.Duration(float64(r.At-rows[0].At) * scale), Tenant: r.Tenant, Model: r.Model, Prompt: r.Prompt, Output: r.Output}
	}
	return out, nil
}
