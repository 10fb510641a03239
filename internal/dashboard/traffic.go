package dashboard

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-sched/sluice/admission"
)

// idleSamples is how many samples without a decision a tenant's counters
// are kept: a tenant that stops sending leaves the map, so that it costs
// only while it has traffic.
const idleSamples = 60

// Traffic counts every tenant's answers, as an admission.Observer beside the
// metrics one, and turns them into per-second rates at each Sample. Only
// tenants with traffic have counters (configured tenants only: an
// UNKNOWN_TENANT answer is not counted, so no caller can grow the map).
// Observing is a read-locked map lookup and atomic adds, with no allocation
// once the tenant has counters.
type Traffic struct {
	mu      sync.RWMutex
	tenants map[string]*tenantCounters

	sampleMu sync.Mutex               // serialises Sample; guards the fields below and the counters' sample fields
	times    [windowSamples]time.Time // when the last samples were taken, a ring
	pos      int                      // the ring's slot of the next sample
	rates    atomic.Pointer[rateTable]
}

// windowSamples is how many samples a rate spans: 5 × SampleEvery (5 s by
// default), long enough that a burst shows for a few seconds, short enough
// that the table follows the load.
const windowSamples = 5

// tenantCounters are one tenant's cumulative answers; the sample fields are
// Sample's, under sampleMu.
type tenantCounters struct {
	n [numCounts]atomic.Int64

	hist [windowSamples][numCounts]int64 // the counts at the last samples, a ring indexed as Traffic.times
	idle int
}

// The counts kept per tenant.
const (
	countAdmitted = iota
	countDegraded
	countRefused
	countTokens // weighted tokens of admitted and degraded requests, charged at admission
	numCounts
)

// Rates are a tenant's answers per second over the last windowSamples
// samples.
type Rates struct {
	Admitted float64 // ADMITTED per second
	Degraded float64 // DEGRADED per second
	Refused  float64 // REJECTED per second
	Tokens   float64 // weighted tokens per second admitted (achieved, against the floor)
}

// total is the tenant's traffic, by which the busiest come first.
func (r Rates) total() float64 { return r.Admitted + r.Degraded + r.Refused }

// rateTable is one Sample's result: every tenant with counters, ranked
// (the busiest first) when a page first asks, since a page is asked for
// far less often than once a second and a hundred thousand active tenants
// take milliseconds to sort. It has no index by name: a page looks up the
// few rows it shows in one pass, and a map of every active tenant rebuilt
// each second would cost more than the counters themselves.
type rateTable struct {
	ranked []rankedTenant
	sort   sync.Once
	sum    Rates // every counted tenant's, for the fleet strip
}

// busiestFirst returns the tenants, the busiest first.
func (rt *rateTable) busiestFirst() []rankedTenant {
	rt.sort.Do(func() {
		slices.SortFunc(rt.ranked, func(a, b rankedTenant) int {
			if c := cmp.Compare(b.rates.total(), a.rates.total()); c != 0 {
				return c
			}
			if c := cmp.Compare(b.rates.Tokens, a.rates.Tokens); c != 0 {
				return c
			}
			return cmp.Compare(a.name, b.name)
		})
	})
	return rt.ranked
}

// ratesOf returns the rates of the named tenants that have counters.
func (rt *rateTable) ratesOf(names []string) map[string]Rates {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	out := make(map[string]Rates, len(names))
	for _, r := range rt.ranked {
		if want[r.name] {
			out[r.name] = r.rates
			if len(out) == len(want) {
				break
			}
		}
	}
	return out
}

// rankedTenant is a tenant and its rates.
type rankedTenant struct {
	name  string
	rates Rates
}

// NewTraffic returns an empty Traffic.
func NewTraffic() *Traffic {
	t := &Traffic{tenants: make(map[string]*tenantCounters)}
	t.rates.Store(&rateTable{})
	return t
}

// ObserveDecision implements admission.Observer.
func (t *Traffic) ObserveDecision(req admission.Request, d admission.Decision) {
	if d.Reason == admission.ReasonUnknownTenant {
		return
	}
	name := d.Trace.Tenant
	if name == "" {
		name = req.Tenant
	}
	c := t.counters(name)
	switch d.Outcome {
	case admission.Admitted:
		c.n[countAdmitted].Add(1)
		c.n[countTokens].Add(d.Trace.WeightedTokens)
	case admission.Degraded:
		c.n[countDegraded].Add(1)
		c.n[countTokens].Add(d.Trace.WeightedTokens)
	case admission.Rejected:
		c.n[countRefused].Add(1)
	}
}

// ObserveRelease implements admission.Observer; releases are not counted.
func (t *Traffic) ObserveRelease(admission.Release, admission.ReleaseResult) {}

// counters returns name's counters, creating them on its first answer.
func (t *Traffic) counters(name string) *tenantCounters {
	t.mu.RLock()
	c := t.tenants[name]
	t.mu.RUnlock()
	if c != nil {
		return c
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if c = t.tenants[name]; c == nil {
		c = new(tenantCounters)
		t.tenants[name] = c
	}
	return c
}

// Sample turns the counts into rates over the last windowSamples samples
// and drops the counters of tenants idle for idleSamples samples. The first
// Sample only sets the baseline. An answer counted on counters being dropped
// at that moment is lost: at most one answer of a tenant idle for a minute.
func (t *Traffic) Sample(now time.Time) {
	t.sampleMu.Lock()
	defer t.sampleMu.Unlock()
	cur, prev := t.pos, (t.pos+windowSamples-1)%windowSamples
	oldest := (t.pos + 1) % windowSamples // the slot this sample's successor overwrites
	if t.times[oldest].IsZero() {
		oldest = 0 // fewer samples than the window so far: span them all
	}
	t.times[cur] = now
	t.pos = (t.pos + 1) % windowSamples
	dt := now.Sub(t.times[oldest]).Seconds()
	var gone []string
	t.mu.RLock()
	table := &rateTable{ranked: make([]rankedTenant, 0, len(t.tenants))}
	for name, c := range t.tenants {
		moved := false
		for i := range c.n {
			c.hist[cur][i] = c.n[i].Load()
			moved = moved || c.hist[cur][i] != c.hist[prev][i]
		}
		if moved {
			c.idle = 0
		} else if c.idle++; c.idle >= idleSamples {
			gone = append(gone, name)
			continue
		}
		var r Rates
		if dt > 0 {
			d := func(i int) float64 { return float64(c.hist[cur][i]-c.hist[oldest][i]) / dt }
			r = Rates{Admitted: d(countAdmitted), Degraded: d(countDegraded), Refused: d(countRefused), Tokens: d(countTokens)}
		}
		table.ranked = append(table.ranked, rankedTenant{name, r})
		table.sum.Admitted += r.Admitted
		table.sum.Degraded += r.Degraded
		table.sum.Refused += r.Refused
		table.sum.Tokens += r.Tokens
	}
	t.mu.RUnlock()
	if len(gone) > 0 {
		t.mu.Lock()
		for _, name := range gone {
			delete(t.tenants, name)
		}
		t.mu.Unlock()
	}
	t.rates.Store(table)
}

// table returns the last Sample's rates.
func (t *Traffic) table() *rateTable { return t.rates.Load() }

// Total returns the answers per second of every counted tenant as of the
// last Sample (UNKNOWN_TENANT answers are not counted).
func (t *Traffic) Total() Rates {
	if rt := t.table(); rt != nil {
		return rt.sum
	}
	return Rates{}
}

// Tracked returns how many tenants have counters (for tests and sizing).
func (t *Traffic) Tracked() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.tenants)
}

// RatesOf returns a tenant's rates as of the last Sample; false when it has
// no counters.
func (t *Traffic) RatesOf(name string) (Rates, bool) {
	r, ok := t.table().ratesOf([]string{name})[name]
	return r, ok
}
