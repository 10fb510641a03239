//go:build cgo

package nvml

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
)

// fabricSpec is what a mock GPU's fabric info and links say.
type fabricSpec struct {
	none     bool // the fabric API answers ERROR_NOT_SUPPORTED (HGX)
	cluster  [16]uint8
	clique   uint32
	state    uint8
	status   gonvml.Return
	health   uint8
	links    int          // NVLink ports; GetNvLinkState beyond them is INVALID_ARGUMENT
	disabled map[int]bool // links reported FEATURE_DISABLED
	extra    []int        // further enabled links at these indexes (≥ links)
}

// healthyClique is a GPU registered in clique id of cluster c, all links up.
func healthyClique(c [16]uint8, id uint32) fabricSpec {
	return fabricSpec{cluster: c, clique: id, state: gonvml.GPU_FABRIC_STATE_COMPLETED,
		status: gonvml.SUCCESS, health: gonvml.GPU_FABRIC_HEALTH_SUMMARY_HEALTHY, links: 18}
}

// clocks are a mock GPU's readings: max SM and memory clocks (MHz), memory
// bus width (bits) and CUDA cores, as the H200 and B200 answer them.
type clocks struct{ sm, mem, bus, cores int }

func clocksOf(cfg gpus.Config) clocks {
	if cfg.CudaMajor == 10 {
		return clocks{sm: 1965, mem: 3996, bus: 8192, cores: 148 * 128}
	}
	return clocks{sm: 1980, mem: 3201, bus: 6144, cores: 132 * 128}
}

// rig gives a mock server's device the functions the dgx mocks leave
// unset (links, fabric, clocks, bus width, cores; GetAttributes answers
// NOT_SUPPORTED, as on a GPU that is not a MIG device) and a PCI bus id in
// GetPciInfo, as a driver does.
func rig(d *server.Device, f fabricSpec) {
	c := clocksOf(d.Config)
	d.GetMaxClockInfoFunc = func(t gonvml.ClockType) (uint32, gonvml.Return) {
		switch t {
		case gonvml.CLOCK_SM:
			return uint32(c.sm), gonvml.SUCCESS
		case gonvml.CLOCK_MEM:
			return uint32(c.mem), gonvml.SUCCESS
		}
		return 0, gonvml.ERROR_INVALID_ARGUMENT
	}
	d.GetMemoryBusWidthFunc = func() (uint32, gonvml.Return) { return uint32(c.bus), gonvml.SUCCESS }
	d.GetNumGpuCoresFunc = func() (int, gonvml.Return) { return c.cores, gonvml.SUCCESS }
	d.GetAttributesFunc = func() (gonvml.DeviceAttributes, gonvml.Return) {
		return gonvml.DeviceAttributes{}, gonvml.ERROR_NOT_SUPPORTED
	}
	d.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) {
		var p gonvml.PciInfo
		for i, c := range []byte(d.PciBusID) {
			p.BusId[i] = int8(c)
		}
		return p, gonvml.SUCCESS
	}
	d.GetNvLinkStateFunc = func(link int) (gonvml.EnableState, gonvml.Return) {
		if slices.Contains(f.extra, link) {
			return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
		}
		if link < 0 || link >= f.links {
			return 0, gonvml.ERROR_INVALID_ARGUMENT
		}
		if f.disabled[link] {
			return gonvml.FEATURE_DISABLED, gonvml.SUCCESS
		}
		return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
	}
	d.GetGpuFabricInfo_v4Func = func() (gonvml.GpuFabricInfo_v4, gonvml.Return) {
		if f.none {
			return gonvml.GpuFabricInfo_v4{}, gonvml.ERROR_NOT_SUPPORTED
		}
		v4 := gonvml.GpuFabricInfo_v4{ClusterUuid: f.cluster, Status: uint32(f.status), State: f.state,
			HealthSummary: f.health, NumCliques: 2}
		// Sorted by type: the unicast pointer first, a multicast one after,
		// as a Hopper driver reports them.
		v4.Cliques[0] = gonvml.GpuFabricClique_v1{Type: gonvml.GPU_FABRIC_CLIQUE_TYPE_UNICAST_POINTER, Id: f.clique}
		v4.Cliques[1] = gonvml.GpuFabricClique_v1{Type: gonvml.GPU_FABRIC_CLIQUE_TYPE_MULTICAST_POINTER, Id: f.clique + 1000}
		return v4, gonvml.SUCCESS
	}
	d.GetGpuFabricInfoFunc = func() (gonvml.GpuFabricInfo, gonvml.Return) {
		if f.none {
			return gonvml.GpuFabricInfo{}, gonvml.ERROR_NOT_SUPPORTED
		}
		return gonvml.GpuFabricInfo{ClusterUuid: f.cluster, Status: uint32(f.status), CliqueId: f.clique, State: f.state}, gonvml.SUCCESS
	}
}

// tray is one GB200-style compute tray: a mock with 4 B200 GPUs.
func tray(specs ...fabricSpec) *server.Server {
	s := dgxb200.NewWithGPUs(gpus.Multiple(len(specs), gpus.B200_SXM5_180GB)...)
	for i, f := range specs {
		rig(s.Devices[i].(*server.Device), f)
	}
	return s
}

func four(f fabricSpec) []fabricSpec { return []fabricSpec{f, f, f, f} }

func uuidOf(b byte) [16]uint8 {
	var u [16]uint8
	for i := range u {
		u[i] = b + byte(i)
	}
	return u
}

func discover(t *testing.T, lib gonvml.Interface, node string) topology.NodeDiscovery {
	t.Helper()
	nd, err := DiscoverWith(lib, node)
	if err != nil {
		t.Fatalf("discover %s: %v", node, err)
	}
	return nd
}

// racks discovers two NVL72 racks, 18 trays × 4 B200 each, rack r in
// cluster uuidOf(r) clique 7+r; change may alter any tray's GPUs first.
func racks(t *testing.T, change func(rack, tray int, specs []fabricSpec)) []topology.NodeDiscovery {
	t.Helper()
	var nds []topology.NodeDiscovery
	for r := range 2 {
		for tr := range 18 {
			specs := four(healthyClique(uuidOf(byte(0x10*(r+1))), uint32(7+r)))
			if change != nil {
				change(r, tr, specs)
			}
			nds = append(nds, discover(t, tray(specs...), fmt.Sprintf("rack%d-tray%02d", r, tr+1)))
		}
	}
	return nds
}

func merge(t *testing.T, nds []topology.NodeDiscovery) topology.Cluster {
	t.Helper()
	c, err := topology.Merge(nds)
	if err != nil {
		t.Fatalf("merge: %v", err)
	}
	return c
}

func TestTwoNVL72RacksFormTwoDomainsOf72(t *testing.T) {
	nds := racks(t, nil)
	c := merge(t, nds)
	want := []string{
		"10111213-1415-1617-1819-1a1b1c1d1e1f.7",
		"20212223-2425-2627-2829-2a2b2c2d2e2f.8",
	}
	if len(c.Domains) != 2 {
		t.Fatalf("%d domains, want 2", len(c.Domains))
	}
	b200, _ := topology.LookupGPU("B200")
	nvmlBytes := int64(gpus.B200_SXM5_180GB.MemoryMB) << 20
	for i, d := range c.Domains {
		if d.ID != want[i] || d.Kind != topology.KindNVLinkClique {
			t.Errorf("domain %d = %q kind %q, want %q kind %q", i, d.ID, d.Kind, want[i], topology.KindNVLinkClique)
		}
		if len(d.Nodes) != 18 || d.GPUCount() != 72 || d.HealthyGPUCount() != 72 || d.GPUModel() != "B200" {
			t.Errorf("domain %s: %d nodes, %d GPUs, %d healthy, model %q; want 18, 72, 72, B200",
				d.ID, len(d.Nodes), d.GPUCount(), d.HealthyGPUCount(), d.GPUModel())
		}
		// FLOP/s and bandwidth from the table; HBM bytes and SMs as NVML
		// read them.
		wantSources := topology.PeakSources{SMs: "nvml", FLOPS: "table", HBMBandwidth: "table", HBMBytes: "nvml"}
		if p := d.TotalPeaks(); p.FLOPS != 72*b200.FLOPS || p.HBMBandwidth != 72*b200.HBMBandwidth ||
			p.HBMBytes != 72*nvmlBytes || p.SMs != 72*148 || p.Source != topology.SourceTable || p.FigureSources() != wantSources {
			t.Errorf("domain %s peaks %+v, want 72 × the B200 table's FLOP/s and bandwidth, NVML's bytes and SMs", d.ID, p)
		}
		for _, nd := range d.Nodes {
			if !strings.HasPrefix(nd.Name, fmt.Sprintf("rack%d-", i)) {
				t.Errorf("domain %s holds node %s of another rack", d.ID, nd.Name)
			}
			for _, g := range nd.GPUs {
				if g.ActiveNVLinks != 18 || !strings.HasPrefix(g.UUID, "GPU-") || g.PCIBusID == "" || g.Name != "NVIDIA B200 180GB HBM3e" {
					t.Errorf("%s gpu %d = %+v", nd.Name, g.Index, g)
				}
				// Every GPU's readings are kept, known or not.
				if g.MemoryBytes != nvmlBytes || g.MaxSMClockMHz != 1965 || g.MaxMemClockMHz != 3996 || g.MemoryBusWidthBits != 8192 {
					t.Errorf("%s gpu %d readings: %d B, %d/%d MHz, %d bits", nd.Name, g.Index, g.MemoryBytes, g.MaxSMClockMHz, g.MaxMemClockMHz, g.MemoryBusWidthBits)
				}
			}
		}
	}
	// The same discoveries in any order merge to the same cluster: the
	// control plane sees node records in no particular order.
	shuffled := append([]topology.NodeDiscovery(nil), nds...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	if again := merge(t, shuffled); !reflect.DeepEqual(again, c) {
		t.Error("merging the shuffled discoveries gave a different cluster")
	}
}

func TestHGXH200NodesWithoutFabricAreADomainEach(t *testing.T) {
	var nds []topology.NodeDiscovery
	for n := range 3 {
		s := dgxh200.New()
		for _, d := range s.Devices {
			rig(d.(*server.Device), fabricSpec{none: true, links: 18})
		}
		nds = append(nds, discover(t, s, fmt.Sprintf("hgx-%d", n+1)))
	}
	c := merge(t, nds)
	if len(c.Domains) != 3 {
		t.Fatalf("%d domains, want 3", len(c.Domains))
	}
	h200, _ := topology.LookupGPU("H200")
	for i, d := range c.Domains {
		name := fmt.Sprintf("hgx-%d", i+1)
		if d.ID != name || d.Kind != topology.KindHGX || len(d.Nodes) != 1 || d.Nodes[0].Name != name {
			t.Errorf("domain %d = %q kind %q nodes %d, want %q kind hgx, one node of its name", i, d.ID, d.Kind, len(d.Nodes), name)
		}
		if d.HealthyGPUCount() != 8 || d.GPUModel() != "H200" || d.TotalPeaks().HBMBandwidth != 8*h200.HBMBandwidth {
			t.Errorf("domain %s: %d healthy %s GPUs, bandwidth %g", d.ID, d.HealthyGPUCount(), d.GPUModel(), d.TotalPeaks().HBMBandwidth)
		}
	}
}

func TestRegisteredWithoutClusterIsTheNodesDomain(t *testing.T) {
	// A single-node NVSwitch fabric registers with a zero cluster UUID.
	s := dgxh200.New()
	for _, d := range s.Devices {
		rig(d.(*server.Device), healthyClique([16]uint8{}, 0))
	}
	nd := discover(t, s, "hgx-fm")
	if nd.Domain != "" {
		t.Errorf("domain %q, want the node's own", nd.Domain)
	}
}

func TestDisabledLinkIsCountedAndCostsTheGPU(t *testing.T) {
	nds := racks(t, func(rack, tr int, specs []fabricSpec) {
		if rack == 0 && tr == 4 {
			specs[2].disabled = map[int]bool{5: true}
		}
	})
	// The tray's own discovery counts what is up.
	if g := nds[4].GPUs[2]; g.ActiveNVLinks != 17 || !g.Healthy {
		t.Fatalf("tray discovery: gpu 2 has %d active links, healthy %v; want 17, true (peers are judged at merge)", g.ActiveNVLinks, g.Healthy)
	}
	c := merge(t, nds)
	d := c.Domains[0]
	g := d.Nodes[4].GPUs[2]
	if g.Healthy || g.Problem != "17 active NVLinks, its domain peers have 18" {
		t.Errorf("gpu = healthy %v problem %q; want unhealthy for its missing link", g.Healthy, g.Problem)
	}
	if d.GPUCount() != 72 || d.HealthyGPUCount() != 71 || c.Domains[1].HealthyGPUCount() != 72 {
		t.Errorf("healthy GPUs %d/%d and %d; want 71/72 and the other rack untouched", d.HealthyGPUCount(), d.GPUCount(), c.Domains[1].HealthyGPUCount())
	}
}

func TestUnhealthyFabricReducesDomainCapacity(t *testing.T) {
	healthy := merge(t, racks(t, nil)).Domains[0]
	nds := racks(t, func(rack, tr int, specs []fabricSpec) {
		if rack == 0 && tr == 0 {
			specs[1].health = gonvml.GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
		}
	})
	c := merge(t, nds)
	d := c.Domains[0]
	g := d.Nodes[0].GPUs[1]
	if g.Healthy || g.Problem != "fabric health: unhealthy" || g.ActiveNVLinks != 18 {
		t.Errorf("gpu = healthy %v problem %q links %d; want unhealthy by fabric health, links intact", g.Healthy, g.Problem, g.ActiveNVLinks)
	}
	b200, _ := topology.LookupGPU("B200")
	if got := d.TotalPeaks().FLOPS; got != 71*b200.FLOPS {
		t.Errorf("domain FLOP/s %g, want 71 GPUs' %g", got, 71*b200.FLOPS)
	}
	// What the scheduler sees: pd's buckets shrink with the GPU.
	cat, err := pd.NewCatalog(pd.DefaultModels())
	if err != nil {
		t.Fatal(err)
	}
	full, err := pd.NewDomainCapacity(&healthy, cat, pd.DefaultConfig(), 0)
	if err != nil {
		t.Fatal(err)
	}
	less, err := pd.NewDomainCapacity(&d, cat, pd.DefaultConfig(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if less.GPUs() != 71 || full.GPUs() != 72 {
		t.Errorf("pd GPUs %d and %d, want 71 and 72", less.GPUs(), full.GPUs())
	}
	if ratio := float64(less.PrefillRate()) / float64(full.PrefillRate()); ratio < 70.9/72 || ratio > 71.1/72 {
		t.Errorf("prefill rate ratio %g, want 71/72", ratio)
	}
	if ratio := float64(less.DecodeRate()) / float64(full.DecodeRate()); ratio < 70.9/72 || ratio > 71.1/72 {
		t.Errorf("decode rate ratio %g, want 71/72", ratio)
	}
}

func TestFabricJudgement(t *testing.T) {
	u := uuidOf(0xa0)
	id := "a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf.3"
	ok := fabricInfo{clusterUUID: u, status: gonvml.SUCCESS, cliqueID: 3, state: gonvml.GPU_FABRIC_STATE_COMPLETED,
		health: gonvml.GPU_FABRIC_HEALTH_SUMMARY_HEALTHY}
	with := func(change func(*fabricInfo)) fabricInfo { f := ok; change(&f); return f }
	for _, tc := range []struct {
		name          string
		info          fabricInfo
		clique, issue string
	}{
		{"healthy", ok, id, ""},
		{"health not reported (v1)", with(func(f *fabricInfo) { f.health = gonvml.GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED }), id, ""},
		{"unhealthy", with(func(f *fabricInfo) { f.health = gonvml.GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY }), id, "fabric health: unhealthy"},
		{"limited", with(func(f *fabricInfo) { f.health = gonvml.GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY }), id, "fabric health: limited capacity"},
		{"not supported", with(func(f *fabricInfo) { f.state = gonvml.GPU_FABRIC_STATE_NOT_SUPPORTED }), "", ""},
		{"not started", with(func(f *fabricInfo) { f.state = gonvml.GPU_FABRIC_STATE_NOT_STARTED }), "", "fabric registration not started"},
		{"in progress", with(func(f *fabricInfo) { f.state = gonvml.GPU_FABRIC_STATE_IN_PROGRESS }), "", "fabric registration in progress"},
		{"unknown state", with(func(f *fabricInfo) { f.state = 9 }), "", "fabric state 9 unknown"},
		{"probe failed", with(func(f *fabricInfo) { f.status = gonvml.ERROR_TIMEOUT }), "", "fabric registration failed: ERROR_TIMEOUT"},
		{"no cluster", with(func(f *fabricInfo) { f.clusterUUID = [16]uint8{} }), "", ""},
	} {
		clique, issue := judgeFabric(tc.info)
		if clique != tc.clique || issue != tc.issue {
			t.Errorf("%s: clique %q problem %q, want %q %q", tc.name, clique, issue, tc.clique, tc.issue)
		}
	}
}

func TestGPUOutsideItsNodesCliqueIsUnhealthy(t *testing.T) {
	a, b := healthyClique(uuidOf(1), 1), healthyClique(uuidOf(1), 2)
	notYet := a
	notYet.state = gonvml.GPU_FABRIC_STATE_IN_PROGRESS
	nd := discover(t, tray(b, a, a, notYet), "tray")
	if nd.Domain != cliqueID(uuidOf(1), 1) {
		t.Fatalf("node domain %q, want the majority clique", nd.Domain)
	}
	want := []string{
		"in fabric clique " + cliqueID(uuidOf(1), 2) + "; the rest of its node is in " + nd.Domain,
		"", "",
		"fabric registration in progress",
	}
	for i, g := range nd.GPUs {
		if g.Problem != want[i] || g.Healthy != (want[i] == "") {
			t.Errorf("gpu %d: healthy %v problem %q, want %q", i, g.Healthy, g.Problem, want[i])
		}
	}
}

func TestOlderDriverFabricAPIs(t *testing.T) {
	spec := healthyClique(uuidOf(5), 9)
	spec.health = gonvml.GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY // only v4 can say so
	for _, tc := range []struct {
		name    string
		missing []string
		v4, v1  bool
		domain  string
		healthy bool
	}{
		{"v4", nil, true, false, cliqueID(uuidOf(5), 9), false},
		{"v1 only", []string{symFabricInfoV4}, false, true, cliqueID(uuidOf(5), 9), true},
		{"none", []string{symFabricInfoV4, symFabricInfo}, false, false, "", true},
	} {
		s := tray(four(spec)...)
		s.LookupSymbolFunc = func(sym string) error {
			for _, m := range tc.missing {
				if sym == m {
					return errors.New("undefined symbol: " + sym)
				}
			}
			return nil
		}
		nd := discover(t, s, "tray")
		dev := s.Devices[0].(*server.Device)
		if got := len(dev.GetGpuFabricInfo_v4Calls()) > 0; got != tc.v4 {
			t.Errorf("%s: GetGpuFabricInfo_v4 called %v, want %v", tc.name, got, tc.v4)
		}
		if got := len(dev.GetGpuFabricInfoCalls()) > 0; got != tc.v1 {
			t.Errorf("%s: GetGpuFabricInfo called %v, want %v", tc.name, got, tc.v1)
		}
		if nd.Domain != tc.domain || nd.GPUs[0].Healthy != tc.healthy {
			t.Errorf("%s: domain %q healthy %v, want %q %v", tc.name, nd.Domain, nd.GPUs[0].Healthy, tc.domain, tc.healthy)
		}
	}
}

// calls counts every call a go-nvml mock recorded, by method, through its
// ...Calls() recorders.
func calls(m any) map[string]int {
	out := make(map[string]int)
	v := reflect.ValueOf(m)
	for i := range v.NumMethod() {
		name := v.Type().Method(i).Name
		meth := v.Method(i)
		if !strings.HasSuffix(name, "Calls") || meth.Type().NumIn() != 0 || meth.Type().NumOut() != 1 {
			continue
		}
		if n := meth.Call(nil)[0].Len(); n > 0 {
			out[strings.TrimSuffix(name, "Calls")] = n
		}
	}
	return out
}

func TestFailedInitFallsBackAndCallsNothingElse(t *testing.T) {
	// Any other method of this mock panics if called (its func is nil), and
	// the recorders show whether it was.
	lib := &mock.Interface{InitFunc: func() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }}
	_, err := DiscoverWith(lib, "n")
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "ERROR_LIBRARY_NOT_FOUND") {
		t.Fatalf("err = %v, want ErrUnavailable naming ERROR_LIBRARY_NOT_FOUND", err)
	}
	disc := func(node string) (topology.NodeDiscovery, error) { return DiscoverWith(lib, node) }
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	l, err := load("auto", disc, "n", fallbackLog(log, "auto"))
	if err != nil {
		t.Fatal(err)
	}
	if l.Cluster.GPUCount() != topology.Simulated().GPUCount() || !strings.HasPrefix(l.Source, "simulated (NVML unavailable: nvml.Init: ERROR_LIBRARY_NOT_FOUND") {
		t.Errorf("auto fell back to %q with %d GPUs, want the simulated cluster", l.Source, l.Cluster.GPUCount())
	}
	if lines := strings.Count(logs.String(), "\n"); lines != 1 || !strings.Contains(logs.String(), "level=INFO") {
		t.Errorf("log = %q, want one INFO line", logs.String())
	}
	if _, err := load("nvml", disc, "n", fallbackLog(log, "nvml")); err == nil || !strings.Contains(err.Error(), "topology nvml: NVML unavailable: nvml.Init: ERROR_LIBRARY_NOT_FOUND") {
		t.Errorf("nvml: err = %v, want the Init failure", err)
	}
	if got := calls(lib); !reflect.DeepEqual(got, map[string]int{"Init": 3}) {
		t.Errorf("NVML calls = %v, want Init only", got)
	}
}

func TestDriverNotLoadedWarns(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() gonvml.Return { return gonvml.ERROR_DRIVER_NOT_LOADED }}
	var logs bytes.Buffer
	l, err := load("auto", func(node string) (topology.NodeDiscovery, error) { return DiscoverWith(lib, node) }, "n",
		fallbackLog(slog.New(slog.NewTextHandler(&logs, nil)), "auto"))
	if err != nil || !strings.HasPrefix(l.Source, "simulated") {
		t.Fatalf("auto: %q, %v; want the simulated fallback", l.Source, err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "ERROR_DRIVER_NOT_LOADED") {
		t.Errorf("log = %q, want a WARN naming the cause", logs.String())
	}
	if got := calls(lib); !reflect.DeepEqual(got, map[string]int{"Init": 1}) {
		t.Errorf("NVML calls = %v, want Init only", got)
	}
}

func TestSuccessfulDiscoveryShutsDown(t *testing.T) {
	s := tray(four(healthyClique(uuidOf(3), 1))...)
	discover(t, s, "tray")
	if n := len(s.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times, want 1", n)
	}
}

func TestNoGPUIsUnavailableButABrokenCountIsNot(t *testing.T) {
	empty := dgxh200.NewWithGPUs()
	if _, err := DiscoverWith(empty, "cpu"); !errors.Is(err, ErrUnavailable) {
		t.Errorf("no GPU: err = %v, want ErrUnavailable", err)
	}
	broken := dgxh200.New()
	broken.DeviceGetCountFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_UNKNOWN }
	disc := func(node string) (topology.NodeDiscovery, error) { return DiscoverWith(broken, node) }
	// NVML works but fails: auto must not quietly simulate a GPU machine.
	if _, err := load("auto", disc, "n", nil); err == nil || errors.Is(err, ErrUnavailable) {
		t.Errorf("auto over a failing DeviceGetCount: err = %v, want an error that is not a fallback", err)
	}
}

func TestUnknownGPUPeaksAreEstimatedFromReadings(t *testing.T) {
	s := dgxh200.New()
	s.Devices = s.Devices[:2]
	for _, dv := range s.Devices {
		d := dv.(*server.Device)
		rig(d, fabricSpec{none: true, links: 18})
		d.Config.Name = "NVIDIA H200 NVL" // a board the table refuses
		d.GetMaxClockInfoFunc = func(c gonvml.ClockType) (uint32, gonvml.Return) {
			switch c {
			case gonvml.CLOCK_SM:
				return 1785, gonvml.SUCCESS
			case gonvml.CLOCK_MEM:
				return 3201, gonvml.SUCCESS
			}
			return 0, gonvml.ERROR_INVALID_ARGUMENT
		}
		d.GetMemoryBusWidthFunc = func() (uint32, gonvml.Return) { return 6144, gonvml.SUCCESS }
		d.GetAttributesFunc = func() (gonvml.DeviceAttributes, gonvml.Return) {
			return gonvml.DeviceAttributes{}, gonvml.ERROR_NOT_SUPPORTED
		}
		d.GetNumGpuCoresFunc = func() (int, gonvml.Return) { return 132 * 128, gonvml.SUCCESS }
	}
	nd := discover(t, s, "nvl")
	p := nd.GPUs[0].Peaks
	want := topology.Peaks{
		SMs:          132,
		FLOPS:        132 * 1785e6 * 4096,
		HBMBandwidth: 6144.0 / 8 * 3201e6 * 2,
		HBMBytes:     int64(gpus.H200_SXM5_141GB.MemoryMB) << 20,
		Source:       topology.SourceNVMLEstimate,
		Figures: topology.PeakSources{SMs: topology.SourceNVML, FLOPS: topology.SourceNVMLEstimate,
			HBMBandwidth: topology.SourceNVMLEstimate, HBMBytes: topology.SourceNVML},
	}
	if p != want {
		t.Errorf("peaks = %+v\nwant    %+v", p, want)
	}
	if g := nd.GPUs[0]; !g.Healthy || g.MaxSMClockMHz != 1785 || g.MaxMemClockMHz != 3201 || g.MemoryBusWidthBits != 6144 || g.MemoryBytes != want.HBMBytes {
		t.Errorf("gpu = %+v, want healthy with its readings", g)
	}
	// GetAttributes did not answer, so the SMs came from the cores.
	if d := s.Devices[0].(*server.Device); len(d.GetAttributesCalls()) != 1 || len(d.GetNumGpuCoresCalls()) != 1 {
		t.Errorf("GetAttributes called %d times, GetNumGpuCores %d; want 1, 1", len(d.GetAttributesCalls()), len(d.GetNumGpuCoresCalls()))
	}
}

// A MIG-style device answers GetAttributes: its SM count is taken from it,
// and the cores are not asked.
func TestSMsFromAttributes(t *testing.T) {
	s := dgxh200.New()
	s.Devices = s.Devices[:1]
	d := s.Devices[0].(*server.Device)
	rig(d, fabricSpec{none: true, links: 18})
	d.Config.Name = "NVIDIA H200 NVL"
	d.GetAttributesFunc = func() (gonvml.DeviceAttributes, gonvml.Return) {
		return gonvml.DeviceAttributes{MultiprocessorCount: 60}, gonvml.SUCCESS
	}
	g := discover(t, s, "mig").GPUs[0]
	if g.Peaks.SMs != 60 || g.Peaks.FLOPS != 60*1980e6*4096 || !g.Healthy {
		t.Errorf("gpu = %+v, want 60 SMs from GetAttributes", g)
	}
	if n := len(d.GetNumGpuCoresCalls()); n != 0 {
		t.Errorf("GetNumGpuCores called %d times, want 0", n)
	}
}

// A GPU whose peaks can be neither looked up nor fully estimated is listed
// unhealthy, with the figures that could be estimated and the missing
// readings named; its node is discovered and merges (Validate accepts it).
func TestUnestimableGPUIsUnhealthyNotAnError(t *testing.T) {
	s := dgxh200.New()
	s.Devices = s.Devices[:2]
	for _, dv := range s.Devices {
		rig(dv.(*server.Device), fabricSpec{none: true, links: 18})
	}
	d := s.Devices[0].(*server.Device)
	d.Config.Name = "NVIDIA Mystery"
	d.Config.CudaMajor = 42
	d.GetMaxClockInfoFunc = func(gonvml.ClockType) (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	d.GetAttributesFunc = func() (gonvml.DeviceAttributes, gonvml.Return) {
		return gonvml.DeviceAttributes{MultiprocessorCount: 100}, gonvml.SUCCESS
	}
	nd, err := DiscoverWith(s, "x")
	if err != nil {
		t.Fatalf("discovery failed: %v", err)
	}
	g := nd.GPUs[0]
	want := "cannot estimate peaks: no max memory clock, no max SM clock, no BF16 rate of compute capability 42.0; describe it in a topology file"
	if g.Healthy || g.Problem != want {
		t.Errorf("gpu 0: healthy %v problem %q\nwant unhealthy: %s", g.Healthy, g.Problem, want)
	}
	wantPeaks := topology.Peaks{SMs: 100, HBMBytes: int64(gpus.H200_SXM5_141GB.MemoryMB) << 20, Source: topology.SourceNVMLEstimate,
		Figures: topology.PeakSources{SMs: "nvml", FLOPS: "unavailable", HBMBandwidth: "unavailable", HBMBytes: "nvml"}}
	if g.Peaks != wantPeaks || g.MemoryBusWidthBits != 6144 {
		t.Errorf("gpu 0 peaks %+v bus %d\nwant %+v and its bus width", g.Peaks, g.MemoryBusWidthBits, wantPeaks)
	}
	c := merge(t, []topology.NodeDiscovery{nd})
	dom := c.Domains[0]
	if dom.HealthyGPUCount() != 1 || dom.GPUModel() != "H200" {
		t.Errorf("domain: %d healthy, model %q; want the H200 alone", dom.HealthyGPUCount(), dom.GPUModel())
	}
}

// The driver lacks the functions added after R470: they are not called (a
// call would abort the process), and their readings are unavailable.
func TestNewerSymbolsAreGuarded(t *testing.T) {
	s := dgxh200.New()
	s.Devices = s.Devices[:1]
	d := s.Devices[0].(*server.Device)
	rig(d, fabricSpec{none: true, links: 18})
	d.Config.Name = "NVIDIA H200 NVL" // estimated: every reading matters
	missing := []string{symBusWidth, symNumGpuCores, symAttributes, symAttributesV2, symComputeCap}
	s.LookupSymbolFunc = func(sym string) error {
		if slices.Contains(missing, sym) {
			return errors.New("undefined symbol: " + sym)
		}
		return nil
	}
	g := discover(t, s, "old").GPUs[0]
	for name, n := range map[string]int{
		"GetMemoryBusWidth":        len(d.GetMemoryBusWidthCalls()),
		"GetNumGpuCores":           len(d.GetNumGpuCoresCalls()),
		"GetAttributes":            len(d.GetAttributesCalls()),
		"GetCudaComputeCapability": len(d.GetCudaComputeCapabilityCalls()),
	} {
		if n != 0 {
			t.Errorf("%s called %d times though the driver lacks it", name, n)
		}
	}
	want := "cannot estimate peaks: no SM count, no memory bus width, no compute capability; describe it in a topology file"
	if g.Healthy || g.Problem != want || g.MemoryBusWidthBits != 0 || g.MaxSMClockMHz != 1980 {
		t.Errorf("gpu: healthy %v problem %q bus %d sm clock %d\nwant unhealthy: %s", g.Healthy, g.Problem, g.MemoryBusWidthBits, g.MaxSMClockMHz, want)
	}
	// A known GPU needs none of them: the table fills what NVML cannot.
	h := dgxh200.New()
	h.Devices = h.Devices[:1]
	rig(h.Devices[0].(*server.Device), fabricSpec{none: true, links: 18})
	h.LookupSymbolFunc = s.LookupSymbolFunc
	k := discover(t, h, "old-h200").GPUs[0]
	h200, _ := topology.LookupGPU("H200")
	if !k.Healthy || k.Peaks.SMs != h200.SMs || k.Peaks.FigureSources().SMs != "table" || k.Peaks.FigureSources().HBMBytes != "nvml" {
		t.Errorf("known gpu on an old driver = %+v", k)
	}
}

// A GPU whose identity cannot be read is listed unhealthy under a stand-in
// name; the node's other GPUs are discovered as usual.
func TestLostGPUIsAStandIn(t *testing.T) {
	s := dgxh200.New()
	s.Devices = s.Devices[:4]
	for _, dv := range s.Devices {
		rig(dv.(*server.Device), fabricSpec{none: true, links: 18})
	}
	s.DeviceGetHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) {
		if i == 1 {
			return nil, gonvml.ERROR_GPU_IS_LOST
		}
		return s.Devices[i], gonvml.SUCCESS
	}
	lostUUID := s.Devices[2].(*server.Device)
	lostUUID.GetUUIDFunc = func() (string, gonvml.Return) { return "", gonvml.ERROR_GPU_IS_LOST }
	lostName := s.Devices[3].(*server.Device)
	lostName.GetNameFunc = func() (string, gonvml.Return) { return "", gonvml.ERROR_UNKNOWN }
	nd := discover(t, s, "h")
	want := []struct{ name, uuid, problem string }{
		{"NVIDIA H200 141GB HBM3e", s.Devices[0].(*server.Device).UUID, ""},
		{"gpu-index-1", "", "DeviceGetHandleByIndex: ERROR_GPU_IS_LOST"},
		{"gpu-index-2", "", "GetUUID: ERROR_GPU_IS_LOST"},
		{"gpu-index-3", lostName.UUID, "GetName: ERROR_UNKNOWN"},
	}
	for i, g := range nd.GPUs {
		w := want[i]
		if g.Index != i || g.Name != w.name || g.UUID != w.uuid || g.Problem != w.problem || g.Healthy != (w.problem == "") {
			t.Errorf("gpu %d = %q %q healthy %v problem %q; want %+v", i, g.Name, g.UUID, g.Healthy, g.Problem, w)
		}
	}
	d := merge(t, []topology.NodeDiscovery{nd}).Domains[0]
	if d.GPUCount() != 4 || d.HealthyGPUCount() != 1 || d.GPUModel() != "H200" {
		t.Errorf("domain: %d GPUs, %d healthy, model %q; want 4, 1, H200", d.GPUCount(), d.HealthyGPUCount(), d.GPUModel())
	}
}

// NVML numbers links up to NVLINK_MAX_LINKS (36): a link above 18 counts.
func TestLinksAbove18AreCounted(t *testing.T) {
	spec := fabricSpec{none: true, links: 18, extra: []int{20, gonvml.NVLINK_MAX_LINKS - 1}}
	s := dgxh200.New()
	s.Devices = s.Devices[:1]
	d := s.Devices[0].(*server.Device)
	rig(d, spec)
	if g := discover(t, s, "h").GPUs[0]; g.ActiveNVLinks != 20 {
		t.Errorf("%d active NVLinks, want 20 (18, link 20 and link %d)", g.ActiveNVLinks, gonvml.NVLINK_MAX_LINKS-1)
	}
	if n := len(d.GetNvLinkStateCalls()); n != gonvml.NVLINK_MAX_LINKS {
		t.Errorf("GetNvLinkState called %d times, want %d", n, gonvml.NVLINK_MAX_LINKS)
	}
}

// Every return code go-nvml knows has its name in returnNames, spelled as
// go-nvml's own table spells it (what Return.Error gives while no library
// is loaded, as in these tests; a loaded one gives nvmlErrorString's prose
// instead, which is why Problems and errors never use it).
func TestReturnNames(t *testing.T) {
	named := 0
	for code := range 1000 {
		ret := gonvml.Return(code)
		goName := ret.Error()
		if strings.HasPrefix(goName, "unknown return value") {
			if got, want := returnName(ret), fmt.Sprintf("NVML error %d", code); got != want {
				t.Errorf("returnName(%d) = %q, want %q", code, got, want)
			}
			continue
		}
		named++
		if got := returnName(ret); got != goName {
			t.Errorf("returnName(%d) = %q, want %q", code, got, goName)
		}
	}
	if named != len(returnNames) || named < 30 {
		t.Errorf("go-nvml names %d codes, returnNames %d", named, len(returnNames))
	}
}

// A failed Init is named without asking the library (Return.Error may call
// nvmlErrorString, which nothing may call after a failed Init).
func TestInitErrorName(t *testing.T) {
	for ret, want := range map[gonvml.Return]string{
		gonvml.ERROR_LIBRARY_NOT_FOUND:       "ERROR_LIBRARY_NOT_FOUND (libnvidia-ml.so.1 is not installed)",
		gonvml.ERROR_DRIVER_NOT_LOADED:       "ERROR_DRIVER_NOT_LOADED (the NVIDIA kernel driver is not running)",
		gonvml.ERROR_NO_PERMISSION:           "ERROR_NO_PERMISSION",
		gonvml.ERROR_LIB_RM_VERSION_MISMATCH: "ERROR_LIB_RM_VERSION_MISMATCH (NVML library and kernel driver versions differ)",
		gonvml.ERROR_FUNCTION_NOT_FOUND:      "ERROR_FUNCTION_NOT_FOUND",
		gonvml.ERROR_UNKNOWN:                 "ERROR_UNKNOWN",
		gonvml.Return(12345):                 "NVML error 12345",
	} {
		if got := initErrorName(ret); got != want {
			t.Errorf("initErrorName(%d) = %q, want %q", int32(ret), got, want)
		}
	}
}
