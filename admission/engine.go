package admission

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/wfq"
)

// Observer receives every answer and release, outside the engine's lock.
// The metrics adapter implements it; it must be cheap and must not block.
type Observer interface {
	ObserveDecision(req Request, d Decision)
	ObserveRelease(rel Release, res ReleaseResult)
}

// Option configures an Engine.
type Option func(*Engine)

// WithClock sets the clock (default: the real one).
func WithClock(c clock.Clock) Option { return func(e *Engine) { e.clk = c } }

// WithObserver sets the observer of decisions and releases.
func WithObserver(o Observer) Option { return func(e *Engine) { e.observer = o } }

// Engine is the admission decision engine. All its state is in memory and
// guarded by one mutex; a decision is a handful of integer bucket operations
// under it. It is safe for concurrent use.
type Engine struct {
	clk      clock.Clock
	base     time.Time // the zero of the engine's monotonic nanosecond scale
	observer Observer
	wake     chan struct{} // nudges the dispatcher loop
	shared   *sharedSync   // nil when embedded
	optErr   error         // an invalid option, reported by New

	mu struct {
		sync.Mutex
		cfg         *Config
		cat         *pd.Catalog
		models      map[string]*modelState
		modelList   []*modelState
		tenants     map[string]*tenantState // active tenants; idle ones live only in cfg
		maxWeight   int64
		domains     []*domainState
		domainByID  map[string]*domainState
		drainedAway map[string]string // drain reasons of domains not in the cluster: drained when they (re)appear
		placeGen    uint64            // bumped whenever placement weights or eligibility change
		floorTotal  int64             // Σ configured floors, weighted tokens/s

		queue          *wfq.Queue
		deadlines      waiterHeap
		backlogPrefill int64 // Σ estimated prefill FLOPs of queued requests
		backlogDecode  int64
		blocked        []*domainState // during dispatch: domains reserved for waiting heads

		leases leaseTable

		idem    map[string]idemEntry
		commits map[uint64]chan struct{} // strict mode: leases whose store commit is in flight
		idemExp []idemExpiry
		idemOff int

		lastSweep int64
		closed    bool
	}
}

// New builds an engine serving cfg on cluster. cfg is defaulted and
// validated (also against the cluster: floors must fit soft capacity).
func New(cfg Config, cluster topology.Cluster, opts ...Option) (*Engine, error) {
	e := &Engine{clk: clock.Real{}, wake: make(chan struct{}, 1)}
	for _, o := range opts {
		o(e)
	}
	if e.optErr != nil {
		return nil, e.optErr
	}
	e.base = e.clk.Now()
	e.mu.tenants = make(map[string]*tenantState)
	e.mu.idem = make(map[string]idemEntry)
	e.mu.commits = make(map[uint64]chan struct{})
	e.mu.domainByID = make(map[string]*domainState)
	e.mu.drainedAway = make(map[string]string)
	if err := cluster.Validate(); err != nil {
		return nil, fmt.Errorf("topology: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.applyLocked(&cfg, &cluster, e.nowLocked(), true); err != nil {
		return nil, err
	}
	return e, nil
}

// nowLocked returns the engine's monotonic time in nanoseconds.
func (e *Engine) nowLocked() int64 { return int64(e.clk.Now().Sub(e.base)) }

// Apply replaces the configuration without dropping in-flight or queued
// work: bucket levels, leases and the queue are kept. An invalid config is
// refused (a *ConfigError naming the key) and the current one keeps serving.
// The engine keeps its own copy of cfg.
func (e *Engine) Apply(cfg Config) error {
	e.mu.Lock()
	answered, err := e.applyLocked(&cfg, nil, e.nowLocked(), true)
	e.mu.Unlock()
	e.finish(answered)
	return err
}

// SetTopology replaces the cluster. Domains that remain keep their levels
// and leases; domains that leave get no new placements while their leases
// run to completion. Unlike a config, a cluster is not refused for floors
// it cannot hold: hardware that is gone cannot be kept by refusing to
// notice. Floors then get what there is (each domain's reserve is capped
// at its capacity, leaving shared traffic nothing) until capacity returns.
// Only an invalid cluster or one the catalog cannot serve is refused.
func (e *Engine) SetTopology(cluster topology.Cluster) error {
	if err := cluster.Validate(); err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	e.mu.Lock()
	cfg := e.mu.cfg.clone()
	answered, err := e.applyLocked(&cfg, &cluster, e.nowLocked(), false)
	e.mu.Unlock()
	e.finish(answered)
	return err
}

// Config returns a copy of the configuration in force.
func (e *Engine) Config() Config {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mu.cfg.clone()
}

// stagedDomain is a domain of the next configuration, built before commit.
type stagedDomain struct {
	live *domainState // nil for a domain new to the cluster
	topo topology.Domain
	cap  *pd.DomainCapacity
}

// applyLocked validates cfg (and cluster, when not nil) together and, only if
// both are good, swaps them in. Every domain gets a new capacity built from
// the new catalog and config, carrying the live levels and KV over; the
// domain objects themselves are kept, so leases and drains stay attached.
// It returns the queued requests it had to answer (their model is gone).
func (e *Engine) applyLocked(in *Config, cluster *topology.Cluster, now int64, checkFloors bool) ([]*waiter, error) {
	cfg := in.clone()
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cat, err := pd.NewCatalog(cfg.Models)
	if err != nil {
		return nil, cfgErr("models", "%v", err)
	}

	var topos []topology.Domain
	if cluster != nil {
		topos = cluster.Domains
	} else {
		for _, d := range e.mu.domains {
			topos = append(topos, d.topo)
		}
	}
	if len(topos) == 0 {
		return nil, fmt.Errorf("topology: the cluster has no domains")
	}
	staged := make([]stagedDomain, 0, len(topos))
	caps := make([]*pd.DomainCapacity, 0, len(topos))
	for i := range topos {
		d := &topos[i]
		c, err := pd.NewDomainCapacity(d, cat, cfg.Capacity, now)
		if err != nil {
			return nil, fmt.Errorf("topology: domain %s: %w", d.ID, err)
		}
		live := e.mu.domainByID[d.ID]
		if live != nil {
			c.CopyLevels(now, live.cap)
		}
		staged = append(staged, stagedDomain{live: live, topo: *d, cap: c})
		caps = append(caps, c)
	}

	var floorTotal int64
	var maxWeight int64 = 1
	for name := range cfg.Tenants {
		p, _ := cfg.Policy(name)
		floorTotal += p.Floor
		maxWeight = max(maxWeight, p.Weight)
	}
	for _, p := range cfg.Tiers {
		maxWeight = max(maxWeight, p.Weight)
	}
	if checkFloors {
		if err := checkFloorsFit(cat, caps, floorTotal, cfg.OutputTokenWeight); err != nil {
			return nil, err
		}
	}

	// Commit: nothing below can fail.
	domains := make([]*domainState, 0, len(staged))
	byID := make(map[string]*domainState, len(staged))
	for _, sd := range staged {
		d := sd.live
		var old *pd.DomainCapacity
		if d == nil {
			d = newDomainState(sd.topo, sd.cap, now)
			if reason, ok := e.mu.drainedAway[sd.topo.ID]; ok {
				// It left while drained: it comes back drained, with no
				// window in which the control plane's mark is missing.
				d.draining, d.drainReason = true, reason
			}
		} else {
			old = d.cap
		}
		delete(e.mu.drainedAway, sd.topo.ID)
		d.topo, d.cap, d.removed = sd.topo, sd.cap, false
		if e.shared != nil {
			e.shared.capacityRebuiltLocked(now, d, old)
		}
		domains = append(domains, d)
		byID[d.ID()] = d
	}
	for id, d := range e.mu.domainByID {
		if _, ok := byID[id]; !ok {
			d.removed = true // leases holding it finish; it is never placed on again
			if d.draining {
				e.mu.drainedAway[id] = d.drainReason
			}
		}
	}
	e.mu.domains, e.mu.domainByID = domains, byID
	e.mu.cfg = &cfg
	e.mu.cat = cat
	e.mu.maxWeight = maxWeight
	e.mu.floorTotal = floorTotal
	e.rebuildModelsLocked()
	e.refreshTenantsLocked(now)
	qc := wfq.Config{MaxPerFlow: cfg.Queue.MaxPerFlow, MaxTotal: cfg.Queue.MaxTotal, MaxCritical: cfg.Queue.MaxCritical}
	if e.mu.queue == nil {
		e.mu.queue = wfq.New(qc)
	} else {
		e.mu.queue.SetConfig(qc)
	}
	answered := e.reresolveQueuedLocked(now)
	e.placementChangedLocked()
	return answered, nil
}

// reresolveQueuedLocked points queued requests at the new catalog's models.
// A request whose model is gone is answered CAPACITY_EXCEEDED; lower tiers
// that are gone or no longer in the chain are dropped.
func (e *Engine) reresolveQueuedLocked(now int64) []*waiter {
	var queued, answered []*waiter
	e.mu.queue.Each(func(it *wfq.Item) { queued = append(queued, it.Value.(*waiter)) })
	for _, w := range queued {
		m, ok := e.mu.models[w.p.tierBuf[0].name]
		if !ok {
			e.rejectQueuedLocked(now, w, ReasonCapacityExceeded, 0)
			answered = append(answered, w)
			continue
		}
		n := 1
		old := w.p.tierBuf
		w.p.tierBuf[0] = m
		for _, li := range m.chain {
			for _, o := range old[1:w.p.ntiers] {
				if e.mu.modelList[li].name == o.name {
					w.p.tierBuf[n] = e.mu.modelList[li]
					n++
				}
			}
		}
		w.p.ntiers = n
	}
	return answered
}

// checkFloorsFit refuses floors that exceed soft capacity, converting weighted
// tokens with the catalog's most expensive model (see reserveRates).
func checkFloorsFit(cat *pd.Catalog, caps []*pd.DomainCapacity, floorTotal, outWeight int64) error {
	if floorTotal == 0 {
		return nil
	}
	var prefillCap, decodeCap, prefillNeed, decodeNeed float64
	for _, c := range caps {
		pr, dr := reservePerToken(cat, c, outWeight)
		prefillCap += float64(c.PrefillRate())
		decodeCap += float64(c.DecodeRate())
		// Weighted by the domain's share, as reserves are spread.
		prefillNeed += pr * float64(c.PrefillRate())
		decodeNeed += dr * float64(c.DecodeRate())
	}
	if !(prefillCap > 0 && decodeCap > 0) {
		return cfgErr("tenants", "floors total %d weighted tokens/s but the cluster has no capacity", floorTotal)
	}
	prefillNeed = prefillNeed / prefillCap * float64(floorTotal)
	decodeNeed = decodeNeed / decodeCap * float64(floorTotal)
	if !(prefillNeed <= prefillCap && decodeNeed <= decodeCap) {
		return cfgErr("tenants", "floors total %d weighted tokens/s, which needs %.3g FLOP/s of prefill and %.3g B/s of decode; soft capacity is %.3g FLOP/s and %.3g B/s",
			floorTotal, prefillNeed, decodeNeed, prefillCap, decodeCap)
	}
	return nil
}

// reservePerToken is what one weighted token of floor costs in a domain:
// counted as a prompt token of the largest model for prefill, and as
// 1/outWeight of one of its output tokens at a 2k-token context for decode.
// Floors are therefore reserved for the most expensive traffic a tenant can send.
func reservePerToken(cat *pd.Catalog, c *pd.DomainCapacity, outWeight int64) (prefill, decode float64) {
	m := cat.Largest()
	p, err1 := c.Cost(m, 1, 0)
	d, err2 := c.Cost(m, 2048, 1)
	if err1 != nil || err2 != nil {
		return 0, 0
	}
	return float64(p.PrefillFLOP), float64(d.DecodeBytes) / float64(outWeight)
}

// placementChangedLocked recomputes floor reserves over the eligible domains
// and invalidates cached rendezvous orders.
func (e *Engine) placementChangedLocked() {
	e.mu.placeGen++
	var prefillCap, decodeCap float64
	for _, d := range e.mu.domains {
		if d.eligible() {
			prefillCap += float64(d.cap.PrefillRate())
			decodeCap += float64(d.cap.DecodeRate())
		}
	}
	for _, d := range e.mu.domains {
		if !d.eligible() || e.mu.floorTotal == 0 {
			d.cap.SetReserve(0, 0)
			continue
		}
		pr, dr := reservePerToken(e.mu.cat, d.cap, e.mu.cfg.OutputTokenWeight)
		f := float64(e.mu.floorTotal)
		prefill := pr * f * float64(d.cap.PrefillRate()) / prefillCap
		decode := dr * f * float64(d.cap.DecodeRate()) / decodeCap
		d.cap.SetReserve(int64(math.Min(prefill, math.MaxInt64/2)), int64(math.Min(decode, math.MaxInt64/2)))
	}
}

// wakeDispatcher nudges Run without blocking.
func (e *Engine) wakeDispatcher() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Run dispatches queued requests and expires leases until ctx ends. The
// server runs it in one goroutine; tests call Tick on a manual clock instead.
func (e *Engine) Run(ctx context.Context) {
	if e.shared != nil {
		go e.runShared(ctx)
	}
	t := time.NewTimer(time.Millisecond)
	defer t.Stop()
	for {
		next := e.Tick()
		t.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
			if !t.Stop() {
				<-t.C
			}
		case <-t.C:
		}
	}
}

// Tick does the engine's timed work at the clock's current time: it rejects
// queued requests whose deadline has come, expires leases and idempotency
// records, moves domain health and dispatches what now fits. It returns how
// soon it wants to run again.
func (e *Engine) Tick() time.Duration {
	var answered []*waiter
	e.mu.Lock()
	now := e.nowLocked()
	answered = e.expireDeadlinesLocked(now, answered)
	e.expireLeasesLocked(now)
	e.expireIdempotencyLocked(now)
	e.stepHealthLocked(now)
	answered = e.dispatchLocked(now, answered)
	if now-e.mu.lastSweep >= int64(10*time.Second) {
		e.sweepIdleTenantsLocked(now)
		e.mu.lastSweep = now
	}
	next := 50 * time.Millisecond
	if e.mu.queue.Len() > 0 {
		next = time.Millisecond
	}
	e.mu.Unlock()
	e.finish(answered)
	return next
}

// finish wakes the goroutines of answered waiters, outside the lock.
func (e *Engine) finish(ws []*waiter) {
	for _, w := range ws {
		close(w.done)
	}
}

// Close answers every queued request with SHUTTING_DOWN (the client retries
// on another replica) and refuses new ones. Leases stay valid until released
// or expired.
func (e *Engine) Close() {
	var answered []*waiter
	e.mu.Lock()
	e.mu.closed = true
	now := e.nowLocked()
	e.mu.queue.Each(func(it *wfq.Item) {
		w := it.Value.(*waiter)
		answered = append(answered, w)
	})
	for _, w := range answered {
		e.rejectQueuedLocked(now, w, ReasonShuttingDown, time.Second)
	}
	e.mu.Unlock()
	e.finish(answered)
}
