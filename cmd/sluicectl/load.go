package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/sluice-sched/sluice/admission/client"
	"github.com/sluice-sched/sluice/admission/client/etcdmembers"
	"github.com/sluice-sched/sluice/internal/controlplane"
	"github.com/sluice-sched/sluice/internal/load"
)

func init() {
	register(command{
		name:    "load",
		summary: "live gRPC load on a server or fleet: closed/open loop or a trace; rates, refusals, HDR latencies, beside health Check",
		run:     runLoad,
	})
}

// defaultLoadTenants is --tenants' default: the embedded config's demo
// tenants, as the replay examples mix them, on the small model.
const defaultLoadTenants = "acme:small:0.4,globex:small:0.3,initech:small:0.2,hooli:small:0.1"

// runLoad offers live load to one sluiced (--server) or to the replicas
// registered in etcd (--etcd without --server, routed by rendezvous as
// client.Router does) and prints what came back; with --reference health
// it runs the same callers against the server's health Check in
// alternating rounds and prints the ratio.
func runLoad(args []string, out, errw io.Writer) error {
	fs := flag.NewFlagSet("sluicectl load", flag.ContinueOnError)
	fs.SetOutput(errw)
	var ef etcdFlags
	ef.register(fs)
	var sf serverFlags
	sf.register(fs)
	var tf traceFlags
	tf.register(fs)
	server := fs.String("server", "", "sluiced gRPC address (default localhost:7070; with --etcd and no --server: every replica registered there, each tenant routed to its replica by rendezvous)")
	concurrency := fs.Int("concurrency", 16, "closed loop: callers, each Admit, hold, Release, again")
	rate := fs.Float64("rate", 0, "open loop: arrivals per second (0: closed loop)")
	arrivals := fs.String("arrivals", "poisson", "open loop arrivals: poisson (exponential gaps, seeded) or fixed (evenly spaced)")
	maxInFlight := fs.Int("max-in-flight", 10000, "open loop and trace: calls outstanding at most; an arrival past it is dropped and counted")
	tenants := fs.String("tenants", defaultLoadTenants, "closed and open loops: tenant:model:share,… each call's tenant and model, drawn by --seed")
	prompt := fs.Int64("prompt", 100, "closed and open loops: prompt tokens per request")
	output := fs.Int64("output", 10, "closed and open loops: max output tokens per request (also the output each Release reports)")
	accept := fs.String("accept-downgrade", "", "lower model tiers every request accepts, comma-separated (e.g. medium,small)")
	duration := fs.Duration("duration", 10*time.Second, "how long calls start, per round (trace: default the whole trace)")
	deadline := fs.Duration("deadline", 2*time.Second, "each Admit's gRPC deadline, the request's deadline in sluiced's queue (0: none; the server's queue.default_wait)")
	hold := fs.Duration("hold", 0, "how long each lease is held before its Release")
	release := fs.Bool("release", true, "release each lease after --hold; false: Admit only, leases accumulate until the server's leases.ttl")
	requestIDs := fs.Bool("request-ids", true, "send a unique request_id with every Admit, as the Go client does")
	conns := fs.Int("conns", 1, "gRPC connections to the server, shared by the callers")
	reference := fs.String("reference", "", `"health": also run the same callers against the server's gRPC health Check and print the ratio`)
	rounds := fs.Int("rounds", 1, "with --reference: rounds of load and reference, alternating which goes first")
	serverPID := fs.Int("server-pid", 0, "the server's process id, when it runs on this machine: its CPU time per call is reported beside the client's (from /proc)")
	prefill := fs.Int("prefill", 0, "admit this many leases before measuring and hold them through the run (released at the end unless --release=false)")
	format := fs.String("o", "table", "output format: table or json")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := checkFormat(*format); err != nil {
		return err
	}
	opts := load.Options{Concurrency: *concurrency, Rate: *rate, MaxInFlight: *maxInFlight, Prompt: *prompt, Output: *output,
		Duration: *duration, Deadline: *deadline, Hold: *hold, Release: *release, RequestIDs: *requestIDs, Seed: tf.seed,
		ServerPID: *serverPID}
	switch *arrivals {
	case "poisson":
		opts.Poisson = true
	case "fixed":
	default:
		return fmt.Errorf("--arrivals %q: want poisson or fixed", *arrivals)
	}
	if *accept != "" {
		opts.AcceptDowngrade = strings.Split(*accept, ",")
	}
	switch {
	case tf.path != "":
		opts.Mode = load.ModeTrace
		for _, f := range []string{"rate", "concurrency", "tenants", "prompt", "output", "arrivals"} {
			if set[f] {
				return fmt.Errorf("--%s is for the closed and open loops; --trace gives the arrivals, tenants (--mix) and tokens", f)
			}
		}
		if !set["duration"] {
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
	case *rate != 0 || set["rate"]:
		opts.Mode = load.ModeOpen
		if set["concurrency"] {
			return errors.New("--concurrency is the closed loop's; the open loop (--rate) bounds its calls with --max-in-flight")
		}
	default:
		opts.Mode = load.ModeClosed
		for _, f := range []string{"arrivals", "max-in-flight"} {
			if set[f] {
				return fmt.Errorf("--%s is for the open loop (--rate) and --trace", f)
			}
		}
	}
	for _, f := range []string{"mix", "format", "speed", "from", "to", "burst"} {
		if set[f] && opts.Mode != load.ModeTrace {
			return fmt.Errorf("--%s needs --trace", f)
		}
	}
	if opts.Mode != load.ModeTrace {
		m, err := load.ParseTenants(*tenants)
		if err != nil {
			return err
		}
		opts.Tenants = m
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	switch *reference {
	case "", "health":
	default:
		return fmt.Errorf("--reference %q: want health (or nothing)", *reference)
	}
	if *rounds < 1 {
		return fmt.Errorf("--rounds %d: want at least 1", *rounds)
	}
	if *rounds > 1 && *reference == "" {
		return errors.New("--rounds alternates the load with the reference: it needs --reference health")
	}
	if *conns < 1 {
		return fmt.Errorf("--conns %d: want at least 1", *conns)
	}
	if *serverPID < 0 {
		return fmt.Errorf("--server-pid %d: want a process id", *serverPID)
	}
	if *prefill < 0 {
		return fmt.Errorf("--prefill %d: want ≥ 0", *prefill)
	}
	if *prefill > 0 && opts.Mode == load.ModeTrace {
		return errors.New("--prefill admits leases of --tenants: it is for the closed and open loops, not --trace")
	}
	fleet := *server == "" && ef.endpoints != ""
	if fleet && *reference != "" {
		return errors.New("--reference runs against one server: give --server (the fleet's replicas are measured one at a time)")
	}
	if fleet && set["conns"] {
		return errors.New("--conns is for one server: with --etcd the Router holds one connection per replica")
	}
	if *server == "" && !fleet {
		*server = "localhost:7070"
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
		cli, err := ef.client()
		if err != nil {
			return err
		}
		defer cli.Close()
		prefix := controlplane.NormalizePrefix(ef.prefix)
		router := client.NewRouter(etcdmembers.NewSource(cli, prefix, slog.New(slog.NewTextHandler(errw, nil))),
			sf.sec.Dialer(), client.WithMaxAttempts(1))
		defer router.Close()
		wctx, cancel := context.WithTimeout(ctx, ef.timeout)
		select {
		case <-router.Ready():
		case <-wctx.Done():
			cancel()
			return fmt.Errorf("etcd %s: no member list within --timeout %v", ef.endpoints, ef.timeout)
		}
		cancel()
		if len(router.Members()) == 0 {
			return fmt.Errorf("etcd %s: no sluiced replica is registered under %s", ef.endpoints, prefix)
		}
		targets = []load.Target{router}
		target = fmt.Sprintf("the %d replicas registered in etcd", len(router.Members()))
		leaseSum = func(ctx context.Context) (int64, error) {
			views, err := fleetViews(ctx, cli, prefix, sf.sec, errw)
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
		for range *conns {
			conn, err := dialServer(*server, sf.sec)
			if err != nil {
				return err
			}
			defer conn.Close()
			targets = append(targets, load.NewTarget(conn))
			grpcs = append(grpcs, conn)
		}
		target = *server
		leaseSum = func(ctx context.Context) (int64, error) { return load.LeasesHeld(ctx, grpcs[0]) }
	}

	var held []load.Lease
	if *prefill > 0 {
		var err error
		fmt.Fprintf(errw, "sluicectl load: prefilling %d leases…\n", *prefill)
		if held, err = load.Prefill(ctx, opts, targets, *prefill); err != nil {
			return err
		}
	}
	var refConns []grpc.ClientConnInterface
	if *reference == "health" {
		refConns = grpcs
	}
	rep, err := load.Compare(ctx, opts, targets, refConns, *rounds)
	if err != nil {
		return err
	}
	rep.Target, rep.Connections, rep.Prefilled = target, len(grpcs), int64(len(held))
	if fleet {
		rep.Connections = 0
	}
	lctx, cancel := context.WithTimeout(ctx, ef.timeout)
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
	if *format == "json" {
		return rep.WriteJSON(out)
	}
	return rep.WriteTable(out)
}
