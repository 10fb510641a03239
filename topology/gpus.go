package topology

import (
	"slices"
	"strings"
)

// Peak sources: where a GPU's Peaks came from.
const (
	SourceTable        = "table"         // the known-GPU table (LookupGPU)
	SourceConfig       = "config"        // written in a cluster file or other config
	SourceNVMLEstimate = "nvml-estimate" // estimated from NVML clock and memory readings
	SourceNVML         = "nvml"          // read from NVML as is (HBM bytes, SM count); used in Peaks.Figures
	// SourceUnavailable marks a figure (in Peaks.Figures) that could be
	// neither looked up nor estimated: it is zero, and its GPU is unhealthy.
	SourceUnavailable = "unavailable"
)

// knownGPU is one row of the known-GPU table.
type knownGPU struct {
	model  string // canonical model name, the table's key
	peaks  Peaks
	nvlink int // NVLink ports per GPU
}

// gpuTable holds the datasheet peaks of the GPUs Sluice knows by name. FLOPS
// is dense (not sparse) BF16 tensor throughput.
var gpuTable = []knownGPU{
	{"H100", Peaks{SMs: 132, FLOPS: 989e12, HBMBandwidth: 3.35e12, HBMBytes: 80e9, Source: SourceTable}, 18},
	{"H200", Peaks{SMs: 132, FLOPS: 989e12, HBMBandwidth: 4.8e12, HBMBytes: 141e9, Source: SourceTable}, 18},
	{"B200", Peaks{SMs: 148, FLOPS: 2.25e15, HBMBandwidth: 8.0e12, HBMBytes: 180e9, Source: SourceTable}, 18},
	{"GB200", Peaks{SMs: 148, FLOPS: 2.5e15, HBMBandwidth: 8.0e12, HBMBytes: 186e9, Source: SourceTable}, 18},
}

// variantWords mark board variants whose peaks differ from the SXM part the
// table describes ("NVIDIA H100 PCIe", "NVIDIA H200 NVL"); such names are
// not matched.
var variantWords = []string{"pcie", "nvl"}

// lookup finds the table row for an NVML-style name. The name is split into
// words on spaces, dashes and underscores, case-insensitively; a leading
// "nvidia" is dropped, the first remaining word must equal a model exactly
// (so "GB200" is never taken for "B200", nor "GH200" for "H200"), and no
// later word may name another board variant.
func lookup(name string) (*knownGPU, bool) {
	words := strings.FieldsFunc(strings.ToLower(name), func(r rune) bool {
		return r == ' ' || r == '-' || r == '_' || r == '\t'
	})
	if len(words) > 0 && words[0] == "nvidia" {
		words = words[1:]
	}
	if len(words) == 0 {
		return nil, false
	}
	for _, w := range words[1:] {
		if slices.Contains(variantWords, w) {
			return nil, false
		}
	}
	for i := range gpuTable {
		if strings.ToLower(gpuTable[i].model) == words[0] {
			return &gpuTable[i], true
		}
	}
	return nil, false
}

// LookupGPU returns the datasheet peaks of a known GPU, matching NVML-style
// names case-insensitively: "NVIDIA H100 80GB HBM3", "H100 SXM", "NVIDIA H200",
// "NVIDIA B200", "NVIDIA GB200", "GB200". The peaks' Source is SourceTable.
// PCIe and NVL board variants, whose peaks are lower, are not matched.
func LookupGPU(name string) (Peaks, bool) {
	k, ok := lookup(name)
	if !ok {
		return Peaks{}, false
	}
	return k.peaks, true
}

// ModelName returns the canonical table name of a GPU ("GB200" for
// "NVIDIA GB200"), or the name with surrounding space trimmed when the GPU is
// not in the table. Calibrations and Domain.GPUModel use it, so the same GPU
// reads the same whichever source named it.
func ModelName(name string) string {
	if k, ok := lookup(name); ok {
		return k.model
	}
	return strings.TrimSpace(name)
}

// KnownGPUs returns the canonical names of the GPUs in the table, sorted.
func KnownGPUs() []string {
	names := make([]string, len(gpuTable))
	for i, k := range gpuTable {
		names[i] = k.model
	}
	slices.Sort(names)
	return names
}

// defaultNVLinks is the NVLink port count of a known GPU, 0 for others.
func defaultNVLinks(name string) int {
	if k, ok := lookup(name); ok {
		return k.nvlink
	}
	return 0
}
