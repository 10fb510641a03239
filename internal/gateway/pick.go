package gateway

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
)

// Loads is the port to the engines' readings: how many requests wait at
// the engine whose metrics URL is metricsURL; false when there is no
// fresh reading of it.
type Loads interface {
	Waiting(metricsURL string) (float64, bool)
}

// endpoint is one engine a request may be sent to.
type endpoint struct {
	address string
	metrics string
	models  []string // served names; empty: every model
	// inFlight counts the requests this gateway sent there and has not
	// seen end: the load the readings do not show yet.
	inFlight *atomic.Int64
}

// serves reports whether e serves a model under any of names.
func (e *endpoint) serves(names []string) bool {
	if len(e.models) == 0 {
		return true
	}
	for _, n := range names {
		if slices.Contains(e.models, n) {
			return true
		}
	}
	return false
}

// catalog maps the names clients use to the catalog's models and back.
type catalog struct {
	byServed map[string]string   // a served name or a model's own name → the model
	served   map[string][]string // a model → the names it is served under, the preferred first
	order    []string            // the models, in the catalog's order
}

func newCatalog(models []pd.Model) *catalog {
	c := &catalog{byServed: make(map[string]string), served: make(map[string][]string)}
	for _, m := range models {
		names := slices.Clone(m.ServedNames)
		if !slices.Contains(names, m.Name) {
			names = append(names, m.Name)
		}
		c.served[m.Name] = names
		c.order = append(c.order, m.Name)
		for _, n := range names {
			c.byServed[n] = m.Name
		}
	}
	return c
}

// picker chooses an endpoint of a domain for a granted model.
type picker struct {
	mu       sync.Mutex
	byDomain map[string][]*endpoint
	counts   map[string]*atomic.Int64 // by address, kept across topology changes
}

// setTopology indexes the engines c names that serve at an address.
func (p *picker) setTopology(c topology.Cluster) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.counts == nil {
		p.counts = make(map[string]*atomic.Int64)
	}
	byDomain := make(map[string][]*endpoint, len(c.Domains))
	seen := make(map[string]bool)
	for _, d := range c.Domains {
		for _, e := range d.Engines {
			if e.Address == "" {
				continue // metrics only
			}
			n := p.counts[e.Address]
			if n == nil {
				n = new(atomic.Int64)
				p.counts[e.Address] = n
			}
			seen[e.Address] = true
			byDomain[d.ID] = append(byDomain[d.ID], &endpoint{address: e.Address, metrics: e.Metrics, models: e.Models, inFlight: n})
		}
	}
	for a, n := range p.counts {
		if !seen[a] && n.Load() == 0 {
			delete(p.counts, a)
		}
	}
	p.byDomain = byDomain
}

// pick returns the endpoints of domain that serve a model under names
// (and are in subset, when it is not nil), the least loaded first, at most
// max of them: load is the engine's waiting requests as last read plus the
// requests this gateway sent there since; ties go to the fewest in flight
// from here, then to the topology's order. None: no endpoint fits.
func (p *picker) pick(domain string, names []string, subset []string, loads Loads, max int) []*endpoint {
	p.mu.Lock()
	eps := p.byDomain[domain]
	p.mu.Unlock()
	type scored struct {
		e        *endpoint
		load     float64
		inFlight int64
	}
	var cand []scored
	for _, e := range eps {
		if !e.serves(names) || subset != nil && !slices.Contains(subset, e.address) {
			continue
		}
		n := e.inFlight.Load()
		load := float64(n)
		if loads != nil {
			if w, ok := loads.Waiting(e.metrics); ok {
				load += w
			}
		}
		cand = append(cand, scored{e, load, n})
	}
	slices.SortStableFunc(cand, func(a, b scored) int {
		switch {
		case a.load != b.load:
			if a.load < b.load {
				return -1
			}
			return 1
		case a.inFlight != b.inFlight:
			if a.inFlight < b.inFlight {
				return -1
			}
			return 1
		}
		return 0
	})
	out := make([]*endpoint, 0, min(len(cand), max))
	for _, c := range cand[:min(len(cand), max)] {
		out = append(out, c.e)
	}
	return out
}

// any returns the least loaded endpoint of any domain, for a request that
// is not admitted (one without a body: a model list, a health check).
func (p *picker) any(subset []string, loads Loads) *endpoint {
	p.mu.Lock()
	domains := make([]string, 0, len(p.byDomain))
	for d := range p.byDomain {
		domains = append(domains, d)
	}
	p.mu.Unlock()
	slices.Sort(domains)
	var best *endpoint
	bestLoad := 0.0
	for _, d := range domains {
		for _, e := range p.pick(d, nil, subset, loads, 1) {
			l := float64(e.inFlight.Load())
			if best == nil || l < bestLoad {
				best, bestLoad = e, l
			}
		}
	}
	return best
}
