package fleetsim

import (
	"fmt"
	"io"
	"math"
	"math/bits"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-sched/sluice/admission/sharing"
)

// Result is what a run measured. Everything in it follows from the
// Config alone: two runs of one Config give the same Result.
type Result struct {
	Config Config       `json:"config"`
	Shards []ShardStats `json:"shards"`

	// Rounds counts the replicas' reconciles.
	Rounds             int64 `json:"rounds"`
	Requests           int64 `json:"requests"`
	Admitted           int64 `json:"admitted"`
	RefusedQuota       int64 `json:"refusedQuota"`
	RefusedCapacity    int64 `json:"refusedCapacity"`
	RefusedUnavailable int64 `json:"refusedUnavailable"`
	// Tenants is the distinct tenants that sent a request; TenantStates
	// the tenants' states summed over the replicas holding one.
	Tenants      int `json:"tenants"`
	TenantStates int `json:"tenantStates"`

	// Relayed counts the engine readings the replicas took from the
	// store (Config.EngineReaders), and RelayAgeP50, RelayAgeP99 and
	// RelayAgeMax are their ages as taken.
	Relayed     int64         `json:"relayed,omitempty"`
	RelayAgeP50 time.Duration `json:"relayAgeP50,omitempty"`
	RelayAgeP99 time.Duration `json:"relayAgeP99,omitempty"`
	RelayAgeMax time.Duration `json:"relayAgeMax,omitempty"`

	// Hot is every tenant routed to several replicas, busiest first.
	Hot []Overshoot `json:"hot"`
	// Settle is the mid-run changes of a hot tenant's replicas.
	Settle []Settle `json:"settle"`
}

// Overshoot is one spread tenant's admissions against its quota over the
// run, in weighted tokens.
type Overshoot struct {
	Tenant   string `json:"tenant"`
	Replicas int    `json:"replicas"` // N_t: the most it had at once
	Rate     int64  `json:"rate"`     // R, tokens/s
	Burst    int64  `json:"burst"`
	Admitted int64  `json:"admitted"`
	Quota    int64  `json:"quota"`     // R·T + burst
	Allowed  int64  `json:"allowance"` // (N_t − 1)·R·W, the batched bound's excess
}

// Ratio is admitted ÷ quota.
func (o *Overshoot) Ratio() float64 { return float64(o.Admitted) / float64(o.Quota) }

// OverBound reports whether the tenant was admitted more than quota +
// (N_t − 1)·R·W.
func (o *Overshoot) OverBound() bool { return o.Admitted > o.Quota+o.Allowed }

// Settle is how the grants of one tenant's replicas came back to its rate
// after a replica joined or left it.
type Settle struct {
	Event    string        `json:"event"` // join or leave
	Tenant   string        `json:"tenant"`
	Before   int           `json:"before"` // replicas before and after
	After    int           `json:"after"`
	At       time.Duration `json:"at"`
	Settled  bool          `json:"settled"` // within settleBand by the end of the run, and staying there
	After5   time.Duration `json:"settleTime"`
	WorstOff float64       `json:"worstOff"` // the largest |Σ grants − R| ÷ R from the change on
}

// result gathers what the run measured.
func (s *sim) result() *Result {
	res := s.res
	res.Config = s.cfg
	res.Shards = s.store.stats()
	if res.Relayed > 0 {
		res.RelayAgeP50 = time.Duration(s.relayAge.ValueAtQuantile(50)) * time.Microsecond
		res.RelayAgeP99 = time.Duration(s.relayAge.ValueAtQuantile(99)) * time.Microsecond
		res.RelayAgeMax = time.Duration(s.relayAge.Max()) * time.Microsecond
	}
	for _, w := range s.seen {
		res.Tenants += bits.OnesCount64(w)
	}
	for _, r := range s.replicas {
		res.TenantStates += len(r.tenants)
	}
	for k := range len(s.admitted) {
		rt := s.routes[k]
		if rt.most < 2 {
			continue
		}
		l := s.limits(k)[sharing.KindTokens]
		perT := mulSeconds(l[0], s.cfg.Duration)
		res.Hot = append(res.Hot, Overshoot{
			Tenant: tenantName(k), Replicas: rt.most, Rate: l[0], Burst: l[1], Admitted: s.admitted[k],
			Quota: perT + l[1], Allowed: int64(rt.most-1) * mulSeconds(l[0], Interval),
		})
	}
	for _, e := range s.events {
		rate := s.limits(e.rank)[sharing.KindTokens][0]
		st := Settle{Event: e.kind, Tenant: tenantName(e.rank), Before: e.before, After: len(s.routes[e.rank].members), At: time.Duration(s.changeAt)}
		from := len(e.samples) // the first sample of the last run within the band
		for i, v := range e.samples {
			off := math.Abs(float64(v-rate)) / float64(rate)
			st.WorstOff = max(st.WorstOff, off)
			switch {
			case off > settleBand:
				from = len(e.samples)
			case from == len(e.samples):
				from = i
			}
		}
		if st.Settled = from < len(e.samples); st.Settled {
			st.After5 = time.Duration(from) * Interval
		}
		res.Settle = append(res.Settle, st)
	}
	return &res
}

// mulSeconds is rate·d in units, rate in units per second.
func mulSeconds(rate int64, d time.Duration) int64 {
	return int64(float64(rate) * d.Seconds())
}

// hotRows is how many of the busiest spread tenants the table lists.
const hotRows = 5

// WriteTable prints the result as text tables.
func (r *Result) WriteTable(w io.Writer) error {
	c := r.Config
	sec := c.Duration.Seconds()
	per := func(v int64) string { return thousands(int64(math.Round(float64(v) / sec))) }
	var b strings.Builder
	fmt.Fprintf(&b, "fleet: %s replicas, %s tenants (%s sent requests, %s tenant states), %s domains, %s shards, %v virtual, %s requests/s offered, seed %d\n\n",
		thousands(int64(c.Replicas)), thousands(int64(c.Tenants)), thousands(int64(r.Tenants)), thousands(int64(r.TenantStates)),
		thousands(int64(c.Domains)), thousands(int64(c.Shards)), c.Duration, thousands(int64(c.Rate)), c.Seed)

	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "shard\tcalls/s\tbucket updates/s\ttenant\tdomain\tgauge updates/s\trequest B/s\treply B/s\tkeys\t")
	var sum ShardStats
	var most ShardStats
	for _, s := range r.Shards {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", s.Name, per(s.Calls), per(s.Buckets()), per(s.TenantBuckets), per(s.DomainBuckets),
			per(s.Gauges), per(s.RequestBytes), per(s.ReplyBytes), thousands(int64(s.Keys)))
		sum.Calls += s.Calls
		sum.TenantBuckets += s.TenantBuckets
		sum.DomainBuckets += s.DomainBuckets
		sum.Gauges += s.Gauges
		sum.EngineEntries += s.EngineEntries
		sum.Published += s.Published
		sum.RequestBytes += s.RequestBytes
		sum.ReplyBytes += s.ReplyBytes
		sum.Keys += s.Keys
		most.Calls = max(most.Calls, s.Calls)
		most.TenantBuckets = max(most.TenantBuckets, s.Buckets()) // the busiest by all buckets
		most.Gauges = max(most.Gauges, s.Gauges)
		most.RequestBytes = max(most.RequestBytes, s.RequestBytes+s.ReplyBytes)
		most.Keys = max(most.Keys, s.Keys)
	}
	fmt.Fprintf(tw, "all\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", per(sum.Calls), per(sum.Buckets()), per(sum.TenantBuckets), per(sum.DomainBuckets),
		per(sum.Gauges), per(sum.RequestBytes), per(sum.ReplyBytes), thousands(int64(sum.Keys)))
	n := float64(len(r.Shards))
	ratio := func(m, all int64) string {
		if all == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", float64(m)*n/float64(all))
	}
	fmt.Fprintf(tw, "busiest ÷ mean\t%s\t%s\t\t\t%s\t%s\t\t%s\t\n", ratio(most.Calls, sum.Calls), ratio(most.TenantBuckets, sum.Buckets()),
		ratio(most.Gauges, sum.Gauges), ratio(most.RequestBytes, sum.RequestBytes+sum.ReplyBytes), ratio(int64(most.Keys), int64(sum.Keys)))
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("fleetsim: table: %w", err)
	}
	fmt.Fprintf(&b, "\ndomain bucket updates/s, fleet-wide (prefill + decode): %s (%.1f per replica per round; %s rounds)\n",
		per(sum.DomainBuckets), float64(sum.DomainBuckets)/float64(max(r.Rounds, 1)), thousands(r.Rounds))
	if c.EngineReaders > 0 {
		fmt.Fprintf(&b, "engine readings (%d readers a domain): %s published/s, %s asked for apart from a gauge/s, %s relayed/s, their age p50 %v, p99 %v, max %v\n",
			c.EngineReaders, per(sum.Published), per(sum.EngineEntries-sum.Published), per(r.Relayed), r.RelayAgeP50, r.RelayAgeP99, r.RelayAgeMax)
	}
	fmt.Fprintf(&b, "requests: %s offered, %s admitted, %s over quota, %s over capacity, %s store unavailable\n\n",
		thousands(r.Requests), thousands(r.Admitted), thousands(r.RefusedQuota), thousands(r.RefusedCapacity), thousands(r.RefusedUnavailable))

	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tenant\treplicas\trate tok/s\tadmitted\tquota R·T+B\tadmitted ÷ quota\t(N_t−1)·R·W\texcess ÷ (N_t−1)·R·W\t")
	shown := map[string]bool{}
	row := func(o *Overshoot) {
		shown[o.Tenant] = true
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%.4f\t%s\t%s\t\n", o.Tenant, o.Replicas, thousands(o.Rate), thousands(o.Admitted), thousands(o.Quota),
			o.Ratio(), thousands(o.Allowed), excess(o))
	}
	for i := range min(hotRows, len(r.Hot)) {
		row(&r.Hot[i])
	}
	worst, worstEx, over := 0.0, math.Inf(-1), 0
	var worstAt, worstExAt string
	for i := range r.Hot {
		o := &r.Hot[i]
		if o.Ratio() > worst {
			worst, worstAt = o.Ratio(), o.Tenant
		}
		if e := float64(o.Admitted-o.Quota) / float64(o.Allowed); e > worstEx {
			worstEx, worstExAt = e, o.Tenant
		}
		if o.OverBound() {
			over++
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("fleetsim: table: %w", err)
	}
	if len(r.Hot) > 0 {
		fmt.Fprintf(&b, "%d tenants spread over several replicas: highest admitted ÷ quota %.4f (%s), highest excess ÷ (N_t−1)·R·W %.3f (%s), %d over the bound\n\n",
			len(r.Hot), worst, worstAt, worstEx, worstExAt, over)
	} else {
		b.WriteString("no tenant is spread over several replicas\n\n")
	}

	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "change\ttenant\treplicas\tat\tΣ grants within 5% of R after\tworst |Σ grants − R| ÷ R\t")
	for _, st := range r.Settle {
		after := "not by the end"
		if st.Settled {
			after = fmt.Sprintf("%.1f s", st.After5.Seconds())
		}
		fmt.Fprintf(tw, "%s\t%s\t%d → %d\t%.1f s\t%s\t%.3f\t\n", st.Event, st.Tenant, st.Before, st.After, st.At.Seconds(), after, st.WorstOff)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("fleetsim: table: %w", err)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("fleetsim: table: %w", err)
	}
	return nil
}

// excess is (admitted − quota) ÷ allowance, or "-" without an allowance.
func excess(o *Overshoot) string {
	if o.Allowed == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", float64(o.Admitted-o.Quota)/float64(o.Allowed))
}

// thousands writes v with comma separators.
func thousands(v int64) string {
	s := fmt.Sprint(v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
