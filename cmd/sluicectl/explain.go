package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

func init() {
	register(command{
		name:    "explain",
		summary: "what Admit would do with a request now, gate by gate and domain by domain (nothing charged)",
		run:     runExplain,
	})
}

// runExplain asks a server's Operator/ExplainAdmit about one request.
func runExplain(args []string, out, errw io.Writer) error {
	fs := flag.NewFlagSet("sluicectl explain", flag.ContinueOnError)
	fs.SetOutput(errw)
	var of operatorFlags
	of.register(fs)
	format := fs.String("o", "table", "output format: table or json")
	req := &admissionv1.AdmitRequest{}
	fs.StringVar(&req.Tenant, "tenant", "", "tenant (required)")
	fs.StringVar(&req.Model, "model", "", "model tier (required)")
	fs.Int64Var(&req.PromptTokens, "prompt", 1000, "prompt tokens")
	fs.Int64Var(&req.MaxOutputTokens, "output", 200, "max output tokens")
	accept := fs.String("accept", "", "lower tiers the request accepts, comma-separated")
	critical := fs.Bool("critical", false, "priority CRITICAL")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if err := checkFormat(*format); err != nil {
		return err
	}
	if req.Tenant == "" || req.Model == "" {
		return fmt.Errorf("--tenant and --model are required")
	}
	if *accept != "" {
		req.AcceptDowngrade = strings.Split(*accept, ",")
	}
	if *critical {
		req.Priority = admissionv1.Priority_PRIORITY_CRITICAL
	}
	var x *admissionv1.ExplainAdmitResponse
	err := of.call(func(ctx context.Context, op admissionv1.OperatorClient) (err error) {
		x, err = op.ExplainAdmit(ctx, req)
		return err
	})
	if err != nil {
		return err
	}
	if *format == "json" {
		return writeProto(out, x)
	}
	return writeExplanation(out, x)
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
