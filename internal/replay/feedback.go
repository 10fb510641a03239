package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"text/tabwriter"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/topology"
)

// FeedbackOptions are the replays behind the capacity loop's target
// table (FeedbackTable).
type FeedbackOptions struct {
	Trace string // the saturating replay's trace, for the heading
	Seed  uint64
	Speed float64
	Rows  []Row // the trace at Speed
	// The spread rows' replay: its own trace and speed (the same rows at
	// 1× when the caller has no other).
	SpreadTrace string
	SpreadSpeed float64
	SpreadRows  []Row
	// Many is the spread rows again on the spread trace with a mix of many
	// tenants, under its own config; nil: none. One tenant's share of the
	// work bounds how far a few tenants can spread (docs/capacity-feedback.md).
	Many *SpreadMix

	Config   admission.Config
	Cluster  topology.Cluster
	Deadline time.Duration
	// Engine holds the engines' knobs; its Capacity, Changes and OpenLoop
	// are set by each replay.
	Engine EngineOptions
	// Low and High are the engines' capacities of the two rows (0.6 and
	// 1.5 by default).
	Low, High float64
	// Change is the mid-run halving on engines at 1×; zero: the cluster's
	// first domain, halfway through the replay, to 0.5.
	Change EngineChange
}

// SpreadMix is a spread replay of its own mix and config.
type SpreadMix struct {
	Name   string // how the table names it
	Rows   []Row
	Config admission.Config
}

// FeedbackRun is one replay of the table.
type FeedbackRun struct {
	Name    string        `json:"name"`
	Policy  string        `json:"policy"`
	Speed   float64       `json:"speed"`
	Engines *EngineReport `json:"engines"`
	// MinFairShare is the smallest ratio, over the tenants, of what a
	// tenant was admitted to its weighted max-min fair share.
	MinFairShare float64 `json:"minFairShare"`
	Jain         float64 `json:"jainIndex"`
}

// TargetRow is one line of the table: what was measured under sluice
// with the loop closed and open and under the threshold rule, the figure
// the target reads, the target, and whether it is met.
type TargetRow struct {
	Row       string `json:"row"`
	Measure   string `json:"measure"`
	Closed    string `json:"closed"`
	Open      string `json:"open"`
	Threshold string `json:"threshold"`
	Measured  string `json:"measured"`
	Target    string `json:"target"`
	// Met is "met", "NOT MET", or "-" for a figure without a target; the
	// clairvoyant dispatcher's yardstick is "within reach" or "out of reach".
	Met string `json:"met"`
}

// FeedbackTable is the capacity loop measured against its targets.
type FeedbackTable struct {
	Trace       string        `json:"trace"`
	Rows        int           `json:"rows"`
	Seed        uint64        `json:"seed"`
	Speed       float64       `json:"speed"`
	SpreadTrace string        `json:"spreadTrace"`
	SpreadSpeed float64       `json:"spreadSpeed"`
	SpreadMix   string        `json:"spreadMix,omitempty"` // the many tenants' spread rows, if any
	Deadline    string        `json:"deadline"`
	Targets     []TargetRow   `json:"targets"`
	Runs        []FeedbackRun `json:"runs"`
}

// minFairShare is the smallest achieved ÷ fair share over r's tenants.
func minFairShare(r *Report) float64 {
	least := math.Inf(1)
	for i := range r.Tenants {
		a, g := sum(r.Tenants[i].Achieved), sum(r.Tenants[i].Target)
		if g > 0 {
			least = math.Min(least, float64(a)/float64(g))
		}
	}
	if math.IsInf(least, 1) {
		return 0
	}
	return least
}

// rescale returns rows at speed to instead of from.
func rescale(rows []Row, from, to float64) []Row {
	out := make([]Row, len(rows))
	for i, r := range rows {
		r.At = time.Duration(math.Round(float64(r.At) * from / to))
		out[i] = r
	}
	return out
}

// feedbackRunner runs and keeps the table's replays.
type feedbackRunner struct {
	o    *FeedbackOptions
	runs []FeedbackRun
}

func (f *feedbackRunner) run(name, policy string, rows []Row, speed float64, eng EngineOptions) (*FeedbackRun, error) {
	return f.runWith(name, policy, rows, speed, eng, f.o.Config)
}

func (f *feedbackRunner) runWith(name, policy string, rows []Row, speed float64, eng EngineOptions, cfg admission.Config) (*FeedbackRun, error) {
	r, err := Run(rows, Options{Policy: policy, Config: cfg, Cluster: f.o.Cluster, Deadline: f.o.Deadline, Engine: eng})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	f.runs = append(f.runs, FeedbackRun{Name: name, Policy: policy, Speed: speed, Engines: r.Engines, MinFairShare: minFairShare(r), Jain: r.Jain})
	return &f.runs[len(f.runs)-1], nil
}

// trio is one capacity's three replays.
type trio struct{ closed, open, threshold *FeedbackRun }

func (f *feedbackRunner) trio(label string, capacity float64, changes []EngineChange) (trio, error) {
	var t trio
	var err error
	eng := f.o.Engine
	eng.Capacity, eng.Changes = capacity, changes
	if t.closed, err = f.run(label+" closed", PolicySluice, f.o.Rows, f.o.Speed, eng); err != nil {
		return t, err
	}
	eng.OpenLoop = true
	if t.open, err = f.run(label+" open", PolicySluice, f.o.Rows, f.o.Speed, eng); err != nil {
		return t, err
	}
	eng.OpenLoop = false
	if t.threshold, err = f.run(label+" threshold", PolicyThreshold, f.o.Rows, f.o.Speed, eng); err != nil {
		return t, err
	}
	return t, nil
}

// equalUtil replays the threshold rule on engines at capacity at the
// speed at which it uses them as much as util (bisected on the
// logarithm of the speed, at most the table's speed).
func (f *feedbackRunner) equalUtil(label string, capacity, util float64) (*FeedbackRun, error) {
	eng := f.o.Engine
	eng.Capacity = capacity
	lo, hi := math.Log(f.o.Speed/32), math.Log(f.o.Speed)
	var best *Report
	bestSpeed := 0.0
	for range 10 {
		mid := (lo + hi) / 2
		speed := math.Exp(mid)
		r, err := Run(rescale(f.o.Rows, f.o.Speed, speed), Options{Policy: PolicyThreshold, Config: f.o.Config, Cluster: f.o.Cluster, Deadline: f.o.Deadline, Engine: eng})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", label, err)
		}
		if best == nil || math.Abs(r.Engines.Util-util) < math.Abs(best.Engines.Util-util) {
			best, bestSpeed = r, speed
		}
		if r.Engines.Util < util {
			lo = mid
		} else {
			hi = mid
		}
	}
	f.runs = append(f.runs, FeedbackRun{Name: label, Policy: PolicyThreshold, Speed: bestSpeed, Engines: best.Engines, MinFairShare: minFairShare(best), Jain: best.Jain})
	return &f.runs[len(f.runs)-1], nil
}

// withinSLO replays the clairvoyant dispatcher on engines at capacity
// with the largest budget up to the SLO whose TTFT p99 is within it: the
// SLO itself, or one bisected between half the SLO and the SLO to within
// 0.4% (the TTFT histogram rounds a p99 at the budget up by up to 0.1%).
// Its utilization is the most this dispatcher finds within the SLO. Nil
// when no budget tried keeps TTFT p99 within the SLO.
func (f *feedbackRunner) withinSLO(label string, capacity float64) (*FeedbackRun, time.Duration, error) {
	eng := f.o.Engine
	eng.Capacity = capacity
	slo := eng.SLO
	var best *Report
	var budget time.Duration
	try := func(b time.Duration) (bool, error) {
		eng.Budget = b
		r, err := Run(f.o.Rows, Options{Policy: PolicyClairvoyant, Config: f.o.Config, Cluster: f.o.Cluster, Deadline: f.o.Deadline, Engine: eng})
		if err != nil {
			return false, fmt.Errorf("%s: %w", label, err)
		}
		if r.Engines.TTFTP99 > float64(slo)/1e6 {
			return false, nil
		}
		best, budget = r, b
		return true, nil
	}
	ok, err := try(slo)
	for lo, hi, i := slo/2, slo, 0; !ok && err == nil && i < 7; i++ {
		mid := (lo + hi) / 2
		var in bool
		if in, err = try(mid); in {
			lo = mid
		} else {
			hi = mid
		}
	}
	if err != nil || best == nil {
		return nil, 0, err
	}
	f.runs = append(f.runs, FeedbackRun{Name: fmt.Sprintf("%s, budget %v", label, budget.Round(time.Millisecond)), Policy: PolicyClairvoyant,
		Speed: f.o.Speed, Engines: best.Engines, MinFairShare: minFairShare(best), Jain: best.Jain})
	return &f.runs[len(f.runs)-1], budget, nil
}

func pct(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }
func num(v float64) string { return fmt.Sprintf("%.0f", v) }
func msf(v float64) string { return fmt.Sprintf("%.0f ms", v) }

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT MET"
}

// RunFeedbackTable replays o's trace on engines at o.Low and o.High
// times the model, with a mid-run halving, and o's spread trace, under
// sluice with the capacity loop closed and open and under the threshold
// rule, and measures each target of the loop; and o's trace on engines at
// 1× with lower tiers allowed and not (CompareDowngrade).
func RunFeedbackTable(o FeedbackOptions) (*FeedbackTable, error) {
	if o.Low <= 0 {
		o.Low = 0.6
	}
	if o.High <= 0 {
		o.High = 1.5
	}
	o.Engine = o.Engine.withDefaults()
	if o.Change.Domain == "" {
		if len(o.Cluster.Domains) == 0 || len(o.Rows) == 0 {
			return nil, fmt.Errorf("the capacity table needs a cluster and a trace")
		}
		last := o.Rows[len(o.Rows)-1].At
		o.Change = EngineChange{Domain: o.Cluster.Domains[0].ID, At: (last / 2).Truncate(time.Second), Capacity: 0.5}
	}
	f := &feedbackRunner{o: &o}
	qT := o.Config.Feedback.QueueThreshold
	slo := float64(o.Engine.SLO) / 1e6
	tab := &FeedbackTable{Trace: o.Trace, Rows: len(o.Rows), Seed: o.Seed, Speed: o.Speed, SpreadTrace: o.SpreadTrace, SpreadSpeed: o.SpreadSpeed, Deadline: o.Deadline.String()}
	if o.Many != nil {
		tab.SpreadMix = o.Many.Name
	}
	add := func(row TargetRow) { tab.Targets = append(tab.Targets, row) }
	each := func(t trio, v func(*FeedbackRun) string) (string, string, string) {
		return v(t.closed), v(t.open), v(t.threshold)
	}

	// reachable adds whether target × the open loop's measure and the
	// TTFT SLO hold together, within the tenants' quotas, for a dispatcher
	// that foresees each engine's prefills (the clairvoyant, its budget
	// bisected).
	reachable := func(name string, capacity float64, open *FeedbackRun, what string, target float64, measure func(*EngineReport) (float64, string)) error {
		cv, budget, err := f.withinSLO(name+" clairvoyant within the SLO", capacity)
		if err != nil {
			return err
		}
		reach, most := "out of reach", "no budget from half the SLO up keeps TTFT p99 within it"
		if cv != nil {
			got, shown := measure(cv.Engines)
			of, _ := measure(open.Engines)
			share := got / math.Max(of, 1e-9)
			most = fmt.Sprintf("÷ open %.3f (%s, TTFT p99 %s, budget %v)", share, shown, msf(cv.Engines.TTFTP99), budget.Round(time.Millisecond))
			if share >= target {
				reach = "within reach"
			}
		}
		add(TargetRow{name, fmt.Sprintf("the most %s with TTFT p99 ≤ %.0f ms within the quotas: a clairvoyant dispatcher, its budget bisected", what, slo),
			"", "", "", most, fmt.Sprintf("≥ %g for both targets", target), reach})
		return nil
	}

	low, err := f.trio(fmt.Sprintf("engine %g×", o.Low), o.Low, nil)
	if err != nil {
		return nil, err
	}
	high, err := f.trio(fmt.Sprintf("engine %g×", o.High), o.High, nil)
	if err != nil {
		return nil, err
	}
	for _, c := range []struct {
		cap float64
		t   trio
	}{{o.Low, low}, {o.High, high}} {
		name := fmt.Sprintf("engine %g×", c.cap)
		e := func(r *FeedbackRun) *EngineReport { return r.Engines }
		cl, op, th := each(c.t, func(r *FeedbackRun) string { return num(e(r).QueueP99) })
		q := e(c.t.closed).QueueP99
		add(TargetRow{name, "engine queue p99, worst domain", cl, op, th, num(q), fmt.Sprintf("closed ≤ %g and < open", qT),
			verdict(q <= qT && q < e(c.t.open).QueueP99)})
		cl, op, th = each(c.t, func(r *FeedbackRun) string { return msf(e(r).TTFTP99) })
		add(TargetRow{name, "TTFT p99 (dispatch to first token)", cl, op, th, cl, fmt.Sprintf("closed ≤ %.0f ms", slo), verdict(e(c.t.closed).TTFTP99 <= slo)})
		cl, op, th = each(c.t, func(r *FeedbackRun) string { return msf(e(r).AloneP99) })
		add(TargetRow{name, "p99 of the admitted prefills alone on their engine (no policy's TTFT p99 is below it)", cl, op, th, cl, "-", "-"})
		cl, op, th = each(c.t, func(r *FeedbackRun) string { return pct(e(r).WithinSLO) })
		add(TargetRow{name, fmt.Sprintf("requests with a first token ≤ %.0f ms after arrival", slo), cl, op, th, cl, "-", "-"})
		cl, op, th = each(c.t, func(r *FeedbackRun) string { return pct(e(r).Util) })
		if c.cap == o.Low {
			// The open loop sends the engines all they can take: its
			// utilization is the most this demand gives them.
			busy := e(c.t.closed).Util / math.Max(e(c.t.open).Util, 1e-9)
			add(TargetRow{name, "utilization of the engines' true capacity", cl, op, th, fmt.Sprintf("closed ÷ open %.2f", busy), "≥ 0.85", verdict(busy >= 0.85)})
			if err := reachable(name, c.cap, c.t.open, "utilization", 0.85, func(e *EngineReport) (float64, string) { return e.Util, pct(e.Util) }); err != nil {
				return nil, err
			}
		} else {
			add(TargetRow{name, "utilization of the engines' true capacity", cl, op, th, cl, "-", "-"})
		}
		cl, op, th = each(c.t, func(r *FeedbackRun) string { return num(e(r).AdmittedRate) })
		ratio := e(c.t.closed).AdmittedRate / math.Max(e(c.t.open).AdmittedRate, 1)
		if c.cap == o.High {
			add(TargetRow{name, "admitted weighted tokens/s", cl, op, th, fmt.Sprintf("closed ÷ open %.2f", ratio), "≥ 1.3", verdict(ratio >= 1.3)})
			if err := reachable(name, c.cap, c.t.open, "admitted", 1.3, func(e *EngineReport) (float64, string) { return e.AdmittedRate, num(e.AdmittedRate) }); err != nil {
				return nil, err
			}
		} else {
			add(TargetRow{name, "admitted weighted tokens/s", cl, op, th, fmt.Sprintf("closed ÷ open %.2f", ratio), "-", "-"})
		}
		cl, op, th = each(c.t, func(r *FeedbackRun) string { return fmt.Sprint(e(r).FloorViolations) })
		add(TargetRow{name, "floor-violation seconds, all tenants", cl, op, th, cl, "closed 0", verdict(e(c.t.closed).FloorViolations == 0)})
		cl, op, th = each(c.t, func(r *FeedbackRun) string { return fmt.Sprint(e(r).WithinShareRefused) })
		add(TargetRow{name, "refusals of tenants within their share", cl, op, th, cl, "closed 0", verdict(e(c.t.closed).WithinShareRefused == 0)})
		cl, op, th = each(c.t, func(r *FeedbackRun) string { return fmt.Sprintf("%.2f", r.MinFairShare) })
		add(TargetRow{name, "least admitted ÷ fair share of a tenant (no tier starved)", cl, op, th, cl, "closed ≥ 0.5", verdict(c.t.closed.MinFairShare >= 0.5)})

		eq, err := f.equalUtil(fmt.Sprintf("engine %g× threshold at equal utilization", c.cap), c.cap, e(c.t.closed).Util)
		if err != nil {
			return nil, err
		}
		add(TargetRow{name, "TTFT p99 at equal utilization (threshold's speed bisected)",
			fmt.Sprintf("%s at %s", msf(e(c.t.closed).TTFTP99), pct(e(c.t.closed).Util)), "",
			fmt.Sprintf("%s at %s (×%.2f)", msf(eq.Engines.TTFTP99), pct(eq.Engines.Util), eq.Speed),
			fmt.Sprintf("%s vs %s", msf(e(c.t.closed).TTFTP99), msf(eq.Engines.TTFTP99)), "closed ≤ threshold",
			verdict(e(c.t.closed).TTFTP99 <= eq.Engines.TTFTP99)})
	}

	// The mid-run halving, on engines the model is right about, and the
	// same replay without it: what the trace's bursts alone give the
	// domain's queue from that time on.
	halving, err := f.trio("halving", 1, []EngineChange{o.Change})
	if err != nil {
		return nil, err
	}
	same := o.Change
	same.Capacity = 1
	baseline, err := f.trio("halving's baseline", 1, []EngineChange{same})
	if err != nil {
		return nil, err
	}
	recov := func(r *FeedbackRun) string {
		c := r.Engines.Changes[0]
		switch {
		case c.OverS < 0:
			return fmt.Sprintf("0 s (never past %g)", qT)
		case c.RecoveryS < 0:
			return fmt.Sprintf("never (past from +%.1f s, peak %d)", c.OverS, c.PeakQueue)
		}
		return fmt.Sprintf("%.1f s (past from +%.1f s, peak %d)", c.RecoveryS, c.OverS, c.PeakQueue)
	}
	halvingRow := fmt.Sprintf("engine 1× → %s %g× at %v", o.Change.Domain, o.Change.Capacity, o.Change.At)
	cl, op, th := each(halving, recov)
	rc := halving.closed.Engines.Changes[0].RecoveryS
	add(TargetRow{halvingRow, fmt.Sprintf("time its queue is past %g until back to stay %v", qT, recoveryHold), cl, op, th, cl, "closed ≤ 5 s",
		verdict(rc >= 0 && rc <= 5)})
	cl, op, th = each(baseline, recov)
	add(TargetRow{halvingRow, "the same, with no change (the trace's bursts alone)", cl, op, th, cl, "-", "-"})

	// Spread, on engines the model is right about: the table's mix, and
	// many tenants' if given.
	eng := o.Engine
	eng.Capacity = 1
	// first: the first-choice share is a target, for the many tenants'
	// run: with the table's mix one tenant is most of the load, and no
	// spread within 1.5 leaves half of it on one domain of four.
	type spreadRun struct {
		name, label string
		rows        []Row
		cfg         admission.Config
		first       bool
	}
	spreads := []spreadRun{{"spread closed", fmt.Sprintf("spread ×%g, engine 1×", o.SpreadSpeed), o.SpreadRows, o.Config, false}}
	if o.Many != nil {
		spreads = append(spreads, spreadRun{"spread closed, " + o.Many.Name, fmt.Sprintf("spread ×%g, engine 1×, %s", o.SpreadSpeed, o.Many.Name), o.Many.Rows, o.Many.Config, true})
	}
	for _, v := range spreads {
		sp, err := f.runWith(v.name, PolicySluice, v.rows, o.SpreadSpeed, eng, v.cfg)
		if err != nil {
			return nil, err
		}
		add(TargetRow{v.label, "busiest ÷ least busy domain of the same GPUs (utilization)", fmt.Sprintf("%.2f", sp.Engines.Spread), "", "",
			fmt.Sprintf("%.2f", sp.Engines.Spread), "≤ 1.5", verdict(sp.Engines.Spread > 0 && sp.Engines.Spread <= 1.5)})
		target, result := "-", "-"
		if v.first {
			target, result = "≥ 50%", verdict(sp.Engines.FirstShareMin >= 0.5)
		}
		add(TargetRow{v.label, "least share of a tenant's admissions on its " + sp.Engines.FirstBy, pct(sp.Engines.FirstShareMin), "", "",
			pct(sp.Engines.FirstShareMin), target, result})
	}
	// Downgrade, on engines the model is right about: the saturated rows
	// without lower tiers and with every request accepting its model's,
	// at the table's deadline and at the config's default wait.
	for _, deadline := range []time.Duration{o.Deadline, 0} {
		dl := deadline
		if dl == 0 {
			dl = o.Config.Queue.DefaultWait.Duration
		}
		label := fmt.Sprintf("downgrade vs not, deadline %v", dl)
		c, err := CompareDowngrade(o.Rows, Options{Config: o.Config, Cluster: o.Cluster, Deadline: deadline, Engine: eng})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", label, err)
		}
		for _, r := range []struct {
			name string
			rep  *Report
		}{{"not allowed", c.Not}, {"allowed", c.Allowed}} {
			f.runs = append(f.runs, FeedbackRun{Name: fmt.Sprintf("downgrade %s, deadline %v", r.name, dl), Policy: PolicySluice, Speed: o.Speed,
				Engines: r.rep.Engines, MinFairShare: minFairShare(r.rep), Jain: r.rep.Jain})
		}
		add(TargetRow{label, "utilization of engines at 1× (over the longer of the two replays)", fmt.Sprintf("%s → %s", pct(c.UtilNot), pct(c.UtilAllowed)), "", "",
			fmt.Sprintf("allowed ÷ not %.3f", c.UtilAllowed/math.Max(c.UtilNot, 1e-9)), "≥ 1", verdict(c.UtilAllowed >= c.UtilNot)})
		least := fmt.Sprintf("%.4f (%s)", c.LeastRatio, c.LeastTenant)
		add(TargetRow{label, "least admitted weighted tokens of a tenant, allowed ÷ not", least, "", "", least, "≥ 1", verdict(c.LeastRatio >= 1)})
	}
	tab.Runs = f.runs
	return tab, nil
}

// WriteJSON writes t as indented JSON.
func (t *FeedbackTable) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(t); err != nil {
		return fmt.Errorf("json: %w", err)
	}
	return nil
}

// WriteTable writes the targets as a text table, and a line per replay.
func (t *FeedbackTable) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	many := ""
	if t.SpreadMix != "" {
		many = ", also with " + t.SpreadMix
	}
	fmt.Fprintf(tw, "capacity loop targets: %s ×%g (%d requests, seed %d, deadline %s); spread on %s ×%g%s\n\n",
		t.Trace, t.Speed, t.Rows, t.Seed, t.Deadline, t.SpreadTrace, t.SpreadSpeed, many)
	fmt.Fprintln(tw, "row\tmeasure\tsluice closed\tsluice open\tthreshold\tmeasured\ttarget\tresult")
	for _, r := range t.Targets {
		cell := func(s string) string {
			if s == "" {
				return "-"
			}
			return s
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Row, r.Measure, cell(r.Closed), cell(r.Open), cell(r.Threshold), r.Measured, r.Target, r.Met)
	}
	fmt.Fprintln(tw, "\nreplay\tspeed\tadmitted tok/s\tutilization\tTTFT p99 ms\tqueue p99\tfloor viol s\tfactors at the end")
	for _, r := range t.Runs {
		factors := "-"
		if r.Policy == PolicySluice {
			factors = ""
			for i, d := range r.Engines.Domains {
				if i > 0 {
					factors += " "
				}
				factors += fmt.Sprintf("%s %.2f", d.ID, d.Factor)
			}
		}
		e := r.Engines
		fmt.Fprintf(tw, "%s\t%.3g\t%.0f\t%.1f%%\t%.0f\t%.0f\t%d\t%s\n", r.Name, r.Speed, e.AdmittedRate, 100*e.Util, e.TTFTP99, e.QueueP99, e.FloorViolations, factors)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}
