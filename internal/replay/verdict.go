package replay

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Verdict leads a comparison: the measures that decide, side by side, each
// with the policies best on it, and the policy best on most of them.
//
// The per-tenant measures count the tenants that do not burst (all of them
// when none does, or when every one does): what a policy must protect is
// the others' service while one tenant asks for many times its share. The
// bursters' own figures are shown beside, not counted.
type Verdict struct {
	Policies []string `json:"policies"`
	// Bursting names the tenants the per-tenant measures leave out.
	Bursting []string `json:"bursting,omitempty"`
	// Measures decide; NotDeciding are shown for reference only.
	Measures    []Measure `json:"measures"`
	NotDeciding []Measure `json:"notDeciding"`
	// Winners are the policies best on the most measures (more than one
	// on a tie), Wins that number.
	Winners []string `json:"winners"`
	Wins    int      `json:"wins"`
	Summary string   `json:"summary"`
	Note    string   `json:"note"`
}

// Measure is one figure of every policy, in the order of Policies.
type Measure struct {
	Name string `json:"name"`
	// Of says over what it is taken: the tenants counted, or the cluster.
	Of string `json:"of"`
	// Better is "lower" or "higher"; empty for a measure that does not
	// decide.
	Better string    `json:"better,omitempty"`
	Values []float64 `json:"values"`
	Text   []string  `json:"text"` // each value as the report prints it
	// Winners are the policies with the best value (all of them on a tie).
	Winners []string `json:"winners,omitempty"`
}

// jainW2Note says why Jain's index and W2 do not decide.
const jainW2Note = "Jain's index and W2 measure how close each tenant's service came to an equal weighted split of what was admitted, " +
	"a burster included: they reward equal service even to a tenant asking for many times its share, so a policy that holds " +
	"a burster back to keep the others' floors and waits scores worse on both. They are shown, not counted."

// InReplay returns b with its window in replay time: offsets from the
// replay's first instant (trace time less from), divided by speed (0: 1),
// as LoadTrace places the rows.
func (b Burst) InReplay(from time.Duration, speed float64) Burst {
	if speed <= 0 {
		speed = 1
	}
	b.From = time.Duration(float64(max(b.From-from, 0)) / speed)
	b.To = time.Duration(float64(max(b.To-from, 0)) / speed)
	return b
}

// bursting lists the tenants of c.Bursts that the reports know, sorted;
// none when that would leave no tenant to count.
func (c *Comparison) bursting() []string {
	if len(c.Reports) == 0 {
		return nil
	}
	var names []string
	for _, b := range c.Bursts {
		if !slices.Contains(names, b.Tenant) && slices.ContainsFunc(c.Reports[0].Tenants, func(t TenantReport) bool { return t.Name == b.Tenant }) {
			names = append(names, b.Tenant)
		}
	}
	if len(names) >= len(c.Reports[0].Tenants) {
		return nil
	}
	slices.Sort(names)
	return names
}

// utilization is the mean over domains of the busier phase's share of its
// capacity; with the engines, theirs.
func utilization(r *Report) float64 {
	if r.Engines != nil {
		return r.Engines.Util
	}
	if len(r.Domains) == 0 {
		return 0
	}
	var s float64
	for _, d := range r.Domains {
		s += max(d.PrefillUtil, d.DecodeUtil)
	}
	return s / float64(len(r.Domains))
}

// Verdict returns the comparison's verdict; nil with fewer than two
// policies.
func (c *Comparison) Verdict() *Verdict {
	if len(c.Reports) < 2 {
		return nil
	}
	v := &Verdict{Bursting: c.bursting(), Note: jainW2Note}
	for _, r := range c.Reports {
		v.Policies = append(v.Policies, r.Policy)
	}
	counted := func(t *TenantReport) bool { return !slices.Contains(v.Bursting, t.Name) }
	of := "all tenants"
	if len(v.Bursting) > 0 {
		of = "tenants not bursting"
	}
	measure := func(name, of, better string, value func(r *Report) (float64, string)) Measure {
		m := Measure{Name: name, Of: of, Better: better}
		for _, r := range c.Reports {
			x, text := value(r)
			m.Values, m.Text = append(m.Values, x), append(m.Text, text)
		}
		if better == "" {
			return m
		}
		best := m.Values[0]
		for _, x := range m.Values {
			if better == "lower" && x < best || better == "higher" && x > best {
				best = x
			}
		}
		for i, x := range m.Values {
			if x == best {
				m.Winners = append(m.Winners, v.Policies[i])
			}
		}
		return m
	}
	sum := func(f func(t *TenantReport) int) func(r *Report) (float64, string) {
		return func(r *Report) (float64, string) {
			n := 0
			for i := range r.Tenants {
				if t := &r.Tenants[i]; counted(t) {
					n += f(t)
				}
			}
			return float64(n), fmt.Sprint(n)
		}
	}
	v.Measures = []Measure{
		measure("refusals within share", of, "lower", sum(func(t *TenantReport) int { return t.WithinShareRefused })),
		measure("floor violation seconds", of, "lower", sum(func(t *TenantReport) int { return t.FloorViolations })),
		measure("worst p99 wait", of, "lower", func(r *Report) (float64, string) {
			worst, who := -1.0, ""
			for i := range r.Tenants {
				if t := &r.Tenants[i]; counted(t) && t.WaitP99 > worst {
					worst, who = t.WaitP99, t.Name
				}
			}
			return max(worst, 0), fmt.Sprintf("%.1f ms (%s)", max(worst, 0), who)
		}),
		measure("utilization", "cluster", "higher", func(r *Report) (float64, string) {
			u := utilization(r)
			return u, fmt.Sprintf("%.1f%%", 100*u)
		}),
		measure("max service diff / VTC bound", "backlogged pairs", "lower", func(r *Report) (float64, string) {
			x := r.MaxServiceDiff / max(r.VTCBound, 1)
			held := "held"
			if r.MaxServiceDiff > r.VTCBound {
				held = "broken"
			}
			return x, fmt.Sprintf("%.2f, %s", x, held)
		}),
	}
	v.NotDeciding = []Measure{
		measure("Jain's index", "all tenants", "", func(r *Report) (float64, string) { return r.Jain, fmt.Sprintf("%.4f", r.Jain) }),
		measure("largest W2, tok/s", "all tenants", "", func(r *Report) (float64, string) {
			w := 0.0
			for _, t := range r.Tenants {
				w = max(w, t.Wasserstein2)
			}
			return w, fmt.Sprintf("%.0f", w)
		}),
	}
	dm, do := c.deferralMeasures(measure)
	v.Measures, v.NotDeciding = append(v.Measures, dm...), append(v.NotDeciding, do...)
	for _, name := range v.Bursting {
		tenant := func(r *Report) *TenantReport {
			i := slices.IndexFunc(r.Tenants, func(t TenantReport) bool { return t.Name == name })
			return &r.Tenants[i]
		}
		v.NotDeciding = append(v.NotDeciding,
			measure("refused", name+" (bursting)", "", func(r *Report) (float64, string) {
				n := tenant(r).Refused()
				return float64(n), fmt.Sprint(n)
			}),
			measure("p99 wait", name+" (bursting)", "", func(r *Report) (float64, string) {
				w := tenant(r).WaitP99
				return w, fmt.Sprintf("%.1f ms", w)
			}),
			measure("floor violation seconds", name+" (bursting)", "", func(r *Report) (float64, string) {
				n := tenant(r).FloorViolations
				return float64(n), fmt.Sprint(n)
			}))
	}
	wins, outright := map[string][]string{}, map[string][]string{}
	for _, m := range v.Measures {
		for _, p := range m.Winners {
			wins[p] = append(wins[p], m.Name)
			if len(m.Winners) == 1 {
				outright[p] = append(outright[p], m.Name)
			}
		}
	}
	for _, p := range v.Policies {
		switch n := len(wins[p]); {
		case n > v.Wins:
			v.Winners, v.Wins = []string{p}, n
		case n == v.Wins && n > 0:
			v.Winners = append(v.Winners, p)
		}
	}
	v.Summary = v.summary(wins, outright)
	return v
}

// summary says the verdict in a sentence: the winners' measures, ties
// included (a tie counts for each), then what each other policy wins
// outright.
func (v *Verdict) summary(wins, outright map[string][]string) string {
	var b strings.Builder
	switch len(v.Winners) {
	case 1:
		fmt.Fprintf(&b, "%s is best on %d of %d measures (%s)", v.Winners[0], v.Wins, len(v.Measures), strings.Join(wins[v.Winners[0]], ", "))
	default:
		fmt.Fprintf(&b, "%s tie, best on %d of %d measures each", strings.Join(v.Winners, " and "), v.Wins, len(v.Measures))
	}
	for _, p := range v.Policies {
		if len(outright[p]) > 0 && !slices.Contains(v.Winners, p) {
			fmt.Fprintf(&b, "; %s on %s", p, strings.Join(outright[p], ", "))
		}
	}
	return b.String()
}
