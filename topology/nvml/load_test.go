package nvml

import (
	"bytes"
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
		{"auto:/nonexistent.yaml", failWith(noLib), "", "fallback: topology: open /nonexistent.yaml", ""},
		{"auto", failWith(broken), "", "topology auto: gpu 3: GetUUID", ""},
		{"nvml", fakeNode, "nvml (node n1)", "", ""},
		{"nvml", failWith(noLib), "", "topology nvml: NVML unavailable: no library", ""},
		{"simulated", failWith(errors.New("must not be called")), "simulated", "", ""},
		{file, failWith(errors.New("must not be called")), file, "", ""},
		{"/nonexistent.yaml", fakeNode, "", "open /nonexistent.yaml", ""},
	} {
		var logs bytes.Buffer
		l, err := load(tc.spec, slog.New(slog.NewTextHandler(&logs, nil)), tc.discover, func() string { return "n1" })
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
	l, err := load("nvml", nil, fakeNode, func() string { return "h1" })
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Cluster.Domains) != 1 || l.Cluster.Domains[0].ID != "h1" || l.Cluster.Domains[0].Kind != topology.KindHGX || l.Cluster.GPUCount() != 8 {
		t.Errorf("cluster = %+v, want one HGX domain h1 of 8 GPUs", l.Cluster.Domains)
	}
}

func TestLoadWithoutLogger(t *testing.T) {
	// nil logger: the fallback still happens, silently.
	l, err := load("auto", nil, failWith(&unavailableError{reason: "x"}), hostname)
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
	_, err = estimatePeaks(readings{})
	want := "cannot estimate peaks: no memory total, no SM count, no memory bus width, no max memory clock, no max SM clock, no BF16 rate of compute capability 0.0"
	if err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
	for _, cc := range [][3]int{{8, 0, 2048}, {8, 6, 1024}, {8, 9, 1024}, {9, 0, 4096}, {10, 0, 8192}, {10, 3, 8192}, {12, 0, 1024}, {7, 0, 0}} {
		if got := bf16PerSMClock(cc[0], cc[1]); got != float64(cc[2]) {
			t.Errorf("bf16PerSMClock(%d.%d) = %g, want %d", cc[0], cc[1], got, cc[2])
		}
	}
	if coresPerSM(8, 0) != 64 || coresPerSM(9, 0) != 128 || coresPerSM(6, 1) != 0 {
		t.Error("coresPerSM")
	}
}
