package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/controlplane"
)

func init() {
	register(command{
		name:    "drain",
		summary: "drain a domain on every replica (a mark in etcd, with who and why)",
		run:     func(args []string, out io.Writer) error { return runDrain(args, out, true) },
	})
	register(command{
		name:    "undrain",
		summary: "remove a domain's drain mark: every replica places on it again",
		run:     func(args []string, out io.Writer) error { return runDrain(args, out, false) },
	})
}

// runDrain writes (drain) or deletes (undrain) a domain's drain mark in etcd;
// every replica acts on it within one watch round-trip. Without --etcd it
// asks the one sluiced at --server instead (a single replica without a
// control plane; the drain lasts until that process restarts).
func runDrain(args []string, out io.Writer, drain bool) error {
	name := map[bool]string{true: "drain", false: "undrain"}[drain]
	fs := flag.NewFlagSet("sluicectl "+name, flag.ContinueOnError)
	fs.SetOutput(out)
	var ef etcdFlags
	ef.register(fs)
	server := fs.String("server", "", "without --etcd: the one sluiced to drain directly (gRPC address)")
	var reason, by *string
	if drain {
		reason = fs.String("reason", "", "why the domain is drained (shown by sluicectl domains and ListDomains)")
		by = fs.String("by", os.Getenv("USER"), "who drains it (default $USER)")
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("usage: sluicectl %s DOMAIN [flags]", name)
	}
	domain := pos[0]
	ctx, cancel := context.WithTimeout(context.Background(), ef.timeout)
	defer cancel()
	if ef.endpoints == "" {
		if *server != "" {
			return drainOne(ctx, *server, domain, drain, reason, by, out)
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
	m := controlplane.DrainMark{Domain: domain, Reason: *reason, By: *by, At: time.Now().UTC()}
	rev, err := controlplane.PutDrain(ctx, cli, prefix, m)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s: drain mark written at revision %d (%s); leases there run to completion\n", domain, rev, m.Describe())
	return nil
}

// drainOne drains or undrains a domain on one server through the Operator RPC.
func drainOne(ctx context.Context, server, domain string, drain bool, reason, by *string, out io.Writer) error {
	conn, err := dialServer(server)
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
