package topology

import (
	"math"
	"strings"
	"testing"
)

func TestSimulatedLayout(t *testing.T) {
	c := Simulated()
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if got := len(c.Domains); got != 6 {
		t.Fatalf("domains = %d, want 6", got)
	}
	if got := c.GPUCount(); got != 176 {
		t.Errorf("GPUCount = %d, want 176", got)
	}
	want := []struct {
		id, kind, model string
		nodes, gpus     int
		firstNode       string
	}{
		{"nvl72-a", KindNVL72, "GB200", 18, 72, "nvl72-a-tray01"},
		{"nvl72-b", KindNVL72, "GB200", 18, 72, "nvl72-b-tray01"},
		{"hgx-h200-1", KindHGX, "H200", 1, 8, "hgx-h200-1"},
		{"hgx-h200-2", KindHGX, "H200", 1, 8, "hgx-h200-2"},
		{"hgx-h200-3", KindHGX, "H200", 1, 8, "hgx-h200-3"},
		{"hgx-h200-4", KindHGX, "H200", 1, 8, "hgx-h200-4"},
	}
	names := map[string]bool{}
	uuids := map[string]bool{}
	for i, w := range want {
		d := c.Domains[i]
		if d.ID != w.id || d.Kind != w.kind || d.GPUModel() != w.model || len(d.Nodes) != w.nodes || d.GPUCount() != w.gpus {
			t.Errorf("domain %d = {%s %s %s nodes %d gpus %d}, want %+v", i, d.ID, d.Kind, d.GPUModel(), len(d.Nodes), d.GPUCount(), w)
		}
		if d.Nodes[0].Name != w.firstNode {
			t.Errorf("domain %s first node = %q, want %q", d.ID, d.Nodes[0].Name, w.firstNode)
		}
		for _, nd := range d.Nodes {
			if names[nd.Name] {
				t.Errorf("node name %q repeated", nd.Name)
			}
			names[nd.Name] = true
			for _, g := range nd.GPUs {
				if !g.Healthy || g.Peaks.Source != SourceTable || !strings.HasPrefix(g.UUID, "GPU-") || uuids[g.UUID] {
					t.Errorf("%s gpu %d = %+v", nd.Name, g.Index, g)
				}
				uuids[g.UUID] = true
			}
		}
	}
	if c.Domains[0].Nodes[17].Name != "nvl72-a-tray18" {
		t.Errorf("last tray = %q", c.Domains[0].Nodes[17].Name)
	}
	if got := len(names); got != 36+4 {
		t.Errorf("%d distinct nodes, want 40", got)
	}
}

func TestSimulatedIsDeterministicAndFresh(t *testing.T) {
	a, b := Simulated(), Simulated()
	if a.Domains[0].Nodes[0].GPUs[0].UUID != b.Domains[0].Nodes[0].GPUs[0].UUID {
		t.Fatal("UUIDs differ between calls")
	}
	a.Domains[0].Nodes[0].GPUs[0].Healthy = false
	a.Domains[0].ID = "changed"
	if c := Simulated(); !c.Domains[0].Nodes[0].GPUs[0].Healthy || c.Domains[0].ID != "nvl72-a" {
		t.Fatal("changing one Simulated() result changed the next")
	}
}

func TestLookupGPU(t *testing.T) {
	h100 := Peaks{SMs: 132, FLOPS: 989e12, HBMBandwidth: 3.35e12, HBMBytes: 80e9, Source: SourceTable}
	h200 := Peaks{SMs: 132, FLOPS: 989e12, HBMBandwidth: 4.8e12, HBMBytes: 141e9, Source: SourceTable}
	b200 := Peaks{SMs: 148, FLOPS: 2.25e15, HBMBandwidth: 8.0e12, HBMBytes: 180e9, Source: SourceTable}
	gb200 := Peaks{SMs: 148, FLOPS: 2.5e15, HBMBandwidth: 8.0e12, HBMBytes: 186e9, Source: SourceTable}
	for _, tc := range []struct {
		name  string
		want  Peaks
		model string
	}{
		{"NVIDIA H100 80GB HBM3", h100, "H100"},
		{"H100 SXM", h100, "H100"},
		{"nvidia h100 sxm5 80gb", h100, "H100"},
		{"NVIDIA H200", h200, "H200"},
		{"NVIDIA B200", b200, "B200"},
		{"NVIDIA GB200", gb200, "GB200"},
		{"GB200", gb200, "GB200"},
		{"gb200", gb200, "GB200"},
		{"NVIDIA-GB200", gb200, "GB200"},
	} {
		got, ok := LookupGPU(tc.name)
		if !ok || got != tc.want {
			t.Errorf("LookupGPU(%q) = %+v, %v; want %+v", tc.name, got, ok, tc.want)
		}
		if m := ModelName(tc.name); m != tc.model {
			t.Errorf("ModelName(%q) = %q, want %q", tc.name, m, tc.model)
		}
	}
	for _, name := range []string{"", "NVIDIA", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GH200 480GB", "NVIDIA B200A", "NVIDIA L40S", "X100"} {
		if p, ok := LookupGPU(name); ok {
			t.Errorf("LookupGPU(%q) = %+v, want no match", name, p)
		}
	}
	if m := ModelName(" NVIDIA L40S "); m != "NVIDIA L40S" {
		t.Errorf("ModelName of unknown = %q", m)
	}
	if got := strings.Join(KnownGPUs(), ","); got != "B200,GB200,H100,H200" {
		t.Errorf("KnownGPUs = %s", got)
	}
}

func TestTotalPeaksCountsHealthyOnly(t *testing.T) {
	c := Simulated()
	d, ok := c.Domain("hgx-h200-2")
	if !ok {
		t.Fatal("no hgx-h200-2")
	}
	want := Peaks{SMs: 8 * 132, FLOPS: 8 * 989e12, HBMBandwidth: 8 * 4.8e12, HBMBytes: 8 * 141e9, Source: SourceTable}
	if got := d.TotalPeaks(); got != want {
		t.Errorf("TotalPeaks = %+v, want %+v", got, want)
	}
	d.Nodes[0].GPUs[3].Healthy = false // through the pointer into c
	want = Peaks{SMs: 7 * 132, FLOPS: 7 * 989e12, HBMBandwidth: 7 * 4.8e12, HBMBytes: 7 * 141e9, Source: SourceTable}
	if got := c.Domains[3].TotalPeaks(); got != want {
		t.Errorf("TotalPeaks with one unhealthy = %+v, want %+v", got, want)
	}
	if d.GPUCount() != 8 || d.HealthyGPUCount() != 7 || d.HealthyNodeCount() != 1 {
		t.Errorf("counts = %d, %d healthy, %d nodes", d.GPUCount(), d.HealthyGPUCount(), d.HealthyNodeCount())
	}
	for i := range d.Nodes[0].GPUs {
		d.Nodes[0].GPUs[i].Healthy = false
	}
	if got := d.TotalPeaks(); got != (Peaks{}) || d.HealthyNodeCount() != 0 {
		t.Errorf("all unhealthy: TotalPeaks = %+v, healthy nodes %d", got, d.HealthyNodeCount())
	}
	nvl := c.Domains[0]
	if got := nvl.TotalPeaks(); got.FLOPS != 72*2.5e15 || got.HBMBytes != 72*186e9 || got.SMs != 72*148 {
		t.Errorf("NVL72 TotalPeaks = %+v", got)
	}
	if _, ok := c.Domain("nope"); ok {
		t.Error("Domain(nope) found")
	}
}

func TestGPUModelMixed(t *testing.T) {
	c := Simulated()
	d := c.Domains[2]
	d.Nodes[0].GPUs[0].Name = "H200" // same model, other spelling
	if got := d.GPUModel(); got != "H200" {
		t.Errorf("GPUModel = %q, want H200", got)
	}
	d.Nodes[0].GPUs[1].Name = "NVIDIA B200"
	if got := d.GPUModel(); got != MixedModel {
		t.Errorf("GPUModel = %q, want %q", got, MixedModel)
	}
	if got := (Domain{}).GPUModel(); got != "" {
		t.Errorf("empty GPUModel = %q", got)
	}
	// An unhealthy GPU discovery could not identify does not mix the
	// model; a domain with no healthy GPU goes by all of them.
	d = Simulated().Domains[2]
	d.Nodes[0].GPUs[3] = GPU{Index: 3, Name: "gpu-index-3", Problem: "GetName: ERROR_GPU_IS_LOST"}
	if got := d.GPUModel(); got != "H200" {
		t.Errorf("GPUModel with a stand-in = %q, want H200", got)
	}
	for i := range d.Nodes[0].GPUs {
		d.Nodes[0].GPUs[i].Healthy = false
	}
	if got := d.GPUModel(); got != MixedModel {
		t.Errorf("GPUModel with none healthy = %q, want %q", got, MixedModel)
	}
}

// An unhealthy GPU may have zero peaks (discovery could not estimate
// them); a healthy one may not, and no GPU may have negative or NaN ones.
func TestValidateUnhealthyZeroPeaks(t *testing.T) {
	c := Simulated()
	g := &c.Domains[5].Nodes[0].GPUs[2]
	g.Healthy, g.Problem = false, "cannot estimate peaks"
	g.Peaks = Peaks{SMs: 100, Source: SourceNVMLEstimate}
	if err := c.Validate(); err != nil {
		t.Errorf("unhealthy GPU with zero peaks: %v", err)
	}
	for _, bad := range []Peaks{{SMs: -1}, {FLOPS: math.NaN()}, {HBMBandwidth: math.Inf(1)}, {HBMBytes: -5}} {
		g.Peaks = bad
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "positive or zero (unhealthy GPU)") {
			t.Errorf("unhealthy GPU with peaks %+v: err = %v", bad, err)
		}
	}
	g.Peaks, g.Healthy = Peaks{SMs: 100, Source: SourceNVMLEstimate}, true
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "gpu 2: peaks: flops must be positive and finite") {
		t.Errorf("healthy GPU with zero flops: err = %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(c *Cluster)
		want   []string
	}{
		{"node in two domains", func(c *Cluster) {
			c.Domains[3].Nodes = append(c.Domains[3].Nodes, c.Domains[2].Nodes[0])
		}, []string{`domains[3] "hgx-h200-2": node "hgx-h200-1" is also in domain "hgx-h200-1"`}},
		{"duplicate domain id", func(c *Cluster) { c.Domains[4].ID = "nvl72-a" }, []string{`domains[4] "nvl72-a": duplicate domain id (also domains[0])`}},
		{"empty domain id", func(c *Cluster) { c.Domains[1].ID = "" }, []string{"domains[1]: empty id"}},
		{"node twice in one domain", func(c *Cluster) { c.Domains[0].Nodes[1].Name = "nvl72-a-tray01" }, []string{`node "nvl72-a-tray01" listed twice`}},
		{"zero flops", func(c *Cluster) { c.Domains[5].Nodes[0].GPUs[2].Peaks.FLOPS = 0 }, []string{`domains[5] "hgx-h200-4": node "hgx-h200-4": gpu 2: peaks: flops must be positive`}},
		{"zero hbm", func(c *Cluster) { c.Domains[5].Nodes[0].GPUs[1].Peaks.HBMBytes = 0 }, []string{"gpu 1: peaks: hbm_bytes must be positive"}},
		{"duplicate uuid", func(c *Cluster) {
			c.Domains[1].Nodes[0].GPUs[0].UUID = c.Domains[0].Nodes[0].GPUs[0].UUID
		}, []string{`is also node "nvl72-a-tray01" gpu 0`}},
		{"no GPUs, no kind, two problems at once", func(c *Cluster) {
			c.Domains[2].Nodes[0].GPUs = nil
			c.Domains[3].Kind = ""
		}, []string{`node "hgx-h200-1": no GPUs`, `domains[3] "hgx-h200-2": empty kind`}},
		{"empty", func(c *Cluster) { c.Domains = nil }, []string{"domains: none"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Simulated()
			tc.break_(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("Validate passed")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}
