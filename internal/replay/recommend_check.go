package replay

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
)

// CheckOptions are what RecommendChecked replays on and searches for.
type CheckOptions struct {
	Config  admission.Config // defaulted and validated (Setup)
	Cluster topology.Cluster
	// Window is the burst window (as Recommend's).
	Window time.Duration
	// Target is the p99 time to admission (Wait) each tenant's rate is
	// searched for; 0 keeps the knee of the sweep as the rate.
	Target time.Duration
}

// The rate search: from the tenant's mean rate, double until a replay
// meets the target (up to searchDoublings times, 2^7 = 128× the mean),
// then bisect between the last rate that missed and the first that met
// until they are within searchPrecision of each other (at most
// searchHalvings replays: the interval starts at half the rate that met).
// A tenant's search is therefore at most 1 + 7 + 7 = 15 replays of its
// rows alone. When no doubling meets the target, the bisection looks
// instead for the smallest rate within plateauMargin of the best p99 seen,
// with the same bound.
const (
	searchDoublings = 7
	searchHalvings  = 7
	searchPrecision = 0.01
	plateauMargin   = 0.1
)

// MaxSearchReplays is the most replays one tenant's rate search runs.
const MaxSearchReplays = 1 + searchDoublings + searchHalvings

// SearchStep is one replay of a rate search: the tenant's rows alone at
// Rate and its burst.
type SearchStep struct {
	Rate  int64 `json:"rate"`
	Burst int64 `json:"burst"`
	Wait  Wait  `json:"wait"`
	Met   bool  `json:"met"`
}

// CapacityCheck is the proposals' sum against the cluster's soft capacity.
// A weighted token costs each tenant differently (its models, its prompt
// and output lengths), so the sum is weighed per tenant: at rates R_t, the
// cluster's prefill carries Σ R_t · f_t FLOP/s, where f_t is the tenant's
// prefill FLOPs per weighted token over its rows, against Σ domains'
// soft prefill FLOP/s; decode likewise in bytes. Load is the larger of the
// two shares.
type CapacityCheck struct {
	Domains     int     `json:"domains"`
	PrefillRate float64 `json:"softPrefillFlopPerS"`
	DecodeRate  float64 `json:"softDecodeBytesPerS"`
	SumOfRates  int64   `json:"sumOfRates"`
	PrefillLoad float64 `json:"prefillLoad"`
	DecodeLoad  float64 `json:"decodeLoad"`
	Load        float64 `json:"load"`
	Bound       string  `json:"bound"` // "prefill" or "decode": the larger load
	// Capacity is the weighted tokens per second the cluster's soft
	// capacity carries at the proposals' mix: SumOfRates / Load.
	Capacity float64 `json:"capacityTokensPerS"`
}

// TogetherResult is one tenant in the replay of every tenant's rows at
// once, each held to its proposed quota.
type TogetherResult struct {
	Tenant string `json:"tenant"`
	Rate   int64  `json:"rate"`
	Burst  int64  `json:"burst"`
	Alone  *Wait  `json:"alone,omitempty"` // at its proposal; nil when scaled
	Wait   Wait   `json:"wait"`
	// Met is whether Wait meets the target; absent without one.
	Met *bool `json:"met,omitempty"`
}

// Plan is a recommendation checked against the cluster and the config: each
// tenant's rate and burst (by the knee, or searched for a target p99),
// what the tenant gets alone at them, the proposals' sum against soft
// capacity, the floors and weights, and one replay of all of them together.
type Plan struct {
	// TargetMs is the target p99 time to admission; 0 without one.
	TargetMs float64          `json:"targetP99Ms,omitempty"`
	By       string           `json:"rateBy"` // "knee" or "target"
	Measure  string           `json:"measure"`
	Tenants  []Recommendation `json:"tenants"`
	Capacity CapacityCheck    `json:"capacity"`
	Together []TogetherResult `json:"together"`
	// Scaled is the replay together with every rate divided by the load,
	// when the load is above 1.
	Scaled []TogetherResult `json:"scaledToCapacity,omitempty"`
	// Flags are the problems found, each with what to do.
	Flags []string `json:"flags"`
	// Replays counts every replay the plan ran.
	Replays int `json:"replays"`
}

// measure says what Wait is, for the reports.
const measure = "time to admission: from a request's arrival to its admission, waiting in arrival order for its quota's tokens " +
	"(a client that waits out QUOTA_EXCEEDED's Retry-After) and then in the engine's queue; a refused request is never admitted"

// RecommendChecked recommends each tenant's rate and burst (Recommend's
// knee, or with o.Target the smallest rate whose replay of the tenant's
// rows alone meets it) and checks them: each tenant alone at its
// proposal, the proposals' sum against the cluster's soft capacity, the
// config's floors and weights, and a replay of every tenant together at
// its proposal. Weighted tokens are the config's (its
// output_token_weight), as the replays count them. Tenants the config does
// not name are not replayed (with o.Target that is an error).
func RecommendChecked(rows []Row, o CheckOptions) (*Plan, error) {
	if o.Window <= 0 {
		return nil, errors.New("recommend: the burst window must be positive")
	}
	outW := max(o.Config.OutputTokenWeight, 1)
	p := &Plan{By: "knee", Measure: measure, Flags: []string{}, Tenants: Recommend(rows, outW, o.Window)}
	if o.Target > 0 {
		p.By, p.TargetMs = "target", float64(o.Target)/1e6
	}
	byTenant := map[string][]Row{}
	for _, r := range rows {
		byTenant[r.Tenant] = append(byTenant[r.Tenant], r)
	}
	for i := range p.Tenants {
		rec := &p.Tenants[i]
		pol, ok := o.Config.Policy(rec.Tenant)
		if !ok {
			if o.Target > 0 {
				return nil, fmt.Errorf("tenant %q is not in the config (its tenants: %s): its rate cannot be searched on the cluster", rec.Tenant, strings.Join(sortedTenants(o.Config), ", "))
			}
			p.Flags = append(p.Flags, fmt.Sprintf("%s: not in the config: not replayed, not checked; name it in --config to check it", rec.Tenant))
			continue
		}
		rec.InConfig = true
		rec.Tier, rec.Floor, rec.Weight = o.Config.Tenants[rec.Tenant].Tier, pol.Floor, max(pol.Weight, 1)
		rec.ConfigRate, rec.ConfigBurst = pol.Tokens.Rate, pol.Tokens.Burst
		own := byTenant[rec.Tenant]
		if o.Target > 0 {
			if err := p.search(rec, own, &o); err != nil {
				return nil, err
			}
			continue
		}
		w, err := p.replay(own, &o, map[string]quota{rec.Tenant: {rec.Rate, rec.Burst}})
		if err != nil {
			return nil, err
		}
		rec.Alone = w[rec.Tenant]
		if rec.Alone.NeverFit > 0 {
			p.Flags = append(p.Flags, neverFitFlag(rec))
		}
	}
	var known []Row // the rows of the tenants the config names
	for _, r := range rows {
		if _, ok := o.Config.Tenants[r.Tenant]; ok {
			known = append(known, r)
		}
	}
	if len(known) == 0 {
		return p, nil
	}
	if err := p.check(known, &o); err != nil {
		return nil, err
	}
	return p, nil
}

// replay is quotaReplay, counted.
func (p *Plan) replay(rows []Row, o *CheckOptions, quotas map[string]quota) (map[string]Wait, error) {
	p.Replays++
	w, err := quotaReplay(rows, o, quotas)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	return w, nil
}

// burstAt is the burst that goes with rate: the largest window of the
// tenant's demand less what rate carries in it, at least its largest
// request (as Recommend's C).
func (r *Recommendation) burstAt(rate int64) int64 {
	return max(r.WindowTokens-int64(float64(rate)*r.WindowSecs), r.LargestReq)
}

// search sets rec's rate and burst to the smallest rate (to
// searchPrecision) whose replay of the tenant's rows alone meets the
// target. The burst goes with the rate (burstAt), which makes a larger
// rate's bucket hold at least as many tokens over any interval as a
// smaller rate's: the wait falls as the rate rises, so bisection finds
// the edge. When no rate up to 2^searchDoublings × the mean meets it (the
// cluster's queue, not the quota, sets the wait), the search bisects
// instead for the smallest rate within plateauMargin of the best p99 it
// saw: beyond it more quota buys no less wait.
func (p *Plan) search(rec *Recommendation, rows []Row, o *CheckOptions) error {
	try := func(rate int64, goalMs float64) (bool, error) {
		burst := rec.burstAt(rate)
		w, err := p.replay(rows, o, map[string]quota{rec.Tenant: {rate, burst}})
		if err != nil {
			return false, err
		}
		st := SearchStep{Rate: rate, Burst: burst, Wait: w[rec.Tenant]}
		st.Met = st.Wait.Meets(p.TargetMs)
		rec.Search = append(rec.Search, st)
		return st.Wait.Meets(goalMs), nil
	}
	goal := p.TargetMs
	lo := max(int64(math.Ceil(rec.MeanRate)), 1)
	met, err := try(lo, goal)
	if err != nil {
		return err
	}
	hi := lo
	for i := 0; !met && i < searchDoublings; i++ {
		lo, hi = hi, hi*2
		if met, err = try(hi, goal); err != nil {
			return err
		}
	}
	rec.TargetMet = met
	if !met {
		best := -1.0
		for _, st := range rec.Search {
			if !st.Wait.Never() && (best < 0 || st.Wait.P99Ms < best) {
				best = st.Wait.P99Ms
			}
		}
		if best < 0 {
			// Refused at every rate: its other gates decide. The knee
			// stays, with what it gets alone.
			rec.Burst = rec.burstAt(rec.Rate)
			w, err := p.replay(rows, o, map[string]quota{rec.Tenant: {rec.Rate, rec.Burst}})
			if err != nil {
				return err
			}
			rec.Alone = w[rec.Tenant]
			p.Flags = append(p.Flags, fmt.Sprintf("%s: refused too often to meet any p99 at every rate up to %d tok/s (%s): its other gates, not the quota, decide; proposed the knee %d tok/s; "+
				"see its refusals in the config (rps, max_concurrency, budget) before its rate",
				rec.Tenant, hi, rec.Search[len(rec.Search)-1].Wait.refusals(), rec.Rate))
			return nil
		}
		goal = best * (1 + plateauMargin)
		for i, st := range rec.Search { // rates in increasing order
			if st.Wait.Meets(goal) {
				lo, hi = st.Rate, st.Rate
				if i > 0 {
					lo = rec.Search[i-1].Rate
				}
				break
			}
		}
	}
	for i := 0; i < searchHalvings && float64(hi-lo) > max(1, searchPrecision*float64(hi)); i++ {
		mid := lo + (hi-lo)/2
		ok, err := try(mid, goal)
		if err != nil {
			return err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	rec.Rate, rec.Burst = hi, rec.burstAt(hi)
	for _, st := range rec.Search {
		if st.Rate == hi {
			rec.Alone = st.Wait
		}
	}
	if rec.Alone.NeverFit > 0 {
		p.Flags = append(p.Flags, neverFitFlag(rec))
	}
	if !met {
		p.Flags = append(p.Flags, fmt.Sprintf("%s: no rate up to %d tok/s (%.0f× its mean) meets p99 %v alone: its best is %.1f ms, set by the engine's queue on the cluster, not by the quota; "+
			"proposed %d tok/s, the smallest rate within %.0f%% of that best; raise the target, or give it capacity (a floor, larger or fewer-shared domains)",
			rec.Tenant, rec.Search[searchDoublings].Rate, float64(rec.Search[searchDoublings].Rate)/rec.MeanRate, o.Target, goal/(1+plateauMargin), hi, 100*plateauMargin))
	}
	return nil
}

// neverFitFlag says which of rec's requests no rate admits.
func neverFitFlag(rec *Recommendation) string {
	return fmt.Sprintf("%s: %d of its %d requests (%.1f%%) are refused CAPACITY_EXCEEDED alone on the cluster: larger than any domain's shared part, they run only on its floor reserve, when its floor bucket is full, whatever its quota; "+
		"its p99s are over the others; raise capacity.burst_seconds, lower the floors' reserve, or serve them on larger domains",
		rec.Tenant, rec.Alone.NeverFit, rec.Alone.Requests, 100*float64(rec.Alone.NeverFit)/float64(max(rec.Alone.Requests, 1)))
}

// check runs the checks over the proposals of the tenants rows name (all
// in the config): capacity, floors, weights, and the replays together.
func (p *Plan) check(rows []Row, o *CheckOptions) error {
	var recs []*Recommendation
	for i := range p.Tenants {
		if p.Tenants[i].InConfig {
			recs = append(recs, &p.Tenants[i])
		}
	}
	c, err := capacityOf(rows, recs, o)
	if err != nil {
		return err
	}
	p.Capacity = c
	for _, r := range recs {
		if r.Rate < r.Floor {
			p.Flags = append(p.Flags, fmt.Sprintf("%s: rate %d tok/s is below its floor %d (tier %s): the config refuses a floor above the token rate, "+
				"and the floor would reserve capacity the quota never lets it use; set its rate to %d (the floor; the replays together do) or lower its floor to %d",
				r.Tenant, r.Rate, r.Floor, r.Tier, r.Floor, r.Rate))
		}
	}
	// together replays every tenant at once, at its proposal or (scale
	// above 1) at its rate ÷ scale with the burst that goes with it; at
	// least its floor either way, as the config requires.
	together := func(scale float64) ([]TogetherResult, error) {
		quotas := map[string]quota{}
		var out []TogetherResult
		for _, r := range recs {
			rate := max(int64(math.Ceil(float64(r.Rate)/scale)), r.Floor, 1)
			q := quota{rate, r.burstAt(rate)}
			if scale == 1 {
				// As proposed, but at least the floor, as the config
				// requires (flagged above).
				q = quota{max(r.Rate, r.Floor), r.Burst}
			}
			quotas[r.Tenant] = q
			t := TogetherResult{Tenant: r.Tenant, Rate: q.rate, Burst: q.burst}
			if scale == 1 {
				t.Alone = &r.Alone
			}
			out = append(out, t)
		}
		w, err := p.replay(rows, o, quotas)
		if err != nil {
			return nil, err
		}
		for i := range out {
			out[i].Wait = w[out[i].Tenant]
			if p.TargetMs > 0 {
				met := out[i].Wait.Meets(p.TargetMs)
				out[i].Met = &met
			}
		}
		return out, nil
	}
	if p.Together, err = together(1); err != nil {
		return err
	}
	if c.Load > 1 {
		if p.Scaled, err = together(c.Load); err != nil {
			return err
		}
		var got []string
		for _, t := range p.Scaled {
			got = append(got, fmt.Sprintf("%s %s", t.Tenant, t.Wait))
		}
		what, do := "the target cannot hold for all tenants at once", "add capacity, lower the target, or let weights and floors decide who waits"
		if p.TargetMs == 0 {
			what, do = "these rates cannot all be used at once", "add capacity, or let weights and floors decide who waits"
		}
		p.Flags = append(p.Flags, fmt.Sprintf("sum of rates %d tok/s is %.2f× the cluster's soft capacity (%.0f tok/s at these tenants' costs, %s-bound): %s; "+
			"rates scaled to capacity (÷%.2f, at least the floors, bursts with them) give p99 ms %s in one replay together: %s",
			c.SumOfRates, c.Load, c.Capacity, c.Bound, what, c.Load, strings.Join(got, ", "), do))
		// Under full contention each tenant gets its weighted max-min
		// share of capacity, at most its rate.
		rates, weights := make([]int64, len(recs)), make([]int64, len(recs))
		var wsum int64
		for i, r := range recs {
			rates[i], weights[i] = r.Rate, r.Weight
			wsum += r.Weight
		}
		for i, share := range waterfill(int64(c.Capacity), rates, weights) {
			if r := recs[i]; share < r.Rate {
				p.Flags = append(p.Flags, fmt.Sprintf("%s: with every tenant at its rate, its weighted share (weight %d of %d) is %d tok/s, below its rate %d: "+
					"it gets its rate only while others leave capacity idle; raise its weight or floor, or lower the others' rates",
					r.Tenant, r.Weight, wsum, share, r.Rate))
			}
		}
	}
	if p.TargetMs > 0 {
		var missed []string
		for i, t := range p.Together {
			if !*t.Met && recs[i].TargetMet {
				missed = append(missed, fmt.Sprintf("%s %s ms", t.Tenant, t.Wait))
			}
		}
		if len(missed) > 0 {
			p.Flags = append(p.Flags, fmt.Sprintf("together, %d of the tenants that meet p99 %v alone miss it (%s): the others' load on the cluster adds the wait; "+
				"give them floors (reserved capacity), add capacity, or expect their p99 together",
				len(missed), o.Target, strings.Join(missed, ", ")))
		}
	}
	return nil
}

// capacityOf weighs the proposals against the cluster's soft capacity
// (CapacityCheck).
func capacityOf(rows []Row, recs []*Recommendation, o *CheckOptions) (CapacityCheck, error) {
	cfg := o.Config
	cat, err := pd.NewCatalog(cfg.Models)
	if err != nil {
		return CapacityCheck{}, fmt.Errorf("models: %w", err)
	}
	c := CapacityCheck{Domains: len(o.Cluster.Domains)}
	for i := range o.Cluster.Domains {
		dc, err := pd.NewDomainCapacity(&o.Cluster.Domains[i], cat, cfg.Capacity, 0)
		if err != nil {
			return CapacityCheck{}, fmt.Errorf("topology: %w", err)
		}
		c.PrefillRate += float64(dc.PrefillRate())
		c.DecodeRate += float64(dc.DecodeRate())
	}
	outW := max(cfg.OutputTokenWeight, 1)
	type cost struct{ flop, bytes, weighted float64 }
	per := map[string]*cost{}
	for _, r := range rows {
		m, ok := cat.Get(r.Model)
		if !ok {
			return CapacityCheck{}, fmt.Errorf("trace line %d: model %q is not in the catalog (%s)", r.Line, r.Model, strings.Join(cat.Names(), ", "))
		}
		k, err := cat.Cost(m, r.Prompt, r.Output)
		if err != nil {
			return CapacityCheck{}, fmt.Errorf("trace line %d: %w", r.Line, err)
		}
		t := per[r.Tenant]
		if t == nil {
			t = &cost{}
			per[r.Tenant] = t
		}
		t.flop += float64(k.PrefillFLOP)
		t.bytes += float64(k.DecodeBytes)
		t.weighted += float64(r.Prompt + outW*r.Output)
	}
	var flop, bytes float64
	for _, r := range recs {
		c.SumOfRates += r.Rate
		if t := per[r.Tenant]; t != nil && t.weighted > 0 {
			flop += float64(r.Rate) * t.flop / t.weighted
			bytes += float64(r.Rate) * t.bytes / t.weighted
		}
	}
	if c.PrefillRate > 0 {
		c.PrefillLoad = flop / c.PrefillRate
	}
	if c.DecodeRate > 0 {
		c.DecodeLoad = bytes / c.DecodeRate
	}
	c.Load, c.Bound = c.PrefillLoad, "prefill"
	if c.DecodeLoad > c.PrefillLoad {
		c.Load, c.Bound = c.DecodeLoad, "decode"
	}
	if c.Load > 0 {
		c.Capacity = float64(c.SumOfRates) / c.Load
	}
	return c, nil
}

// WriteJSON writes p as indented JSON.
func (p *Plan) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(p); err != nil {
		return fmt.Errorf("json: %w", err)
	}
	return nil
}

// WriteTable writes p as text: the proposals, the evidence for each (the
// search's replays, or the sweep), the capacity check, the replays
// together and the flags.
func (p *Plan) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if p.TargetMs > 0 {
		fmt.Fprintf(tw, "rate R: the smallest meeting p99 %v alone on the cluster, by a search (at most %d replays a tenant); %d replays in all\n",
			time.Duration(p.TargetMs*1e6), MaxSearchReplays, p.Replays)
	} else {
		fmt.Fprintf(tw, "rate R: the knee of each tenant's capacity sweep; %d replays in all\n", p.Replays)
	}
	fmt.Fprintf(tw, "p99: %s\n", p.Measure)
	head := "tenant\ttier\tfloor\tweight\trequests\tmean tok/s\trate R tok/s\t× mean\tburst C tok\t"
	if p.TargetMs > 0 {
		head += "p99 alone ms\ttarget\tconfig rate/burst"
	} else {
		head += "sweep p99 ms\tp99 alone ms\tconfig rate/burst"
	}
	fmt.Fprintln(tw, head)
	for i := range p.Tenants {
		r := &p.Tenants[i]
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.0f\t%d\t%.2f\t%d\t", r.Tenant, dash(r.Tier), r.Floor, r.Weight, r.Requests, r.MeanRate,
			r.Rate, float64(r.Rate)/math.Max(r.MeanRate, 1e-9), r.Burst)
		alone, config := "not in the config", "-"
		if r.InConfig {
			alone, config = r.Alone.String(), fmt.Sprintf("%g/%g", r.ConfigRate, r.ConfigBurst)
		}
		if p.TargetMs > 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", alone, metWord(r.TargetMet), config)
		} else {
			fmt.Fprintf(tw, "%.1f\t%s\t%s\n", r.RateP99, alone, config)
		}
	}
	for i := range p.Tenants {
		r := &p.Tenants[i]
		if p.TargetMs == 0 {
			writeSweep(tw, r)
			continue
		}
		fmt.Fprintf(tw, "\n%s: rate search (each step its rows alone on the cluster at that rate and its burst)\n", r.Tenant)
		fmt.Fprintln(tw, "step\trate tok/s\tburst tok\tp99 ms\trefused\tmeets target\t")
		for k, st := range r.Search {
			mark := ""
			if st.Rate == r.Rate {
				mark = "  ← R"
			}
			fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%s%s\n", k+1, st.Rate, st.Burst, st.Wait, st.Wait.refusals(), metWord(st.Met), mark)
		}
		writeBurst(tw, r)
	}
	if len(p.Together) > 0 {
		c := &p.Capacity
		fmt.Fprintf(tw, "\ncapacity: %d domains, soft prefill %.3g FLOP/s, decode %.3g B/s; sum of rates %d tok/s is %.2f× of it (prefill %.2f, decode %.2f), %.0f tok/s at these tenants' costs\n",
			c.Domains, c.PrefillRate, c.DecodeRate, c.SumOfRates, c.Load, c.PrefillLoad, c.DecodeLoad, c.Capacity)
		writeTogether(tw, "together: every tenant's rows in one replay, each at its proposal", p.Together, p.TargetMs > 0)
		if len(p.Scaled) > 0 {
			writeTogether(tw, fmt.Sprintf("scaled to capacity: the same replay with every rate ÷ %.2f (at least its floor)", c.Load), p.Scaled, p.TargetMs > 0)
		}
	}
	if len(p.Flags) == 0 {
		fmt.Fprintln(tw, "\nflags: none")
	} else {
		fmt.Fprintln(tw, "\nflags:")
		for _, f := range p.Flags {
			fmt.Fprintf(tw, "- %s\n", f)
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// writeTogether writes one replay of every tenant together.
func writeTogether(tw io.Writer, title string, ts []TogetherResult, target bool) {
	fmt.Fprintf(tw, "\n%s\n", title)
	head := "tenant\trate tok/s\tburst tok\tp99 alone ms\tp99 together ms\trefused"
	if target {
		head += "\ttarget"
	}
	fmt.Fprintln(tw, head)
	for _, t := range ts {
		alone := "-"
		if t.Alone != nil {
			alone = t.Alone.String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s", t.Tenant, t.Rate, t.Burst, alone, t.Wait, t.Wait.refusals())
		if t.Met != nil {
			fmt.Fprintf(tw, "\t%s", metWord(*t.Met))
		}
		fmt.Fprintln(tw)
	}
}

func metWord(met bool) string {
	if met {
		return "met"
	}
	return "not met"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
