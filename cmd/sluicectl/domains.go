package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-sched/sluice/admission/client"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/controlplane"
)

// newDomainCmd is `sluicectl domain list|drain|undrain`.
func newDomainCmd(g *globals) *cobra.Command {
	return group("domain", "List domains, drain and undrain them", `A domain is an NVLink domain: the unit a request never crosses. list shows
the replicas' view (draining state, in-flight leases, warm-up) beside the
drain marks in etcd; drain and undrain write and delete a domain's mark,
which every replica acts on within one watch round-trip.

The earlier names go on working: sluicectl domains, sluicectl drain DOMAIN,
sluicectl undrain DOMAIN.`,
		newDomainListCmd(g), newDrainCmd(g, true), newDrainCmd(g, false))
}

// domainRow is one line of `sluicectl domain list`: the replicas' view of the
// domain (one server's, or every registered replica's) and the drain mark in
// etcd (when there is one).
type domainRow struct {
	ID           string  `json:"id"`
	Kind         string  `json:"kind,omitempty"`
	GPUs         int64   `json:"gpus"`
	Draining     bool    `json:"draining"` // on every replica that has the domain
	DrainReason  string  `json:"drainReason,omitempty"`
	InFlight     int64   `json:"inFlight"`     // summed over the replicas
	HealthWeight float64 `json:"healthWeight"` // the lowest of the replicas'
	OnServer     bool    `json:"onServer"`     // some replica has the domain
	// WarmupFraction is the share of its shared capacity the domain has
	// while it warms up after a return (the lowest of the replicas'; 1 when
	// whole); WarmupLeftSeconds is the longest time left.
	WarmupFraction    float64 `json:"warmupFraction"`
	WarmupLeftSeconds float64 `json:"warmupLeftSeconds,omitempty"`
	// The capacity loop: the lowest of the replicas' corrections of the
	// model, the engines' last signals (the replica's that read them
	// last), and whether any replica sees them saturated or stale, or the
	// floors short.
	CapacityFactor       float64 `json:"capacityFactor"`
	EngineQueue          float64 `json:"engineQueue,omitempty"`
	EngineKVUsage        float64 `json:"engineKVUsage,omitempty"`
	EngineMetricsAgeSecs float64 `json:"engineMetricsAgeSeconds,omitempty"`
	EngineMetricsStale   bool    `json:"engineMetricsStale,omitempty"`
	EngineSaturated      bool    `json:"engineSaturated,omitempty"`
	FloorsShort          bool    `json:"floorsShort,omitempty"`
	// PrefillUse and DecodeUse are the shares of the domain's rates the
	// replicas' admissions took of late, summed over the replicas.
	PrefillUse    float64 `json:"prefillUse"`
	DecodeUse     float64 `json:"decodeUse"`
	engineAgeSeen bool
	// Replicas is each answering replica's view, with --etcd and no
	// --server: a replica that has not applied a mark shows here.
	Replicas []replicaDomain         `json:"replicas,omitempty"`
	Mark     *controlplane.DrainMark `json:"drainMark,omitempty"`
}

// replicaDomain is one replica's view of a domain.
type replicaDomain struct {
	Replica      string  `json:"replica"`
	Has          bool    `json:"has"` // false: the replica does not have the domain
	Draining     bool    `json:"draining"`
	DrainReason  string  `json:"drainReason,omitempty"`
	InFlight     int64   `json:"inFlight"`
	HealthWeight float64 `json:"healthWeight"`
}

// newDomainListCmd is `domain list` (also `domains`): the domains of the
// sluiced at --server or, with --etcd and no --server, of every replica
// registered in etcd (in-flight leases summed, each replica's draining
// state shown), beside the drain marks in etcd, so that an SRE sees both
// whether a drain was asked for and whether every replica acts on it, and
// how many leases are still in flight there. --server "" with --etcd lists
// the marks only, asking no replica. Warnings (member entries that are not
// members, no replica answering) go to stderr, so that -o json on stdout
// stays parsable.
func newDomainListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List domains: draining state, in-flight leases, warm-up (a server or every replica), drain marks (etcd)",
		Long: `List domains: the draining state, in-flight leases, health and capacity
(full, or warming after a return) of the sluiced at --server, or, with --etcd
and no --server, of every replica registered in etcd (in-flight leases
summed, a replica that does not drain a domain the others drain named),
beside the drain marks in etcd and a line while burst credit is frozen.
--server "" with --etcd lists the drain marks only, asking no replica.
Also: sluicectl domains.`,
		Example: `  sluicectl domain list --server sluiced:7070
  sluicectl domain list --etcd http://etcd:2379 -o json`,
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error { return listDomainsCmd(g) },
	}
}

// listDomainsCmd runs domain list.
func listDomainsCmd(g *globals) error {
	errw := g.stderr
	etcd := g.etcd.endpoints != ""
	marksOnly := g.serverFrom == "--server" && g.server == ""
	server := g.server
	switch {
	case marksOnly && !etcd:
		return errors.New(`--server "" lists the drain marks only: it needs --etcd (or SLUICE_ETCD)`)
	case !g.serverSet() && !etcd:
		server = g.oneServer()
	}
	fleet := server == "" && !marksOnly
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	rows := map[string]*domainRow{}
	var views []replicaView
	if server != "" {
		g.note(server)
		resp, err := listDomains(ctx, server, g.sec)
		if err != nil {
			return err
		}
		views = []replicaView{{Member: client.Member{ID: server, Addr: server}, domains: resp.GetDomains(), freeze: resp.GetCreditFreeze()}}
	}
	var freezeMark *controlplane.CreditFreezeMark
	var unreachable []error
	if etcd {
		cli, err := g.etcdClient()
		if err != nil {
			return err
		}
		defer cli.Close()
		prefix := g.etcdPrefix()
		if fleet {
			if views, err = fleetViews(ctx, cli, prefix, g.sec, errw); err != nil {
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
	if err := g.out().value(list, func(w io.Writer) error {
		writeFreeze(w, views, freezeMark)
		return writeDomains(w, list, answered > 0, etcd, fleet)
	}); err != nil {
		return err
	}
	switch {
	case fleet && len(views) == 0:
		fmt.Fprintln(errw, "sluicectl: no replica registered in etcd; the drain marks only")
	case fleet && answered == 0:
		fmt.Fprintf(errw, "sluicectl: none of the %d registered replicas answered; the drain marks only\n", len(views))
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
				r.CapacityFactor = d.GetCapacityFactor()
			}
			r.OnServer = true
			if f := d.GetCapacityFactor(); f > 0 { // an older server sends none
				r.CapacityFactor = min(r.CapacityFactor, f)
			}
			if age := d.GetEngineMetricsAge(); age != nil && (!r.engineAgeSeen || age.AsDuration().Seconds() < r.EngineMetricsAgeSecs) {
				r.engineAgeSeen = true
				r.EngineQueue, r.EngineKVUsage, r.EngineMetricsAgeSecs = d.GetEngineQueue(), d.GetEngineKvUsage(), age.AsDuration().Seconds()
			}
			r.EngineMetricsStale = r.EngineMetricsStale || d.GetEngineMetricsStale()
			r.EngineSaturated = r.EngineSaturated || d.GetEngineSaturated()
			r.FloorsShort = r.FloorsShort || d.GetFloorsShort()
			if left := d.GetWarmupLeft().AsDuration(); left > 0 { // an older server sends neither field: whole
				r.WarmupFraction = min(r.WarmupFraction, d.GetWarmupFraction())
				r.WarmupLeftSeconds = max(r.WarmupLeftSeconds, left.Seconds())
			}
			r.InFlight += d.GetInFlight()
			r.PrefillUse += d.GetPrefillUse()
			r.DecodeUse += d.GetDecodeUse()
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
	fmt.Fprintln(tw, "DOMAIN\tKIND\tGPUS\tDRAINING\tIN FLIGHT\tUSE\tHEALTH\tCAPACITY\tFEEDBACK\tDRAIN MARK")
	for _, r := range list {
		kind, gpus, draining, inflight, use, health, capacity, feedback := "-", "-", "-", "-", "-", "-", "-", "-"
		if r.OnServer {
			kind, gpus, inflight = r.Kind, fmt.Sprint(r.GPUs), fmt.Sprint(r.InFlight)
			use = fmt.Sprintf("prefill %.0f%%, decode %.0f%%", 100*r.PrefillUse, 100*r.DecodeUse)
			draining, health = drainingCell(r, fleet), fmt.Sprintf("%.2f", r.HealthWeight)
			capacity, feedback = warmupCell(r), feedbackCell(r)
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, kind, gpus, draining, inflight, use, health, capacity, feedback, mark)
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

// feedbackCell renders the FEEDBACK column: the capacity loop's
// correction of the model ("0.80×"; "model" when uncorrected or from a
// server without the loop) and what its engines last said: "saturated"
// (only floor traffic placed), "stale" (the model alone decides), the
// queue and KV use; "FLOORS SHORT" when the floors reserved there no
// longer fit.
func feedbackCell(r domainRow) string {
	var parts []string
	if r.CapacityFactor > 0 && r.CapacityFactor != 1 {
		parts = append(parts, fmt.Sprintf("%.2f×", r.CapacityFactor))
	} else {
		parts = append(parts, "model")
	}
	switch {
	case r.EngineMetricsStale:
		parts = append(parts, fmt.Sprintf("engines stale (%s)", (time.Duration(r.EngineMetricsAgeSecs*float64(time.Second))).Round(100*time.Millisecond)))
	case r.engineAgeSeen || r.EngineSaturated:
		state := "engines"
		if r.EngineSaturated {
			state = "engines SATURATED"
		}
		parts = append(parts, fmt.Sprintf("%s (queue %.0f, KV %.0f%%)", state, r.EngineQueue, 100*r.EngineKVUsage))
	}
	if r.FloorsShort {
		parts = append(parts, "FLOORS SHORT")
	}
	return strings.Join(parts, ", ")
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
