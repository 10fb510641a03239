package enginesim

import (
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-sched/sluice/internal/replay"
	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
)

// PlanOptions say how Plan sizes and places the engines.
type PlanOptions struct {
	// Capacity is what each engine sustains relative to the model, as the
	// replay's --engine-capacity: 1 serves at the domain's peak-derived
	// rates (the pd rates ÷ soft_fraction), 0.5 at half of them.
	Capacity float64
	// PerDomain is how many engines serve a domain whose topology names
	// none; they split its rates and KV evenly. Default 1.
	PerDomain int
	// MaxBatch and PrefillTokens are each engine's scheduler limits;
	// default the replay's (256 and 8192).
	MaxBatch      int
	PrefillTokens int64
	// Listen is where the engines without an address of their own listen:
	// "host:port", the first on port and each next one on the next port
	// (port 0: each on a free port), or "host:first-last", within that
	// range.
	Listen string
}

// MaxCapacity bounds PlanOptions.Capacity, as the replay bounds its
// engines'.
const MaxCapacity = 100

// EngineConfig is one engine to serve.
type EngineConfig struct {
	Domain string
	// Index is the engine's place among its domain's.
	Index int
	// Listen is the host:port it listens on.
	Listen string
	// Models are the names it answers to (a request's "model"): the
	// catalog's served names and model names, or those its topology entry
	// lists.
	Models []string
	Spec   Spec

	cat    *pd.Catalog
	cap    *pd.DomainCapacity // its own: a DomainCapacity is not shared across engines' locks
	byName map[string]*pd.Model
}

// Plan sizes one engine per engine the cluster's domains name, or
// o.PerDomain per domain that names none, from the domain's peaks and the
// model catalog as the replay sizes its engines: prefill FLOP/s and decode
// bytes/s are Capacity × the domain's pd rates ÷ soft_fraction, split
// evenly among its engines, as is its KV limit. A domain without healthy
// GPUs gets no engine.
func Plan(cluster topology.Cluster, models []pd.Model, capCfg pd.Config, o PlanOptions) ([]EngineConfig, error) {
	switch {
	case !(o.Capacity > 0) || o.Capacity > MaxCapacity:
		return nil, fmt.Errorf("capacity %g: must be in (0, %d]", o.Capacity, MaxCapacity)
	case o.PerDomain < 0:
		return nil, fmt.Errorf("engines per domain %d: must be positive", o.PerDomain)
	case o.MaxBatch < 0:
		return nil, fmt.Errorf("max batch %d: must be positive", o.MaxBatch)
	case o.PrefillTokens < 0:
		return nil, fmt.Errorf("prefill tokens %d: must be positive", o.PrefillTokens)
	}
	if o.PerDomain == 0 {
		o.PerDomain = 1
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = replay.DefaultMaxBatch
	}
	if o.PrefillTokens == 0 {
		o.PrefillTokens = replay.DefaultPrefillTokens
	}
	ports, err := parseListen(o.Listen)
	if err != nil {
		return nil, err
	}
	cat, err := pd.NewCatalog(models)
	if err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	soft := capCfg.SoftFraction
	if soft <= 0 {
		soft = pd.DefaultConfig().SoftFraction
	}
	var all []string
	for _, name := range cat.Names() {
		m, _ := cat.Get(name)
		all = append(all, servedNames(m)...)
	}
	var out []EngineConfig
	for i := range cluster.Domains {
		d := &cluster.Domains[i]
		probe, err := pd.NewDomainCapacity(d, cat, capCfg, 0)
		if err != nil {
			return nil, fmt.Errorf("topology: %w", err)
		}
		if probe.PrefillRate() == 0 {
			continue // no healthy GPU
		}
		n := o.PerDomain
		if len(d.Engines) > 0 {
			n = len(d.Engines)
		}
		_, kv := probe.KV()
		spec := Spec{
			PrefillRate:   o.Capacity * float64(probe.PrefillRate()) / soft / float64(n),
			DecodeRate:    o.Capacity * float64(probe.DecodeRate()) / soft / float64(n),
			KVBytes:       kv / int64(n),
			MaxBatch:      o.MaxBatch,
			PrefillTokens: o.PrefillTokens,
		}
		if err := spec.validate(); err != nil {
			return nil, fmt.Errorf("domain %s: %w", d.ID, err)
		}
		for j := range n {
			ec := EngineConfig{Domain: d.ID, Index: j, Models: all, Spec: spec, cat: cat, byName: map[string]*pd.Model{}}
			if ec.cap, err = pd.NewDomainCapacity(d, cat, capCfg, 0); err != nil {
				return nil, fmt.Errorf("topology: %w", err)
			}
			if j < len(d.Engines) {
				e := d.Engines[j]
				ec.Listen = e.Address
				if len(e.Models) > 0 {
					ec.Models = slices.Clone(e.Models)
				}
			}
			if ec.Listen == "" {
				if ec.Listen, err = ports.next(); err != nil {
					return nil, err
				}
			}
			for _, name := range ec.Models {
				m := modelNamed(cat, name)
				if m == nil {
					return nil, fmt.Errorf("domain %s: engine %d: model %q is not in the catalog (%s)", d.ID, j, name, strings.Join(all, ", "))
				}
				ec.byName[name] = m
			}
			out = append(out, ec)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("topology: no domain has a healthy GPU to serve on")
	}
	return out, nil
}

// servedNames are the names m is served under: its served names, then its
// own name when they do not hold it.
func servedNames(m *pd.Model) []string {
	names := slices.Clone(m.ServedNames)
	if !slices.Contains(names, m.Name) {
		names = append(names, m.Name)
	}
	return names
}

// modelNamed is the catalog model served under name, or nil.
func modelNamed(cat *pd.Catalog, name string) *pd.Model {
	for _, n := range cat.Names() {
		m, _ := cat.Get(n)
		if slices.Contains(servedNames(m), name) {
			return m
		}
	}
	return nil
}

// portPlan hands out listen addresses.
type portPlan struct {
	host               string
	first, next0, last int // last < 0: no bound; next0 0: every engine on a free port
}

func parseListen(s string) (*portPlan, error) {
	bad := func(why string) (*portPlan, error) {
		return nil, fmt.Errorf("listen %q: %s; want host:port or host:first-last, e.g. 127.0.0.1:8100", s, why)
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return bad("no host:port")
	}
	first, last, ranged := strings.Cut(port, "-")
	lo, err := strconv.Atoi(first)
	if err != nil || lo < 0 || lo > math.MaxUint16 {
		return bad(fmt.Sprintf("port %q is not in 0..65535", first))
	}
	p := &portPlan{host: host, first: lo, next0: lo, last: -1}
	if ranged {
		hi, err := strconv.Atoi(last)
		if err != nil || hi < lo || hi > math.MaxUint16 || lo == 0 {
			return bad(fmt.Sprintf("range %q is not first-last within 1..65535", port))
		}
		p.last = hi
	}
	return p, nil
}

func (p *portPlan) next() (string, error) {
	if p.next0 == 0 {
		return net.JoinHostPort(p.host, "0"), nil
	}
	hi := p.last
	if hi < 0 {
		hi = math.MaxUint16
	}
	if p.next0 > hi {
		return "", fmt.Errorf("listen %s: more engines than ports", net.JoinHostPort(p.host, fmt.Sprintf("%d-%d", p.first, hi)))
	}
	a := net.JoinHostPort(p.host, strconv.Itoa(p.next0))
	p.next0++
	return a, nil
}
