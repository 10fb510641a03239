package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// Comparison is a replay of one trace under several policies.
type Comparison struct {
	Trace string `json:"trace"`
	Rows  int    `json:"rows"`
	Seed  uint64 `json:"seed"`
	// Bursts are the trace's bursts in replay time (Burst.InReplay): the
	// verdict leaves their tenants out of its per-tenant measures and the
	// HTML charts shade their windows. Compare leaves it empty; the JSON
	// names the tenants in verdict.bursting.
	Bursts  []Burst   `json:"-"`
	Reports []*Report `json:"reports"`
}

// WriteJSON writes c as indented JSON, its verdict first.
func (c *Comparison) WriteJSON(w io.Writer) error {
	type comparison Comparison // without the methods: no recursion
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	err := enc.Encode(struct {
		Verdict *Verdict `json:"verdict,omitempty"`
		*comparison
	}{c.Verdict(), (*comparison)(c)})
	if err != nil {
		return fmt.Errorf("json: %w", err)
	}
	return nil
}

// reasonsOf lists the refusal reasons of t, sorted, as "REASON:n,…".
func reasonsOf(t *TenantReport) string {
	var rs []string
	for r := range t.Rejected {
		rs = append(rs, r)
	}
	slices.Sort(rs)
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s:%d", r, t.Rejected[r])
	}
	if b.Len() == 0 {
		return "-"
	}
	return b.String()
}

// WriteTable writes c as text tables: the verdict, then per policy a line
// per tenant, the domains' utilization and the fairness figures.
func (c *Comparison) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "trace %s: %d requests, seed %d\n", c.Trace, c.Rows, c.Seed)
	if v := c.Verdict(); v != nil {
		writeVerdict(tw, v)
	}
	c.writeDeferral(tw)
	for _, r := range c.Reports {
		fmt.Fprintf(tw, "\npolicy %s: %.0f s simulated, %d requests, spanning two domains: %d, Jain %.4f, max service diff %.0f (VTC bound %.0f)\n",
			r.Policy, r.Seconds, r.Requests, r.Spanning, r.Jain, r.MaxServiceDiff, r.VTCBound)
		fmt.Fprintln(tw, "tenant\tweight\tfloor\trequests\tadmitted\tdegraded\trefused\trefused %\twait p50 ms\tp95 ms\tp99 ms\tfloor viol s\tW2 tok/s\trefusals")
		for i := range r.Tenants {
			t := &r.Tenants[i]
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t%.0f\t%s\n",
				t.Name, t.Weight, t.Floor, t.Requests, t.Admitted, t.Degraded, t.Refused(), 100*float64(t.Refused())/float64(max(t.Requests, 1)),
				t.WaitP50, t.WaitP95, t.WaitP99, t.FloorViolations, t.Wasserstein2, reasonsOf(t))
		}
		fmt.Fprintln(tw, "domain\tadmitted\tprefill util\tdecode util")
		for _, d := range r.Domains {
			fmt.Fprintf(tw, "%s\t%d\t%.1f%%\t%.1f%%\n", d.ID, d.Admitted, 100*d.PrefillUtil, 100*d.DecodeUtil)
		}
		if r.Engines != nil {
			writeEngines(tw, r.Engines)
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// writeVerdict writes the verdict: its sentence, the deciding measures
// with their winners, the others, and why Jain and W2 do not decide.
func writeVerdict(tw io.Writer, v *Verdict) {
	fmt.Fprintf(tw, "\nverdict: %s\n", v.Summary)
	fmt.Fprintf(tw, "measure\tof\tbetter\t%s\tbest\n", strings.Join(v.Policies, "\t"))
	for _, m := range v.Measures {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Name, m.Of, m.Better, strings.Join(m.Text, "\t"), strings.Join(m.Winners, " "))
	}
	for _, m := range v.NotDeciding {
		fmt.Fprintf(tw, "%s\t%s\t-\t%s\tnot counted\n", m.Name, m.Of, strings.Join(m.Text, "\t"))
	}
	fmt.Fprintln(tw, v.Note)
}

// writeEngines writes what the engines measured: a summary line, a line
// per domain, and the capacity changes.
func writeEngines(tw io.Writer, e *EngineReport) {
	loop := ""
	if e.Loop != "" {
		loop = ", loop " + e.Loop
	}
	fmt.Fprintf(tw, "engines at %g× the model%s: admitted %.0f tok/s, utilization %.1f%% (prefill %.1f%%, decode %.1f%%), TTFT p50 %.1f p99 %.1f ms, first token within %.0f ms of arrival %.1f%%, engine queue p99 %.0f\n",
		e.Capacity, loop, e.AdmittedRate, 100*e.Util, 100*e.PrefillUtil, 100*e.DecodeUtil, e.TTFTP50, e.TTFTP99, e.SLOMs, 100*e.WithinSLO, e.QueueP99)
	fmt.Fprintf(tw, "floor violations %d s, refused within share %d, spread %.2f, least share on the first domain %.1f%% (%s), leases expired in an engine %d\n",
		e.FloorViolations, e.WithinShareRefused, e.Spread, 100*e.FirstShareMin, e.FirstBy, e.ExpiredLeases)
	fmt.Fprintln(tw, "engine\tcapacity\tfactor\tadmitted\ttokens\tqueue p99\tqueue max\tKV max\tTTFT p99 ms\tbusy\tprefill util\tdecode util")
	for _, d := range e.Domains {
		factor := "-"
		if d.Factor > 0 {
			factor = fmt.Sprintf("%.2f", d.Factor)
		}
		fmt.Fprintf(tw, "%s\t%g\t%s\t%d\t%d\t%.0f\t%d\t%.1f%%\t%.1f\t%.1f%%\t%.1f%%\t%.1f%%\n", d.ID, d.Capacity, factor, d.Admitted, d.AdmittedTokens,
			d.QueueP99, d.QueueMax, 100*d.KVMax, d.TTFTP99, 100*d.Busy, 100*d.PrefillUtil, 100*d.DecodeUtil)
	}
	for _, c := range e.Changes {
		fmt.Fprintf(tw, "change %s at %.1f s to %g×: queue peak %d, %s\n", c.Domain, c.AtS, c.Capacity, c.PeakQueue, c.Recovery(e.QueueThreshold))
	}
}

// Recovery says in words how the domain's queue came back after the change.
func (c *EngineChangeReport) Recovery(threshold float64) string {
	switch {
	case c.OverS < 0:
		return fmt.Sprintf("queue never past %g", threshold)
	case c.RecoveryS < 0:
		return fmt.Sprintf("past %g from %.1f s after, never back to stay %g s", threshold, c.OverS, c.RecoveryHoldS)
	}
	return fmt.Sprintf("past %g from %.1f s after, back to stay %g s after %.1f s", threshold, c.OverS, c.RecoveryHoldS, c.RecoveryS)
}

// Compare replays rows under each policy on the same cluster and config
// (opts.Policy is ignored); every policy sees the same arrivals.
func Compare(trace string, seed uint64, rows []Row, opts Options, policies []string) (*Comparison, error) {
	c := &Comparison{Trace: trace, Rows: len(rows), Seed: seed}
	for _, p := range policies {
		opts.Policy = p
		r, err := Run(rows, opts)
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", p, err)
		}
		c.Reports = append(c.Reports, r)
	}
	return c, nil
}
