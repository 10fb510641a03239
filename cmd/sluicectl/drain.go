package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-sched/sluice/admission/client"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/controlplane"
)

// newDrainCmd is `domain drain DOMAIN` or, with drain false, `domain
// undrain DOMAIN` (also `drain DOMAIN` and `undrain DOMAIN`). With --etcd it
// writes or deletes the domain's drain mark in etcd, which every replica
// acts on within one watch round-trip. Without --etcd it asks the one
// sluiced at --server instead (a single replica without a control plane;
// the drain lasts until that process restarts). A drain mark is written
// only for a domain that exists: in the node agents' records, or on the
// replica at --server, or else on any registered replica; --force writes it
// anyway (for a domain whose agents have not published yet).
func newDrainCmd(g *globals, drain bool) *cobra.Command {
	var (
		reason, by string
		force      bool
	)
	c := &cobra.Command{
		Use:   "undrain DOMAIN",
		Short: "Remove a domain's drain mark: every replica places on it again",
		Long: `Remove a domain's drain mark in etcd (--etcd): every replica places on it
again. Without --etcd, undrain the one sluiced at --server only. Also:
sluicectl undrain DOMAIN.`,
		Example: `  sluicectl domain undrain nvl72-a --etcd http://etcd:2379`,
		Args:    args(1, 1, "one DOMAIN"),
		RunE: func(_ *cobra.Command, a []string) error {
			if by == "" {
				by = os.Getenv("USER")
			}
			return runDrain(g, a[0], drain, reason, by, force)
		},
	}
	if drain {
		c.Use = "drain DOMAIN"
		c.Short = "Drain a domain on every replica (a mark in etcd, with who and why)"
		c.Long = `Drain a domain on every replica: write its drain mark in etcd (--etcd), with
who and why; leases there run to completion, and no replica places a new
request there. The domain must be known to the node agents or the replicas
(--force writes the mark anyway). Without --etcd, drain the one sluiced at
--server only, until it restarts. Also: sluicectl drain DOMAIN.`
		c.Example = `  sluicectl domain drain nvl72-a --reason "rack swap" --etcd http://etcd:2379
  sluicectl domain drain hgx-h200-1 --server sluiced:7070 --reason fan`
		c.Flags().StringVar(&reason, "reason", "", "why the domain is drained (shown by sluicectl domain list and ListDomains)")
		c.Flags().StringVar(&by, "by", "", "who drains it (default $USER)")
		c.Flags().BoolVar(&force, "force", false, "write the mark even for a domain neither the agents nor the replicas know (it applies when the domain appears)")
	}
	return c
}

// drainResult is what a drain or undrain did.
type drainResult struct {
	Domain string `json:"domain"`
	Action string `json:"action"` // drain or undrain
	// Where is "etcd" (the mark, for every replica) or the one server's
	// address.
	Where string `json:"where"`
	// Revision is the etcd revision of the mark written.
	Revision int64                   `json:"revision,omitempty"`
	Mark     *controlplane.DrainMark `json:"mark,omitempty"`
	// Removed says whether undrain found a mark to delete.
	Removed *bool `json:"removed,omitempty"`
	// Reason is the drain reason sent to the one server.
	Reason string `json:"reason,omitempty"`
}

// sentence is the table form of r.
func (r drainResult) sentence() string {
	switch {
	case r.Where != "etcd" && r.Action == "drain":
		return fmt.Sprintf("%s: drained on %s only (no --etcd)", r.Domain, r.Where)
	case r.Where != "etcd":
		return fmt.Sprintf("%s: undrained on %s only (no --etcd)", r.Domain, r.Where)
	case r.Action == "drain":
		return fmt.Sprintf("%s: drain mark written at revision %d (%s); leases there run to completion", r.Domain, r.Revision, r.Mark.Describe())
	case *r.Removed:
		return fmt.Sprintf("%s: drain mark removed; replicas place on it again", r.Domain)
	}
	return fmt.Sprintf("%s: no drain mark (nothing to undrain)", r.Domain)
}

// runDrain drains or undrains domain.
func runDrain(g *globals, domain string, drain bool, reason, by string, force bool) error {
	res := drainResult{Domain: domain, Action: "undrain"}
	if drain {
		res.Action = "drain"
	}
	emit := func() error {
		return g.out().value(res, func(w io.Writer) error {
			_, err := fmt.Fprintln(w, res.sentence())
			return err
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	if g.etcd.endpoints == "" {
		if !g.serverSet() || g.server == "" {
			return errors.New("--etcd (or SLUICE_ETCD) is required (or --server to act on one replica only)")
		}
		res.Where = g.server
		err := g.call(g.server, func(ctx context.Context, op admissionv1.OperatorClient) error {
			if !drain {
				_, err := op.UndrainDomain(ctx, &admissionv1.UndrainDomainRequest{Domain: domain})
				return err
			}
			res.Reason = controlplane.DrainMark{Domain: domain, Reason: reason, By: by, At: time.Now().UTC()}.Describe()
			_, err := op.DrainDomain(ctx, &admissionv1.DrainDomainRequest{Domain: domain, Reason: res.Reason})
			return err
		})
		if err != nil {
			return err
		}
		return emit()
	}
	res.Where = "etcd"
	cli, err := g.etcdClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	prefix := g.etcdPrefix()
	if !drain {
		existed, err := controlplane.DeleteDrain(ctx, cli, prefix, domain)
		if err != nil {
			return err
		}
		res.Removed = &existed
		return emit()
	}
	if !force {
		if g.server != "" {
			g.note(g.server)
		}
		if err := checkDomain(ctx, cli, prefix, g.server, g.sec, domain, g.stderr); err != nil {
			return err
		}
	}
	m := controlplane.DrainMark{Domain: domain, Reason: reason, By: by, At: time.Now().UTC()}
	if res.Revision, err = controlplane.PutDrain(ctx, cli, prefix, m); err != nil {
		return err
	}
	res.Mark = &m
	return emit()
}

// checkDomain returns an error unless domain is known: a domain of the node
// agents' records, or of the replica at server, or (server "") of any replica
// registered under prefix that answers. Member entries that are not members
// are warned about on errw.
func checkDomain(ctx context.Context, cli *clientv3.Client, prefix, server string, sec client.Security, domain string, errw io.Writer) error {
	agents, err := controlplane.AgentDomains(ctx, cli, prefix)
	if err != nil {
		return err
	}
	if slices.Contains(agents, domain) {
		return nil
	}
	known := slices.Clone(agents)
	var views []replicaView
	if server != "" {
		resp, err := listDomains(ctx, server, sec)
		views = []replicaView{{Member: client.Member{ID: server, Addr: server}, domains: resp.GetDomains(), err: err}}
	} else if views, err = fleetViews(ctx, cli, prefix, sec, errw); err != nil {
		return err
	}
	answered := 0
	for _, v := range views {
		if v.err != nil {
			continue
		}
		answered++
		for _, d := range v.domains {
			if d.GetId() == domain {
				return nil
			}
			known = append(known, d.GetId())
		}
	}
	slices.Sort(known)
	known = slices.Compact(known)
	if len(known) == 0 {
		return fmt.Errorf("domain %q: cannot check it: no node agent record in etcd and no replica answered (%d asked); --force writes the mark anyway", domain, len(views))
	}
	if len(known) > 12 {
		known = append(known[:12], "…")
	}
	return fmt.Errorf("domain %q is unknown: not in the node agents' records nor on the %d replicas that answered (known: %s); --force writes the mark anyway (it applies when the domain appears)",
		domain, answered, strings.Join(known, ", "))
}
