package admission

import (
	"time"

	"github.com/sluice-sched/sluice/internal/rendezvous"
	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
)

// domainState is one NVLink domain as the engine sees it: its soft capacity,
// drain mark, health weight and in-flight count.
type domainState struct {
	topo        topology.Domain
	cap         *pd.DomainCapacity
	hash        uint64 // rendezvous node hash of the id
	idx         int    // index in placer.domains and its rendezvous tree
	draining    bool
	drainReason string
	removed     bool // left the cluster; only its leases still refer to it
	inFlight    int
	health      health
	loop        capacityLoop // the capacity correction from what its engines report and sustain
}

func newDomainState(d topology.Domain, c *pd.DomainCapacity, now int64) *domainState {
	return &domainState{topo: d, cap: c, hash: rendezvous.NodeHash(d.ID), health: health{weight: 1, windowStart: now}, loop: newCapacityLoop(now)}
}

// ID returns the domain id.
func (d *domainState) ID() string { return d.topo.ID }

// The domain as the shared-state strategies see it (sharing.Domain).

// Removed reports whether the domain has left the cluster.
func (d *domainState) Removed() bool { return d.removed }

// Capacity returns the domain's soft capacity.
func (d *domainState) Capacity() *pd.DomainCapacity { return d.cap }

// RestoreCapacity makes the capacity whole again after a share: the
// limits of the domain's own topology, the levels kept.
func (d *domainState) RestoreCapacity() {
	_ = d.cap.Resize(&d.topo) // the same domain: cannot fail
}

// eligible reports whether new requests may be placed on the domain.
func (d *domainState) eligible() bool {
	return !d.draining && !d.removed && d.cap.GPUs() > 0 // the capacity counts the healthy GPUs
}

// info describes the domain for operators.
func (d *domainState) info(now int64, fb *FeedbackConfig) DomainInfo {
	p, dec := d.cap.Levels(now)
	kv, kvLimit := d.cap.KV()
	warm, warmEnd := d.cap.Warmup(now)
	left := time.Duration(0)
	if warmEnd != 0 {
		left = time.Duration(warmEnd - now)
	}
	fullP, fullD, _ := d.cap.FullLimits()
	priorP, priorD := d.cap.PriorRates()
	info := DomainInfo{
		ID:           d.ID(),
		Kind:         d.topo.Kind,
		GPUs:         d.topo.GPUCount(),
		Draining:     d.draining,
		DrainReason:  d.drainReason,
		HealthWeight: d.health.weight,
		InFlight:     d.inFlight,
		PrefillRate:  d.cap.PrefillRate(),
		PrefillLevel: p,
		PrefillBurst: d.cap.PrefillBurst(),
		DecodeRate:   d.cap.DecodeRate(),
		DecodeLevel:  dec,
		DecodeBurst:  d.cap.DecodeBurst(),
		KVInUse:      kv,
		KVLimit:      kvLimit,
		ReservedFrac: d.cap.ReservedFraction(),

		WarmupFraction: float64(warm) / pd.WarmupFull, // display only
		WarmupLeft:     left,

		EffectivePrefillRate: fullP,
		EffectiveDecodeRate:  fullD,
		PriorPrefillRate:     priorP,
		PriorDecodeRate:      priorD,
		FloorsShort:          d.cap.FloorsShort(),
	}
	d.loop.info(now, fb, &info)
	return info
}

// health turns Release outcomes into a placement weight: above the error
// rate the weight is cut; after a cool-down it climbs back in steps.
type health struct {
	weight      float64
	ok, errs    int64
	windowStart int64
	nextStep    int64 // when the next recovery step may happen; 0 when healthy
}

// record counts one Release outcome and cuts the weight when the window's
// error rate passes the threshold. It reports whether the weight changed.
func (h *health) record(hc *HealthConfig, now int64, failed bool) bool {
	if now-h.windowStart >= int64(hc.Window.Duration) {
		h.ok, h.errs, h.windowStart = 0, 0, now
	}
	if failed {
		h.errs++
	} else {
		h.ok++
	}
	total := h.ok + h.errs
	if total < hc.MinSamples || float64(h.errs) <= hc.ErrorRate*float64(total) {
		return false
	}
	changed := h.weight != hc.CutWeight
	h.weight = hc.CutWeight
	h.nextStep = now + int64(hc.Cooldown.Duration)
	h.ok, h.errs, h.windowStart = 0, 0, now
	return changed
}

// step moves a cut weight one step back up once its time has come. It
// reports whether the weight changed.
func (h *health) step(hc *HealthConfig, now int64) bool {
	if h.weight >= 1 || now < h.nextStep {
		return false
	}
	h.weight = min(1, h.weight+hc.Step)
	h.nextStep = now + int64(hc.StepEvery.Duration)
	return true
}

type unknownDomainError struct{ id string }

func (e *unknownDomainError) Error() string {
	return "domain " + e.id + ": " + ErrUnknownDomain.Error()
}
func (e *unknownDomainError) Unwrap() error { return ErrUnknownDomain }
