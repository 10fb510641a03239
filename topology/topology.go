package topology

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
)

// Domain kinds used by the built-in sources. Kind is free text; these are the
// values Sluice itself writes.
const (
	KindNVL72 = "nvl72" // a GB200 NVL72 rack: one NVLink clique of 72 GPUs on 18 trays
	KindHGX   = "hgx"   // an HGX board: one node's 8 GPUs on their own NVLink island
	// KindNVLinkClique is a multi-node NVLink clique found by NVML fabric
	// discovery (an NVL72 rack, or a partition of one); Merge writes it.
	KindNVLinkClique = "nvlink-clique"
	// KindPCIe is a node whose GPUs have no active NVLink: each node is its
	// own domain, and Merge writes this kind for it.
	KindPCIe = "pcie"
)

// MixedModel is what Domain.GPUModel returns for a domain with more than one
// GPU model.
const MixedModel = "mixed"

// Peaks are a GPU's datasheet limits, or a sum of them over a domain.
type Peaks struct {
	SMs          int     // streaming multiprocessors
	FLOPS        float64 // dense BF16 tensor FLOP/s
	HBMBandwidth float64 // HBM bandwidth, bytes/s
	HBMBytes     int64   // HBM capacity, bytes
	Source       string  // SourceTable, SourceConfig or SourceNVMLEstimate
	// Figures says where each figure came from where that differs from
	// Source: an NVML estimate reads some figures (HBM bytes, SMs) and
	// derives others (bandwidth, FLOP/s), and an operator needs to know
	// which to trust. An empty field means Source; FigureSources resolves.
	Figures PeakSources
}

// PeakSources names the source of each figure of a Peaks: SourceTable,
// SourceConfig, SourceNVML (read as is) or SourceNVMLEstimate (derived from
// readings).
type PeakSources struct {
	SMs          string `json:"sms"`
	FLOPS        string `json:"flops"`
	HBMBandwidth string `json:"hbm_bandwidth"`
	HBMBytes     string `json:"hbm_bytes"`
}

// FigureSources returns the source of every figure, taking Source for the
// figures Figures leaves empty.
func (p Peaks) FigureSources() PeakSources {
	f := p.Figures
	for _, s := range []*string{&f.SMs, &f.FLOPS, &f.HBMBandwidth, &f.HBMBytes} {
		if *s == "" {
			*s = p.Source
		}
	}
	return f
}

// check reports the first limit that is not positive and finite. An
// unhealthy GPU contributes no capacity, so its figures may also be zero:
// discovery lists a GPU whose peaks it could not (fully) obtain as
// unhealthy, with the figures it did obtain.
func (p Peaks) check(healthy bool) error {
	want := "positive"
	if !healthy {
		want = "positive or zero (unhealthy GPU)"
	}
	ok := func(v float64) bool { return (v > 0 || !healthy && v == 0) && !math.IsInf(v, 0) }
	switch {
	case !ok(float64(p.SMs)):
		return fmt.Errorf("peaks: sms must be %s, got %d", want, p.SMs)
	case !ok(p.FLOPS):
		return fmt.Errorf("peaks: flops must be %s and finite, got %g", want, p.FLOPS)
	case !ok(p.HBMBandwidth):
		return fmt.Errorf("peaks: hbm_bandwidth must be %s and finite, got %g", want, p.HBMBandwidth)
	case !ok(float64(p.HBMBytes)):
		return fmt.Errorf("peaks: hbm_bytes must be %s, got %d", want, p.HBMBytes)
	// Bounds far above any GPU, so that sums over a domain cannot overflow.
	case p.FLOPS > MaxFLOPS:
		return fmt.Errorf("peaks: flops must be at most %g, got %g", MaxFLOPS, p.FLOPS)
	case p.HBMBandwidth > MaxHBMBandwidth:
		return fmt.Errorf("peaks: hbm_bandwidth must be at most %g, got %g", MaxHBMBandwidth, p.HBMBandwidth)
	case p.HBMBytes > MaxHBMBytes:
		return fmt.Errorf("peaks: hbm_bytes must be at most %d, got %d", int64(MaxHBMBytes), p.HBMBytes)
	case p.SMs > MaxSMs:
		return fmt.Errorf("peaks: sms must be at most %d, got %d", MaxSMs, p.SMs)
	}
	return nil
}

// Upper bounds on one GPU's peaks: a thousand times today's largest, and
// low enough that a cluster's sums stay far inside int64 and float64.
const (
	MaxFLOPS        = 1e19 // FLOP/s
	MaxHBMBandwidth = 1e16 // B/s
	MaxHBMBytes     = 1 << 50
	MaxSMs          = 1 << 20
)

// GPU is one accelerator.
type GPU struct {
	Index    int    // index on its node, as NVML numbers it
	UUID     string // "GPU-…"; unique in the cluster when set
	Name     string // the product name as the source gave it, e.g. "NVIDIA GB200"
	PCIBusID string // e.g. "00000000:18:00.0"
	// What NVML read about the GPU (zero where it was not read: a file, the
	// simulated cluster, or a reading the driver refused). Peaks hold what
	// the scheduler uses; these are the raw readings beside them.
	MemoryBytes        int64 // GetMemoryInfo().Total
	MaxSMClockMHz      int   // GetMaxClockInfo(CLOCK_SM)
	MaxMemClockMHz     int   // GetMaxClockInfo(CLOCK_MEM)
	MemoryBusWidthBits int   // GetMemoryBusWidth
	Peaks              Peaks
	ActiveNVLinks      int  // NVLink ports up
	Healthy            bool // false: present but contributes no capacity
	// Problem says why a GPU is unhealthy ("fabric health: unhealthy",
	// "16 active NVLinks, its domain peers have 18"), so that an operator
	// reading the topology sees the cause, not just a smaller domain.
	// Empty for a healthy GPU, and for one a file marked unhealthy.
	Problem string
}

// Node is one machine (an NVL72 compute tray, an HGX server).
type Node struct {
	Name string // unique in the cluster
	GPUs []GPU
}

// Domain is an NVLink domain: the unit no request may cross. Prefill, decode
// and the KV transfer between them stay inside one domain.
type Domain struct {
	ID    string // an NVML clique id "<ClusterUuid>.<CliqueId>", or a name
	Kind  string // KindNVL72, KindHGX, …
	Nodes []Node
	// Engines are the domain's serving engines whose metrics Sluice reads
	// (their waiting queue and KV-cache use) to correct its capacity.
	Engines []Engine
}

// Engine is one serving engine: its Prometheus metrics endpoint, what
// kind of engine it is ("vllm", "sglang", or a kind sluiced's config
// names), which says which metrics to read, and, for an engine a gateway
// routes requests to, the address it serves on and the model names it
// serves. An engine without an Address is read for its metrics only and
// is never chosen as a request's endpoint.
type Engine struct {
	Metrics string // an http(s) URL
	Kind    string
	// Address is the host:port the gateway sends requests to; empty for a
	// metrics-only engine.
	Address string
	// Models are the model names the engine serves, as clients name them
	// (the catalog's served names); empty: every model of the domain.
	Models []string
}

// Validate reports what is wrong with the engine, if anything: its metrics
// URL must be http(s) with a host, its kind named, its address (if any) a
// host:port, and its model names non-empty and distinct.
func (e Engine) Validate() error {
	u, err := url.Parse(e.Metrics)
	switch {
	case e.Metrics == "":
		return errors.New("metrics: missing")
	case err != nil:
		return fmt.Errorf("metrics: %w", err)
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		return fmt.Errorf("metrics: want an http(s) URL with a host, got %q", e.Metrics)
	case e.Kind == "":
		return errors.New("kind: missing (vllm, sglang, or a kind the config names)")
	}
	if e.Address != "" {
		if err := checkAddress(e.Address); err != nil {
			return fmt.Errorf("address: %w", err)
		}
	}
	for i, m := range e.Models {
		switch {
		case m == "":
			return fmt.Errorf("models[%d]: empty", i)
		case slices.Contains(e.Models[:i], m):
			return fmt.Errorf("models[%d]: %q named twice", i, m)
		}
	}
	return nil
}

// checkAddress reports whether a is a host:port with a host and a port
// number in 1..65535.
func checkAddress(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("want host:port, got %q", a)
	}
	n, err := strconv.Atoi(port)
	switch {
	case host == "":
		return fmt.Errorf("want host:port with a host, got %q", a)
	case err != nil || n < 1 || n > 65535:
		return fmt.Errorf("want a port in 1..65535, got %q", a)
	}
	return nil
}

// Equal reports whether e and o are the same engine.
func (e Engine) Equal(o Engine) bool {
	return e.Metrics == o.Metrics && e.Kind == o.Kind && e.Address == o.Address && slices.Equal(e.Models, o.Models)
}

// GPUCount returns the number of GPUs in the domain, healthy or not.
func (d Domain) GPUCount() int {
	n := 0
	for _, nd := range d.Nodes {
		n += len(nd.GPUs)
	}
	return n
}

// HealthyGPUCount returns the number of healthy GPUs in the domain.
func (d Domain) HealthyGPUCount() int {
	n := 0
	for _, nd := range d.Nodes {
		for _, g := range nd.GPUs {
			if g.Healthy {
				n++
			}
		}
	}
	return n
}

// HealthyNodeCount returns the number of nodes with at least one healthy GPU:
// the nodes that hold model weights.
func (d Domain) HealthyNodeCount() int {
	n := 0
	for _, nd := range d.Nodes {
		if slices.ContainsFunc(nd.GPUs, func(g GPU) bool { return g.Healthy }) {
			n++
		}
	}
	return n
}

// TotalPeaks sums the peaks of the domain's healthy GPUs; an unhealthy GPU
// contributes nothing. Source is the GPUs' common source, "mixed" when they
// differ, and empty when no GPU is healthy; Figures likewise is the GPUs'
// common Figures, and empty (so: Source) when they differ.
func (d Domain) TotalPeaks() Peaks {
	var t Peaks
	first := true
	sameFigures := true
	for _, nd := range d.Nodes {
		for _, g := range nd.GPUs {
			if !g.Healthy {
				continue
			}
			t.SMs += g.Peaks.SMs
			t.FLOPS += g.Peaks.FLOPS
			t.HBMBandwidth += g.Peaks.HBMBandwidth
			t.HBMBytes = satAdd(t.HBMBytes, g.Peaks.HBMBytes)
			switch {
			case first:
				t.Source, t.Figures, first = g.Peaks.Source, g.Peaks.Figures, false
			case t.Source != g.Peaks.Source:
				t.Source = "mixed"
			}
			sameFigures = sameFigures && t.Figures == g.Peaks.Figures
		}
	}
	if !sameFigures || t.Source == "mixed" {
		t.Figures = PeakSources{}
	}
	return t
}

// satAdd adds non-negative a and b, saturating at MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// GPUModel returns the model of the domain's healthy GPUs (of all its GPUs
// when none is healthy) as ModelName spells it ("GB200"), MixedModel when
// they differ, and "" for a domain without GPUs. Calibrations are looked up
// by it, so it follows the GPUs that bear capacity: an unhealthy GPU that
// discovery could not identify (listed under a stand-in name such as
// "gpu-index-3") does not make its domain "mixed".
func (d Domain) GPUModel() string {
	healthyOnly := d.HealthyGPUCount() > 0
	model, lastName := "", ""
	for _, nd := range d.Nodes {
		for _, g := range nd.GPUs {
			if healthyOnly && !g.Healthy {
				continue
			}
			if model != "" && g.Name == lastName {
				continue // a domain's GPUs mostly share one name: read it once
			}
			m := ModelName(g.Name)
			lastName = g.Name
			switch {
			case model == "":
				model = m
			case m != model:
				return MixedModel
			}
		}
	}
	return model
}

// Clone returns a deep copy of the domain.
func (d Domain) Clone() Domain {
	c := d
	c.Nodes = make([]Node, len(d.Nodes))
	for i, nd := range d.Nodes {
		c.Nodes[i] = Node{Name: nd.Name, GPUs: slices.Clone(nd.GPUs)}
	}
	return c
}

// Cluster is every NVLink domain Sluice may place on. A Cluster is plain data:
// safe to share once no one writes to it.
type Cluster struct {
	Domains []Domain
}

// Domain returns the domain with the given id. The pointer points into
// c.Domains.
func (c Cluster) Domain(id string) (*Domain, bool) {
	for i := range c.Domains {
		if c.Domains[i].ID == id {
			return &c.Domains[i], true
		}
	}
	return nil, false
}

// GPUCount returns the number of GPUs in the cluster, healthy or not.
func (c Cluster) GPUCount() int {
	n := 0
	for _, d := range c.Domains {
		n += d.GPUCount()
	}
	return n
}

// Clone returns a deep copy of the cluster.
func (c Cluster) Clone() Cluster {
	out := Cluster{Domains: make([]Domain, len(c.Domains))}
	for i, d := range c.Domains {
		out.Domains[i] = d.Clone()
	}
	return out
}

// domainRef names a domain in Validate's messages, formatted only when one
// is written.
type domainRef struct {
	index int
	id    string
}

// String formats the reference as domains[i] "id".
func (r domainRef) String() string { return fmt.Sprintf("domains[%d] %q", r.index, r.id) }

// Validate checks the invariants the scheduler relies on: at least one
// domain; domain ids non-empty and unique; every domain has a kind and nodes;
// node names non-empty and unique across the cluster, so that a node belongs
// to exactly one domain and nothing can span two; every node has GPUs with
// unique indexes; GPU UUIDs, where set, unique across the cluster; every GPU
// has a name and positive, finite peaks, except that an unhealthy GPU's
// figures may be zero (it contributes no capacity, and discovery lists a
// GPU it could not estimate that way). It reports every problem found,
// each under the path of its domain (domains[i] "id").
func (c Cluster) Validate() error {
	if len(c.Domains) == 0 {
		return errors.New("domains: none")
	}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format, args...))
	}
	domainAt := make(map[string]int, len(c.Domains))
	nodes, gpus := 0, 0
	for _, d := range c.Domains {
		nodes += len(d.Nodes)
		for _, nd := range d.Nodes {
			gpus += len(nd.GPUs)
		}
	}
	nodeIn := make(map[string]string, nodes) // node name → domain id
	type gpuRef struct {
		node  string
		index int
	}
	gpuAt := make(map[string]gpuRef, gpus) // UUID → where it is
	for i, d := range c.Domains {
		where := domainRef{i, d.ID}
		switch j, dup := domainAt[d.ID]; {
		case d.ID == "":
			bad("domains[%d]: empty id", i)
		case dup:
			bad("%s: duplicate domain id (also domains[%d])", where, j)
		default:
			domainAt[d.ID] = i
		}
		if d.Kind == "" {
			bad("%s: empty kind", where)
		}
		if len(d.Nodes) == 0 {
			bad("%s: no nodes", where)
		}
		for j, e := range d.Engines {
			if err := e.Validate(); err != nil {
				bad("%s: engines[%d].%v", where, j, err)
			}
		}
		for _, nd := range d.Nodes {
			if nd.Name == "" {
				bad("%s: node with empty name", where)
				continue
			}
			if other, dup := nodeIn[nd.Name]; dup {
				if other == d.ID {
					bad("%s: node %q listed twice", where, nd.Name)
				} else {
					bad("%s: node %q is also in domain %q: a node belongs to exactly one domain", where, nd.Name, other)
				}
				continue
			}
			nodeIn[nd.Name] = d.ID
			if len(nd.GPUs) == 0 {
				bad("%s: node %q: no GPUs", where, nd.Name)
			}
			// The messages' prefixes are formatted only for an error: a
			// fleet's topology has a hundred thousand GPUs.
			seen := make(map[int]bool, len(nd.GPUs))
			for _, g := range nd.GPUs {
				gpuBad := func(format string, args ...any) {
					bad("%s: node %q: gpu %d: "+format, append([]any{where, nd.Name, g.Index}, args...)...)
				}
				if seen[g.Index] {
					gpuBad("duplicate index")
				}
				seen[g.Index] = true
				if g.Name == "" {
					gpuBad("empty name")
				}
				if err := g.Peaks.check(g.Healthy); err != nil {
					gpuBad("%w", err)
				}
				if g.UUID == "" {
					continue
				}
				if other, dup := gpuAt[g.UUID]; dup {
					gpuBad("UUID %s is also node %q gpu %d", g.UUID, other.node, other.index)
				} else {
					gpuAt[g.UUID] = gpuRef{nd.Name, g.Index}
				}
			}
		}
	}
	return errors.Join(errs...)
}
