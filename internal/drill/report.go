package drill

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Summary is what `drill NAME` or `drill all` prints: every drill's report
// and whether every promise held.
type Summary struct {
	Reports []*Report `json:"drills"`
	// Held is true when every drill ran and every promise held.
	Held bool `json:"held"`
	// Errors are the drills that could not be run, with why.
	Errors []string `json:"errors,omitempty"`
	// Totals add up a soak's drills (nil for one drill or all).
	Totals *SoakTotals `json:"totals,omitempty"`
}

// WriteJSON prints s as indented JSON.
func (s *Summary) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// WriteTable prints each report: the timeline, a table of the phases and
// the promises, then one line per drill. A soak's reports are many: it
// prints only those with a broken promise, then its totals.
func (s *Summary) WriteTable(w io.Writer) error {
	for _, r := range s.Reports {
		if s.Totals != nil && r.Held {
			continue
		}
		if err := r.WriteTable(w); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	if s.Totals != nil {
		if err := s.Totals.WriteTotals(w); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DRILL\tTARGET\tPROMISES\tRESULT")
	for _, r := range s.Reports {
		held := 0
		for _, p := range r.Promises {
			if p.Held {
				held++
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d held\t%s\n", r.Drill, dash(r.Target), held, len(r.Promises), verdict(r.Held))
	}
	for _, e := range s.Errors {
		fmt.Fprintf(tw, "%s\t\t\tNOT RUN\n", e)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	_, err := fmt.Fprintf(w, "\n%s\n", map[bool]string{true: "every promise held", false: "A PROMISE BROKE"}[s.Held])
	return err
}

func verdict(held bool) string {
	if held {
		return "held"
	}
	return "BROKEN"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteTable prints one drill's report.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "drill %s", r.Drill)
	if r.Target != "" {
		fmt.Fprintf(w, " %s", r.Target)
	}
	fmt.Fprintf(w, " — %s\n", r.Fleet)
	for _, m := range r.Timeline {
		fmt.Fprintf(w, "  %7.2fs  %s\n", m.At, m.What)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tSECONDS\tSENT\tADMITTED/S\tREFUSED\tLOST\tPAST DEADLINE\tP50 MS\tP99 MS\tFLOORS HELD\tQUOTA\tON DOMAIN\tAFTER MARK")
	for _, p := range r.Phases {
		fmt.Fprintf(tw, "%s\t%.1f–%.1f\t%d\t%.1f\t%s\t%d\t%d\t%.2f%s\t%.2f%s\t%s\t%s\t%s\t%s\n",
			p.Name, p.From, p.To, p.Sent, p.AdmittedPerSec, refusals(p), p.Lost, p.PastDeadline,
			p.P50Ms, change(p.P50Change), p.P99Ms, change(p.P99Change), floors(p), quota(p), opt(p.OnTarget), opt(p.Forbidden))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	if f := r.Fault; f != nil {
		fmt.Fprintf(w, "fault: asked %.2fs, held %.2fs (%.2f–%.2fs; its action began at %.2fs)\n", f.AskedS, f.SpanS, f.HeldS, f.EndedS, f.BeganS)
	}
	if r.RecoverSeconds != nil {
		fmt.Fprintf(w, "time to recover: %.0fs after the fault's end\n", *r.RecoverSeconds)
	} else {
		fmt.Fprintln(w, "time to recover: never, before the drill's end")
	}
	if r.Deferred != nil {
		if err := r.Deferred.writeTable(w); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROMISE\tRESULT\tDETAIL")
	for _, p := range r.Promises {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Name, verdict(p.Held), p.Detail)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

func refusals(p *PhaseReport) string {
	if p.Rejected == 0 {
		return "0"
	}
	var parts []string
	for _, k := range sortedKeys(p.Refusals) {
		parts = append(parts, fmt.Sprintf("%d %s", p.Refusals[k], k))
	}
	return strings.Join(parts, ", ")
}

func change(c *float64) string {
	if c == nil {
		return ""
	}
	return fmt.Sprintf(" (×%.2f)", *c)
}

func floors(p *PhaseReport) string {
	if len(p.Floors) == 0 {
		return "-"
	}
	var parts []string
	for _, f := range p.Floors {
		parts = append(parts, fmt.Sprintf("%s %d/%d", f.Tenant, f.Held, f.Seconds))
	}
	return strings.Join(parts, ", ")
}

func quota(p *PhaseReport) string {
	q := p.Quota
	if q == nil {
		return "-"
	}
	switch {
	case q.Excess > q.Bound:
		return fmt.Sprintf("%s +%d > %d", q.Tenant, q.Excess, q.Bound)
	case q.Excess > 0:
		return fmt.Sprintf("%s +%d ≤ %d", q.Tenant, q.Excess, q.Bound)
	case q.Under > 0:
		return fmt.Sprintf("%s −%.1f%%", q.Tenant, q.Under)
	}
	return q.Tenant + " exact"
}

func opt(n *int64) string {
	if n == nil {
		return "-"
	}
	return fmt.Sprint(*n)
}
