package admission

import (
	"fmt"

	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/wfq"
)

// Apply replaces the configuration without dropping in-flight or queued
// work: bucket levels, leases and the queue are kept. An invalid config is
// refused (a *ConfigError naming the key) and the current one keeps serving.
// The engine keeps its own copy of cfg.
func (e *Engine) Apply(cfg Config) error {
	e.mu.Lock()
	answered, err := e.applyLocked(&cfg, true, nil, e.nowLocked(), true, true)
	e.mu.Unlock()
	finish(answered)
	return err
}

// SetTopology replaces the cluster. Domains that remain keep their levels
// and leases; domains that leave get no new placements while their leases
// run to completion. Unlike a config, a cluster is not refused for floors
// it cannot hold: hardware that is gone cannot be kept by refusing to
// notice. Floors then get what there is (each domain's reserve is capped
// at its capacity, leaving shared traffic nothing) until capacity returns.
// Only an invalid cluster or one the catalog cannot serve is refused.
// Domains new to the engine, and domains whose healthy GPUs grew, warm up
// (Config.Warmup).
func (e *Engine) SetTopology(cluster topology.Cluster) error {
	return e.setTopology(cluster, true)
}

// SetStartupTopology is SetTopology without warm-up: the cluster replaces
// the one the engine started with as if it had been there from the start
// (a control plane's first cluster from its node agents, read at start-up).
func (e *Engine) SetStartupTopology(cluster topology.Cluster) error {
	return e.setTopology(cluster, false)
}

func (e *Engine) setTopology(cluster topology.Cluster, warm bool) error {
	if err := cluster.Validate(); err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	e.mu.Lock()
	cfg := e.mu.cfg.clone()
	answered, err := e.applyLocked(&cfg, false, &cluster, e.nowLocked(), false, warm)
	e.mu.Unlock()
	finish(answered)
	return err
}

// Config returns a copy of the configuration in force.
func (e *Engine) Config() Config {
	e.mu.Lock()
	defer e.mu.Unlock()
	cfg := e.mu.cfg.clone()
	cfg.Tenants = e.mu.gates.index.toMap()
	return cfg
}

// staged is the next configuration, built and checked in full before
// anything live changes.
type staged struct {
	cfg        Config // without its tenants, which are in tenants
	tenants    *tenantIndex
	cat        *pd.Catalog
	domains    []stagedDomain
	floorTotal int64
	weights    map[int64]int // tenants by weight
}

// stagedDomain is a domain of the next configuration.
type stagedDomain struct {
	live *domainState // nil for a domain new to the cluster
	topo topology.Domain
	cap  *pd.DomainCapacity
}

// applyLocked validates cfg (and cluster, when not nil) together and, only if
// both are good, swaps them in. With withTenants, cfg's tenants replace the
// configured ones; without, cfg's are ignored and the configured ones stay.
// With warm, domains that join or gain healthy GPUs warm up (never on the
// first apply: domains present at start-up start whole). It returns the queued requests it had to answer
// (their model is gone).
func (e *Engine) applyLocked(in *Config, withTenants bool, cluster *topology.Cluster, now int64, checkFloors, warm bool) ([]*waiter, error) {
	keep := e.mu.gates.index
	if withTenants {
		keep = nil
	}
	st, err := e.mu.place.stage(in, keep, cluster, now, checkFloors)
	if err != nil {
		return nil, err
	}
	// Commit: nothing below can fail.
	old := e.mu.cfg
	e.mu.cfg = &st.cfg
	p := &e.mu.place
	p.cfg, p.cat, p.floorTotal, p.weights = &st.cfg, st.cat, st.floorTotal, st.weights
	p.maxWeight = p.highestWeight()
	p.rebuildModels()
	warming := p.commitDomains(st.domains, now, warm && old != nil, func(at int64, d *domainState, was *pd.DomainCapacity) {
		e.shared.CapacityRebuiltLocked(at, d, was)
	})
	if old != nil && warmupChanged(&old.Warmup, &st.cfg.Warmup) {
		p.retuneWarmups(now)
	}
	e.mu.gates.reconfigureLocked(&st.cfg, st.tenants, now, p.modelList, func(t *tenantState) {
		e.shared.TenantReadyLocked(t, now, true)
	})
	q := st.cfg.Queue
	qc := wfq.Config{MaxPerFlow: q.MaxPerFlow, MaxTotal: q.MaxTotal, MaxCritical: q.MaxCritical}
	e.mu.room.idem.configure(st.cfg.Leases.IdempotencyTTL.Duration, st.cfg.Leases.MaxIdempotencyRecords)
	e.mu.room.tiers.window = int64(q.TierShareWindow.Duration)
	if e.mu.room.queue == nil {
		e.mu.room.queue = wfq.New(qc)
	} else {
		e.mu.room.queue.SetConfig(qc)
	}
	// Queued requests point at the new catalog's models; those whose model
	// is gone are answered.
	var answered []*waiter
	for _, w := range e.mu.room.waiters() {
		if !p.reresolve(&w.p) {
			e.mu.room.reject(now, w, refusal{ReasonCapacityExceeded, 0})
			answered = append(answered, w)
			continue
		}
		if w.p.ntiers == 1 {
			w.lowerOnly = false // its lower tiers are gone: it waits for its own
		}
	}
	p.changed()
	p.unawait()                 // the domains may be new: the next dispatch pass says again
	for _, w := range warming { // after changed: each ramp starts above the floor reserve
		p.startWarmup(now, w.d, w.from)
	}
	return answered, nil
}

// stage builds the next configuration: cfg defaulted and validated, its
// tenants indexed (or, with keep, the tenants of keep, the index in force,
// kept), its catalog, and every domain's capacity built from them,
// carrying the live levels and KV over (on the cluster given, or the
// placer's current one). Floors are checked against the new capacity when
// checkFloors is set.
func (p *placer) stage(in *Config, keep *tenantIndex, cluster *topology.Cluster, now int64, checkFloors bool) (*staged, error) {
	st := &staged{cfg: in.cloneSettings(), weights: make(map[int64]int)}
	cfg := &st.cfg
	cfg.SetDefaults()
	if keep == nil {
		cfg.Tenants = in.Tenants // read here, copied into the index below
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cat, err := pd.NewCatalog(cfg.Models)
	if err != nil {
		return nil, cfgWrap("models", err)
	}
	st.cat = cat
	var topos []topology.Domain
	if cluster != nil {
		topos = cluster.Domains
	} else {
		for _, d := range p.domains {
			topos = append(topos, d.topo)
		}
	}
	if len(topos) == 0 {
		return nil, fmt.Errorf("topology: the cluster has no domains")
	}
	caps := make([]*pd.DomainCapacity, 0, len(topos))
	for i := range topos {
		d := &topos[i]
		c, err := pd.NewDomainCapacity(d, cat, cfg.Capacity, now)
		if err != nil {
			return nil, fmt.Errorf("topology: domain %s: %w", d.ID, err)
		}
		live := p.byID[d.ID]
		if live != nil {
			c.CopyLevels(now, live.cap)
		}
		st.domains = append(st.domains, stagedDomain{live: live, topo: *d, cap: c})
		caps = append(caps, c)
	}
	if keep != nil {
		st.tenants, st.floorTotal, st.weights = keep, p.floorTotal, p.weights
	} else {
		for _, tc := range cfg.Tenants {
			pol, _ := cfg.policyOf(tc)
			st.floorTotal += pol.Floor
			st.weights[pol.Weight]++
		}
		st.tenants = newTenantIndex(cfg.Tenants, cfg.Tiers)
		cfg.Tenants = nil
	}
	if checkFloors {
		if err := checkFloorsFit(cat, caps, st.floorTotal, cfg.OutputTokenWeight); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// commitDomains swaps the staged domains in. Domains that stay keep their
// objects, so leases and drains stay attached; their capacity is the
// rebuilt one (rebuilt is told). Domains that leave are marked removed:
// their leases finish, and a drained one comes back drained. With warm,
// domains new to the cluster and those whose healthy GPUs grew are
// returned, to warm up once the floor reserves are spread.
func (p *placer) commitDomains(staged []stagedDomain, now int64, warm bool, rebuilt func(now int64, d *domainState, old *pd.DomainCapacity)) []pendingWarmup {
	var warming []pendingWarmup
	domains := make([]*domainState, 0, len(staged))
	byID := make(map[string]*domainState, len(staged))
	for _, sd := range staged {
		d := sd.live
		var old *pd.DomainCapacity
		gpusBefore := 0 // a domain new to the cluster had none
		if d == nil {
			d = newDomainState(sd.topo, sd.cap, now)
			if reason, ok := p.drainedAway[sd.topo.ID]; ok {
				// It left while drained: it comes back drained, with no
				// window in which the control plane's mark is missing.
				d.draining, d.drainReason = true, reason
			}
		} else {
			old = d.cap
			gpusBefore = d.topo.HealthyGPUCount()
		}
		delete(p.drainedAway, sd.topo.ID)
		d.topo, d.cap, d.removed = sd.topo, sd.cap, false
		if gpus := sd.topo.HealthyGPUCount(); warm && !d.draining && gpus > gpusBefore { // a drained one warms at its undrain
			warming = append(warming, p.gainedGPUs(now, d, gpusBefore, gpus))
		}
		rebuilt(now, d, old)
		domains = append(domains, d)
		byID[d.ID()] = d
	}
	for id, d := range p.byID {
		if _, ok := byID[id]; !ok {
			d.removed = true // leases holding it finish; it is never placed on again
			if d.draining {
				p.drainedAway[id] = d.drainReason
			}
		}
	}
	p.domains, p.byID = domains, byID
	p.rebuildTree()
	return warming
}
