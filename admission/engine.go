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

	mu struct {
		sync.Mutex
		cfg        *Config
		cat        *pd.Catalog
		models     map[string]*modelState
		modelList  []*modelState
		tenants    map[string]*tenantState // active tenants; idle ones live only in cfg
		maxWeight  int64
		domains    []*domainState
		domainByID map[string]*domainState
		placeGen   uint64 // bumped whenever placement weights or eligibility change
		floorTotal int64  // Σ configured floors, weighted tokens/s

		queue          *wfq.Queue
		deadlines      waiterHeap
		backlogPrefill int64 // Σ estimated prefill FLOPs of queued requests
		backlogDecode  int64
		blocked        []*domainState // during dispatch: domains reserved for waiting heads

		leases leaseTable

		idem    map[string]idemEntry
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
	e.base = e.clk.Now()
	e.mu.tenants = make(map[string]*tenantState)
	e.mu.idem = make(map[string]idemEntry)
	e.mu.domainByID = make(map[string]*domainState)
	if err := cluster.Validate(); err != nil {
		return nil, fmt.Errorf("topology: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.applyLocked(&cfg, &cluster, e.nowLocked()); err != nil {
		return nil, err
	}
	return e, nil
}

// nowLocked returns the engine's monotonic time in nanoseconds.
func (e *Engine) nowLocked() int64 { return int64(e.clk.Now().Sub(e.base)) }

// Apply replaces the configuration without dropping in-flight or queued
// work: bucket levels, leases and the queue are kept. An invalid config is
// refused (a *ConfigError naming the key) and the current one keeps serving.
func (e *Engine) Apply(cfg Config) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.applyLocked(&cfg, nil, e.nowLocked())
}

// SetTopology replaces the cluster. Domains that remain keep their levels
// and leases; domains that leave get no new placements while their leases
// run to completion.
func (e *Engine) SetTopology(cluster topology.Cluster) error {
	if err := cluster.Validate(); err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.applyLocked(e.mu.cfg, &cluster, e.nowLocked())
}

// Config returns a copy of the configuration in force.
func (e *Engine) Config() Config {
	e.mu.Lock()
	defer e.mu.Unlock()
	return *e.mu.cfg
}

// applyLocked validates cfg (and cluster, when not nil) together and, only if
// both are good, swaps them in.
func (e *Engine) applyLocked(in *Config, cluster *topology.Cluster, now int64) error {
	cfg := *in
	cfg.Tiers = make(map[string]TierPolicy, len(in.Tiers))
	for k, v := range in.Tiers {
		cfg.Tiers[k] = v
	}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	cat, err := pd.NewCatalog(cfg.Models)
	if err != nil {
		return cfgErr("models", "%v", err)
	}

	// Build the new domain set off to the side, reusing live state.
	var domains []*domainState
	if cluster != nil {
		for i := range cluster.Domains {
			d := &cluster.Domains[i]
			if old, ok := e.mu.domainByID[d.ID]; ok && !old.removed {
				if err := old.cap.Resize(d); err != nil {
					return fmt.Errorf("topology: domain %s: %w", d.ID, err)
				}
				old.topo = *d
				domains = append(domains, old)
				continue
			}
			c, err := pd.NewDomainCapacity(d, cat, cfg.Capacity, now)
			if err != nil {
				return fmt.Errorf("topology: domain %s: %w", d.ID, err)
			}
			domains = append(domains, newDomainState(*d, c, now))
		}
	} else {
		for _, d := range e.mu.domains {
			c, err := pd.NewDomainCapacity(&d.topo, cat, cfg.Capacity, now)
			if err != nil {
				return fmt.Errorf("topology: domain %s: %w", d.ID(), err)
			}
			c.CopyLevels(now, d.cap)
			domains = append(domains, &domainState{topo: d.topo, cap: c, health: d.health, draining: d.draining, drainReason: d.drainReason, inFlight: d.inFlight})
		}
	}
	if len(domains) == 0 {
		return fmt.Errorf("topology: the cluster has no domains")
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
	if err := checkFloorsFit(cat, domains, floorTotal, cfg.OutputTokenWeight); err != nil {
		return err
	}

	// Commit.
	oldByID := e.mu.domainByID
	e.mu.domainByID = make(map[string]*domainState, len(domains))
	for _, d := range domains {
		e.mu.domainByID[d.ID()] = d
	}
	for id, d := range oldByID {
		if _, ok := e.mu.domainByID[id]; !ok {
			d.removed = true // leases holding it finish; it is never placed on again
		}
	}
	e.mu.domains = domains
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
	e.placementChangedLocked()
	return nil
}

// checkFloorsFit refuses floors that exceed soft capacity, converting weighted
// tokens with the catalog's most expensive model (see reserveRates).
func checkFloorsFit(cat *pd.Catalog, domains []*domainState, floorTotal, outWeight int64) error {
	if floorTotal == 0 {
		return nil
	}
	var prefillCap, decodeCap, prefillNeed, decodeNeed float64
	for _, d := range domains {
		pr, dr := reservePerToken(cat, d.cap, outWeight)
		prefillCap += float64(d.cap.PrefillRate())
		decodeCap += float64(d.cap.DecodeRate())
		// Weighted by the domain's share, as reserves are spread.
		prefillNeed += pr * float64(d.cap.PrefillRate())
		decodeNeed += dr * float64(d.cap.DecodeRate())
	}
	prefillNeed = prefillNeed / prefillCap * float64(floorTotal)
	decodeNeed = decodeNeed / decodeCap * float64(floorTotal)
	if prefillNeed > prefillCap || decodeNeed > decodeCap {
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
