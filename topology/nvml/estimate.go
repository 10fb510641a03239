package nvml

import (
	"fmt"
	"math"
	"strings"

	"github.com/sluice-sched/sluice/topology"
)

// readings are the NVML figures an unknown GPU's peaks are estimated from.
// A zero field was not obtainable.
type readings struct {
	memTotal     uint64 // bytes, GetMemoryInfo().Total
	sms          int    // multiprocessors
	smClockMHz   uint32 // GetMaxClockInfo(CLOCK_SM)
	memClockMHz  uint32 // GetMaxClockInfo(CLOCK_MEM)
	busWidthBits uint32 // GetMemoryBusWidth
	ccMajor      int    // CUDA compute capability
	ccMinor      int
}

// bf16PerSMClock is the dense BF16 tensor FLOP one SM does per clock, by
// compute capability, from the datasheets: dense BF16 FLOP/s ÷ (SMs · boost
// clock). 0: unknown architecture, no estimate.
func bf16PerSMClock(major, minor int) float64 {
	switch {
	case major == 8 && minor == 0: // A100: 312e12 / (108 · 1.41e9)
		return 2048
	case major == 8: // A10, A40, L4, L40S: 1024
		return 1024
	case major == 9: // H100, H200: 989e12 / (132 · 1.83e9)
		return 4096
	case major == 10: // B200, GB200, B300
		return 8192
	case major == 12: // RTX Blackwell
		return 1024
	}
	return 0
}

// coresPerSM is the CUDA cores of one SM, to turn GetNumGpuCores into SMs
// when GetAttributes is not supported. 0: unknown.
func coresPerSM(major, minor int) int {
	switch {
	case major == 8 && minor == 0:
		return 64
	case major >= 8 && major <= 12:
		return 128
	}
	return 0
}

// estimatePeaks derives an unknown GPU's peaks from its readings (formulas
// in the package documentation). Every figure must be obtainable: an error
// names each one that is not, so the operator knows what a topology file
// must supply instead.
func estimatePeaks(r readings) (topology.Peaks, error) {
	var missing []string
	if r.memTotal == 0 {
		missing = append(missing, "memory total")
	}
	if r.sms <= 0 {
		missing = append(missing, "SM count")
	}
	if r.busWidthBits == 0 {
		missing = append(missing, "memory bus width")
	}
	if r.memClockMHz == 0 {
		missing = append(missing, "max memory clock")
	}
	if r.smClockMHz == 0 {
		missing = append(missing, "max SM clock")
	}
	perClock := bf16PerSMClock(r.ccMajor, r.ccMinor)
	if perClock == 0 {
		missing = append(missing, fmt.Sprintf("BF16 rate of compute capability %d.%d", r.ccMajor, r.ccMinor))
	}
	if len(missing) > 0 {
		return topology.Peaks{}, fmt.Errorf("cannot estimate peaks: no %s", strings.Join(missing, ", no "))
	}
	p := topology.Peaks{
		SMs:          r.sms,
		FLOPS:        float64(r.sms) * float64(r.smClockMHz) * 1e6 * perClock,
		HBMBandwidth: float64(r.busWidthBits) / 8 * float64(r.memClockMHz) * 1e6 * 2,
		HBMBytes:     int64(min(r.memTotal, uint64(math.MaxInt64))),
		Source:       topology.SourceNVMLEstimate,
		Figures: topology.PeakSources{
			SMs:          topology.SourceNVML,
			FLOPS:        topology.SourceNVMLEstimate,
			HBMBandwidth: topology.SourceNVMLEstimate,
			HBMBytes:     topology.SourceNVML,
		},
	}
	return p, nil
}
