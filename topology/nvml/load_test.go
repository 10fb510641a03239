package nvml

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/topology"
)

// These run with and without cgo: discovery is faked by a function.

func fakeNode(node string) (topology.NodeDiscovery, error) {
	p, _ := topology.LookupGPU("H200")
	nd := topology.NodeDiscovery{Node: node}
	for i := range 8 {
		nd.GPUs = append(nd.GPUs, topology.GPU{Index: i, Name: "NVIDIA H200", Peaks: p, ActiveNVLinks: 18, Healthy: true})
	}
	return nd, nil
}

func failWith(err error) discoverFunc {
	return func(string) (topology.NodeDiscovery, error) { return topology.NodeDiscovery{}, err }
}

func TestLoadSpecs(t *testing.T) {
	const file = "../testdata/cluster.yaml"
	noLib := &unavailableError{reason: "no library", expected: true}
	noDriver := &unavailableError{reason: "driver not loaded"}
	broken := errors.New("gpu 3: GetUUID: ERROR_GPU_IS_LOST")
	for _, tc := range []struct {
		spec     string
		discover discoverFunc
		source   string // prefix of Loaded.Source; "" wants an error
		err      string // substring of the error
		log      string // substring of the one log line; "" wants none
	}{
		{"auto", fakeNode, "nvml (node n1)", "", ""},
		{"", fakeNode, "nvml (node n1)", "", ""},
		{"auto", failWith(noLib), "simulated (NVML unavailable: no library)", "", "level=INFO"},
		{"auto", failWith(noDriver), "simulated (NVML unavailable: driver not loaded)", "", "level=WARN"},
		{"auto:" + file, failWith(noLib), file + " (NVML unavailable: no library)", "", "fallback=" + file},
		{"auto:" + file, fakeNode, "nvml (node n1)", "", ""},
		{"auto:", fakeNode, "", `topology "auto:": want a file path`, ""},
		{"auto:/nonexistent.yaml", failWith(noLib), "", "fallback: open /nonexistent.yaml", ""},
		{"auto", failWith(broken), "", "topology auto: gpu 3: GetUUID", ""},
		{"nvml", fakeNode, "nvml (node n1)", "", ""},
		{"nvml", failWith(noLib), "", "topology nvml: NVML unavailable: no library", ""},
		{"simulated", failWith(errors.New("must not be called")), "simulated", "", ""},
		{file, failWith(errors.New("must not be called")), file, "", ""},
		{"/nonexistent.yaml", fakeNode, "", "open /nonexistent.yaml", ""},
	} {
		var logs bytes.Buffer
		l, err := load(tc.spec, tc.discover, "n1", fallbackLog(slog.New(slog.NewTextHandler(&logs, nil)), tc.spec))
		switch {
		case tc.source == "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: err = %v, want one containing %q", tc.spec, err, tc.err)
		case tc.source != "" && err != nil:
			t.Errorf("%q: %v", tc.spec, err)
		case tc.source != "" && (!strings.HasPrefix(l.Source, tc.source) || l.Cluster.Validate() != nil):
			t.Errorf("%q: source %q (valid: %v), want %q", tc.spec, l.Source, l.Cluster.Validate(), tc.source)
		}
		lines := strings.Count(logs.String(), "\n")
		if tc.log == "" && lines != 0 || tc.log != "" && (lines != 1 || !strings.Contains(logs.String(), tc.log)) {
			t.Errorf("%q: log %q, want one line with %q (or none when empty)", tc.spec, logs.String(), tc.log)
		}
	}
}

func TestLoadNVMLBuildsOneNodesCluster(t *testing.T) {
	l, err := load("nvml", fakeNode, "h1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Cluster.Domains) != 1 || l.Cluster.Domains[0].ID != "h1" || l.Cluster.Domains[0].Kind != topology.KindHGX || l.Cluster.GPUCount() != 8 {
		t.Errorf("cluster = %+v, want one HGX domain h1 of 8 GPUs", l.Cluster.Domains)
	}
}

func TestLoadWithoutLogger(t *testing.T) {
	// nil logger: the fallback still happens, silently.
	l, err := load("auto", failWith(&unavailableError{reason: "x"}), hostname(), fallbackLog(nil, "auto"))
	if err != nil || !strings.HasPrefix(l.Source, "simulated") {
		t.Errorf("got %q, %v", l.Source, err)
	}
}

func TestEstimatePeaks(t *testing.T) {
	// An L40S by its readings: 142 SMs, 2520 MHz, 384-bit GDDR6 at 9001 MHz.
	p, err := estimatePeaks(readings{memTotal: 48e9, sms: 142, smClockMHz: 2520, memClockMHz: 9001, busWidthBits: 384, ccMajor: 8, ccMinor: 9})
	if err != nil {
		t.Fatal(err)
	}
	if p.SMs != 142 || p.FLOPS != 142*2520e6*1024 || p.HBMBandwidth != 384.0/8*9001e6*2 || p.HBMBytes != 48e9 {
		t.Errorf("peaks = %+v", p)
	}
	if f := p.FigureSources(); f.SMs != "nvml" || f.HBMBytes != "nvml" || f.FLOPS != "nvml-estimate" || f.HBMBandwidth != "nvml-estimate" || p.Source != "nvml-estimate" {
		t.Errorf("sources = %q %+v", p.Source, f)
	}
	// Nothing read: every figure unavailable, every reading named.
	p, err = estimatePeaks(readings{})
	want := "cannot estimate peaks: no memory total, no SM count, no memory bus width, no max memory clock, no max SM clock, no compute capability"
	if err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
	if p.SMs != 0 || p.FLOPS != 0 || p.HBMBandwidth != 0 || p.HBMBytes != 0 || p.FigureSources() != (topology.PeakSources{SMs: "unavailable", FLOPS: "unavailable", HBMBandwidth: "unavailable", HBMBytes: "unavailable"}) {
		t.Errorf("peaks of nothing = %+v", p)
	}
	// Memory readings without an SM count: bandwidth and bytes estimated,
	// FLOP/s not.
	p, err = estimatePeaks(readings{memTotal: 16e9, busWidthBits: 256, memClockMHz: 7000, smClockMHz: 1500, ccMajor: 11})
	if err == nil || err.Error() != "cannot estimate peaks: no SM count, no BF16 rate of compute capability 11.0" {
		t.Errorf("err = %v", err)
	}
	if p.HBMBandwidth != 256.0/8*7000e6*2 || p.HBMBytes != 16e9 || p.FLOPS != 0 ||
		p.FigureSources() != (topology.PeakSources{SMs: "unavailable", FLOPS: "unavailable", HBMBandwidth: "nvml-estimate", HBMBytes: "nvml"}) {
		t.Errorf("partial peaks = %+v %+v", p, p.FigureSources())
	}
	// A V100 by its readings (80 SMs of 64 cores at 1530 MHz, 4096-bit HBM2
	// at 877 MHz): its FP16 tensor rate, 125 TFLOP/s on the datasheet.
	p, err = estimatePeaks(readings{memTotal: 32e9, sms: 5120 / coresPerSM(7, 0), smClockMHz: 1530, memClockMHz: 877, busWidthBits: 4096, ccMajor: 7})
	if err != nil || p.SMs != 80 || p.FLOPS < 124e12 || p.FLOPS > 126e12 || p.HBMBandwidth < 897e9 || p.HBMBandwidth > 899e9 {
		t.Errorf("V100 = %+v, %v; want 80 SMs, ≈125e12 FLOP/s, ≈898e9 B/s", p, err)
	}
	for _, cc := range [][3]int{{7, 0, 1024}, {7, 5, 1024}, {8, 0, 2048}, {8, 6, 1024}, {8, 9, 1024}, {9, 0, 4096},
		{10, 0, 8192}, {10, 3, 8192}, {11, 0, 0}, {12, 0, 1024}, {6, 1, 0}} {
		if got := bf16PerSMClock(cc[0], cc[1]); got != float64(cc[2]) {
			t.Errorf("bf16PerSMClock(%d.%d) = %g, want %d", cc[0], cc[1], got, cc[2])
		}
	}
	if coresPerSM(7, 5) != 64 || coresPerSM(8, 0) != 64 || coresPerSM(9, 0) != 128 || coresPerSM(6, 1) != 0 {
		t.Error("coresPerSM")
	}
}

func TestLoadedSaysWhetherNVMLDiscoveredIt(t *testing.T) {
	for _, tc := range []struct {
		spec     string
		discover discoverFunc
		want     bool
	}{
		{"nvml", fakeNode, true},
		{"auto", fakeNode, true},
		{"auto", failWith(&unavailableError{reason: "x"}), false},
		{"simulated", fakeNode, false},
		{"../testdata/cluster.yaml", fakeNode, false},
	} {
		l, err := load(tc.spec, tc.discover, "n1", nil)
		if err != nil || l.Discovered != tc.want {
			t.Errorf("%s: discovered %v, %v; want %v", tc.spec, l.Discovered, err, tc.want)
		}
	}
}

// countingDiscover is a discovery that fails with err while it is set, and
// counts its calls.
type countingDiscover struct {
	calls int
	err   error
}

func (c *countingDiscover) discover(node string) (topology.NodeDiscovery, error) {
	c.calls++
	if c.err != nil {
		return topology.NodeDiscovery{}, c.err
	}
	return fakeNode(node)
}

// An agent discovers its node again and again; while NVML has never
// answered, the auto fallback is logged once, at Load's level, and again
// only when its reason changes.
func TestNodeLoaderLogsTheFallbackOnce(t *testing.T) {
	var logs bytes.Buffer
	d := &countingDiscover{err: &unavailableError{reason: "driver not loaded"}}
	l := NewNodeLoaderWith("auto", "nvl72-a-tray03", slog.New(slog.NewTextHandler(&logs, nil)), d.discover)
	load := func(n int) {
		t.Helper()
		for range n {
			nd, err := l.Load(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if nd.Node != "nvl72-a-tray03" || nd.Domain != "nvl72-a" || len(nd.GPUs) != 4 || !nd.GPUs[0].Healthy {
				t.Fatalf("fallback node = %+v, want the simulated tray", nd)
			}
		}
	}
	load(3)
	if d.calls != 3 {
		t.Errorf("NVML tried %d times, want every time (3)", d.calls)
	}
	if got := logs.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "level=WARN") || !strings.Contains(got, "driver not loaded") {
		t.Errorf("log = %q, want one WARN line", got)
	}
	// Another reason: logged once more, at its own level.
	logs.Reset()
	d.err = &unavailableError{reason: "no library", expected: true}
	load(2)
	if got := logs.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "level=INFO") || !strings.Contains(got, "no library") {
		t.Errorf("log = %q, want one INFO line for the new fallback", got)
	}
}

// Once NVML has answered, its loss is no reason to fall back: the file or
// the simulated cluster would publish healthy GPUs the node may no longer
// have. The node is NVML's last discovery with every GPU unhealthy, under
// auto and nvml alike; the loss is logged at Warn once per reason, and NVML
// answering again ends it.
func TestNodeLoaderMarksTheNodeUnhealthyWhenNVMLGoes(t *testing.T) {
	driver := &unavailableError{reason: "nvml.Init: ERROR_DRIVER_NOT_LOADED"}
	noGPU := &unavailableError{reason: "no GPU on this node"}
	noLib := &unavailableError{reason: "nvml.Init: ERROR_LIBRARY_NOT_FOUND", expected: true}
	steps := []struct {
		err     error  // what NVML says; nil: it answers
		problem string // every GPU's; "" wants NVML's healthy node
		log     string // the one log line's level and reason; "" wants none
	}{
		{nil, "", ""},
		{driver, driver.Error(), "level=WARN msg=\"NVML stopped working; the node's GPUs are reported unhealthy, not taken from the fallback topology\""},
		{driver, driver.Error(), ""},
		{noGPU, noGPU.Error(), "level=WARN"},
		{nil, "", ""},
		{noGPU, noGPU.Error(), "level=WARN"}, // news again: NVML answered in between
		{noLib, noLib.Error(), "level=WARN"}, // expected on a CPU host, not on one whose NVML answered
		{noLib, noLib.Error(), ""},
	}
	for _, spec := range []string{"auto", "auto:../testdata/cluster.yaml", "nvml"} {
		var logs bytes.Buffer
		d := &countingDiscover{}
		l := NewNodeLoaderWith(spec, "nvl72-a-tray03", slog.New(slog.NewTextHandler(&logs, nil)), d.discover)
		want, _ := fakeNode("nvl72-a-tray03")
		for i, step := range steps {
			logs.Reset()
			d.err = step.err
			nd, err := l.Load(context.Background())
			if err != nil {
				t.Fatalf("%s step %d: %v", spec, i, err)
			}
			if nd.Node != want.Node || nd.Domain != want.Domain || len(nd.GPUs) != len(want.GPUs) {
				t.Fatalf("%s step %d: node %s domain %q with %d GPUs, want NVML's %s with %d", spec, i, nd.Node, nd.Domain, len(nd.GPUs), want.Node, len(want.GPUs))
			}
			for j, g := range nd.GPUs {
				w := want.GPUs[j]
				w.Healthy, w.Problem = step.problem == "", step.problem
				if g != w {
					t.Errorf("%s step %d: gpu %d = %+v\nwant %+v", spec, i, j, g, w)
				}
			}
			got := logs.String()
			if step.log == "" && got != "" || step.log != "" && (strings.Count(got, "\n") != 1 || !strings.Contains(got, step.log) ||
				!strings.Contains(got, "reason=\""+step.problem+"\"")) {
				t.Errorf("%s step %d: log %q, want one line with %q and the reason (none when empty)", spec, i, got, step.log)
			}
			// What Load returned is the caller's: marking it does not
			// change the next loss's node.
			for j := range nd.GPUs {
				nd.GPUs[j].Name = "scribbled"
			}
		}
	}
	// A failing call on a node whose NVML answered before also makes its
	// GPUs unhealthy; on a node where NVML never answered it is an error.
	d := &countingDiscover{}
	l := NewNodeLoaderWith("auto", "n1", nil, d.discover)
	if _, err := l.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.err = errors.New("nvml: DeviceGetCount: ERROR_UNKNOWN")
	nd, err := l.Load(context.Background())
	if err != nil || len(nd.GPUs) == 0 || nd.GPUs[0].Healthy || nd.GPUs[0].Problem != d.err.Error() {
		t.Errorf("after a failing call: %v %+v, want the GPUs unhealthy with the failure as their problem", err, nd.GPUs)
	}
	fresh := NewNodeLoaderWith("auto", "n1", nil, d.discover)
	if _, err := fresh.Load(context.Background()); err == nil || err.Error() != "topology auto: nvml: DeviceGetCount: ERROR_UNKNOWN" {
		t.Errorf("err = %v, want the DeviceGetCount failure", err)
	}
}

func TestNodeLoaderSpecs(t *testing.T) {
	const file = "../testdata/cluster.yaml"
	c, err := topology.LoadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	inFile := c.Domains[0].Nodes[0].Name
	for _, tc := range []struct {
		spec, node string
		discover   discoverFunc
		gpus       int    // 0 wants an error
		err        string // substring of the error
	}{
		{"nvml", "n1", fakeNode, 8, ""},
		{"nvml", "n1", failWith(&unavailableError{reason: "x"}), 0, "topology nvml: NVML unavailable: x"},
		{"auto", "n1", failWith(errors.New("gpu 3: broken")), 0, "topology auto: gpu 3: broken"},
		{"auto:" + file, inFile, failWith(&unavailableError{reason: "x"}), len(c.Domains[0].Nodes[0].GPUs), ""},
		{"auto:", "n1", fakeNode, 0, `want a file path after "auto:"`},
		{"simulated", "hgx-h200-1", failWith(errors.New("must not be called")), 8, ""},
		{"simulated", "nope", failWith(errors.New("must not be called")), 0, `topology simulated: node "nope" is not in the topology`},
		{file, inFile, failWith(errors.New("must not be called")), len(c.Domains[0].Nodes[0].GPUs), ""},
	} {
		l := NewNodeLoaderWith(tc.spec, tc.node, nil, tc.discover)
		nd, err := l.Load(context.Background())
		switch {
		case tc.gpus == 0 && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q %s: err = %v, want one containing %q", tc.spec, tc.node, err, tc.err)
		case tc.gpus != 0 && (err != nil || nd.Node != tc.node || len(nd.GPUs) != tc.gpus):
			t.Errorf("%q %s: %+v, %v; want %d GPUs", tc.spec, tc.node, nd, err, tc.gpus)
		}
	}
}
