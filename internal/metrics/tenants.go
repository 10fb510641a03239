package metrics

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-sched/sluice/admission"
)

// OtherTenant is the tenant label of every tenant that has no series of its
// own: tenants beyond the busiest MaxTenantSeries, and names the config does
// not know (UNKNOWN_TENANT), which must never become a label.
const OtherTenant = "other"

// DefaultMaxTenantSeries is how many tenants get series of their own when
// Options leaves it 0.
const DefaultMaxTenantSeries = 100

// tenantSeries holds one tenant label's pre-resolved children, so that
// observing a decision is an atomic add with no label hashing.
type tenantSeries struct {
	name string
	// window counts the tenant's decisions since the last ranking.
	window    atomic.Uint64
	decisions [maxOutcome][maxReason]prometheus.Counter
	credit    prometheus.Counter
	clamped   prometheus.Counter // Releases charged at the overrun bound
	// latency is the Admit histogram per requested model, copied on write
	// (a model is added once; models are the catalog's, so they are few).
	latency atomic.Pointer[map[string]*latencySeries]
}

// tenantSet decides which tenants have series of their own: up to max
// configured tenants, the busiest by decisions since the last ranking; every
// other tenant is counted under OtherTenant. Lookups on the hot path read an
// immutable map through an atomic pointer; only a tenant without series
// takes the mutex, to be counted for the next ranking (or named at once
// while there is room).
type tenantSet struct {
	max   int
	vecs  *tenantVecs
	named atomic.Pointer[map[string]*tenantSeries]
	other *tenantSeries

	mu struct {
		sync.Mutex
		// candidates counts the decisions of tenants without series since
		// the last ranking, bounded at candidateFactor × max entries
		// (countLocked).
		candidates map[string]uint64
	}
}

// candidateFactor bounds the candidates counted between two rankings.
const candidateFactor = 4

// tenantVecs are the tenant-labelled metric vectors a tenantSet fills.
type tenantVecs struct {
	decisions *prometheus.CounterVec // tenant, decision, reason
	credit    *prometheus.CounterVec // tenant
	clamped   *prometheus.CounterVec // tenant
	latency   *latencyVec            // tenant, model
}

func newTenantSet(max int, vecs *tenantVecs) *tenantSet {
	s := &tenantSet{max: max, vecs: vecs}
	s.other = s.newSeries(OtherTenant)
	empty := map[string]*tenantSeries{}
	s.named.Store(&empty)
	s.mu.candidates = make(map[string]uint64)
	return s
}

// newSeries resolves a label's children.
func (s *tenantSet) newSeries(name string) *tenantSeries {
	ts := &tenantSeries{name: name}
	for o := admission.Admitted; o <= admission.Rejected; o++ {
		for r := admission.ReasonNone; int(r) < maxReason; r++ {
			if (o == admission.Rejected) == (r == admission.ReasonNone) {
				continue // admissions have no reason; rejections always have one
			}
			ts.decisions[o][r] = s.vecs.decisions.WithLabelValues(name, o.String(), r.String())
		}
	}
	ts.credit = s.vecs.credit.WithLabelValues(name)
	ts.clamped = s.vecs.clamped.WithLabelValues(name)
	lat := map[string]*latencySeries{}
	ts.latency.Store(&lat)
	return ts
}

// series returns the series of tenant, counting the decision for the next
// ranking. known is false for a name the config does not have, which always
// counts as OtherTenant.
func (s *tenantSet) series(tenant string, known bool) *tenantSeries {
	if ts, ok := (*s.named.Load())[tenant]; ok {
		ts.window.Add(1)
		return ts
	}
	if !known || tenant == OtherTenant { // a tenant named "other" shares the label
		return s.other
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	named := *s.named.Load()
	if ts, ok := named[tenant]; ok { // named meanwhile
		ts.window.Add(1)
		return ts
	}
	if len(named) < s.max {
		// Room left: name the tenant at once, so that a deployment with
		// fewer tenants than the bound never sees OtherTenant.
		ts := s.newSeries(tenant)
		ts.window.Add(1)
		s.publishLocked(named, ts)
		return ts
	}
	s.countLocked(tenant)
	return s.other
}

// countLocked counts a decision of a tenant without series. The candidates
// are bounded: when the map is full, every count is halved and those that
// reach 0 are dropped (a decay, as in lossy counting), so that a busy
// tenant arriving after many one-off ones still finds a place, and keeps
// its lead over them. A halving costs the map's size and empties at least
// the entries counted once, so it is rare; when it frees nothing the
// newcomer is not counted this time.
func (s *tenantSet) countLocked(tenant string) {
	c := s.mu.candidates
	if n, ok := c[tenant]; ok {
		c[tenant] = n + 1
		return
	}
	limit := candidateFactor * s.max
	if len(c) >= limit {
		for k, n := range c {
			if n /= 2; n == 0 {
				delete(c, k)
			} else {
				c[k] = n
			}
		}
	}
	if len(c) < limit {
		c[tenant] = 1
	}
}

// publishLocked stores a copy of named with ts added.
func (s *tenantSet) publishLocked(named map[string]*tenantSeries, ts *tenantSeries) {
	next := make(map[string]*tenantSeries, len(named)+1)
	for k, v := range named {
		next[k] = v
	}
	next[ts.name] = ts
	s.named.Store(&next)
}

// rank re-chooses the named tenants: the max busiest by decisions since the
// last ranking, incumbents first among equals (so that series do not flap
// between tenants of the same traffic), then by name. A tenant that loses
// its place has its series deleted; its later traffic counts under
// OtherTenant, whose counters only grow, so rate() over either stays right.
// The server ranks at every scrape.
func (s *tenantSet) rank() {
	s.mu.Lock()
	defer s.mu.Unlock()
	named := *s.named.Load()
	if len(s.mu.candidates) == 0 { // nobody waiting for a place
		for _, ts := range named {
			ts.window.Store(0)
		}
		return
	}
	type cand struct {
		name      string
		n         uint64
		incumbent *tenantSeries
	}
	all := make([]cand, 0, len(named)+len(s.mu.candidates))
	for name, ts := range named {
		all = append(all, cand{name, ts.window.Swap(0), ts})
	}
	for name, n := range s.mu.candidates {
		all = append(all, cand{name: name, n: n})
	}
	clear(s.mu.candidates)
	slices.SortFunc(all, func(a, b cand) int {
		if c := cmp.Compare(b.n, a.n); c != 0 {
			return c
		}
		if (a.incumbent != nil) != (b.incumbent != nil) {
			if a.incumbent != nil {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.name, b.name)
	})
	next := make(map[string]*tenantSeries, s.max)
	for i, c := range all {
		if i < s.max {
			ts := c.incumbent
			if ts == nil {
				ts = s.newSeries(c.name)
			}
			next[c.name] = ts
			continue
		}
		if c.incumbent != nil {
			s.deleteSeries(c.name)
		}
	}
	s.named.Store(&next)
}

// deleteSeries drops every series labelled with tenant.
func (s *tenantSet) deleteSeries(tenant string) {
	l := prometheus.Labels{"tenant": tenant}
	s.vecs.decisions.DeletePartialMatch(l)
	s.vecs.credit.DeletePartialMatch(l)
	s.vecs.clamped.DeletePartialMatch(l)
	s.vecs.latency.deleteTenant(tenant)
}

// find returns the series of tenant (OtherTenant's if it has none) without
// counting anything.
func (s *tenantSet) find(tenant string) *tenantSeries {
	if ts, ok := (*s.named.Load())[tenant]; ok {
		return ts
	}
	return s.other
}

// names returns the named tenants, sorted.
func (s *tenantSet) names() []string {
	named := *s.named.Load()
	out := make([]string, 0, len(named))
	for n := range named {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// observeLatency records an Admit's latency under the tenant's label and
// the requested model. The model's child is resolved once per label.
func (s *tenantSet) observeLatency(ts *tenantSeries, model string, seconds float64) {
	if o, ok := (*ts.latency.Load())[model]; ok {
		o.Observe(seconds)
		return
	}
	s.mu.Lock()
	cur := *ts.latency.Load()
	o, ok := cur[model]
	if !ok {
		o = s.vecs.latency.with(ts.name, model)
		next := make(map[string]*latencySeries, len(cur)+1)
		for k, v := range cur {
			next[k] = v
		}
		next[model] = o
		ts.latency.Store(&next)
	}
	s.mu.Unlock()
	o.Observe(seconds)
}
