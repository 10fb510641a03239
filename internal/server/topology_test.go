package server

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/topology/nvml"
)

func TestLoadTopologySources(t *testing.T) {
	const file = "../../topology/testdata/cluster.yaml"
	want, err := topology.LoadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{"simulated", file} {
		c, discovered, err := loadTopology(src, nil)
		if discovered {
			t.Errorf("%s: reported as discovered through NVML", src)
		}
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if src == file && c.GPUCount() != want.GPUCount() || src == "simulated" && c.GPUCount() != topology.Simulated().GPUCount() {
			t.Errorf("%s: %d GPUs", src, c.GPUCount())
		}
	}
	if _, _, err := loadTopology("/nonexistent/cluster.yaml", nil); err == nil || !strings.Contains(err.Error(), "/nonexistent/cluster.yaml") {
		t.Errorf("missing file: err = %v, want it named", err)
	}
}

// TestLoadTopologyNVMLOrFallback holds on any machine: where NVML works
// (a GPU host built with cgo) auto and nvml read it; elsewhere nvml fails
// saying why and auto falls back to its file in one log line.
func TestLoadTopologyNVMLOrFallback(t *testing.T) {
	const file = "../../topology/testdata/cluster.yaml"
	direct, viaNVML, nerr := loadTopology("nvml", nil)
	var logs bytes.Buffer
	auto, autoViaNVML, aerr := loadTopology("auto:"+file, slog.New(slog.NewTextHandler(&logs, nil)))
	if viaNVML != (nerr == nil) || autoViaNVML != (nerr == nil) {
		t.Errorf("discovered = %v (nvml), %v (auto); want both %v", viaNVML, autoViaNVML, nerr == nil)
	}
	if aerr != nil {
		t.Fatalf("auto: %v", aerr)
	}
	if nerr == nil {
		if len(direct.Domains) == 0 || auto.GPUCount() != direct.GPUCount() || logs.Len() != 0 {
			t.Errorf("NVML works: auto gave %d GPUs, nvml %d, log %q", auto.GPUCount(), direct.GPUCount(), logs.String())
		}
		return
	}
	if !errors.Is(nerr, nvml.ErrUnavailable) || !strings.HasPrefix(nerr.Error(), "topology nvml: NVML unavailable: ") {
		t.Errorf("nvml: err = %v, want it to say NVML is unavailable", nerr)
	}
	fromFile, _ := topology.LoadFile(file)
	if auto.GPUCount() != fromFile.GPUCount() {
		t.Errorf("auto fell back to %d GPUs, want the file's %d", auto.GPUCount(), fromFile.GPUCount())
	}
	if strings.Count(logs.String(), "\n") != 1 || !strings.Contains(logs.String(), "NVML unavailable") || !strings.Contains(logs.String(), "fallback="+file) {
		t.Errorf("log = %q, want one line naming the fallback", logs.String())
	}
}

// Whether the cluster came through NVML is Load's word, not a guess from
// its source: a file whose path begins with "nvml" is a file.
func TestLoadTopologyFileNamedNVML(t *testing.T) {
	b, err := os.ReadFile("../../topology/testdata/cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	if err := os.WriteFile("nvml-cluster.yaml", b, 0o600); err != nil {
		t.Fatal(err)
	}
	c, discovered, err := loadTopology("nvml-cluster.yaml", nil)
	if err != nil || discovered || c.GPUCount() == 0 {
		t.Errorf("nvml-cluster.yaml: %d GPUs, discovered %v, %v; want the file, not discovered", c.GPUCount(), discovered, err)
	}
}
