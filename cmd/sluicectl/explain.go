package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// newExplainCmd is `sluicectl explain`: a server's Operator/ExplainAdmit
// about one request.
func newExplainCmd(g *globals) *cobra.Command {
	req := &admissionv1.AdmitRequest{}
	var (
		accept   string
		critical bool
	)
	c := &cobra.Command{
		Use:   "explain --tenant T --model M",
		Short: "What Admit would do with a request now, gate by gate and domain by domain (nothing charged)",
		Long: `What Admit would do with a request now, with nothing charged
(Operator/ExplainAdmit, viewer role): the verdict (admitted where, degraded to
what, queued and its place's wait, deferred (with --deferrable) and what holds
it, or refused why and until when), every gate
with its level before and after, and each (tier, domain) placement looked at
with what it needs and what the domain has.`,
		Example: `  sluicectl explain --tenant acme --model large --accept medium --server sluiced:7070`,
		Args:    noArgs,
		RunE: func(*cobra.Command, []string) error {
			if req.Tenant == "" || req.Model == "" {
				return fmt.Errorf("--tenant and --model are required")
			}
			if accept != "" {
				req.AcceptDowngrade = strings.Split(accept, ",")
			}
			if critical {
				req.Priority = admissionv1.Priority_PRIORITY_CRITICAL
			}
			var x *admissionv1.ExplainAdmitResponse
			err := g.call(g.oneServer(), func(ctx context.Context, op admissionv1.OperatorClient) (err error) {
				x, err = op.ExplainAdmit(ctx, req)
				return err
			})
			if err != nil {
				return err
			}
			return g.out().message(x, func(w io.Writer) error { return writeExplanation(w, x) })
		},
	}
	f := c.Flags()
	f.StringVar(&req.Tenant, "tenant", "", "tenant (required)")
	f.StringVar(&req.Model, "model", "", "model tier (required)")
	f.Int64Var(&req.PromptTokens, "prompt", 1000, "prompt tokens")
	f.Int64Var(&req.MaxOutputTokens, "output", 200, "max output tokens")
	f.StringVar(&accept, "accept", "", "lower tiers the request accepts, comma-separated")
	f.BoolVar(&critical, "critical", false, "priority CRITICAL")
	f.BoolVar(&req.Deferrable, "deferrable", false, "a deferrable request: DEFERRED, and what holds it, when it cannot run now on what interactive traffic leaves")
	return c
}

// writeExplanation prints the outcome, then the gates and the placement
// looked at, as tables.
func writeExplanation(out io.Writer, x *admissionv1.ExplainAdmitResponse) error {
	verdict := x.GetOutcome()
	switch {
	case x.GetDomain() != "":
		verdict += fmt.Sprintf(" on %s, model %s", x.GetDomain(), x.GetModel())
		if x.GetFloor() {
			verdict += ", within the floor"
		}
	case x.GetReason() != admissionv1.Reason_REASON_UNSPECIFIED:
		verdict += " " + strings.TrimPrefix(x.GetReason().String(), "REASON_")
		if x.GetRetryAfter() != nil {
			verdict += fmt.Sprintf(", retry after %v", x.GetRetryAfter().AsDuration())
		}
	}
	if x.GetEstimatedWait() != nil {
		verdict += fmt.Sprintf(" (its place in the fair order: about %v)", x.GetEstimatedWait().AsDuration())
	}
	fmt.Fprintf(out, "would be: %s\n\n", verdict)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GATE\tRESULT\tBEFORE\tAFTER\tDETAIL")
	for _, g := range x.GetGates() {
		result := "pass"
		switch {
		case !g.GetReached():
			result = "-"
		case !g.GetPassed():
			result = "REFUSED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", g.GetGate(), result, g.GetBefore(), g.GetAfter(), g.GetDetail())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(x.GetPlacement()) == 0 {
		return nil
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tDOMAIN\tFROM\tFITS\tDETAIL")
	for _, p := range x.GetPlacement() {
		from := "shared"
		if p.GetFloor() {
			from = "floor"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\n", p.GetModel(), p.GetDomain(), from, p.GetFits(), p.GetDetail())
	}
	return tw.Flush()
}
