package topology

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// printed is a small cluster with one unhealthy GPU and one estimated one.
func printed(t *testing.T) Cluster {
	t.Helper()
	est := Peaks{SMs: 142, FLOPS: 3.664e14, HBMBandwidth: 8.64e11, HBMBytes: 48e9, Source: SourceNVMLEstimate,
		Figures: PeakSources{SMs: SourceNVML, HBMBytes: SourceNVML}}
	nodes := []NodeDiscovery{
		{Node: "tray1", Domain: "c.1", GPUs: gpusOf("tray1", "NVIDIA GB200", 2, 18)},
		{Node: "lab\t1", GPUs: []GPU{{Index: 0, UUID: "GPU-l", Name: "NVIDIA L40S", PCIBusID: "00000000:01:00.0", Peaks: est, Healthy: true,
			MemoryBytes: 48e9, MaxSMClockMHz: 2520, MaxMemClockMHz: 9001, MemoryBusWidthBits: 384}}},
	}
	nodes[0].GPUs[1].Healthy, nodes[0].GPUs[1].Problem = false, "fabric health: unhealthy"
	c, err := Merge(nodes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	if err := Write(&b, printed(t), "nvml (node tray1)", FormatTable); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for _, want := range []string{
		"source: nvml (node tray1)",
		"2 domains, 3 GPUs",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// Domain lines: healthy counts and totals over healthy GPUs only.
	fields := func(prefix string) []string {
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return strings.Fields(l)
			}
		}
		t.Fatalf("no line starting %q:\n%s", prefix, out)
		return nil
	}
	if f := fields("c.1 "); strings.Join(f[:10], " ") != "c.1 nvlink-clique GB200 1 2 1 148 2.5P 8T 186G" || f[10] != "table" {
		t.Errorf("domain line %q", f)
	}
	// The tab in the node name cannot shift the columns.
	if f := fields("lab 1 "); f[2] != "pcie" || strings.Join(f[len(f)-4:], " ") != "sms=nvml flops=nvml-estimate bw=nvml-estimate hbm=nvml" {
		t.Errorf("pcie domain line %q", f)
	}
	// NVML's readings on the GPU line; "-" where there are none.
	if f := fields("lab 1 "); len(f) < 4 {
		t.Fatal(f)
	}
	var lab, tray string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "lab 1 ") && strings.Contains(l, "GPU-l"):
			lab = l
		case strings.HasPrefix(l, "c.1 ") && strings.Contains(l, "tray1") && tray == "":
			tray = l
		}
	}
	if !strings.Contains(lab, " 48G  ") || !strings.Contains(lab, " 2520/9001 ") || !strings.Contains(lab, " 384 ") {
		t.Errorf("GPU line lacks its readings: %q", lab)
	}
	if !strings.Contains(tray, " -/- ") {
		t.Errorf("GPU line without readings: %q, want -/- clocks", tray)
	}
	var unhealthy string
	for _, l := range lines {
		if strings.Contains(l, "unhealthy") {
			unhealthy = l
		}
	}
	if !strings.Contains(unhealthy, "tray1") || !strings.Contains(unhealthy, "unhealthy: fabric health: unhealthy") {
		t.Errorf("no GPU line shows the problem:\n%s", out)
	}
	if err := Write(&b, printed(t), "x", "yaml"); err == nil || !strings.Contains(err.Error(), `"yaml": want table or json`) {
		t.Errorf("unknown format: %v", err)
	}
}

func TestWriteJSON(t *testing.T) {
	var b bytes.Buffer
	if err := Write(&b, printed(t), "simulated", FormatJSON); err != nil {
		t.Fatal(err)
	}
	var r Report
	dec := json.NewDecoder(&b)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatal(err)
	}
	if r.Source != "simulated" || len(r.Domains) != 2 {
		t.Fatalf("report = %+v", r)
	}
	d := r.Domains[0]
	gb, _ := LookupGPU("GB200")
	if d.ID != "c.1" || d.GPUs != 2 || d.HealthyGPUs != 1 || d.Peaks.FLOPS != gb.FLOPS || d.GPUModel != "GB200" {
		t.Errorf("domain = %+v", d)
	}
	g := d.Nodes[0].GPUs[1]
	if g.Healthy || g.Problem != "fabric health: unhealthy" || g.ActiveNVLinks != 18 || g.UUID == "" {
		t.Errorf("gpu = %+v", g)
	}
	l := r.Domains[1].Nodes[0].GPUs[0]
	if l.Peaks.Sources != (SourcesReport{SMs: "nvml", FLOPS: "nvml-estimate", HBMBandwidth: "nvml-estimate", HBMBytes: "nvml"}) || l.PCIBusID != "00000000:01:00.0" ||
		l.MemoryBytes != 48e9 || l.MaxSMClockMHz != 2520 || l.MaxMemClockMHz != 9001 || l.MemoryBusWidthBits != 384 {
		t.Errorf("estimated gpu = %+v", l)
	}
}

func TestSI(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 999: "999", 2.25e15: "2.25P", 141e9: "141G", 4.8e12: "4.8T", 1.5e30: "1.5e+06Y"} {
		if got := si(v); got != want {
			t.Errorf("si(%g) = %q, want %q", v, got, want)
		}
	}
}
