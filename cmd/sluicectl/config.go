package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/controlplane"
)

// newConfigCmd is `sluicectl config validate|apply|status`.
func newConfigCmd(g *globals) *cobra.Command {
	return group("config", "Validate a config file, apply it to etcd, or show a server's config status", "",
		newConfigFileCmd(g, false), newConfigFileCmd(g, true), newConfigStatusCmd(g))
}

// newConfigFileCmd is `config validate -f FILE` or, apply, `config apply -f
// FILE`, which validates the file as sluiced parses it and then writes
// the documents that changed to etcd.
func newConfigFileCmd(g *globals, apply bool) *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:     "validate -f FILE",
		Short:   "Parse and validate a config file (YAML or JSON)",
		Example: "  sluicectl config validate -f sluice.yaml",
		Args:    noArgs,
		RunE: func(*cobra.Command, []string) error {
			if file == "" {
				return errors.New("-f FILE is required")
			}
			data, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			if !apply {
				cfg, err := config.Parse(file, data)
				if err != nil {
					return err
				}
				res := validateResult{File: file, Valid: true, Tiers: len(cfg.Tiers), Tenants: len(cfg.Tenants), Models: len(cfg.Models)}
				return g.out().value(res, func(w io.Writer) error {
					_, err := fmt.Fprintf(w, "%s: valid (%d tiers, %d tenants, %d models)\n", file, res.Tiers, res.Tenants, res.Models)
					return err
				})
			}
			return applyConfig(g, file, data)
		},
	}
	if apply {
		c.Use = "apply -f FILE"
		c.Short = "Validate a config file, then write the documents that changed to etcd"
		c.Example = "  sluicectl config apply -f sluice.yaml --etcd http://etcd:2379"
	}
	c.Flags().StringVarP(&file, "filename", "f", "", "config file (YAML or JSON)")
	return c
}

// validateResult is what config validate found.
type validateResult struct {
	File    string `json:"file"`
	Valid   bool   `json:"valid"`
	Tiers   int    `json:"tiers"`
	Tenants int    `json:"tenants"`
	Models  int    `json:"models"`
}

// applyResult is what config apply wrote.
type applyResult struct {
	File            string `json:"file"`
	PolicyUnchanged bool   `json:"policyUnchanged"`
	TenantsWritten  int    `json:"tenantsWritten"`
	TenantsDeleted  int    `json:"tenantsDeleted"`
	Transactions    int    `json:"transactions"`
	Attempts        int    `json:"attempts"`
	Revision        int64  `json:"revision"`
}

// applyConfig writes the file to etcd. ApplyConfig validates it as sluiced
// parses it before writing anything: apply writes nothing that sluiced
// would refuse for its own reasons (a floor too large for the cluster is
// the exception: only a replica knows its cluster).
func applyConfig(g *globals, file string, data []byte) error {
	var res controlplane.ApplyResult
	if err := g.callEtcd(func(ctx context.Context, cli *clientv3.Client, prefix string) error {
		var err error
		res, err = controlplane.ApplyConfig(ctx, cli, prefix, file, data)
		return err
	}); err != nil {
		return err
	}
	r := applyResult{File: file, PolicyUnchanged: res.PolicyUnchanged, TenantsWritten: res.TenantsWritten,
		TenantsDeleted: res.TenantsDeleted, Transactions: res.Transactions, Attempts: res.Attempts, Revision: res.Revision}
	return g.out().value(r, func(w io.Writer) error {
		policy := "written"
		if r.PolicyUnchanged {
			policy = "unchanged"
		}
		fmt.Fprintf(w, "%s: valid; policy %s, %d tenant documents written, %d deleted", file, policy, r.TenantsWritten, r.TenantsDeleted)
		if r.Attempts > 1 {
			fmt.Fprintf(w, " (read %d times: another writer changed the documents meanwhile)", r.Attempts)
		}
		var err error
		switch r.Transactions {
		case 0:
			_, err = fmt.Fprintln(w, "; nothing to change")
		case 1:
			_, err = fmt.Fprintf(w, " at revision %d\n", r.Revision)
		default:
			_, err = fmt.Fprintf(w, " in %d transactions, the last at revision %d\n", r.Transactions, r.Revision)
		}
		return err
	})
}

// newConfigStatusCmd is `config status`: a server's GetConfigStatus.
func newConfigStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "status",
		Short:   "Show a server's config: source, revision, last refusal, etcd reachability, the credit freeze in force",
		Example: "  sluicectl config status --server sluiced:7070",
		Args:    noArgs,
		RunE: func(*cobra.Command, []string) error {
			var st *admissionv1.GetConfigStatusResponse
			err := g.call(g.oneServer(), func(ctx context.Context, op admissionv1.OperatorClient) (err error) {
				st, err = op.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
				return err
			})
			if err != nil {
				return err
			}
			return g.out().message(st, func(w io.Writer) error { return writeConfigStatus(w, st) })
		},
	}
}

// writeConfigStatus prints a GetConfigStatus answer for people.
func writeConfigStatus(out io.Writer, st *admissionv1.GetConfigStatusResponse) error {
	fmt.Fprintf(out, "source:     %s\n", st.GetSource())
	if st.GetRevision() != 0 {
		fmt.Fprintf(out, "revision:   %d\n", st.GetRevision())
	}
	if st.GetAppliedAt() != nil {
		fmt.Fprintf(out, "applied at: %s\n", st.GetAppliedAt().AsTime().UTC().Format(time.RFC3339))
	}
	switch {
	case st.GetControlPlane() == "none":
		// No etcd: nothing is connected (an older server leaves the field
		// empty and is read as before).
		fmt.Fprintf(out, "control_plane: none\n")
	case st.GetControlPlaneConnected():
		fmt.Fprintf(out, "etcd:       connected\n")
	default:
		fmt.Fprintf(out, "etcd:       UNREACHABLE (serving the last good config)\n")
	}
	if f := st.GetCreditFreeze(); f != nil {
		until := f.GetUntil().AsTime()
		fmt.Fprintf(out, "burst credit: FROZEN until %s (%s left)", until.UTC().Format(time.RFC3339), time.Until(until).Round(time.Second))
		if f.GetReason() != "" {
			fmt.Fprintf(out, ": %s", f.GetReason())
		}
		fmt.Fprintln(out)
	}
	if r := st.GetLastRefusal(); r != nil {
		where := r.GetSource()
		if r.GetKey() != "" {
			where += ": " + r.GetKey()
		}
		fmt.Fprintf(out, "refused:    %s: %s", where, strings.TrimSpace(r.GetReason()))
		if r.GetRevision() != 0 {
			fmt.Fprintf(out, " (revision %d)", r.GetRevision())
		}
		fmt.Fprintln(out)
	}
	return nil
}
