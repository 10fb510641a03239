package admission

import (
	"time"

	"github.com/sluice-sched/sluice/internal/tokenbucket"

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
	draining    bool
	drainReason string
	removed     bool // left the cluster; only its leases still refer to it
	inFlight    int
	health      health
}

// health turns Release outcomes into a placement weight: above the error
// rate the weight is cut; after a cool-down it climbs back in steps.
type health struct {
	weight      float64
	ok, errs    int64
	windowStart int64
	nextStep    int64 // when the next recovery step may happen; 0 when healthy
}

func newDomainState(d topology.Domain, c *pd.DomainCapacity, now int64) *domainState {
	return &domainState{topo: d, cap: c, hash: rendezvous.NodeHash(d.ID), health: health{weight: 1, windowStart: now}}
}

// ID returns the domain id.
func (d *domainState) ID() string { return d.topo.ID }

// eligible reports whether new requests may be placed on the domain.
func (d *domainState) eligible() bool {
	return !d.draining && !d.removed && d.topo.HealthyGPUCount() > 0
}

// recordOutcomeLocked counts one Release outcome and cuts the weight when the
// window's error rate passes the threshold. It reports whether the weight changed.
func (e *Engine) recordOutcomeLocked(d *domainState, now int64, failed bool) bool {
	hc := &e.mu.cfg.Health
	h := &d.health
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

// stepHealthLocked moves cut weights back up, one step per StepEvery after
// the cool-down.
func (e *Engine) stepHealthLocked(now int64) {
	hc := &e.mu.cfg.Health
	changed := false
	for _, d := range e.mu.domains {
		h := &d.health
		if h.weight >= 1 || now < h.nextStep {
			continue
		}
		h.weight = min(1, h.weight+hc.Step)
		h.nextStep = now + int64(hc.StepEvery.Duration)
		changed = true
	}
	if changed {
		e.mu.placeGen++
	}
}

// Drain stops new placements on a domain; its leases run to completion.
func (e *Engine) Drain(domain, reason string) error {
	return e.setDrain(domain, true, reason)
}

// DrainAhead drains domain now if the engine has it, or else from the
// moment it appears (a control plane's mark for a domain whose node agents
// have not published yet, or are restarting): there is no window in which
// it takes placements. Undrain clears it either way.
func (e *Engine) DrainAhead(domain, reason string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	d, ok := e.mu.domainByID[domain]
	if !ok {
		e.mu.drainedAway[domain] = reason
		return
	}
	d.draining, d.drainReason = true, reason
	e.placementChangedLocked()
}

// Undrain makes a drained domain eligible again.
func (e *Engine) Undrain(domain string) error {
	return e.setDrain(domain, false, "")
}

func (e *Engine) setDrain(domain string, draining bool, reason string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	d, ok := e.mu.domainByID[domain]
	if !ok {
		if _, away := e.mu.drainedAway[domain]; away && !draining {
			delete(e.mu.drainedAway, domain) // it will come back undrained
			return nil
		}
		return &unknownDomainError{domain}
	}
	d.draining, d.drainReason = draining, reason
	e.placementChangedLocked()
	if !draining {
		e.wakeDispatcher()
	}
	return nil
}

type unknownDomainError struct{ id string }

func (e *unknownDomainError) Error() string {
	return "domain " + e.id + ": " + ErrUnknownDomain.Error()
}
func (e *unknownDomainError) Unwrap() error { return ErrUnknownDomain }

// Domains describes every domain, in cluster order.
func (e *Engine) Domains() []DomainInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.nowLocked()
	out := make([]DomainInfo, 0, len(e.mu.domains))
	for _, d := range e.mu.domains {
		out = append(out, e.domainInfoLocked(d, now))
	}
	return out
}

func (e *Engine) domainInfoLocked(d *domainState, now int64) DomainInfo {
	p, dec := d.cap.Levels(now)
	kv, kvLimit := d.cap.KV()
	return DomainInfo{
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
	}
}

// durationUntil converts a wait into a Retry-After in [0, 24h], so that
// "never" stays a usable number on the wire.
func durationUntil(d time.Duration) time.Duration {
	return min(max(d, 0), 24*time.Hour)
}

// addSat adds two non-negative durations, saturating at tokenbucket.Never.
func addSat(a, b time.Duration) time.Duration {
	if a > tokenbucket.Never-b {
		return tokenbucket.Never
	}
	return a + b
}

// QueueLen returns how many requests wait in the fair queue.
func (e *Engine) QueueLen() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mu.queue.Len()
}

// LeaseCount returns how many leases are held.
func (e *Engine) LeaseCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mu.leases.len()
}
