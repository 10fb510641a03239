package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// newBacklogCmd is `sluicectl backlog`: the deferred backlog a server
// holds, per tenant.
func newBacklogCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "backlog",
		Short: "The deferred backlog: tickets pending and claimed per tenant, the oldest's age",
		Long: `The deferred backlog of the sluiced at --server: per tenant, the deferrable
requests waiting for capacity and a worker (pending), those running on a
worker (claimed), and how long the oldest pending one has waited; largest
backlogs first, totals on the last line. With Redis each replica holds the
tickets it took; ask each replica.`,
		Example: `  sluicectl backlog --server sluiced:7070
  sluicectl backlog -o json`,
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error { return listBacklog(g) },
	}
}

// listBacklog runs backlog.
func listBacklog(g *globals) error {
	server := g.oneServer()
	g.note(server)
	var resp *admissionv1.ListBacklogResponse
	err := g.call(server, func(ctx context.Context, op admissionv1.OperatorClient) (err error) {
		resp, err = op.ListBacklog(ctx, &admissionv1.ListBacklogRequest{})
		return err
	})
	if err != nil {
		return err
	}
	return g.out().message(resp, func(w io.Writer) error { return writeBacklog(w, resp) })
}

// writeBacklog prints the backlog as a table.
func writeBacklog(out io.Writer, resp *admissionv1.ListBacklogResponse) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tTIER\tPENDING\tCLAIMED\tOLDEST")
	for _, t := range resp.GetTenants() {
		oldest := "-"
		if t.GetOldestAge() != nil {
			oldest = t.GetOldestAge().AsDuration().Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", t.GetTenant(), t.GetTier(), t.GetPending(), t.GetClaimed(), oldest)
	}
	fmt.Fprintf(tw, "total\t\t%d\t%d\t\n", resp.GetPending(), resp.GetClaimed())
	return tw.Flush()
}
