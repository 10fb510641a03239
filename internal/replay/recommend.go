package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// SweepPoint is one capacity of a recommendation's sweep: the tenant's
// requests served alone, in arrival order, by a server of Rate weighted
// tokens per second, and the p99 of their queue wait.
type SweepPoint struct {
	Rate     int64   `json:"rate"`
	Multiple float64 `json:"multipleOfMean"`
	P99Ms    float64 `json:"waitP99Ms"`
}

// Recommendation is a tenant's token bucket from its own demand (seed
// 001's tuning method): the rate R at the knee of p99 wait in a capacity
// sweep, and the burst C that lets the largest window of demand through
// at R without waiting.
type Recommendation struct {
	Tenant   string  `json:"tenant"`
	Requests int     `json:"requests"`
	MeanRate float64 `json:"meanRate"` // weighted tokens/s over the trace
	// Rate is R, the knee of the sweep: the point farthest below the
	// chord from the sweep's first point to its last (Kneedle, on the
	// logarithm of the wait, which spans orders of magnitude), where more
	// capacity stops buying much less wait.
	Rate    int64        `json:"rate"`
	RateP99 float64      `json:"rateWaitP99Ms"`
	Sweep   []SweepPoint `json:"sweep"`
	// WindowStart and WindowTokens are the largest window of demand
	// (Window long); Burst is C = WindowTokens − R·Window, at least the
	// largest request.
	Window       time.Duration `json:"-"`
	WindowSecs   float64       `json:"windowSeconds"`
	WindowStart  float64       `json:"windowStartSeconds"`
	WindowTokens int64         `json:"windowTokens"`
	LargestReq   int64         `json:"largestRequest"`
	Burst        int64         `json:"burst"`

	// Set by RecommendChecked for a tenant the config names (InConfig):
	// its tier's policy, what it gets alone on the cluster at Rate and
	// Burst, and, with a target, the search's replays and whether Rate
	// meets it (false: no rate the search tried did).
	InConfig    bool         `json:"inConfig,omitempty"`
	Tier        string       `json:"tier,omitempty"`
	Floor       int64        `json:"floor,omitempty"`
	Weight      int64        `json:"weight,omitempty"`
	ConfigRate  float64      `json:"configRate,omitempty"`
	ConfigBurst float64      `json:"configBurst,omitempty"`
	Alone       Wait         `json:"alone"`
	Search      []SearchStep `json:"search,omitempty"`
	TargetMet   bool         `json:"targetMet,omitempty"`
}

// sweepMultiples are the sweep's capacities, as multiples of the tenant's
// mean rate.
var sweepMultiples = []float64{1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50}

// Recommend computes each tenant's recommendation from rows (weighted
// tokens = prompt + outW × output), with the burst window given (5 s in
// seed 001). It is deterministic and needs no cluster: the sweep is a
// fluid FIFO server per tenant.
func Recommend(rows []Row, outW int64, window time.Duration) []Recommendation {
	byTenant := map[string][]Row{}
	var names []string
	for _, r := range rows {
		if _, ok := byTenant[r.Tenant]; !ok {
			names = append(names, r.Tenant)
		}
		byTenant[r.Tenant] = append(byTenant[r.Tenant], r)
	}
	slices.Sort(names)
	var span time.Duration
	if len(rows) > 0 {
		span = rows[len(rows)-1].At - rows[0].At
	}
	span = max(span, time.Second)
	var out []Recommendation
	for _, name := range names {
		rs := byTenant[name]
		rec := Recommendation{Tenant: name, Requests: len(rs), Window: window, WindowSecs: window.Seconds()}
		var total int64
		w := make([]int64, len(rs))
		for i, r := range rs {
			w[i] = r.Prompt + outW*r.Output
			total += w[i]
			rec.LargestReq = max(rec.LargestReq, w[i])
		}
		rec.MeanRate = float64(total) / span.Seconds()
		for _, m := range sweepMultiples {
			rate := int64(math.Ceil(rec.MeanRate * m))
			rec.Sweep = append(rec.Sweep, SweepPoint{Rate: rate, Multiple: m, P99Ms: fluidP99(rs, w, rate)})
		}
		k := knee(rec.Sweep)
		rec.Rate, rec.RateP99 = rec.Sweep[k].Rate, rec.Sweep[k].P99Ms
		// The largest window of demand: two pointers over arrivals.
		var sum int64
		j := 0
		for i := range rs {
			sum += w[i]
			for rs[i].At-rs[j].At >= window {
				sum -= w[j]
				j++
			}
			if sum > rec.WindowTokens {
				rec.WindowTokens, rec.WindowStart = sum, rs[j].At.Seconds()
			}
		}
		rec.Burst = max(rec.WindowTokens-int64(float64(rec.Rate)*window.Seconds()), rec.LargestReq)
		out = append(out, rec)
	}
	return out
}

// fluidP99 is the p99 queue wait of requests served in arrival order by a
// server draining rate weighted tokens per second: a request waits until
// the work queued ahead of it is done.
func fluidP99(rs []Row, w []int64, rate int64) float64 {
	h := hdrhistogram.New(1, int64(24*time.Hour/time.Microsecond), 3)
	var free float64 // when the server has drained all earlier work, in seconds
	for i, r := range rs {
		at := r.At.Seconds()
		start := math.Max(free, at)
		_ = h.RecordValue(max(int64((start-at)*1e6), 1))
		free = start + float64(w[i])/float64(rate)
	}
	return float64(h.ValueAtQuantile(99)) / 1000
}

// knee returns the index of the sweep point farthest below the chord from
// the first point to the last, with the rate and log10 of the wait (in ms,
// at least 1) scaled to [0, 1]: the Kneedle method's knee of a decreasing
// convex curve. On a linear wait axis a bursty trace's knee sits where
// waits are still tens of seconds; the logarithm weighs 10 s → 1 s as
// much as 100 s → 10 s.
func knee(ps []SweepPoint) int {
	n := len(ps)
	lg := func(ms float64) float64 { return math.Log10(math.Max(ms, 1)) }
	x0, x1 := float64(ps[0].Rate), float64(ps[n-1].Rate)
	y0, y1 := lg(ps[0].P99Ms), lg(ps[n-1].P99Ms)
	if x1 == x0 || y0 == y1 {
		return 0 // flat: the mean rate already waits no more than any
	}
	best, bestD := 0, 0.0
	for i, p := range ps {
		x := (float64(p.Rate) - x0) / (x1 - x0)
		y := (lg(p.P99Ms) - y1) / (y0 - y1)
		if d := (1 - x) - y; d > bestD {
			best, bestD = i, d
		}
	}
	return best
}

// WriteRecommendations writes recs as a table with the evidence (each
// tenant's sweep and largest window) or as JSON.
func WriteRecommendations(w io.Writer, recs []Recommendation, format string) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(recs); err != nil {
			return fmt.Errorf("json: %w", err)
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "tenant\trequests\tmean tok/s\trate R tok/s\tp99 at R ms\tburst C tok\tlargest window\tlargest request")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%d\t%.1f\t%d\t%d tok in %gs from %.1fs\t%d\n",
			r.Tenant, r.Requests, r.MeanRate, r.Rate, r.RateP99, r.Burst, r.WindowTokens, r.WindowSecs, r.WindowStart, r.LargestReq)
	}
	for i := range recs {
		writeSweep(tw, &recs[i])
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// writeSweep writes r's capacity sweep and its burst's arithmetic.
func writeSweep(tw io.Writer, r *Recommendation) {
	fmt.Fprintf(tw, "\n%s: capacity sweep (its requests alone, FIFO at rate; knee marked *)\n", r.Tenant)
	fmt.Fprintln(tw, "rate tok/s\t× mean\twait p99 ms\t")
	for _, p := range r.Sweep {
		mark := ""
		if p.Rate == r.Rate {
			mark = "*"
		}
		fmt.Fprintf(tw, "%d\t%.2f\t%.1f\t%s\n", p.Rate, p.Multiple, p.P99Ms, mark)
	}
	writeBurst(tw, r)
}

// writeBurst writes the arithmetic of r's burst.
func writeBurst(tw io.Writer, r *Recommendation) {
	fmt.Fprintf(tw, "burst C = max(largest %gs window %d − R×%gs %d, largest request %d) = %d\n",
		r.WindowSecs, r.WindowTokens, r.WindowSecs, int64(float64(r.Rate)*r.WindowSecs), r.LargestReq, r.Burst)
}
