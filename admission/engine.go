package admission

import (
	"context"
	"fmt"
	"iter"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
)

const (
	// tickIdle and tickBusy are how soon Run ticks again with the queue
	// empty and with requests waiting.
	tickIdle = 50 * time.Millisecond
	tickBusy = time.Millisecond
	// sweepEvery is how long the idle sweep takes to pass over every
	// active tenant once (sweepIdleLocked).
	sweepEvery = 10 * time.Second
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

// Engine is the admission decision engine. Its state lives in four
// components — the tenant gates, the placer, the waiting room and the
// lease table — all guarded by one mutex; the engine orchestrates a
// decision across them and holds no logic of its own beyond that. A
// decision is a handful of integer bucket operations under the lock. It is
// safe for concurrent use.
type Engine struct {
	clk      clock.Clock
	base     time.Time // the zero of the engine's monotonic nanosecond scale
	observer Observer
	shared   sharing.Strategy // embedded unless WithSharedState
	optErr   error            // an invalid option, reported by New
	// deferredExpired hears of each deferrable request's lease that
	// ended without a Release (OnDeferredLeaseExpired).
	deferredExpired atomic.Pointer[func(leaseID uint64)]

	// Goroutines the engine starts (the shared strategy's loop, store
	// calls that need not delay an answer); Close ends and waits for them.
	life     context.Context
	stopLife context.CancelFunc
	bg       sync.WaitGroup

	mu struct {
		sync.Mutex
		cfg    *Config
		gates  tenantGates
		place  placer
		room   waitingRoom
		leases leaseTable
		closed bool
	}
}

// New builds an engine serving cfg on cluster. cfg is defaulted and
// validated (also against the cluster: floors must fit soft capacity).
func New(cfg Config, cluster topology.Cluster, opts ...Option) (*Engine, error) {
	e := &Engine{clk: clock.Real{}, shared: embedded{}}
	for _, o := range opts {
		o(e)
	}
	if e.optErr != nil {
		return nil, e.optErr
	}
	e.base = e.clk.Now()
	e.life, e.stopLife = context.WithCancel(context.Background())
	e.mu.gates.tenants = make(map[string]*tenantState)
	e.mu.place.byID = make(map[string]*domainState)
	e.mu.place.drainedAway = make(map[string]string)
	e.mu.room.idem = newIdempotency()
	e.mu.room.wake = make(chan struct{}, 1)
	e.mu.leases = newLeaseTable()
	if err := cluster.Validate(); err != nil {
		return nil, fmt.Errorf("topology: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.applyLocked(&cfg, true, &cluster, e.nowLocked(), true, false); err != nil {
		return nil, err
	}
	return e, nil
}

// nowLocked returns the engine's monotonic time in nanoseconds.
func (e *Engine) nowLocked() int64 { return int64(e.clk.Since(e.base)) }

// Run dispatches queued requests, expires leases and runs the shared
// strategy's background work until ctx ends or the engine is closed. The
// server runs it in one goroutine; tests call Tick on a manual clock instead.
func (e *Engine) Run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(e.life, cancel)()
	e.background(func() { e.shared.Run(ctx) })
	t := time.NewTimer(time.Millisecond)
	defer t.Stop()
	for {
		t.Reset(e.Tick())
		select {
		case <-ctx.Done():
			return
		case <-e.mu.room.wake:
		case <-t.C:
		}
	}
}

// background runs fn in a goroutine Close waits for; once the engine is
// closed it runs fn at once instead.
func (e *Engine) background(fn func()) {
	e.mu.Lock()
	closed := e.mu.closed
	if !closed {
		e.bg.Add(1) // under the lock, before Close can wait
	}
	e.mu.Unlock()
	if closed {
		fn()
		return
	}
	go func() {
		defer e.bg.Done()
		fn()
	}()
}

// engineView is the engine as the shared-state strategies see it
// (sharing.View: its lock, clock, tenants, domains and leases, and
// nothing else; sharing.Readings: its domains' capacity loops). It is the one thing outside the engine that reaches into
// the engine's rooms, so that it lives here, beside them.
type engineView struct{ e *Engine }

func (e *Engine) view() engineView { return engineView{e} }

func (v engineView) Lock()            { v.e.mu.Lock() }
func (v engineView) Unlock()          { v.e.mu.Unlock() }
func (v engineView) NowLocked() int64 { return v.e.nowLocked() }
func (v engineView) Wall() time.Time  { return v.e.clk.Now() }

func (v engineView) TenantsLocked() iter.Seq[sharing.Tenant] {
	return func(yield func(sharing.Tenant) bool) {
		for _, t := range v.e.mu.gates.tenants {
			if !yield(t) {
				return
			}
		}
	}
}

func (v engineView) TenantLocked(name string) sharing.Tenant {
	if t := v.e.mu.gates.tenants[name]; t != nil {
		return t
	}
	return nil // not a nil *tenantState in the interface
}

func (v engineView) DomainsLocked() iter.Seq[sharing.Domain] {
	return func(yield func(sharing.Domain) bool) {
		for _, d := range v.e.mu.place.domains {
			if !yield(d) {
				return
			}
		}
	}
}

func (v engineView) DomainLocked(id string) sharing.Domain {
	if d := v.e.mu.place.byID[id]; d != nil {
		return d
	}
	return nil
}

func (v engineView) LeaseLocked(id uint64) (sharing.Charge, bool) {
	l, ok := v.e.mu.leases.get(id)
	if !ok {
		return sharing.Charge{}, false
	}
	return l.sharedCharge(), true
}

func (v engineView) RevokeLocked(requestID string, id uint64) { v.e.revokeLocked(requestID, id) }
func (v engineView) LeaseTTLLocked() time.Duration            { return v.e.mu.cfg.Leases.TTL.Duration }
func (v engineView) Background(fn func())                     { v.e.background(fn) }

// The engine-reading relay's port (sharing.Readings): the domains'
// capacity loops.

func (v engineView) OwnEngineReadingLocked(d sharing.Domain) (sharing.EngineReading, int64, bool) {
	return d.(*domainState).loop.ownReading(v.e.nowLocked())
}

func (v engineView) EngineReadingWantedLocked(d sharing.Domain) bool {
	return d.(*domainState).loop.wanted(v.e.nowLocked(), &v.e.mu.place.cfg.Feedback)
}

func (v engineView) RelayEngineReadingLocked(d sharing.Domain, r sharing.EngineReading) {
	d.(*domainState).loop.relay(v.e.nowLocked(), r, &v.e.mu.place.cfg.Feedback)
}

// Tick does the engine's timed work at the clock's current time: it rejects
// queued requests whose deadline has come (or degrades them, where they
// accept a lower tier that fits), expires leases and idempotency
// records, moves domain health and dispatches what now fits. It returns how
// soon it wants to run again.
func (e *Engine) Tick() time.Duration {
	var answered []*waiter
	e.mu.Lock()
	now := e.nowLocked()
	room := &e.mu.room
	for w := room.overdue(now); w != nil; w = room.overdue(now) {
		if !e.degradeOverdueLocked(now, w) {
			room.reject(now, w, refusal{ReasonDeadlineUnmeetable, room.positionWait(w, e.mu.place.eligibleRates)})
		}
		answered = append(answered, w)
	}
	var expiredDeferred []uint64
	var storeWork []func(context.Context)
	for l, id, ok := e.mu.leases.popExpired(now); ok; l, id, ok = e.mu.leases.popExpired(now) {
		if !l.ticketed {
			l.expire(now)
			continue
		}
		// A worker that died holding deferred work: the ticket is
		// delivered again and charged then, so this lease is settled
		// as unused (accounted once).
		l.Settle(now, pd.Cost{}, 0, 0)
		if work := e.shared.ReleasedLocked(id, l.sharedCharge(), 0, pd.Cost{}); work != nil {
			storeWork = append(storeWork, work)
		}
		expiredDeferred = append(expiredDeferred, id)
	}
	room.idem.expire(now, e.mu.cfg.Leases.IdempotencyTTL.Duration)
	e.mu.place.tick(now)
	e.mu.place.stepFeedback(now)
	e.shareFloorsLocked(now)
	answered = e.dispatchLocked(now, answered)
	e.mu.gates.sweepIdleLocked(now)
	next := tickIdle
	if room.queue.Len() > 0 {
		next = tickBusy
	}
	e.mu.Unlock()
	finish(answered)
	for _, work := range storeWork {
		work(e.life)
	}
	if fn := e.deferredExpired.Load(); fn != nil {
		for _, id := range expiredDeferred {
			(*fn)(id)
		}
	}
	return next
}

// OnDeferredLeaseExpired sets fn to hear, outside the engine's lock, of
// each deferrable request's lease that reached its TTL unreleased: the
// engine settled it as unused, and the backlog delivers its ticket again.
func (e *Engine) OnDeferredLeaseExpired(fn func(leaseID uint64)) {
	e.deferredExpired.Store(&fn)
}

// RevokeLease takes back an admission nobody will run (a deferred ticket
// whose worker could not be reached, or that was cancelled meanwhile): its
// charge is cancelled as if it had never been admitted and requestID, if
// any, forgotten. It reports whether the lease was live.
func (e *Engine) RevokeLease(requestID string, leaseID uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.mu.leases.get(leaseID); !ok {
		return false
	}
	e.revokeLocked(requestID, leaseID)
	return true
}

// LeaseTTL is the configured lease lifetime.
func (e *Engine) LeaseTTL() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mu.cfg.Leases.TTL.Duration
}

// WeightedTokens is what a request of these token counts weighs against
// quotas: prompt + output_token_weight × output.
func (e *Engine) WeightedTokens(prompt, output int64) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return prompt + e.mu.cfg.OutputTokenWeight*output
}

// Deferral is the configured deferral section.
func (e *Engine) Deferral() DeferralConfig {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mu.cfg.Deferral
}

// finish wakes the goroutines of answered waiters, outside the lock.
func finish(ws []*waiter) {
	for _, w := range ws {
		close(w.done)
	}
}

// Close answers every queued request with SHUTTING_DOWN (the client retries
// on another replica), refuses new ones, and ends and waits for the
// goroutines the engine started. Leases stay valid until released.
func (e *Engine) Close() {
	e.mu.Lock()
	e.mu.closed = true
	now := e.nowLocked()
	answered := e.mu.room.waiters()
	for _, w := range answered {
		e.mu.room.reject(now, w, refusal{ReasonShuttingDown, time.Second})
	}
	e.mu.Unlock()
	finish(answered)
	e.stopLife()
	e.bg.Wait()
}

// Drain stops new placements on a domain; its leases run to completion.
func (e *Engine) Drain(domain, reason string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mu.place.setDrain(e.nowLocked(), domain, true, reason)
}

// DrainAhead drains domain now if the engine has it, or else from the
// moment it appears (a control plane's mark for a domain whose node agents
// have not published yet, or are restarting): there is no window in which
// it takes placements. Undrain clears it either way.
func (e *Engine) DrainAhead(domain, reason string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.mu.place.drainAhead(domain, reason)
}

// Undrain makes a drained domain eligible again; its shared capacity warms
// up (Config.Warmup).
func (e *Engine) Undrain(domain string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.mu.place.setDrain(e.nowLocked(), domain, false, ""); err != nil {
		return err
	}
	e.mu.room.wakeDispatcher()
	return nil
}

// Domains describes every domain, in cluster order.
func (e *Engine) Domains() []DomainInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.nowLocked()
	out := make([]DomainInfo, 0, len(e.mu.place.domains))
	for _, d := range e.mu.place.domains {
		out = append(out, d.info(now, &e.mu.cfg.Feedback))
	}
	return out
}

// Tenants describes every configured tenant, sorted by name.
func (e *Engine) Tenants() []TenantInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.nowLocked()
	names := e.mu.gates.index.sortedNames()
	out := make([]TenantInfo, 0, len(names))
	for _, n := range names {
		out = append(out, e.mu.gates.infoLocked(n, now, e.base))
	}
	return out
}

// Tenant describes one tenant.
func (e *Engine) Tenant(name string) (TenantInfo, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.mu.gates.index.find(name); !ok {
		return TenantInfo{}, false
	}
	return e.mu.gates.infoLocked(name, e.nowLocked(), e.base), true
}

// QueueLen returns how many requests wait in the fair queue.
func (e *Engine) QueueLen() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mu.room.queue.Len()
}

// IdempotencyRecords returns how many request ids are remembered and how
// many the bound on their count has forgotten before their TTL.
func (e *Engine) IdempotencyRecords() (records int, evicted uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mu.room.idem.records(), e.mu.room.idem.evicted
}

// LeaseCount returns how many leases are held.
func (e *Engine) LeaseCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mu.leases.len()
}
