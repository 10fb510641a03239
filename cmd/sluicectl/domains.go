package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-sched/sluice/admission/client"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/controlplane"
)

func init() {
	register(command{
		name:    "domains",
		summary: "list domains: draining state and in-flight leases (a server or every replica), drain marks (etcd)",
		run:     runDomains,
	})
}

// domainRow is one line of `sluicectl domains`: the replicas' view of the
// domain (one server's, or every registered replica's) and the drain mark in
// etcd (when there is one).
type domainRow struct {
	ID           string  `json:"id"`
	Kind         string  `json:"kind,omitempty"`
	GPUs         int64   `json:"gpus"`
	Draining     bool    `json:"draining"` // on every replica that has the domain
	DrainReason  string  `json:"drain_reason,omitempty"`
	InFlight     int64   `json:"in_flight"`     // summed over the replicas
	HealthWeight float64 `json:"health_weight"` // the lowest of the replicas'
	OnServer     bool    `json:"on_server"`     // some replica has the domain
	// WarmupFraction is the share of its shared capacity the domain has
	// while it warms up after a return (the lowest of the replicas'; 1 when
	// whole); WarmupLeftSeconds is the longest time left.
	WarmupFraction    float64 `json:"warmup_fraction"`
	WarmupLeftSeconds float64 `json:"warmup_left_seconds,omitempty"`
	// Replicas is each answering replica's view, with --etcd and no
	// --server: a replica that has not applied a mark shows here.
	Replicas []replicaDomain         `json:"replicas,omitempty"`
	Mark     *controlplane.DrainMark `json:"drain_mark,omitempty"`
}

// replicaDomain is one replica's view of a domain.
type replicaDomain struct {
	Replica      string  `json:"replica"`
	Has          bool    `json:"has"` // false: the replica does not have the domain
	Draining     bool    `json:"draining"`
	DrainReason  string  `json:"drain_reason,omitempty"`
	InFlight     int64   `json:"in_flight"`
	HealthWeight float64 `json:"health_weight"`
}

// runDomains lists the domains of the sluiced at --server or, with --etcd
// and no --server, of every replica registered in etcd (in-flight leases
// summed, each replica's draining state shown), beside the drain marks in
// etcd, so that an SRE sees both whether a drain was asked for and whether
// every replica acts on it, and how many leases are still in flight there.
// --server "" with --etcd lists the marks only, asking no replica.
// Warnings (member entries that are not members, no replica answering) go
// to errw, so that -o json on out stays parsable.
func runDomains(args []string, out, errw io.Writer) error {
	fs := flag.NewFlagSet("sluicectl domains", flag.ContinueOnError)
	fs.SetOutput(out)
	var ef etcdFlags
	ef.register(fs)
	var sf serverFlags
	sf.register(fs)
	server := fs.String("server", "", `one sluiced's gRPC address (default: every replica registered in etcd with --etcd, else localhost:7070; "" with --etcd: the drain marks only)`)
	format := fs.String("o", "table", "output format: table or json")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *format != "table" && *format != "json" {
		return fmt.Errorf("-o %q: want table or json", *format)
	}
	serverSet := false
	fs.Visit(func(f *flag.Flag) { serverSet = serverSet || f.Name == "server" })
	marksOnly := serverSet && *server == ""
	switch {
	case marksOnly && ef.endpoints == "":
		return errors.New(`--server "" lists the drain marks only: it needs --etcd (or SLUICE_ETCD)`)
	case *server == "" && ef.endpoints == "":
		*server = "localhost:7070"
	}
	fleet := *server == "" && !marksOnly
	ctx, cancel := context.WithTimeout(context.Background(), ef.timeout)
	defer cancel()
	rows := map[string]*domainRow{}
	var views []replicaView
	if *server != "" {
		resp, err := listDomains(ctx, *server, sf.sec)
		if err != nil {
			return err
		}
		views = []replicaView{{Member: client.Member{ID: *server, Addr: *server}, domains: resp.GetDomains(), freeze: resp.GetCreditFreeze()}}
	}
	var freezeMark *controlplane.CreditFreezeMark
	var unreachable []error
	if ef.endpoints != "" {
		cli, err := ef.client()
		if err != nil {
			return err
		}
		defer cli.Close()
		prefix := controlplane.NormalizePrefix(ef.prefix)
		if fleet {
			if views, err = fleetViews(ctx, cli, prefix, sf.sec, errw); err != nil {
				return err
			}
			for _, v := range views {
				if v.err != nil {
					unreachable = append(unreachable, fmt.Errorf("replica %s (%s): %w", v.ID, v.Addr, v.err))
				}
			}
		}
		marks, err := controlplane.ListDrains(ctx, cli, prefix)
		if err != nil {
			return err
		}
		if m, ok, err := controlplane.GetCreditFreeze(ctx, cli, prefix); err != nil {
			return err
		} else if ok && m.Until.After(time.Now()) {
			freezeMark = &m
		}
		for _, m := range marks {
			rows[m.Domain] = &domainRow{ID: m.Domain, Mark: &m}
		}
	}
	addViews(rows, views, fleet)
	list := make([]domainRow, 0, len(rows))
	for _, r := range rows {
		list = append(list, *r)
	}
	slices.SortFunc(list, func(a, b domainRow) int { return cmp.Compare(a.ID, b.ID) })
	answered := len(views) - len(unreachable)
	if *format == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(list); err != nil {
			return err
		}
	} else {
		writeFreeze(out, views, freezeMark)
		if err := writeDomains(out, list, answered > 0, ef.endpoints != "", fleet); err != nil {
			return err
		}
	}
	switch {
	case fleet && len(views) == 0:
		fmt.Fprintln(errw, "sluicectl domains: no replica registered in etcd; the drain marks only")
	case fleet && answered == 0:
		fmt.Fprintf(errw, "sluicectl domains: none of the %d registered replicas answered; the drain marks only\n", len(views))
	}
	return errors.Join(unreachable...)
}

// addViews merges the replicas' answers into rows: in-flight counts summed,
// draining only when every replica that has the domain drains it, the lowest
// health weight. In fleet mode each replica's view is kept in the row.
func addViews(rows map[string]*domainRow, views []replicaView, fleet bool) {
	for _, v := range views {
		if v.err != nil {
			continue
		}
		for _, d := range v.domains {
			r := rows[d.GetId()]
			if r == nil {
				r = &domainRow{ID: d.GetId()}
				rows[d.GetId()] = r
			}
			if !r.OnServer {
				r.Kind, r.GPUs, r.HealthWeight, r.Draining, r.DrainReason = d.GetKind(), d.GetGpus(), d.GetHealthWeight(), true, d.GetDrainReason()
				r.WarmupFraction = 1
			}
			r.OnServer = true
			if left := d.GetWarmupLeft().AsDuration(); left > 0 { // an older server sends neither field: whole
				r.WarmupFraction = min(r.WarmupFraction, d.GetWarmupFraction())
				r.WarmupLeftSeconds = max(r.WarmupLeftSeconds, left.Seconds())
			}
			r.InFlight += d.GetInFlight()
			r.HealthWeight = min(r.HealthWeight, d.GetHealthWeight())
			r.Draining = r.Draining && d.GetDraining()
			if fleet {
				r.Replicas = append(r.Replicas, replicaDomain{Replica: v.ID, Has: true, Draining: d.GetDraining(),
					DrainReason: d.GetDrainReason(), InFlight: d.GetInFlight(), HealthWeight: d.GetHealthWeight()})
			}
		}
	}
	if !fleet {
		return
	}
	for _, r := range rows { // the replicas that lack the domain
		for _, v := range views {
			if v.err == nil && !slices.ContainsFunc(r.Replicas, func(rd replicaDomain) bool { return rd.Replica == v.ID }) {
				r.Replicas = append(r.Replicas, replicaDomain{Replica: v.ID})
			}
		}
		slices.SortFunc(r.Replicas, func(a, b replicaDomain) int { return cmp.Compare(a.Replica, b.Replica) })
	}
}

// drainingCell renders the DRAINING column: yes or no on one server; over
// the fleet "yes"/"no" when every replica agrees, else how many drain it and
// which do not (or lack the domain).
func drainingCell(r domainRow, fleet bool) string {
	if !fleet || len(r.Replicas) <= 1 {
		if r.Draining {
			return "yes"
		}
		return "no"
	}
	var n int
	var not []string
	for _, rd := range r.Replicas {
		switch {
		case rd.Draining:
			n++
		case !rd.Has:
			not = append(not, rd.Replica+" (absent)")
		default:
			not = append(not, rd.Replica)
		}
	}
	switch {
	case n == len(r.Replicas):
		return fmt.Sprintf("yes (%d/%d)", n, n)
	case n == 0 && !slices.ContainsFunc(r.Replicas, func(rd replicaDomain) bool { return !rd.Has }):
		return "no"
	}
	return fmt.Sprintf("%d/%d, not: %s", n, len(r.Replicas), strings.Join(not, " "))
}

// writeDomains prints the table; columns a source did not fill are "-".
// server says whether some replica answered: only then is a domain of no
// replica "(not on the replicas)".
func writeDomains(w io.Writer, list []domainRow, server, etcd, fleet bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tKIND\tGPUS\tDRAINING\tIN FLIGHT\tHEALTH\tCAPACITY\tDRAIN MARK")
	for _, r := range list {
		kind, gpus, draining, inflight, health, capacity := "-", "-", "-", "-", "-", "-"
		if r.OnServer {
			kind, gpus, inflight = r.Kind, fmt.Sprint(r.GPUs), fmt.Sprint(r.InFlight)
			draining, health = drainingCell(r, fleet), fmt.Sprintf("%.2f", r.HealthWeight)
			capacity = warmupCell(r)
		} else if server {
			kind = "(not on the replicas)"
			if !fleet {
				kind = "(not on the server)"
			}
		}
		mark := "-"
		switch {
		case r.Mark != nil:
			mark = r.Mark.Describe()
		case r.Draining:
			mark = "(none; " + r.DrainReason + ")" // drained on the replicas only
		case slices.ContainsFunc(r.Replicas, func(rd replicaDomain) bool { return rd.Draining }):
			mark = "(none; drained by the Operator RPC on some replicas)"
		case !etcd:
			mark = "(no --etcd)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, kind, gpus, draining, inflight, health, capacity, mark)
	}
	return tw.Flush()
}

// warmupCell renders the CAPACITY column: "full", or the warm-up ramp of a
// domain that returned ("warming 40% (36s left)").
func warmupCell(r domainRow) string {
	if r.WarmupLeftSeconds <= 0 {
		return "full"
	}
	return fmt.Sprintf("warming %.0f%% (%s left)", 100*r.WarmupFraction, (time.Duration(r.WarmupLeftSeconds * float64(time.Second))).Round(time.Second))
}

// writeFreeze prints a line above the table while burst credit is frozen:
// the etcd mark's, and how many answering replicas apply a freeze.
func writeFreeze(w io.Writer, views []replicaView, mark *controlplane.CreditFreezeMark) {
	if mark != nil {
		fmt.Fprintf(w, "burst credit: FROZEN until %s (%s left; etcd mark, %s)\n",
			mark.Until.UTC().Format(time.RFC3339), time.Until(mark.Until).Round(time.Second), mark.Describe())
	}
	answered, frozen := 0, 0
	var first *admissionv1.CreditFreeze
	for _, v := range views {
		if v.err != nil {
			continue
		}
		answered++
		if v.freeze != nil {
			frozen++
			if first == nil {
				first = v.freeze
			}
		}
	}
	switch {
	case frozen == 0:
		return
	case answered == 1:
		fmt.Fprintf(w, "burst credit: FROZEN until %s (%s left): %s\n",
			first.GetUntil().AsTime().UTC().Format(time.RFC3339), time.Until(first.GetUntil().AsTime()).Round(time.Second), first.GetReason())
	default:
		fmt.Fprintf(w, "burst credit: frozen on %d of %d replicas\n", frozen, answered)
	}
}
