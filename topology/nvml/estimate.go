package nvml

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/sluice-sched/sluice/topology"
)

// readings are what NVML said about a GPU: stored in topology.GPU for every
// GPU, and the source of an unknown GPU's estimated peaks. A zero field was
// not obtainable (refused, not supported, or the driver lacks the call).
type readings struct {
	memTotal     uint64 // bytes, GetMemoryInfo().Total
	sms          int    // multiprocessors: GetAttributes, else GetNumGpuCores / coresPerSM
	smClockMHz   uint32 // GetMaxClockInfo(CLOCK_SM)
	memClockMHz  uint32 // GetMaxClockInfo(CLOCK_MEM)
	busWidthBits uint32 // GetMemoryBusWidth
	ccMajor      int    // CUDA compute capability; 0.0 when not read
	ccMinor      int
}

// bf16PerSMClock is the dense BF16 tensor FLOP one SM does per clock, by
// compute capability, from the datasheets: dense tensor FLOP/s ÷ (SMs ·
// boost clock). 0: no rate known, no estimate.
//
//	7.x   V100 SXM2: 125e12 / (80 · 1.53e9) = 1021; T4: 65e12 / (40 · 1.59e9) = 1022.
//	      Volta and Turing have no BF16 tensor cores: this is their FP16
//	      tensor rate, the precision models are served in on them.
//	8.0   A100 SXM: 312e12 / (108 · 1.41e9) = 2049
//	8.x   A10: 125e12 / (72 · 1.695e9) = 1024; L40S: 362e12 / (142 · 2.52e9) = 1012
//	9.0   H100 SXM: 989e12 / (132 · 1.83e9) = 4094
//	10.x  B200, GB200, B300: Hopper's rate doubled (B200: 2.25e15 over 148 SMs
//	      is 8192 per SM per clock at 1.86 GHz)
//	12.x  RTX Blackwell: 1024, the rate of Ada's (8.9) tensor cores
//
// 11.x (Jetson Thor) is left out: its datasheet (2560 CUDA cores, 96 tensor
// cores, sparse FP4 only) gives no dense BF16 rate per SM that reconciles,
// so such a GPU is listed unhealthy until a topology file describes it.
func bf16PerSMClock(major, minor int) float64 {
	switch {
	case major == 7:
		return 1024
	case major == 8 && minor == 0:
		return 2048
	case major == 8:
		return 1024
	case major == 9:
		return 4096
	case major == 10:
		return 8192
	case major == 12:
		return 1024
	}
	return 0
}

// coresPerSM is the CUDA cores of one SM, to turn GetNumGpuCores into SMs
// when GetAttributes is not supported. 0: unknown.
func coresPerSM(major, minor int) int {
	switch {
	case major == 7: // Volta, Turing
		return 64
	case major == 8 && minor == 0:
		return 64
	case major >= 8 && major <= 12:
		return 128
	}
	return 0
}

// estimatePeaks derives an unknown GPU's peaks from its readings (formulas
// in the package documentation), each figure with its source in Figures. A
// figure that cannot be obtained is zero with source
// topology.SourceUnavailable, and the error names every missing reading, so
// that the GPU is listed unhealthy with the reason and the operator knows
// what a topology file must supply instead.
func estimatePeaks(r readings) (topology.Peaks, error) {
	p := topology.Peaks{
		Source: topology.SourceNVMLEstimate,
		Figures: topology.PeakSources{
			SMs:          topology.SourceUnavailable,
			FLOPS:        topology.SourceUnavailable,
			HBMBandwidth: topology.SourceUnavailable,
			HBMBytes:     topology.SourceUnavailable,
		},
	}
	var missing []string
	if r.memTotal > 0 {
		p.HBMBytes, p.Figures.HBMBytes = clampInt64(r.memTotal), topology.SourceNVML
	} else {
		missing = append(missing, "memory total")
	}
	if r.sms > 0 {
		p.SMs, p.Figures.SMs = r.sms, topology.SourceNVML
	} else {
		missing = append(missing, "SM count")
	}
	if r.busWidthBits == 0 {
		missing = append(missing, "memory bus width")
	}
	if r.memClockMHz == 0 {
		missing = append(missing, "max memory clock")
	}
	if r.busWidthBits > 0 && r.memClockMHz > 0 {
		p.HBMBandwidth = float64(r.busWidthBits) / 8 * float64(r.memClockMHz) * 1e6 * 2
		p.Figures.HBMBandwidth = topology.SourceNVMLEstimate
	}
	perClock := bf16PerSMClock(r.ccMajor, r.ccMinor)
	if r.smClockMHz == 0 {
		missing = append(missing, "max SM clock")
	}
	switch {
	case r.ccMajor == 0:
		missing = append(missing, "compute capability")
	case perClock == 0:
		missing = append(missing, fmt.Sprintf("BF16 rate of compute capability %d.%d", r.ccMajor, r.ccMinor))
	}
	if r.sms > 0 && r.smClockMHz > 0 && perClock > 0 {
		p.FLOPS = float64(r.sms) * float64(r.smClockMHz) * 1e6 * perClock
		p.Figures.FLOPS = topology.SourceNVMLEstimate
	}
	if len(missing) > 0 {
		return p, errors.New("cannot estimate peaks: no " + strings.Join(missing, ", no "))
	}
	return p, nil
}

// clampInt64 converts an NVML byte count, saturating at MaxInt64.
func clampInt64(v uint64) int64 {
	return int64(min(v, uint64(math.MaxInt64)))
}
