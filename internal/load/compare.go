package load

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// Round is one round of Compare: the load's and the reference's calls per
// second, measured back to back.
type Round struct {
	Round                int     `json:"round"`
	ReferenceFirst       bool    `json:"referenceFirst"`
	LoadCallsPerSec      float64 `json:"loadCallsPerSec"`
	ReferenceCallsPerSec float64 `json:"referenceCallsPerSec"`
	Ratio                float64 `json:"ratio"`
}

// Report is what `sluicectl load` prints: the options, the load's result,
// the reference's when one ran, and the lease count the server reports.
type Report struct {
	Target      string  `json:"target"`
	Mode        Mode    `json:"mode"`
	Concurrency int     `json:"concurrency,omitempty"`
	Rate        float64 `json:"rate,omitempty"`
	Arrivals    string  `json:"arrivals,omitempty"` // poisson or fixed
	Connections int     `json:"connections"`
	Duration    string  `json:"duration"`
	Hold        string  `json:"hold"`
	Deadline    string  `json:"deadline"`
	Release     bool    `json:"release"`
	Tenants     []Mix   `json:"tenants,omitempty"`
	Prefilled   int64   `json:"prefilled,omitempty"` // leases admitted and held before the measured rounds
	Load        *Result `json:"load"`
	Reference   *Result `json:"reference,omitempty"`
	// Ratio is Load.CallsPerSec / Reference.CallsPerSec over all rounds;
	// RatioMedian the median of the rounds' ratios, which a neighbour's
	// burst on a shared machine moves less.
	Ratio       float64 `json:"ratio,omitempty"`
	RatioMedian float64 `json:"ratioMedian,omitempty"`
	// CPURatio is the reference's CPU time per call (client and server)
	// over the load's: the ratio of calls per second the two would reach
	// on a machine doing nothing else, when both are CPU-bound there. It
	// needs the server's pid (Options.ServerPID).
	CPURatio    float64  `json:"cpuRatio,omitempty"`
	Rounds      []Round  `json:"rounds,omitempty"`
	LeasesHeld  *int64   `json:"leasesHeld,omitempty"` // the server's in-flight leases after the run (ListDomains)
	LeasesError string   `json:"leasesHeldError,omitempty"`
	Notes       []string `json:"notes,omitempty"`
}

// Compare runs rounds of the load (Run on targets) and the reference
// (RunHealth on conns), each for opts.Duration, alternating which goes
// first so that the machine's drift falls on both, and returns both merged
// with the ratio of their calls per second. conns nil runs the load alone,
// once per round.
func Compare(ctx context.Context, opts Options, targets []Target, conns []grpc.ClientConnInterface, rounds int) (*Report, error) {
	if rounds < 1 {
		return nil, fmt.Errorf("--rounds %d: want at least 1", rounds)
	}
	rep := &Report{Mode: opts.Mode, Duration: opts.Duration.String(), Hold: opts.Hold.String(),
		Deadline: opts.Deadline.String(), Release: opts.Release, Tenants: opts.Tenants}
	switch opts.Mode {
	case ModeClosed:
		rep.Concurrency = opts.Concurrency
	case ModeOpen:
		rep.Rate, rep.Arrivals = opts.Rate, "fixed"
		if opts.Poisson {
			rep.Arrivals = "poisson"
		}
	}
	var loads, refs []*Result
	// One draw for every round: pools in turn go on where the last round
	// ended.
	opts.draw = newPicker(&opts)
	seed := opts.Seed
	for i := range rounds {
		refFirst := i%2 == 0
		// Each round draws other tenants from the mix: with the same seed
		// a round would repeat the last one's draws, and a pool's tenants
		// would be warm from the second round on.
		opts.Seed = seed + uint64(i)*0x9e3779b97f4a7c15
		var l, r *Result
		var err error
		runRef := func() error {
			if conns == nil {
				return nil
			}
			r, err = RunHealth(ctx, opts, conns)
			return err
		}
		if refFirst {
			if err := runRef(); err != nil {
				return nil, fmt.Errorf("round %d: reference: %w", i+1, err)
			}
		}
		if l, err = Run(ctx, opts, targets); err != nil {
			return nil, fmt.Errorf("round %d: load: %w", i+1, err)
		}
		if !refFirst {
			if err := runRef(); err != nil {
				return nil, fmt.Errorf("round %d: reference: %w", i+1, err)
			}
		}
		loads = append(loads, l)
		if r != nil {
			refs = append(refs, r)
			rep.Rounds = append(rep.Rounds, Round{Round: i + 1, ReferenceFirst: refFirst, LoadCallsPerSec: l.CallsPerSec,
				ReferenceCallsPerSec: r.CallsPerSec, Ratio: ratio(l.CallsPerSec, r.CallsPerSec)})
		}
	}
	rep.Load = mergeResults(loads)
	if len(refs) > 0 {
		rep.Reference = mergeResults(refs)
		rep.Ratio = ratio(rep.Load.CallsPerSec, rep.Reference.CallsPerSec)
		rs := make([]float64, len(rep.Rounds))
		for i, rd := range rep.Rounds {
			rs[i] = rd.Ratio
		}
		slices.Sort(rs)
		rep.RatioMedian = rs[len(rs)/2]
		if len(rs)%2 == 0 {
			rep.RatioMedian = (rs[len(rs)/2-1] + rs[len(rs)/2]) / 2
		}
		if l, r := rep.Load, rep.Reference; l.ServerCPUPerCallUs > 0 && r.ServerCPUPerCallUs > 0 {
			rep.CPURatio = ratio(r.ClientCPUPerCallUs+r.ServerCPUPerCallUs, l.ClientCPUPerCallUs+l.ServerCPUPerCallUs)
		}
	}
	return rep, nil
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// Lease is a lease a Prefill holds, with what its Release reports.
type Lease struct {
	ID             string
	Prompt, Output int64
}

// Prefill admits n leases with opts' tenants and tokens over opts'
// Concurrency callers and returns them, held, for a measurement under a
// loaded lease table. It gives up when more than max(1000, n/10) Admits
// grant no lease, with the last refusal or error.
func Prefill(ctx context.Context, opts Options, targets []Target, n int) ([]Lease, error) {
	if n <= 0 {
		return nil, nil
	}
	if len(targets) == 0 {
		return nil, errors.New("prefill: no target")
	}
	ids := newIDs(opts.RequestIDs)
	var (
		mu       sync.Mutex
		leases   = make([]Lease, 0, n)
		failures atomic.Int64
		lastErr  atomic.Value
		granted  atomic.Int64
	)
	maxFail := int64(max(1000, n/10))
	pick := newPicker(&opts)
	var wg sync.WaitGroup
	for w := range max(opts.Concurrency, 1) {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(opts.Seed, 1<<32+uint64(w)))
			t := targets[w%len(targets)]
			for granted.Add(1) <= int64(n) {
				if ctx.Err() != nil || failures.Load() > maxFail {
					return
				}
				a := pick.pick(rng)
				cctx, cancel := withDeadline(ctx, opts.Deadline)
				resp, err := t.Admit(cctx, &admissionv1.AdmitRequest{RequestId: ids.next(), Tenant: a.Tenant, Model: a.Model,
					PromptTokens: a.Prompt, MaxOutputTokens: a.Output, Priority: admissionv1.Priority_PRIORITY_NORMAL,
					AcceptDowngrade: opts.AcceptDowngrade})
				cancel()
				switch {
				case err != nil:
					lastErr.Store(fmt.Sprintf("gRPC %v", status.Code(err)))
				case resp.GetLeaseId() == "":
					lastErr.Store(fmt.Sprintf("%v %v", resp.GetDecision(), reasonName(resp.GetReason())))
				default:
					mu.Lock()
					leases = append(leases, Lease{ID: resp.GetLeaseId(), Prompt: a.Prompt, Output: a.Output})
					mu.Unlock()
					continue
				}
				failures.Add(1)
				granted.Add(-1) // try again for this lease
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return leases, fmt.Errorf("prefill: %w", err)
	}
	if len(leases) < n {
		last, _ := lastErr.Load().(string)
		return leases, fmt.Errorf("prefill: %d of %d leases granted before %d Admits granted none (last: %s)", len(leases), n, failures.Load(), last)
	}
	return leases, nil
}

// ReleaseLeases releases leases over concurrency callers and returns how
// many Releases failed, with the first error.
func ReleaseLeases(ctx context.Context, targets []Target, leases []Lease, concurrency int) (int, error) {
	var next, failed atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for w := range max(concurrency, 1) {
		wg.Go(func() {
			t := targets[w%len(targets)]
			for {
				i := next.Add(1) - 1
				if i >= int64(len(leases)) || ctx.Err() != nil {
					return
				}
				l := leases[i]
				if _, err := t.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: l.ID, PromptTokens: l.Prompt, OutputTokens: l.Output,
					Outcome: admissionv1.Outcome_OUTCOME_OK}); err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, err)
				}
			}
		})
	}
	wg.Wait()
	err, _ := first.Load().(error)
	if err != nil {
		return int(failed.Load()), fmt.Errorf("release: %w", err)
	}
	return 0, nil
}

// LeasesHeld asks the server behind cc for its domains and sums their
// in-flight leases: the lease table's size as the server sees it (the
// Operator API needs the viewer role when sluiced runs with --auth).
func LeasesHeld(ctx context.Context, cc grpc.ClientConnInterface) (int64, error) {
	resp, err := admissionv1.NewOperatorClient(cc).ListDomains(ctx, &admissionv1.ListDomainsRequest{})
	if err != nil {
		return 0, fmt.Errorf("ListDomains: %w", err)
	}
	var n int64
	for _, d := range resp.GetDomains() {
		n += d.GetInFlight()
	}
	return n, nil
}

// WriteJSON prints the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// WriteTable prints the report for people: the throughput beside the
// reference, the tenants, the latencies and the errors.
func (r *Report) WriteTable(w io.Writer) error {
	var head string
	switch r.Mode {
	case ModeClosed:
		head = fmt.Sprintf("closed loop, %d callers", r.Concurrency)
	case ModeOpen:
		head = fmt.Sprintf("open loop, %g/s %s", r.Rate, r.Arrivals)
	default:
		head = "trace arrivals"
	}
	rounds := max(len(r.Rounds), 1)
	conns := fmt.Sprintf("%d connection(s)", r.Connections)
	if r.Connections == 0 {
		conns = "each tenant routed to its replica"
	}
	fmt.Fprintf(w, "load %s on %s: %s, %s, %s × %d round(s), hold %s, deadline %s\n",
		r.Load.Kind, r.Target, head, conns, r.Duration, rounds, r.Hold, r.Deadline)
	if r.Prefilled > 0 {
		fmt.Fprintf(w, "prefilled: %d leases held through the run\n", r.Prefilled)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tcalls/s\tAdmit calls/s\tadmissions/s\tcalls\tseconds\tCPU µs/call client\tserver\t")
	cpu := func(res *Result) string {
		if res.ServerCPUPerCallUs == 0 {
			return fmt.Sprintf("%.1f\t-", res.ClientCPUPerCallUs)
		}
		return fmt.Sprintf("%.1f\t%.1f", res.ClientCPUPerCallUs, res.ServerCPUPerCallUs)
	}
	if r.Reference != nil {
		fmt.Fprintf(tw, "health Check (reference)\t%.0f\t\t\t%d\t%.1f\t%s\t\n", r.Reference.CallsPerSec, r.Reference.Calls, r.Reference.Seconds, cpu(r.Reference))
	}
	fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%d\t%.1f\t%s\t\n", r.Load.Kind, r.Load.CallsPerSec, r.Load.AdmitCallsPerSec, r.Load.AdmissionsPerSec,
		r.Load.Calls, r.Load.Seconds, cpu(r.Load))
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.Reference != nil {
		rs := make([]string, len(r.Rounds))
		lo, hi := math.Inf(1), math.Inf(-1)
		for i, rd := range r.Rounds {
			rs[i] = fmt.Sprintf("%.3f", rd.Ratio)
			lo, hi = min(lo, rd.Ratio), max(hi, rd.Ratio)
		}
		fmt.Fprintf(w, "ratio %s ÷ health Check: %.3f over all rounds; median of rounds %.3f (rounds: %s; min %.3f, max %.3f)\n",
			r.Load.Kind, r.Ratio, r.RatioMedian, strings.Join(rs, " "), lo, hi)
		if r.CPURatio > 0 {
			fmt.Fprintf(w, "CPU per call, client + server: health Check's ÷ %s's = %.3f\n", r.Load.Kind, r.CPURatio)
		}
	}
	switch {
	case r.LeasesHeld != nil:
		fmt.Fprintf(w, "leases held on the server after the run (ListDomains in-flight sum): %d\n", *r.LeasesHeld)
	case r.LeasesError != "":
		fmt.Fprintf(w, "leases held on the server: unknown (%s)\n", r.LeasesError)
	}
	if ch := r.Load.Churn; ch != nil {
		fmt.Fprintf(w, "churn (%g/s asked, %d domains): %d drains, %d undrains, %d health cuts (%d found no uncut domain), %.1f changes/s; after: %d draining, %d with a cut weight; errors: %s\n",
			ch.Rate, ch.Domains, ch.Drains, ch.Undrains, ch.HealthCuts, ch.HealthMisses, ch.ChangesPerSec, ch.Draining, ch.WeightCut, orNone(countList(ch.Errors)))
		if ch.FirstError != "" {
			fmt.Fprintf(w, "first churn error: %s\n", ch.FirstError)
		}
	}
	if r.Load.Dropped > 0 {
		fmt.Fprintf(w, "dropped arrivals (max in flight reached): %d\n", r.Load.Dropped)
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tREQUESTS\tADMITTED\tADMITTED/S\tDEGRADED\tDEGRADED/S\tREJECTED\tERRORS\tREFUSALS")
	for _, t := range r.Load.Tenants {
		name := t.Tenant
		if t.Pool > 0 {
			name = fmt.Sprintf("%s (%d of %d called)", t.Tenant, t.Distinct, t.Pool)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%d\t%.1f\t%d\t%d\t%s\n", name, t.Requests, t.Admitted, t.AdmittedPerSec,
			t.Degraded, t.DegradedPerSec, t.Rejected, t.Errors, countList(t.Refusals))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "µs\tcount\tp50\tp90\tp99\tp99.9\tmax\t")
	row := func(name string, p *Percentiles) {
		if p == nil || p.Count == 0 {
			return
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", name, p.Count, p.P50, p.P90, p.P99, p.P999, p.Max)
	}
	row("Admit latency", &r.Load.Latency)
	row("queued (server)", r.Load.Queued)
	row("Release latency", r.Load.ReleaseLatency)
	row("start lag", r.Load.StartLag)
	if r.Reference != nil {
		row("health Check latency", &r.Reference.Latency)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nrefusals: %s\n", orNone(countList(r.Load.Refusals)))
	fmt.Fprintf(w, "errors: Admit %s; Release %s", orNone(countList(r.Load.Errors)), orNone(countList(r.Load.ReleaseErrors)))
	if r.Reference != nil {
		fmt.Fprintf(w, "; health Check %s", orNone(countList(r.Reference.Errors)))
	}
	fmt.Fprintln(w)
	for _, e := range []struct{ what, msg string }{{"Admit", r.Load.FirstError}, {"Release", r.Load.FirstReleaseError}} {
		if e.msg != "" {
			fmt.Fprintf(w, "first %s error: %s\n", e.what, e.msg)
		}
	}
	if r.Reference != nil && r.Reference.FirstError != "" {
		fmt.Fprintf(w, "first health Check error: %s\n", r.Reference.FirstError)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	return nil
}

// countList renders counts by name, largest first: "QUOTA_EXCEEDED 12, …".
func countList(m map[string]int64) string {
	keys := sortedKeys(m)
	slices.SortStableFunc(keys, func(a, b string) int { return cmp.Compare(m[b], m[a]) })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
