package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/controlplane"
)

func init() {
	register(command{
		name:    "domains",
		summary: "list domains: draining state and in-flight leases (a server), drain marks (etcd)",
		run:     runDomains,
	})
}

// domainRow is one line of `sluicectl domains`: a server's view of the
// domain (when it has it) and the drain mark in etcd (when there is one).
type domainRow struct {
	ID           string                  `json:"id"`
	Kind         string                  `json:"kind,omitempty"`
	GPUs         int64                   `json:"gpus"`
	Draining     bool                    `json:"draining"`
	DrainReason  string                  `json:"drain_reason,omitempty"`
	InFlight     int64                   `json:"in_flight"`
	HealthWeight float64                 `json:"health_weight"`
	OnServer     bool                    `json:"on_server"`
	Mark         *controlplane.DrainMark `json:"drain_mark,omitempty"`
}

// runDomains lists the domains of the sluiced at --server (ListDomains) and,
// with --etcd, the drain marks, so that an SRE sees both whether a drain was
// asked for and whether this replica acts on it, and how many leases are
// still in flight there.
func runDomains(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("sluicectl domains", flag.ContinueOnError)
	fs.SetOutput(out)
	var ef etcdFlags
	ef.register(fs)
	server := fs.String("server", "localhost:7070", `sluiced gRPC address ("" to list etcd's drain marks only)`)
	format := fs.String("o", "table", "output format: table or json")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *format != "table" && *format != "json" {
		return fmt.Errorf("-o %q: want table or json", *format)
	}
	if *server == "" && ef.endpoints == "" {
		return fmt.Errorf("nothing to list: give --server, --etcd or both")
	}
	ctx, cancel := context.WithTimeout(context.Background(), ef.timeout)
	defer cancel()
	rows := map[string]*domainRow{}
	if *server != "" {
		conn, err := dialServer(*server)
		if err != nil {
			return err
		}
		defer conn.Close()
		resp, err := admissionv1.NewOperatorClient(conn).ListDomains(ctx, &admissionv1.ListDomainsRequest{})
		if err != nil {
			return fmt.Errorf("server %s: %w", *server, err)
		}
		for _, d := range resp.GetDomains() {
			rows[d.GetId()] = &domainRow{ID: d.GetId(), Kind: d.GetKind(), GPUs: d.GetGpus(), Draining: d.GetDraining(),
				DrainReason: d.GetDrainReason(), InFlight: d.GetInFlight(), HealthWeight: d.GetHealthWeight(), OnServer: true}
		}
	}
	if ef.endpoints != "" {
		cli, err := ef.client()
		if err != nil {
			return err
		}
		defer cli.Close()
		marks, err := controlplane.ListDrains(ctx, cli, controlplane.NormalizePrefix(ef.prefix))
		if err != nil {
			return err
		}
		for _, m := range marks {
			r := rows[m.Domain]
			if r == nil {
				r = &domainRow{ID: m.Domain}
				rows[m.Domain] = r
			}
			r.Mark = &m
		}
	}
	list := make([]domainRow, 0, len(rows))
	for _, r := range rows {
		list = append(list, *r)
	}
	slices.SortFunc(list, func(a, b domainRow) int { return cmp.Compare(a.ID, b.ID) })
	if *format == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(list)
	}
	return writeDomains(out, list, *server != "", ef.endpoints != "")
}

// writeDomains prints the table; columns a source did not fill are "-".
func writeDomains(w io.Writer, list []domainRow, server, etcd bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tKIND\tGPUS\tDRAINING\tIN FLIGHT\tHEALTH\tDRAIN MARK")
	for _, r := range list {
		kind, gpus, draining, inflight, health := "-", "-", "-", "-", "-"
		if r.OnServer {
			kind, gpus, inflight = r.Kind, fmt.Sprint(r.GPUs), fmt.Sprint(r.InFlight)
			draining, health = "no", fmt.Sprintf("%.2f", r.HealthWeight)
			if r.Draining {
				draining = "yes"
			}
		} else if server {
			kind = "(not on the server)"
		}
		mark := "-"
		switch {
		case r.Mark != nil:
			mark = r.Mark.Describe()
		case r.Draining:
			mark = "(none; " + r.DrainReason + ")" // drained on this replica only
		case !etcd:
			mark = "(no --etcd)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, kind, gpus, draining, inflight, health, mark)
	}
	return tw.Flush()
}
