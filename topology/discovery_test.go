package topology

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// gpusOf makes n healthy GPUs of a known model for node, with links up.
func gpusOf(node, model string, n, links int) []GPU {
	p, _ := LookupGPU(model)
	out := make([]GPU, n)
	for i := range out {
		out[i] = GPU{Index: i, UUID: fakeUUID(node, i), Name: model, Peaks: p, ActiveNVLinks: links, Healthy: true}
	}
	return out
}

func TestMergeGroupsNodesByCliqueAndSorts(t *testing.T) {
	in := []NodeDiscovery{
		{Node: "t2", Domain: "c.1", GPUs: gpusOf("t2", "GB200", 4, 18)},
		{Node: "pcie-1", GPUs: gpusOf("pcie-1", "H100", 2, 0)},
		{Node: "t1", Domain: "c.1", GPUs: gpusOf("t1", "GB200", 4, 18)},
		{Node: "cpu-only"}, // no GPUs: left out
		{Node: "hgx-1", GPUs: gpusOf("hgx-1", "H200", 8, 18)},
		{Node: "u1", Domain: "b.7", GPUs: gpusOf("u1", "GB200", 4, 18)},
	}
	// GPUs arrive out of order on one node.
	in[0].GPUs[0], in[0].GPUs[3] = in[0].GPUs[3], in[0].GPUs[0]
	before := fmt.Sprint(in)
	c, err := Merge(in)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(in) != before {
		t.Error("Merge modified its input")
	}
	var got []string
	for _, d := range c.Domains {
		var nodes []string
		for _, nd := range d.Nodes {
			idx := ""
			for _, g := range nd.GPUs {
				idx += fmt.Sprint(g.Index)
			}
			nodes = append(nodes, nd.Name+":"+idx)
		}
		got = append(got, fmt.Sprintf("%s/%s[%s]", d.ID, d.Kind, strings.Join(nodes, " ")))
	}
	want := []string{
		"b.7/nvlink-clique[u1:0123]",
		"c.1/nvlink-clique[t1:0123 t2:0123]",
		"hgx-1/hgx[hgx-1:01234567]",
		"pcie-1/pcie[pcie-1:01]",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("merged:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestMergeMarksLinkDeficitsPerModel(t *testing.T) {
	a := gpusOf("a", "GB200", 4, 18)
	b := gpusOf("b", "GB200", 4, 18)
	b[1].ActiveNVLinks = 16
	b[2].ActiveNVLinks = 0
	b[2].Healthy, b[2].Problem = false, "fabric health: unhealthy" // keeps its first problem
	// A different model with fewer ports is not judged against the GB200s.
	h := gpusOf("h", "H100", 2, 4)
	c, err := Merge([]NodeDiscovery{{Node: "a", Domain: "x.1", GPUs: a}, {Node: "b", Domain: "x.1", GPUs: b}, {Node: "h", Domain: "x.1", GPUs: h}})
	if err != nil {
		t.Fatal(err)
	}
	d := c.Domains[0]
	if g := d.Nodes[1].GPUs[1]; g.Healthy || g.Problem != "16 active NVLinks, its domain peers have 18" {
		t.Errorf("b/1: healthy %v problem %q", g.Healthy, g.Problem)
	}
	if g := d.Nodes[1].GPUs[2]; g.Problem != "fabric health: unhealthy" {
		t.Errorf("b/2 problem %q, want its first", g.Problem)
	}
	if d.HealthyGPUCount() != 8 || !d.Nodes[2].GPUs[0].Healthy {
		t.Errorf("healthy %d, want 10 - 2; the H100s healthy", d.HealthyGPUCount())
	}
	gb, _ := LookupGPU("GB200")
	h100, _ := LookupGPU("H100")
	if got := d.TotalPeaks().HBMBytes; got != 6*gb.HBMBytes+2*h100.HBMBytes {
		t.Errorf("domain HBM %d, want the healthy GPUs' only", got)
	}
	// In input order nothing had been judged: Merge works on copies.
	if !b[1].Healthy {
		t.Error("Merge marked its input")
	}
}

func TestMergeRefusesConflicts(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []NodeDiscovery
		err  string
	}{
		{"nothing", nil, "domains: none"},
		{"only CPU hosts", []NodeDiscovery{{Node: "cpu"}}, "domains: none"},
		{"same node twice", []NodeDiscovery{
			{Node: "t1", Domain: "x.1", GPUs: gpusOf("t1", "B200", 4, 18)},
			{Node: "t1", Domain: "x.2", GPUs: gpusOf("t1-other", "B200", 4, 18)},
		}, `node "t1" is also in domain "x.1"`},
		{"same UUID twice", []NodeDiscovery{
			{Node: "t1", Domain: "x.1", GPUs: gpusOf("t1", "B200", 4, 18)},
			{Node: "t2", Domain: "x.1", GPUs: gpusOf("t1", "B200", 4, 18)},
		}, "is also node"},
		{"clique named as a node", []NodeDiscovery{
			{Node: "t1", Domain: "h", GPUs: gpusOf("t1", "B200", 4, 18)},
			{Node: "h", GPUs: gpusOf("h", "H200", 8, 18)},
		}, `domain id "h" is both a clique and a node without fabric`},
		{"no node name", []NodeDiscovery{{GPUs: gpusOf("", "H200", 1, 0)}}, "empty id"},
		{"bad peaks", []NodeDiscovery{{Node: "n", GPUs: []GPU{{Name: "X", Healthy: true}}}}, "sms must be positive"},
	} {
		_, err := Merge(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.err)
		}
	}
}

func TestFigureSourcesAndTotals(t *testing.T) {
	est := Peaks{SMs: 10, FLOPS: 1e12, HBMBandwidth: 1e11, HBMBytes: 1e9, Source: SourceNVMLEstimate,
		Figures: PeakSources{SMs: SourceNVML, HBMBytes: SourceNVML}}
	if f := est.FigureSources(); f != (PeakSources{SMs: "nvml", FLOPS: "nvml-estimate", HBMBandwidth: "nvml-estimate", HBMBytes: "nvml"}) {
		t.Errorf("FigureSources = %+v", f)
	}
	table, _ := LookupGPU("H200")
	if f := table.FigureSources(); f != (PeakSources{"table", "table", "table", "table"}) {
		t.Errorf("table FigureSources = %+v", f)
	}
	gpu := func(p Peaks) GPU { return GPU{Name: "x", Peaks: p, Healthy: true} }
	same := Domain{Nodes: []Node{{Name: "n", GPUs: []GPU{gpu(est), gpu(est)}}}}
	if tp := same.TotalPeaks(); tp.Figures != est.Figures || tp.SMs != 20 {
		t.Errorf("same sources: total %+v", tp)
	}
	mixed := Domain{Nodes: []Node{{Name: "n", GPUs: []GPU{gpu(est), gpu(table)}}}}
	if tp := mixed.TotalPeaks(); tp.Source != "mixed" || tp.FigureSources() != (PeakSources{"mixed", "mixed", "mixed", "mixed"}) {
		t.Errorf("mixed sources: total %+v", tp)
	}
}

// NodeDiscovery is Merge's inverse for one node: merging what it returns
// for every node gives the cluster's domains, nodes and GPUs back (the kind
// is Merge's own: a clique is KindNVLinkClique, not the file's "nvl72").
func TestNodeDiscoveryOfACluster(t *testing.T) {
	c := Simulated()
	var nds []NodeDiscovery
	for _, d := range c.Domains {
		for _, n := range d.Nodes {
			nd, err := c.NodeDiscovery(n.Name)
			if err != nil {
				t.Fatal(err)
			}
			nds = append(nds, nd)
		}
	}
	if nds[0].Domain != "nvl72-a" || nds[len(nds)-1].Domain != "" {
		t.Errorf("domains %q and %q, want the clique and the HGX node's own (empty)", nds[0].Domain, nds[len(nds)-1].Domain)
	}
	back, err := Merge(nds)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Domains) != len(c.Domains) {
		t.Fatalf("%d domains, want %d", len(back.Domains), len(c.Domains))
	}
	for _, d := range back.Domains {
		if orig, ok := c.Domain(d.ID); !ok || d.GPUCount() != orig.GPUCount() || len(d.Nodes) != len(orig.Nodes) {
			t.Errorf("domain %s (%s, %d GPUs) is not the simulated one", d.ID, d.Kind, d.GPUCount())
		}
	}
	if _, err := c.NodeDiscovery("nope"); err == nil || !strings.Contains(err.Error(), `node "nope" is not in the topology (nodes: nvl72-a-tray01,`) {
		t.Errorf("unknown node: %v", err)
	}
}
