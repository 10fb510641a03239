package admission

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/pd"
)

// EngineSignal is what a domain's serving engines last reported (their
// Prometheus metrics, as the Gateway API Inference Extension reads them).
type EngineSignal struct {
	Domain  string
	Queue   float64       // requests waiting, summed over the domain's engines
	Running float64       // requests running, summed
	KVUsage float64       // the fullest engine's KV-cache utilisation, 0 to 1
	Age     time.Duration // how old the reading is as it is given
	// Relay asks the shared state to relay the reading to the replicas
	// that do not read the domain's engines themselves (this one is among
	// the few that read them for all).
	Relay bool
}

// ErrInvalidEngineSignal is returned by ObserveEngines for a signal whose
// queue, running count or KV use is not a finite number ≥ 0.
var ErrInvalidEngineSignal = errors.New("engine signal is not a reading")

// ObserveEngines records the engines' latest signals, one per domain;
// domains the engine does not have, and signals that are no readings (a
// queue, running count or KV use that is negative, NaN or infinite), are
// skipped and named in the error (the others are recorded). A skipped
// signal changes nothing: the domain's last reading stands and ages, as
// it would had its engines not answered, where a bad number read as 0
// would say that they are clear. The capacity loop acts on them at its
// next step (Config.Feedback).
func (e *Engine) ObserveEngines(signals []EngineSignal) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.nowLocked()
	var unknown, invalid []string
	for _, s := range signals {
		d, ok := e.mu.place.byID[s.Domain]
		if !ok || d.removed {
			unknown = append(unknown, s.Domain)
			continue
		}
		if !saneReading(s.Queue, s.Running, s.KVUsage) {
			invalid = append(invalid, s.Domain)
			continue
		}
		d.loop.observe(now, s, &e.mu.place.cfg.Feedback)
		if s.Relay {
			d.loop.own, d.loop.ownAt, d.loop.hasOwn = s, now-int64(max(s.Age, 0)), true
		}
	}
	var errs []error
	if len(unknown) > 0 {
		errs = append(errs, fmt.Errorf("engine signals for %d unknown domains (%v): %w", len(unknown), unknown[:min(len(unknown), 5)], ErrUnknownDomain))
	}
	if len(invalid) > 0 {
		errs = append(errs, fmt.Errorf("engine signals for %d domains (%v) skipped: %w", len(invalid), invalid[:min(len(invalid), 5)], ErrInvalidEngineSignal))
	}
	return errors.Join(errs...)
}

// RelayEngineReadings says whether the shared state relays engine
// readings between replicas (batched rounds, a few replicas reading each
// domain's engines for all): placement then notes the domains it weighs
// among a request's spread choices, whose readings the rounds ask for.
// Off by default: a replica that reads every domain itself asks for
// nothing.
func (e *Engine) RelayEngineReadings(on bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.mu.place.relayed = on
}

// StarvedEngineDomains appends to dst the domains whose engines' readings
// placement has wanted for feedback.stale or longer (it weighs them among
// a request's spread choices) with none fresh: the replicas that read
// them for all do not relay them (gone, of another version, or the shared
// state unreachable), so the caller reads them itself.
func (e *Engine) StarvedEngineDomains(dst []string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.nowLocked()
	for _, d := range e.mu.place.domains {
		if !d.removed && d.loop.starved(now, &e.mu.place.cfg.Feedback) {
			dst = append(dst, d.ID())
		}
	}
	return dst
}

// capacityLoop is one domain's closed capacity loop: it corrects the
// model's capacity (pd.DomainCapacity.SetFactor) from what the domain's
// engines report and sustain, and guards it while they are saturated.
//
//   - Saturation guard (AIMD): while fresh signals say the engines are
//     saturated (a waiting queue at QueueThreshold or above it, or KV use
//     above KVThreshold), nothing but floor traffic is placed on the
//     domain; once they have been saturated for CutAfter (a standing
//     queue, not a burst's), the factor shrinks by Decrease each period.
//     Between two signals, the requests this replica placed since the
//     last one count as waiting, so that a burst stops at the threshold
//     rather than at the next read: the guard keeps the queue within the
//     threshold, and never places the request that takes it past.
//     Once the signals have been clear for ClearPeriods, a factor the
//     guard cut below its calibrated value (the last calibration's, 1
//     before any) recovers: each period divides it by Decrease, undoing
//     one cut, up to that value, whether or not the domain is in demand.
//     A cut with no calibration behind it says only that the engines
//     were saturated, and they are no longer: were it kept, a false
//     reading would shrink an idle domain for good. At or above its
//     calibrated value the factor grows by Increase each period the
//     domain's buckets are in demand (most of a period's refill taken),
//     up to MaxFactor: the loop finds an engine faster than the model as
//     well as a slower one.
//   - Calibration: over each Window in which the engines were busy (a
//     waiting queue in nine in ten of their signals, or without fresh
//     signals a median reported time to first token past BusyTTFT), what
//     the domain served is what it sustains; the factor moves toward soft_fraction of that,
//     by at most CalibrationStep and not by less than Deadband, and
//     where the window leaves it is its calibrated value. A window that
//     ends with the factor cut by the guard moves the calibrated value
//     alone (calibrate). A window busy by the engines' queue that
//     measured them sustaining less than the calibrated value admits in
//     full (not merely more than soft_fraction of it: engines that
//     slowed) takes the calibrated value down to what they sustained at
//     once.
//
// Signals older than Stale are not acted on: the factor holds, the guard
// is off, and DomainInfo says the metrics are stale.
type capacityLoop struct {
	// The engines' last signal, and the engine time it was read at.
	sig    EngineSignal
	sigAt  int64
	hasSig bool
	// placed counts the requests placed on the domain since the signal
	// was read: as far as the guard can know, they wait in the engines'
	// queue (a burst placed between two reads would otherwise pass it).
	// recent (below) holds the engine times of the last placements.
	placed int
	// satSince is when the signals' current run past the thresholds began
	// (the reading time of its first); -1 while the last is within them.
	// The factor is cut only once the run has lasted CutAfter: a standing
	// queue rather than a burst's.
	satSince int64

	factor float64 // the correction, relative to the model
	// load is how busy the domain is, for spreading: the larger of its
	// buckets' recent use (a moving average of the share of the whole
	// domain's refill taken here), its KV in use here of the whole
	// domain's, and its engines' fresh signals against their thresholds.
	load       float64
	saturated  bool  // the guard holds the domain to its floors
	clearSince int64 // engine time the signals became clear; 0 while saturated or never
	stepAt     int64 // engine time of the last step
	// Taken counters at the last step, for demand.
	takenP, takenD int64
	use            float64 // the moving average of the buckets' use
	// The same per phase, for operators (DomainInfo.PrefillUse and
	// DecodeUse): the share of each of the whole domain's rates taken.
	useP, useD float64

	// The calibration window.
	winStart        int64
	servedP         float64 // prefill FLOP of requests released in it
	servedD         float64 // decode bytes
	signals, queued int     // signals read in it, and those with a waiting queue
	ttfts           []time.Duration
	lastMeasure     float64 // the last window's sustained factor; 0: none yet
	lastMeasureKind string  // what made that window busy
	// calibrated is the factor as the calibrating windows leave it (1,
	// the model, before any): a guard's cut below it recovers to it.
	calibrated float64

	// Kept after the fields a decision reads, off their cache lines.

	// recent is a ring of the engine times of the last placements (next
	// is its next slot), so that a reading made before some of them (one
	// relayed from another replica, a few hundred milliseconds old) leaves
	// those counted.
	recent [recentPlacements]int64
	next   int
	// The last signal this replica read itself, for the others (a few
	// replicas read a domain's engines and relay what they read through
	// the shared state).
	own    EngineSignal
	ownAt  int64
	hasOwn bool
	// Placement's interest in the engines' readings, where other
	// replicas read them: lookedAt is when placement last weighed the
	// domain (one of a request's spread choices), wantedSince when its
	// current run of such looks began (none more than Stale apart);
	// looked is false before the first.
	lookedAt, wantedSince int64
	looked                bool
}

func newCapacityLoop(now int64) capacityLoop {
	return capacityLoop{factor: 1, calibrated: 1, winStart: now, stepAt: now, satSince: -1}
}

// observe records a signal read age ago, its numbers checked sane by the
// caller (saneReading).
func (l *capacityLoop) observe(now int64, s EngineSignal, cfg *FeedbackConfig) {
	at := now - int64(max(s.Age, 0))
	if l.hasSig && at < l.sigAt {
		return // older than the one held (another replica's, relayed late)
	}
	if !l.hasSig || at > l.sigAt {
		l.placed = l.placedAfter(at) // what was placed before it is in it
	}
	switch {
	case !saturatedBy(s, cfg):
		l.satSince = -1
	case l.satSince < 0:
		l.satSince = at
	}
	l.sig, l.sigAt, l.hasSig = s, at, true
	l.signals++
	if s.Queue > 0 {
		l.queued++
	}
}

// ownReading is the last signal this replica read itself, as the shared
// state relays it.
func (l *capacityLoop) ownReading(now int64) (sharing.EngineReading, int64, bool) {
	if !l.hasOwn {
		return sharing.EngineReading{}, 0, false
	}
	s := l.own
	return sharing.EngineReading{Queue: s.Queue, Running: s.Running, KVUsage: s.KVUsage, Age: time.Duration(now - l.ownAt)}, l.ownAt, true
}

// look records that placement weighed the domain at now.
func (l *capacityLoop) look(now int64, cfg *FeedbackConfig) {
	if !l.looked || now-l.lookedAt > int64(cfg.Stale.Duration) {
		l.wantedSince = now
	}
	l.lookedAt, l.looked = now, true
}

// wanted reports whether placement wants the engines' readings: it
// weighed the domain within Stale.
func (l *capacityLoop) wanted(now int64, cfg *FeedbackConfig) bool {
	return l.looked && now-l.lookedAt <= int64(cfg.Stale.Duration)
}

// starved reports whether placement has wanted the engines' readings for
// Stale or longer with none fresh: whoever should relay them does not.
func (l *capacityLoop) starved(now int64, cfg *FeedbackConfig) bool {
	return l.wanted(now, cfg) && !l.fresh(now, cfg) && now-l.wantedSince >= int64(cfg.Stale.Duration)
}

// relay records a signal another replica read, as the shared state
// relayed it; one that is no reading is dropped, as ObserveEngines skips
// it.
func (l *capacityLoop) relay(now int64, r sharing.EngineReading, cfg *FeedbackConfig) {
	if !saneReading(r.Queue, r.Running, r.KVUsage) {
		return
	}
	l.observe(now, EngineSignal{Queue: r.Queue, Running: r.Running, KVUsage: r.KVUsage, Age: r.Age}, cfg)
}

// recentPlacements is how many placement times a domain's loop keeps:
// enough for the default queue threshold's burst and more.
const recentPlacements = 16

// place counts a request placed on the domain at now. Its time matters
// only once the engines have been read (to the first reading every
// placement is older); a domain without engines never writes the ring.
func (l *capacityLoop) place(now int64) {
	l.placed++
	if l.hasSig {
		l.recent[l.next%recentPlacements] = now
		l.next++
	}
}

// placedAfter is how many of the requests placed since the last reading
// were placed after at. Beyond the ring's reach, older placements count
// as after it: the guard errs on the side of the engines. (Placements
// before the first reading are not in the ring: that reading is taken
// to hold them all.)
func (l *capacityLoop) placedAfter(at int64) int {
	n, inRing := 0, min(l.placed, l.next, recentPlacements)
	for n < inRing && l.recent[(l.next-1-n)%recentPlacements] > at {
		n++
	}
	if n == recentPlacements {
		return l.placed
	}
	return n
}

// saneReading reports whether each of vs is a finite number ≥ 0. The
// engine reader checks each engine's values before it sums a domain's
// (internal/enginemetrics); this is the loop's own check of what reaches
// it, from any caller or another replica.
func saneReading(vs ...float64) bool {
	for _, v := range vs {
		if !(v >= 0) || math.IsInf(v, 0) {
			return false
		}
	}
	return true
}

// fresh reports whether the last signal is young enough to act on.
func (l *capacityLoop) fresh(now int64, cfg *FeedbackConfig) bool {
	return l.hasSig && now-l.sigAt <= int64(cfg.Stale.Duration)
}

// guardHold is why the saturation guard keeps a domain to its floors.
type guardHold uint8

const (
	holdNone guardHold = iota
	// holdSaturated: the engines were saturated at the last step, or
	// their fresh signal says they are (held from the reading, not from
	// the next step).
	holdSaturated
	// holdFilled: the requests placed since the fresh signal, counted as
	// waiting, take its queue to the threshold.
	holdFilled
)

// hold reports whether, and why, the guard keeps the domain to its
// floors now.
func (l *capacityLoop) hold(now int64, cfg *FeedbackConfig) guardHold {
	fresh := l.fresh(now, cfg)
	switch {
	case l.saturated || fresh && saturatedBy(l.sig, cfg):
		return holdSaturated
	case fresh && saturatedBy(EngineSignal{Queue: l.sig.Queue + float64(l.placed)}, cfg):
		return holdFilled
	}
	return holdNone
}

// saturatedBy reports whether s says the engines are saturated: their
// queue at the threshold or past it, or their KV use past its threshold.
// The guard keeps the queue within the threshold: at it, the domain takes
// nothing more (hold counts the placements since the signal the same
// way), and a queue that stands there is cut as one past it is.
func saturatedBy(s EngineSignal, cfg *FeedbackConfig) bool {
	return s.Queue >= cfg.QueueThreshold || s.KVUsage > cfg.KVThreshold
}

// released counts a released request's actual cost, and the time to first
// token the router measured (0: not reported), in the window.
func (l *capacityLoop) released(actual pd.Cost, ttft time.Duration) {
	l.servedP += float64(max(actual.PrefillFLOP, 0))
	l.servedD += float64(max(actual.DecodeBytes, 0))
	if ttft > 0 && len(l.ttfts) < maxWindowTTFTs {
		l.ttfts = append(l.ttfts, ttft)
	}
}

// maxWindowTTFTs bounds the times kept per window (a median of the first
// ones is as good).
const maxWindowTTFTs = 4096

// step runs one control period at now for the domain's capacity c
// (soft is the share of peak its rates are); it reports whether the
// factor or the guard changed.
func (l *capacityLoop) step(now int64, cfg *FeedbackConfig, c *pd.DomainCapacity, soft float64) bool {
	factor, saturated := l.factor, l.saturated
	elapsed := now - l.stepAt
	p, d := c.Taken()
	takenP, takenD := p-l.takenP, d-l.takenD
	l.stepAt, l.takenP, l.takenD = now, p, d
	// Demand is against this replica's buckets (its share, where several
	// share the domain); load against the whole domain, so that a share
	// that shrinks as a replica uses a domain less does not make it look
	// busier, and the replica use it less still.
	demand := max(used(takenP, c.PrefillRate(), elapsed), used(takenD, c.DecodeRate(), elapsed)) >= demandShare
	fullP, fullD, fullKV := c.FullLimits()
	usedP, usedD := used(takenP, fullP, elapsed), used(takenD, fullD, elapsed)
	l.use += cfg.LoadSmoothing * (max(usedP, usedD) - l.use)
	l.useP += cfg.LoadSmoothing * (usedP - l.useP)
	l.useD += cfg.LoadSmoothing * (usedD - l.useD)
	l.load = l.use
	if kv, _ := c.KV(); fullKV > 0 {
		l.load = max(l.load, float64(kv)/float64(fullKV))
	}

	if l.fresh(now, cfg) {
		if saturatedBy(l.sig, cfg) {
			l.saturated, l.clearSince = true, 0
			if l.satSince >= 0 && now-l.satSince >= int64(cfg.CutAfter.Duration) {
				l.factor *= cfg.Decrease
			}
		} else {
			l.saturated = false
			if l.clearSince == 0 {
				l.clearSince = now
			}
			switch clearFor := int64(cfg.ClearPeriods) * int64(cfg.Period.Duration); {
			case now-l.clearSince < clearFor:
			case l.factor < l.calibrated: // the guard's cut alone: undo one a period
				l.factor = min(l.factor/cfg.Decrease, l.calibrated)
			case demand:
				l.factor += cfg.Increase
			}
		}
		l.load = max(l.load, l.sig.Queue/max(cfg.QueueThreshold, 1), l.sig.KVUsage/cfg.KVThreshold)
	} else {
		l.saturated, l.clearSince = false, 0
	}
	if now-l.winStart >= int64(cfg.Window.Duration) {
		l.calibrate(now, cfg, c, soft)
	}
	if l.factor < l.calibrated { // the guard's cut: never into the floors' reserve
		l.factor = max(l.factor, min(l.calibrated, floorsFactor(c)))
	}
	l.factor = bounded(l.factor, cfg)
	if l.factor != factor {
		c.SetFactor(now, int64(math.Round(l.factor*pd.FactorFull)))
	}
	return l.factor != factor || l.saturated != saturated
}

// floorsFactor is the least factor at which the domain's rates hold its
// floors' reserves, the larger of prefill's and decode's, rounded up to
// the next step SetFactor takes (0 without a model).
func floorsFactor(c *pd.DomainCapacity) float64 {
	priorP, priorD := c.PriorRates()
	if priorP <= 0 || priorD <= 0 {
		return 0
	}
	rp, rd := c.ReserveRates()
	f := max(float64(rp)/float64(priorP), float64(rd)/float64(priorD))
	return (math.Ceil(f*pd.FactorFull) + 1) / pd.FactorFull
}

// used is the share of what rate refills in elapsed nanoseconds that
// taken is (0 without either).
func used(taken, rate, elapsed int64) float64 {
	if rate <= 0 || elapsed <= 0 {
		return 0
	}
	return max(float64(taken), 0) / (float64(rate) * float64(elapsed) / float64(time.Second))
}

// demandShare is the share of a period's refill taken that counts as
// demand: the domain's buckets, not its traffic, bound what it runs.
const demandShare = 0.8

// bounded is f within [MinFactor, MaxFactor].
func bounded(f float64, cfg *FeedbackConfig) float64 {
	return min(max(f, cfg.MinFactor), cfg.MaxFactor)
}

// calibrate closes the window: if the engines were busy throughout it,
// what the domain served is what it sustains, and the factor moves toward
// soft · sustained / the model's rate (the phase nearer its limit
// decides: the other served only what was asked of it), which is then
// its calibrated value. Where the guard has cut the factor below its
// calibrated value, the window moves that value instead, and the factor
// no higher than it: the cut stays the guard's, to recover from, and one
// window moves what the factor recovers to by calibration_step at most
// (a window the guard held to its floors, on readings that lied, moves
// it that much, not down to the cut).
//
// One bound goes further than a step: a window busy by the engines'
// queue (work waiting in nine of ten readings) ran them at what they
// sustain, and measured ÷ soft is the factor at which the model's soft
// rates are all of it. A calibrated value above that admits more than
// the engines sustain, not merely more than soft_fraction of it (engines
// that slowed, a halving): it drops there at once, and the factor no
// higher, where steps of calibration_step would take a window each while
// the guard's recoveries saturate them again. A window that served no
// more than the floors' reserve measured the guard's hold, not the
// engines, and moves a step.
func (l *capacityLoop) calibrate(now int64, cfg *FeedbackConfig, c *pd.DomainCapacity, soft float64) {
	secs := float64(now-l.winStart) / float64(time.Second)
	busy := ""
	switch {
	case l.fresh(now, cfg) && l.signals > 0 && float64(l.queued) >= busyShare*float64(l.signals):
		busy = busyQueue
	case !l.fresh(now, cfg) && len(l.ttfts) > 0 && medianDuration(l.ttfts) > cfg.BusyTTFT.Duration:
		busy = busyTTFT
	}
	if priorP, priorD := c.PriorRates(); busy != "" && secs > 0 && priorP > 0 && priorD > 0 {
		peakP, peakD := float64(priorP)/soft, float64(priorD)/soft
		measured := max(l.servedP/secs/peakP, l.servedD/secs/peakD)
		l.lastMeasure, l.lastMeasureKind = measured, busy
		switch sustained := measured / soft; {
		case busy == busyQueue && sustained < l.calibrated && sustained > floorsFactor(c):
			l.calibrated = bounded(sustained, cfg)
			l.factor = min(l.factor, l.calibrated)
		case l.factor < l.calibrated:
			l.calibrated = bounded(toward(l.calibrated, measured, cfg), cfg)
			l.factor = min(l.factor, l.calibrated)
		default:
			l.factor = bounded(toward(l.factor, measured, cfg), cfg)
			l.calibrated = l.factor
		}
	}
	l.winStart, l.servedP, l.servedD, l.signals, l.queued = now, 0, 0, 0, 0
	l.ttfts = l.ttfts[:0]
}

// toward is f moved toward measured by calibration_step at most, or f
// where they are within the deadband.
func toward(f, measured float64, cfg *FeedbackConfig) float64 {
	if diff := measured - f; math.Abs(diff) >= cfg.Deadband {
		return f + max(min(diff, cfg.CalibrationStep), -cfg.CalibrationStep)
	}
	return f
}

// busyShare is the share of a window's signals that must show a waiting
// queue for the engines to count as busy throughout it.
const busyShare = 0.9

// What made a calibration window busy.
const (
	busyQueue = "engine queue"
	busyTTFT  = "time to first token"
)

func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// feedbackInfo is the loop's state for DomainInfo.
func (l *capacityLoop) info(now int64, cfg *FeedbackConfig, info *DomainInfo) {
	info.CapacityFactor = l.factor
	info.EngineSaturated = l.saturated
	info.PrefillUse, info.DecodeUse, info.Load = l.useP, l.useD, l.load
	if l.hasSig {
		info.EngineQueue, info.EngineKVUsage = l.sig.Queue, l.sig.KVUsage
		info.EngineMetricsAge = time.Duration(now - l.sigAt)
		info.EngineMetricsStale = !l.fresh(now, cfg)
	}
}

// stepFeedback runs the capacity loops once a period; the floor reserves
// are spread again when a factor moved. The dispatcher is woken when a
// guard lifted, by the caller.
func (p *placer) stepFeedback(now int64) (lifted bool) {
	cfg := &p.cfg.Feedback
	if now-p.feedbackAt < int64(cfg.Period.Duration) {
		return false
	}
	p.feedbackAt = now
	moved := false
	p.leastLoad = math.Inf(1)
	for _, d := range p.domains {
		if d.removed {
			continue
		}
		was := d.loop.saturated
		if d.loop.step(now, cfg, d.cap, p.cfg.Capacity.SoftFraction) {
			moved = true
			lifted = lifted || (was && !d.loop.saturated)
		}
		p.leastLoad = min(p.leastLoad, d.loop.load)
	}
	if moved {
		p.changed()
		p.rates.gen = 0 // the eligible rates moved
	}
	return lifted
}
