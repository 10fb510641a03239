package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/sluice-sched/sluice/admission/client"
	"github.com/sluice-sched/sluice/admission/client/etcdmembers"
	"github.com/sluice-sched/sluice/internal/load"
)

// defaultLoadTenants is --tenants' default: the embedded config's demo
// tenants, as the replay examples mix them, on the small model.
const defaultLoadTenants = "acme:small:0.4,globex:small:0.3,initech:small:0.2,hooli:small:0.1"

// newLoadCmd is `sluicectl load`: live load on one sluiced (--server) or
// on the replicas registered in etcd (--etcd without --server, routed by
// rendezvous as client.Router does), and what came back; with --reference
// health it runs the same callers against the server's health Check in
// alternating rounds and prints the ratio.
func newLoadCmd(g *globals) *cobra.Command {
	var lf loadFlags
	c := &cobra.Command{
		Use:   "load",
		Short: "Live gRPC load on a server or fleet: closed/open loop or a trace; rates, refusals, HDR latencies, beside health Check",
		Long: `Offer live gRPC load to one sluiced (--server) or to every replica registered
in etcd (--etcd and no --server; each tenant routed to its replica by
rendezvous), from outside its process: a closed loop of --concurrency
callers, an open loop at --rate, or a trace's arrivals (--trace). It prints
the calls and Admit calls per second, the admissions and refusals by tenant,
HdrHistogram latencies and the first error message of each kind; with
--reference health, the same callers against the server's health Check in
alternating rounds, and the ratio.

--tenant-pool draws each call's tenant from many generated names (a fleet's
million tenants) without listing them; --churn drains, undrains and cuts
the health weight of the server's domains while the load runs.`,
		Example: `  sluicectl load --server localhost:7070
  sluicectl load --rate 500 --arrivals poisson --duration 30s --deadline 2s -o json
  sluicectl load --reference health --rounds 6 --duration 5s
  sluicectl load --tenant-pool fleet-%06d:100000:small --churn --reference health --rounds 4`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error { return runLoad(g, c, &lf) },
	}
	lf.register(c)
	return c
}

// loadFlags are load's own flags.
type loadFlags struct {
	trace                                traceFlags
	concurrency, maxInFlight, conns      int
	rounds, serverPID, prefill           int
	rate                                 float64
	arrivals, tenants, accept, reference string
	pool, order                          string
	prompt, output                       int64
	duration, deadline, hold             time.Duration
	release, requestIDs, churn           bool
	churnRate                            float64
	openai                               openAIFlags
}

// register adds the flags to c.
func (lf *loadFlags) register(c *cobra.Command) {
	lf.trace.register(c)
	fs := c.Flags()
	fs.IntVar(&lf.concurrency, "concurrency", 16, "closed loop: callers, each Admit, hold, Release, again")
	fs.Float64Var(&lf.rate, "rate", 0, "open loop: arrivals per second (0: closed loop)")
	fs.StringVar(&lf.arrivals, "arrivals", "poisson", "open loop arrivals: poisson (exponential gaps, seeded) or fixed (evenly spaced)")
	fs.IntVar(&lf.maxInFlight, "max-in-flight", 10000, "open loop and trace: calls outstanding at most; an arrival past it is dropped and counted")
	fs.StringVar(&lf.tenants, "tenants", defaultLoadTenants, "closed and open loops: tenant:model:share,… each call's tenant and model, drawn by --seed")
	fs.StringVar(&lf.pool, "tenant-pool", "", "closed and open loops, instead of --tenants: pattern:count:model[:share],… each entry count tenants named by pattern "+
		"(one %d or %0Nd) with 0…count-1, e.g. fleet-%06d:100000:small (sluicectl fleet generate prints the value for its tenants); each call draws one, as --tenant-order says")
	fs.StringVar(&lf.order, "tenant-order", "random", "how --tenant-pool draws: random (each call any name, by --seed) or sequential (the names in turn, shared by the callers: n calls reach min(n, count) tenants)")
	fs.Int64Var(&lf.prompt, "prompt", 100, "closed and open loops: prompt tokens per request")
	fs.Int64Var(&lf.output, "output", 10, "closed and open loops: max output tokens per request (also the output each Release reports)")
	fs.StringVar(&lf.accept, "accept-downgrade", "", "lower model tiers every request accepts, comma-separated (e.g. medium,small)")
	fs.DurationVar(&lf.duration, "duration", 10*time.Second, "how long calls start, per round (trace: default the whole trace)")
	fs.DurationVar(&lf.deadline, "deadline", 2*time.Second, "each Admit's gRPC deadline, the request's deadline in sluiced's queue (0: none; the server's queue.default_wait)")
	fs.DurationVar(&lf.hold, "hold", 0, "how long each lease is held before its Release")
	fs.BoolVar(&lf.release, "release", true, "release each lease after --hold; false: Admit only, leases accumulate until the server's leases.ttl")
	fs.BoolVar(&lf.requestIDs, "request-ids", true, "send a unique request_id with every Admit, as the Go client does")
	fs.IntVar(&lf.conns, "conns", 1, "gRPC connections to the server, shared by the callers")
	fs.StringVar(&lf.reference, "reference", "", `"health": also run the same callers against the server's gRPC health Check and print the ratio`)
	fs.IntVar(&lf.rounds, "rounds", 1, "with --reference: rounds of load and reference, alternating which goes first")
	fs.IntVar(&lf.serverPID, "server-pid", 0, "the server's process id, when it runs on this machine: its CPU time per call is reported beside the client's (from /proc)")
	fs.IntVar(&lf.prefill, "prefill", 0, "admit this many leases before measuring and hold them through the run (released at the end unless --release=false)")
	fs.BoolVar(&lf.churn, "churn", false, "change placement during the load's rounds through the server's API, --churn-rate times a second: in turn drain a random domain, "+
		"cut a domain's health weight (an Admit released with OUTCOME_ERROR), undrain the domain drained longest ago; every drain is undone at each round's end")
	fs.Float64Var(&lf.churnRate, "churn-rate", 10, "with --churn: changes per second")
	lf.openai.register(c)
}

// runLoad runs load.
func runLoad(g *globals, c *cobra.Command, lf *loadFlags) error {
	errw := g.stderr
	set := func(name string) bool { return c.Flags().Changed(name) }
	tf := &lf.trace
	if lf.openai.url != "" {
		return runLoadOpenAI(g, c, lf)
	}
	if err := lf.openai.unused(set); err != nil {
		return err
	}
	opts := load.Options{Concurrency: lf.concurrency, Rate: lf.rate, MaxInFlight: lf.maxInFlight, Prompt: lf.prompt, Output: lf.output,
		Duration: lf.duration, Deadline: lf.deadline, Hold: lf.hold, Release: lf.release, RequestIDs: lf.requestIDs, Seed: tf.seed,
		ServerPID: lf.serverPID}
	switch lf.arrivals {
	case "poisson":
		opts.Poisson = true
	case "fixed":
	default:
		return fmt.Errorf("--arrivals %q: want poisson or fixed", lf.arrivals)
	}
	if lf.accept != "" {
		opts.AcceptDowngrade = strings.Split(lf.accept, ",")
	}
	switch {
	case tf.path != "":
		opts.Mode = load.ModeTrace
		for _, f := range []string{"rate", "concurrency", "tenants", "prompt", "output", "arrivals"} {
			if set(f) {
				return fmt.Errorf("--%s is for the closed and open loops; --trace gives the arrivals, tenants (--mix) and tokens", f)
			}
		}
		if !set("duration") {
			opts.Duration = 0
		}
		rows, err := tf.load()
		if err != nil {
			return err
		}
		opts.Arrivals = make([]load.Arrival, len(rows))
		for i, r := range rows {
			opts.Arrivals[i] = load.Arrival{At: r.At, Tenant: r.Tenant, Model: r.Model, Prompt: r.Prompt, Output: r.Output}
		}
	case lf.rate != 0 || set("rate"):
		opts.Mode = load.ModeOpen
		if set("concurrency") {
			return errors.New("--concurrency is the closed loop's; the open loop (--rate) bounds its calls with --max-in-flight")
		}
	default:
		opts.Mode = load.ModeClosed
		for _, f := range []string{"arrivals", "max-in-flight"} {
			if set(f) {
				return fmt.Errorf("--%s is for the open loop (--rate) and --trace", f)
			}
		}
	}
	for _, f := range []string{"mix", "format", "speed", "from", "to", "burst"} {
		if set(f) && opts.Mode != load.ModeTrace {
			return fmt.Errorf("--%s needs --trace", f)
		}
	}
	switch lf.order {
	case "random":
	case "sequential":
		opts.Sequential = true
	default:
		return fmt.Errorf("--tenant-order %q: want random or sequential", lf.order)
	}
	switch {
	case opts.Mode == load.ModeTrace:
		if set("tenant-pool") || set("tenant-order") {
			return errors.New("--tenant-pool and --tenant-order are for the closed and open loops; --trace gives the tenants (--mix)")
		}
	case set("tenant-pool"):
		if set("tenants") {
			return errors.New("--tenants and --tenant-pool: give one")
		}
		m, err := load.ParseTenantPools(lf.pool)
		if err != nil {
			return err
		}
		opts.Tenants = m
	default:
		if set("tenant-order") {
			return errors.New("--tenant-order is how --tenant-pool draws: it needs --tenant-pool")
		}
		m, err := load.ParseTenants(lf.tenants)
		if err != nil {
			return err
		}
		opts.Tenants = m
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	switch lf.reference {
	case "", "health":
	default:
		return fmt.Errorf("--reference %q: want health (or nothing)", lf.reference)
	}
	if lf.rounds < 1 {
		return fmt.Errorf("--rounds %d: want at least 1", lf.rounds)
	}
	if lf.rounds > 1 && lf.reference == "" {
		return errors.New("--rounds alternates the load with the reference: it needs --reference health")
	}
	if lf.conns < 1 {
		return fmt.Errorf("--conns %d: want at least 1", lf.conns)
	}
	if lf.serverPID < 0 {
		return fmt.Errorf("--server-pid %d: want a process id", lf.serverPID)
	}
	if lf.prefill < 0 {
		return fmt.Errorf("--prefill %d: want ≥ 0", lf.prefill)
	}
	if lf.prefill > 0 && opts.Mode == load.ModeTrace {
		return errors.New("--prefill admits leases of --tenants: it is for the closed and open loops, not --trace")
	}
	server := g.server
	fleet := server == "" && g.etcd.endpoints != ""
	if fleet && lf.reference != "" {
		return errors.New("--reference runs against one server: give --server (the fleet's replicas are measured one at a time)")
	}
	if set("churn-rate") && !lf.churn {
		return errors.New("--churn-rate is --churn's: it needs --churn")
	}
	if lf.churn && fleet {
		return errors.New("--churn changes one server's placement: give --server")
	}
	if lf.churn && opts.Mode == load.ModeTrace {
		return errors.New("--churn draws its health cuts' tenants from --tenants or --tenant-pool: it is for the closed and open loops, not --trace")
	}
	if fleet && set("conns") {
		return errors.New("--conns is for one server: with --etcd the Router holds one connection per replica")
	}
	if server == "" && !fleet {
		server = g.oneServer()
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var (
		targets  []load.Target
		grpcs    []grpc.ClientConnInterface
		leaseSum func(context.Context) (int64, error)
		target   string
	)
	if fleet {
		cli, err := g.etcdClient()
		if err != nil {
			return err
		}
		defer cli.Close()
		prefix := g.etcdPrefix()
		router := client.NewRouter(etcdmembers.NewSource(cli, prefix, slog.New(slog.NewTextHandler(errw, nil))),
			g.sec.Dialer(), client.WithMaxAttempts(1))
		defer router.Close()
		wctx, cancel := context.WithTimeout(ctx, g.timeout)
		select {
		case <-router.Ready():
		case <-wctx.Done():
			cancel()
			return fmt.Errorf("etcd %s: no member list within --timeout %v", g.etcd.endpoints, g.timeout)
		}
		cancel()
		if len(router.Members()) == 0 {
			return fmt.Errorf("etcd %s: no sluiced replica is registered under %s", g.etcd.endpoints, prefix)
		}
		targets = []load.Target{router}
		target = fmt.Sprintf("the %d replicas registered in etcd", len(router.Members()))
		leaseSum = func(ctx context.Context) (int64, error) {
			views, err := fleetViews(ctx, cli, prefix, g.sec, errw)
			if err != nil {
				return 0, err
			}
			var n int64
			for _, v := range views {
				if v.err != nil {
					return 0, fmt.Errorf("replica %s: %w", v.ID, v.err)
				}
				for _, d := range v.domains {
					n += d.GetInFlight()
				}
			}
			return n, nil
		}
	} else {
		g.note(server)
		for range lf.conns {
			conn, err := dialServer(server, g.sec)
			if err != nil {
				return err
			}
			defer conn.Close()
			targets = append(targets, load.NewTarget(conn))
			grpcs = append(grpcs, conn)
		}
		target = server
		leaseSum = func(ctx context.Context) (int64, error) { return load.LeasesHeld(ctx, grpcs[0]) }
	}

	if lf.churn {
		lctx, cancel := context.WithTimeout(ctx, g.timeout)
		ch, err := load.NewChurn(lctx, grpcs[0], targets[0], lf.churnRate, tf.seed)
		cancel()
		if err != nil {
			return serverErr(server, err)
		}
		opts.Churn = ch
	}
	var held []load.Lease
	if lf.prefill > 0 {
		var err error
		fmt.Fprintf(errw, "sluicectl load: prefilling %d leases…\n", lf.prefill)
		if held, err = load.Prefill(ctx, opts, targets, lf.prefill); err != nil {
			return err
		}
	}
	var refConns []grpc.ClientConnInterface
	if lf.reference == "health" {
		refConns = grpcs
	}
	rep, err := load.Compare(ctx, opts, targets, refConns, lf.rounds)
	if err != nil {
		if !fleet {
			return serverErr(server, err)
		}
		return err
	}
	rep.Target, rep.Connections, rep.Prefilled = target, len(grpcs), int64(len(held))
	if fleet {
		rep.Connections = 0
	}
	lctx, cancel := context.WithTimeout(ctx, g.timeout)
	if n, err := leaseSum(lctx); err != nil {
		rep.LeasesError = err.Error()
	} else {
		rep.LeasesHeld = &n
	}
	cancel()
	if !opts.Release {
		rep.Notes = append(rep.Notes, "--release=false: the leases stay on the server until its leases.ttl")
	}
	if len(held) > 0 && opts.Release {
		if failed, err := load.ReleaseLeases(ctx, targets, held, opts.Concurrency); err != nil {
			fmt.Fprintf(errw, "sluicectl load: %d of the %d prefilled leases were not released: %v\n", failed, len(held), err)
		}
	}
	return g.out().write(rep.WriteJSON, rep.WriteTable)
}
