package admission

import (
	"math"
	"math/bits"

	"github.com/sluice-sched/sluice/pd"
)

// Warm-up. A domain that returns — undrained, its healthy GPUs back, or new
// to the cluster after start-up — ramps its shared capacity (both buckets'
// rates and bursts and the KV limit, less the floor reserves) linearly from
// warmup.start_fraction to the whole over warmup.period, so that returning
// hardware does not take a full burst at once. The floor reserve placed on
// the domain is whole from the first moment: floors are a promise, and the
// reserve is spread by the domains' rates before warm-up, so a ramp moves
// no reserve between domains. pd.DomainCapacity keeps the ramp and moves it
// lazily with every call that takes a time.
//
// The ramp's slope is (1 − start_fraction)/period. A domain that gains GPUs
// while serving starts from what it already had (old GPUs/new GPUs of its
// current fraction), so only the returning part ramps. A reload that changes
// the warm-up keeps each ramp's current fraction and goes on at the new
// slope (period 0 makes every domain whole at once).

// warmupFrom is the start fraction of the config in force, in millionths.
func (p *placer) warmupFrom() int64 {
	return int64(math.Round(p.cfg.Warmup.StartFraction * pd.WarmupFull))
}

// warmupEnd is when a ramp from `from` millionths at now reaches the whole
// at the config's slope; now when there is no warm-up.
func (p *placer) warmupEnd(now, from int64) int64 {
	sf := p.warmupFrom()
	period := p.cfg.Warmup.Period
	if period == nil || period.Duration <= 0 || from >= pd.WarmupFull || sf >= pd.WarmupFull {
		return now
	}
	// (Full − from)/(Full − sf) of the period, at most the whole period.
	hi, lo := bits.Mul64(uint64(period.Duration), uint64(pd.WarmupFull-max(from, sf)))
	left, _ := bits.Div64(hi, lo, uint64(pd.WarmupFull-sf)) // hi < divisor: from ≥ sf
	return now + int64(left)
}

// startWarmup starts d's ramp at now, from the config's start fraction or
// from, whichever is higher.
func (p *placer) startWarmup(now int64, d *domainState, from int64) {
	from = max(from, p.warmupFrom())
	d.cap.StartWarmup(now, from, p.warmupEnd(now, from))
}

// pendingWarmup is a ramp to start once the floor reserves are spread.
type pendingWarmup struct {
	d    *domainState
	from int64
}

// gainedGPUs notes the ramp of a domain whose healthy GPUs went from old to
// new (new > old): the GPUs it had keep their fraction; the rest warm.
func (p *placer) gainedGPUs(now int64, d *domainState, old, new int) pendingWarmup {
	cur, _ := d.cap.Warmup(now)
	return pendingWarmup{d, cur * int64(old) / int64(new)}
}

// retuneWarmups carries every running ramp over to a changed warm-up
// config: its current fraction stays, the slope becomes the new one.
func (p *placer) retuneWarmups(now int64) {
	for _, d := range p.domains {
		if w, end := d.cap.Warmup(now); end != 0 {
			d.cap.StartWarmup(now, w, p.warmupEnd(now, w))
		}
	}
}

// warmupChanged reports whether two configs ramp differently.
func warmupChanged(a, b *WarmupConfig) bool {
	if a.StartFraction != b.StartFraction {
		return true
	}
	pa, pb := Duration{}, Duration{}
	if a.Period != nil {
		pa = *a.Period
	}
	if b.Period != nil {
		pb = *b.Period
	}
	return pa != pb
}
