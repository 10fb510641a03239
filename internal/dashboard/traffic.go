package dashboard

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/sluice-sched/sluice/admission"
)

// idleSamples is how many samples without a decision a tenant's counters
// are kept: a tenant that stops sending leaves the map, so that it costs
// only while it has traffic.
const idleSamples = 60

// Traffic counts every tenant's answers, as an admission.Observer beside the
// metrics one, and turns them into per-second rates at each Sample: by
// outcome, and the refusals by reason. It also keeps the Admit latency the
// server measures (ObserveLatency) over the same window. Only tenants with
// traffic have counters (configured tenants only: an UNKNOWN_TENANT answer
// is not counted, so no caller can grow the map). Observing is a
// read-locked map lookup and atomic adds, with no allocation once the
// tenant has counters (and, for a refusal, once it has been refused).
type Traffic struct {
	mu      sync.RWMutex
	tenants map[string]*tenantCounters

	sampleMu sync.Mutex               // serialises Sample; guards the fields below and the counters' sample fields
	times    [windowSamples]time.Time // when the last samples were taken, a ring
	pos      int                      // the ring's slot of the next sample
	rates    atomic.Pointer[rateTable]
	merged   *hdrhistogram.Histogram // Sample's scratch: the window's latencies together

	lat struct {
		sync.Mutex
		// hists holds one histogram per sample interval, a ring as times
		// is; only hists[cur] is written between two Samples, so Sample
		// merges the others without holding the lock.
		hists [windowSamples]*hdrhistogram.Histogram
		cur   int
	}
}

// windowSamples is how many samples a rate spans: 5, the 4 × SampleEvery
// between them (4 s by default), long enough that a burst shows for a few
// seconds, short enough that the table follows the load.
const windowSamples = 5

// tenantCounters are one tenant's cumulative answers; the sample fields are
// Sample's, under sampleMu.
type tenantCounters struct {
	n        [numCounts]atomic.Int64
	refusals atomic.Pointer[reasonCounts] // nil until the tenant's first refusal

	hist [windowSamples][numCounts]int64 // the counts at the last samples, a ring indexed as Traffic.times
	idle int
}

// numReasons sizes the tables indexed by refusal reason.
const numReasons = int(admission.LastReason) + 1

// reasonCounts are a tenant's cumulative refusals by reason. They are made
// at its first refusal: a tenant that is never refused pays a pointer, not
// the 720 B of a table per reason.
type reasonCounts struct {
	n    [numReasons]atomic.Int64
	hist [windowSamples][numReasons]int64 // Sample's, as tenantCounters.hist
}

// reasons returns c's refusal counters, making them on first use.
func (c *tenantCounters) reasons() *reasonCounts {
	if r := c.refusals.Load(); r != nil {
		return r
	}
	c.refusals.CompareAndSwap(nil, new(reasonCounts))
	return c.refusals.Load()
}

// How many refusal reasons are ranked: the fleet strip's, and each tenant
// row's (a table cell has room for two).
const (
	fleetReasons  = 3
	tenantReasons = 2
)

// ReasonRate is a refusal reason and its refusals per second over the
// window.
type ReasonRate struct {
	Reason    admission.Reason
	PerSecond float64
}

// commonest fills dst with the reasons whose rate (rates is indexed by
// reason) is above 0, the commonest first and, at equal rates, the lower
// reason first; slots left over stay zero.
func commonest(rates *[numReasons]float64, dst []ReasonRate) {
	for r, v := range rates {
		if v <= 0 {
			continue
		}
		for i := range dst {
			if dst[i].PerSecond < v {
				copy(dst[i+1:], dst[i:len(dst)-1])
				dst[i] = ReasonRate{Reason: admission.Reason(r), PerSecond: v}
				break
			}
		}
	}
}

// ranked returns the filled slots of a commonest table.
func ranked(rs []ReasonRate) []ReasonRate {
	n := 0
	for n < len(rs) && rs[n].PerSecond > 0 {
		n++
	}
	return slices.Clone(rs[:n])
}

// The Admit latency histograms count microseconds, from 1 µs to 5 minutes
// (beyond any queue wait a config sets; a longer one counts as 5 minutes),
// to 2 significant digits: a p99 to within 1%, in histograms of 23 KB
// where 3 digits would take 164 KB each.
const (
	latencyHighest = int64(5 * time.Minute / time.Microsecond)
	latencyDigits  = 2
)

func newLatencyHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(1, latencyHighest, latencyDigits)
}

// Latency is the Admit latency over the window.
type Latency struct {
	P99   time.Duration // 0 when Count is
	Count int64         // Admit calls timed in the window
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
	ranked  []rankedTenant
	sort    sync.Once
	sum     Rates                    // every counted tenant's, for the fleet strip
	reasons [fleetReasons]ReasonRate // every counted tenant's commonest refusal reasons
	latency Latency
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
func (rt *rateTable) ratesOf(names []string) map[string]rankedTenant {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	out := make(map[string]rankedTenant, len(names))
	for _, r := range rt.ranked {
		if want[r.name] {
			out[r.name] = r
			if len(out) == len(want) {
				break
			}
		}
	}
	return out
}

// rankedTenant is a tenant, its rates and its commonest refusal reasons.
type rankedTenant struct {
	name    string
	rates   Rates
	reasons [tenantReasons]ReasonRate
}

// NewTraffic returns an empty Traffic.
func NewTraffic() *Traffic {
	t := &Traffic{tenants: make(map[string]*tenantCounters), merged: newLatencyHistogram()}
	for i := range t.lat.hists {
		t.lat.hists[i] = newLatencyHistogram()
	}
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
		// The total first: Sample reads the reasons before it, so that
		// they never sum to more than the refusals.
		c.n[countRefused].Add(1)
		if r := int(d.Reason); r >= 0 && r < numReasons {
			c.reasons().n[r].Add(1)
		}
	}
}

// ObserveLatency records the latency of one Admit, as the server measures
// it for sluice_admit_latency_seconds: the engine's decision and any wait
// in the fair queue. It takes a lock held for one histogram add; Sample
// holds it only to move to the next histogram.
func (t *Traffic) ObserveLatency(d time.Duration) {
	us := min(max(d.Microseconds(), 0), latencyHighest)
	t.lat.Lock()
	_ = t.lat.hists[t.lat.cur].RecordValue(us) // within the range: no error
	t.lat.Unlock()
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
	var fleet [numReasons]float64
	for name, c := range t.tenants {
		// The reasons before the totals (see ObserveDecision).
		rc := c.refusals.Load()
		if rc != nil {
			for i := range rc.n {
				rc.hist[cur][i] = rc.n[i].Load()
			}
		}
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
		rt := rankedTenant{name: name}
		if dt > 0 {
			d := func(i int) float64 { return float64(c.hist[cur][i]-c.hist[oldest][i]) / dt }
			rt.rates = Rates{Admitted: d(countAdmitted), Degraded: d(countDegraded), Refused: d(countRefused), Tokens: d(countTokens)}
			if rc != nil && rt.rates.Refused > 0 {
				var own [numReasons]float64
				for i := range own {
					own[i] = float64(rc.hist[cur][i]-rc.hist[oldest][i]) / dt
					fleet[i] += own[i]
				}
				commonest(&own, rt.reasons[:])
			}
		}
		table.ranked = append(table.ranked, rt)
		table.sum.Admitted += rt.rates.Admitted
		table.sum.Degraded += rt.rates.Degraded
		table.sum.Refused += rt.rates.Refused
		table.sum.Tokens += rt.rates.Tokens
	}
	t.mu.RUnlock()
	commonest(&fleet, table.reasons[:])
	table.latency = t.sampleLatency()
	if len(gone) > 0 {
		t.mu.Lock()
		for _, name := range gone {
			delete(t.tenants, name)
		}
		t.mu.Unlock()
	}
	t.rates.Store(table)
}

// sampleLatency starts the next interval's histogram and returns the
// latency over the intervals before it: the window the rates span.
func (t *Traffic) sampleLatency() Latency {
	// Only Sample moves cur, so it reads cur unlocked and empties the next
	// histogram before any observer can write to it.
	i := (t.lat.cur + 1) % windowSamples
	next := t.lat.hists[i]
	next.Reset()
	t.lat.Lock()
	t.lat.cur = i
	t.lat.Unlock()
	t.merged.Reset()
	for _, h := range t.lat.hists {
		if h != next {
			t.merged.Merge(h)
		}
	}
	l := Latency{Count: t.merged.TotalCount()}
	if l.Count > 0 {
		l.P99 = time.Duration(t.merged.ValueAtQuantile(99)) * time.Microsecond
	}
	return l
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
	return r.rates, ok
}

// TopRefusals returns the commonest refusal reasons of every counted
// tenant as of the last Sample: at most 3, the commonest first.
func (t *Traffic) TopRefusals() []ReasonRate { return ranked(t.table().reasons[:]) }

// RefusalsOf returns a tenant's commonest refusal reasons as of the last
// Sample: at most 2, the commonest first; none when it was not refused.
func (t *Traffic) RefusalsOf(name string) []ReasonRate {
	r := t.table().ratesOf([]string{name})[name]
	return ranked(r.reasons[:])
}

// AdmitLatency returns the Admit latency over the window as of the last
// Sample.
func (t *Traffic) AdmitLatency() Latency { return t.table().latency }
