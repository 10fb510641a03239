package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-sched/sluice/admission/client"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/controlplane"
)

func init() {
	register(command{
		name:    "drain",
		summary: "drain a domain on every replica (a mark in etcd, with who and why)",
		run:     func(args []string, out, errw io.Writer) error { return runDrain(args, out, errw, true) },
	})
	register(command{
		name:    "undrain",
		summary: "remove a domain's drain mark: every replica places on it again",
		run:     func(args []string, out, errw io.Writer) error { return runDrain(args, out, errw, false) },
	})
}

// runDrain writes (drain) or deletes (undrain) a domain's drain mark in etcd;
// every replica acts on it within one watch round-trip. Without --etcd it
// asks the one sluiced at --server instead (a single replica without a
// control plane; the drain lasts until that process restarts). A drain mark
// is written only for a domain that exists: in the node agents' records, or
// on the replica at --server, or else on any registered replica; --force
// writes it anyway (for a domain whose agents have not published yet).
func runDrain(args []string, out, errw io.Writer, drain bool) error {
	name := map[bool]string{true: "drain", false: "undrain"}[drain]
	fs := flag.NewFlagSet("sluicectl "+name, flag.ContinueOnError)
	fs.SetOutput(out)
	var ef etcdFlags
	ef.register(fs)
	var sf serverFlags
	sf.register(fs)
	server := fs.String("server", "", "without --etcd: the one sluiced to drain directly (gRPC address); with --etcd: the replica that checks the domain exists")
	format := fs.String("o", "table", "output format: table (a sentence) or json")
	var reason, by *string
	var force *bool
	if drain {
		reason = fs.String("reason", "", "why the domain is drained (shown by sluicectl domains and ListDomains)")
		by = fs.String("by", os.Getenv("USER"), "who drains it (default $USER)")
		force = fs.Bool("force", false, "write the mark even for a domain neither the agents nor the replicas know (it applies when the domain appears)")
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("usage: sluicectl %s DOMAIN [flags]", name)
	}
	domain := pos[0]
	if err := checkFormat(*format); err != nil {
		return err
	}
	if *format == "json" {
		// Every outcome below prints one sentence; -o json turns it into
		// {"domain", "action", "result"}.
		out = &jsonSentence{w: out, domain: domain, action: name}
		defer out.(*jsonSentence).flush()
	}
	ctx, cancel := context.WithTimeout(context.Background(), ef.timeout)
	defer cancel()
	if ef.endpoints == "" {
		if *server != "" {
			return drainOne(ctx, *server, sf.sec, domain, drain, reason, by, out)
		}
		return errors.New("--etcd (or SLUICE_ETCD) is required (or --server to act on one replica only)")
	}
	cli, err := ef.client()
	if err != nil {
		return err
	}
	defer cli.Close()
	prefix := controlplane.NormalizePrefix(ef.prefix)
	if !drain {
		existed, err := controlplane.DeleteDrain(ctx, cli, prefix, domain)
		if err != nil {
			return err
		}
		if !existed {
			fmt.Fprintf(out, "%s: no drain mark (nothing to undrain)\n", domain)
			return nil
		}
		fmt.Fprintf(out, "%s: drain mark removed; replicas place on it again\n", domain)
		return nil
	}
	if !*force {
		if err := checkDomain(ctx, cli, prefix, *server, sf.sec, domain, errw); err != nil {
			return err
		}
	}
	m := controlplane.DrainMark{Domain: domain, Reason: *reason, By: *by, At: time.Now().UTC()}
	rev, err := controlplane.PutDrain(ctx, cli, prefix, m)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s: drain mark written at revision %d (%s); leases there run to completion\n", domain, rev, m.Describe())
	return nil
}

// drainOne drains or undrains a domain on one server through the Operator RPC.
func drainOne(ctx context.Context, server string, sec client.Security, domain string, drain bool, reason, by *string, out io.Writer) error {
	conn, err := dialServer(server, sec)
	if err != nil {
		return err
	}
	defer conn.Close()
	op := admissionv1.NewOperatorClient(conn)
	if drain {
		m := controlplane.DrainMark{Domain: domain, Reason: *reason, By: *by, At: time.Now().UTC()}
		if _, err := op.DrainDomain(ctx, &admissionv1.DrainDomainRequest{Domain: domain, Reason: m.Describe()}); err != nil {
			return fmt.Errorf("server %s: %w", server, err)
		}
		fmt.Fprintf(out, "%s: drained on %s only (no --etcd)\n", domain, server)
		return nil
	}
	if _, err := op.UndrainDomain(ctx, &admissionv1.UndrainDomainRequest{Domain: domain}); err != nil {
		return fmt.Errorf("server %s: %w", server, err)
	}
	fmt.Fprintf(out, "%s: undrained on %s only (no --etcd)\n", domain, server)
	return nil
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

// jsonSentence collects the sentence a drain or undrain prints and writes
// it as one JSON object at the end, for -o json.
type jsonSentence struct {
	w              io.Writer
	domain, action string
	buf            strings.Builder
}

func (j *jsonSentence) Write(p []byte) (int, error) { return j.buf.Write(p) }

// flush writes the object, if anything was said (an error says nothing).
func (j *jsonSentence) flush() {
	if j.buf.Len() == 0 {
		return
	}
	_ = writeJSON(j.w, map[string]string{"domain": j.domain, "action": j.action, "result": strings.TrimSpace(j.buf.String())})
}
