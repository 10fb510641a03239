package deferral

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/indexheap"
	"github.com/sluice-sched/sluice/wfq"
)

// Tuning of the drain loop.
const (
	// drainEvery is how often the backlog tries its heads without being
	// woken (capacity refills without an event).
	drainEvery = 20 * time.Millisecond
	// adoptEvery is how often it asks the store for tickets of replicas
	// that stopped.
	adoptEvery = 5 * time.Second
	// scanLimit is how many tenants' heads one pick looks past when the
	// fairest does not fit (over its quota, say): as the interactive
	// dispatcher's.
	scanLimit = 8
	// grantBatch is the most tickets one pass admits before writing their
	// claims, so that the store groups the writes.
	grantBatch = 256
	// retainFinal is how long a final ticket stays in memory for GetTicket
	// and for a submitter's retried request id.
	retainFinal = 10 * time.Minute
	// writeRetries is how often a failed write of a new ticket or of a
	// final state is tried again (10 ms, 20 ms, … apart).
	writeRetries = 5
	// finishParallel is how many expiries are written at once.
	finishParallel = 128
	// writeTimeout bounds a ticket's write that no longer waits on its
	// caller (a router or worker that went away must not leave the store
	// and the backlog disagreeing on a ticket).
	writeTimeout = 10 * time.Second
)

// Errors of the ticket calls.
var (
	// ErrClaimed: the ticket is running on a worker; it can no longer be
	// cancelled (the worker releases it).
	ErrClaimed = errors.New("deferral: ticket already claimed by a worker")
	// ErrNotYours: the caller may not see or cancel this tenant's ticket.
	ErrNotYours = errors.New("deferral: ticket of another tenant")
	// ErrClosed: the backlog is shutting down.
	ErrClosed = errors.New("deferral: backlog closed")
)

// Answer is the backlog's reply to Admit: the engine's decision, or
// DEFERRED with a ticket.
type Answer struct {
	Decision admission.Decision
	Ticket   string // on DEFERRED answers
	// Message explains a QUEUE_FULL from the backlog's bounds.
	Message string
}

// Delivery is deferred work admitted for a worker: the ticket (with the
// lease its Claim names) and the engine's decision.
type Delivery struct {
	Record   Record
	Decision admission.Decision
}

// ClaimOptions say which work a worker takes.
type ClaimOptions struct {
	// Tenants and Models, when not empty, restrict the work to these.
	Tenants, Models []string
	// Allow, if set, is asked whether the worker may serve a tenant (its
	// principal's binding).
	Allow func(tenant string) bool
	// MaxInFlight is how many claimed, unreleased tickets the worker
	// holds at most; 0 means 1.
	MaxInFlight int
}

// Counts are the backlog's events since start, for metrics.
type Counts struct {
	Deferred    atomic.Uint64 // tickets issued
	QueueFull   atomic.Uint64 // deferrable requests refused at the backlog's bounds
	Claimed     atomic.Uint64 // tickets admitted and handed to a worker
	Redelivered atomic.Uint64 // claimed tickets pending again (lease expired, worker gone)
	Done        atomic.Uint64
	Expired     atomic.Uint64
	Cancelled   atomic.Uint64
}

// Counts returns the backlog's event counters.
func (b *Backlog) Counts() *Counts { return &b.counts }

// Backlog holds deferred tickets and admits them, in weighted fair order
// across tenants, on the capacity interactive traffic leaves, to workers
// that claim them. It is safe for concurrent use.
type Backlog struct {
	engine *admission.Engine
	store  Store
	clk    clock.Clock
	log    *slog.Logger
	wake   chan struct{}
	counts Counts
	// quit closes when the backlog closes: Claim streams end. stop ends
	// the drain loop Start began, and stopped closes once it has.
	quit     chan struct{}
	quitOnce sync.Once
	stop     context.CancelFunc
	stopped  chan struct{}
	// granting serialises grant passes, which decide without mu.
	granting sync.Mutex

	mu struct {
		sync.Mutex
		queue     *wfq.Queue                      // pending tickets, a flow per tenant
		deadlines indexheap.Heap[ticket, *ticket] // pending tickets by defer_within
		held      map[string]*ticket              // pending and claimed, by id
		byRequest map[requestKey]*ticket          // by the submitter's request id
		byLease   map[uint64]*ticket              // claimed, by lease
		parked    []*ticket                       // claimed before a restart: pending again once their lease would have ended
		final     []*ticket                       // final, in the order they ended, kept retainFinal
		finalByID map[string]*ticket              // the same, by id: Get answers them from memory
		perTenant map[string]*tenantLine          // held tickets per tenant (and additions under way)
		total     int
		claimers  map[*claimer]struct{}
		closed    bool
	}
}

type requestKey struct{ tenant, id string }

// tenantLine is one tenant's part of the backlog, kept as tickets move so
// that reading the backlog costs its tenants, not its tickets.
type tenantLine struct {
	held    int // pending, claimed, and additions under way
	claimed int
	byAge   indexheap.Heap[ageRef, *ageRef] // pending tickets, oldest submission first
}

// ageRef is a pending ticket's place in its tenant's byAge heap.
type ageRef struct {
	tk  *ticket
	idx int
}

// Less orders by submission (indexheap.Element).
func (a *ageRef) Less(o *ageRef) bool { return a.tk.rec.Created.Before(o.tk.rec.Created) }

// HeapIndex is the place in the heap (indexheap.Element).
func (a *ageRef) HeapIndex() *int { return &a.idx }

// lineLocked returns tenant's line, made on first use.
func (b *Backlog) lineLocked(tenant string) *tenantLine {
	l := b.mu.perTenant[tenant]
	if l == nil {
		l = &tenantLine{}
		b.mu.perTenant[tenant] = l
	}
	return l
}

// ticket is one held ticket.
type ticket struct {
	rec     Record
	item    wfq.Item
	heapIdx int
	age     ageRef
	claimer *claimer // while claimed
	why     admission.Reason
	ended   time.Time // when it became final
	// stored closes once a new ticket's Add has returned, with storeErr
	// its error: a repeated request id is answered only then. nil for
	// tickets read from the store.
	stored   chan struct{}
	storeErr error
	// unsure is the lease of a claim this replica wrote that the store
	// may still hold: a claim write that failed (it may have been written
	// all the same), or one whose Unclaim failed. The next claim that finds
	// it there takes it back rather than take it for another replica's.
	unsure uint64
}

// Less orders tickets by deadline (indexheap.Element).
func (t *ticket) Less(u *ticket) bool { return t.rec.Deadline.Before(u.rec.Deadline) }

// HeapIndex is t's place in the deadlines heap (indexheap.Element).
func (t *ticket) HeapIndex() *int { return &t.heapIdx }

// claimer is a worker's Claim stream.
type claimer struct {
	opts   ClaimOptions
	tenant map[string]bool
	model  map[string]bool
	free   int // slots for more work
	out    chan Delivery
}

func (c *claimer) accepts(w *Work) bool {
	return (len(c.tenant) == 0 || c.tenant[w.Tenant]) &&
		(len(c.model) == 0 || c.model[w.Model]) &&
		(c.opts.Allow == nil || c.opts.Allow(w.Tenant))
}

// New returns a backlog admitting through engine and keeping its tickets
// in store. Call Start before serving: it takes back the store's
// unfinished tickets and runs the drain loop until ctx ends.
func New(engine *admission.Engine, store Store, clk clock.Clock, log *slog.Logger) *Backlog {
	if clk == nil {
		clk = clock.Real{}
	}
	if log == nil {
		log = slog.Default()
	}
	b := &Backlog{engine: engine, store: store, clk: clk, log: log, wake: make(chan struct{}, 1), quit: make(chan struct{})}
	b.mu.queue = wfq.New(wfq.Config{})
	b.mu.held = make(map[string]*ticket)
	b.mu.finalByID = make(map[string]*ticket)
	b.mu.byRequest = make(map[requestKey]*ticket)
	b.mu.byLease = make(map[uint64]*ticket)
	b.mu.perTenant = make(map[string]*tenantLine)
	b.mu.claimers = make(map[*claimer]struct{})
	engine.OnDeferredLeaseExpired(b.leaseExpired)
	return b
}

// Start adopts the store's unfinished tickets (a restart takes its backlog
// back) and runs the drain loop in a goroutine until ctx ends. A store
// that does not answer is not fatal: the loop adopts again every
// adoptEvery, and Start reports the first failure.
func (b *Backlog) Start(ctx context.Context) error {
	ctx, b.stop = context.WithCancel(ctx)
	b.stopped = make(chan struct{})
	err := b.adopt(ctx)
	go func() {
		defer close(b.stopped)
		b.run(ctx)
	}()
	return err
}

// Close ends the drain loop and waits for it, and ends the workers' Claim
// streams (ErrClosed). No ticket is admitted after Close returns, so that
// an engine closed next (it refuses everything SHUTTING_DOWN) takes no
// ticket with it: the tickets wait in the store for the next start.
func (b *Backlog) Close() {
	b.quitOnce.Do(func() { close(b.quit) })
	if b.stop != nil {
		b.stop()
		<-b.stopped
	}
	b.mu.Lock()
	b.mu.closed = true
	b.mu.Unlock()
}

func (b *Backlog) run(ctx context.Context) {
	drain := time.NewTicker(drainEvery)
	defer drain.Stop()
	adopt := time.NewTicker(adoptEvery)
	defer adopt.Stop()
	for {
		select {
		case <-ctx.Done():
			b.mu.Lock()
			b.mu.closed = true
			b.mu.Unlock()
			return
		case <-adopt.C:
			if err := b.adopt(ctx); err != nil {
				b.log.Warn("deferral: adopting tickets", "err", err)
			}
		case <-drain.C:
		case <-b.wake:
		}
		b.Step(ctx)
	}
}

// Step does the backlog's timed work once at the clock's time: tickets
// past their defer_within expire, tickets parked by a restart return, and
// pending tickets are admitted for the workers that wait. The drain loop
// calls it; tests on a manual clock call it themselves.
func (b *Backlog) Step(ctx context.Context) {
	b.expire(ctx)
	for ctx.Err() == nil && b.grant(ctx) {
	}
}

// Admit decides a request: one that is not deferrable, or that can run
// now, is the engine's; one the engine defers gets a durable ticket (the
// same ticket for a repeated request id), or QUEUE_FULL when the backlog
// is at its bounds. Invalid requests are the engine's
// *admission.InvalidArgumentError.
func (b *Backlog) Admit(ctx context.Context, req admission.Request) (Answer, error) {
	if !req.Deferrable {
		d, err := b.engine.Admit(ctx, req)
		return Answer{Decision: d}, err
	}
	key := requestKey{req.Tenant, req.RequestID}
	if req.RequestID != "" {
		if tk := b.holding(key); tk != nil {
			return b.repeat(ctx, tk, req)
		}
	}
	d, err := b.engine.Admit(ctx, req)
	if err != nil || d.Outcome != admission.Deferred {
		return Answer{Decision: d}, err
	}
	cfg := b.engine.Deferral()
	within := req.DeferWithin
	if within == 0 {
		within = cfg.DefaultWithin.Duration
	}
	now := b.clk.Now()
	tk := &ticket{heapIdx: -1, why: d.Reason, stored: make(chan struct{}), rec: Record{
		ID: newTicketID(), Work: workOf(req), Created: now, Deadline: now.Add(within), State: StatePending,
	}}
	other, msg := b.reserve(tk, key, cfg)
	switch {
	case other != nil: // the same request id, arrived meanwhile
		return b.repeat(ctx, other, req)
	case msg != "":
		out := d
		out.Outcome, out.Reason, out.RetryAfter = admission.Rejected, admission.ReasonQueueFull, time.Second
		b.counts.QueueFull.Add(1)
		return Answer{Decision: out, Message: msg}, nil
	}
	// The write does not end with the caller: a router that gave up may
	// retry with its request id, and must find the ticket written or not
	// at all, not half (in Redis, added but held by nobody). A failed
	// write is tried again (Add is idempotent): one whose answer was lost
	// is then found written.
	wctx, cancel := detached(ctx)
	var seq uint64
	err = retried(wctx, func() (err error) {
		seq, err = b.store.Add(wctx, tk.rec)
		return err
	})
	cancel()
	if err != nil {
		tk.storeErr = err
		close(tk.stored)
		b.unreserve(tk, key)
		return Answer{}, fmt.Errorf("deferral: storing ticket: %w", err)
	}
	tk.rec.Seq = seq
	b.mu.Lock()
	b.enqueueLocked(tk, d.Trace.WeightedTokens)
	b.mu.Unlock()
	close(tk.stored)
	b.counts.Deferred.Add(1)
	b.nudge()
	return Answer{Decision: d, Ticket: tk.rec.ID}, nil
}

// holding returns the ticket the backlog holds for a request id, if any.
func (b *Backlog) holding(key requestKey) *ticket {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.byRequest[key]
}

// repeat answers a repeated request id with its ticket, once the ticket's
// first write has returned: DEFERRED only for a ticket in the store. An
// id reused with a different request is the engine's INVALID_ARGUMENT,
// whatever the ticket's state.
func (b *Backlog) repeat(ctx context.Context, tk *ticket, req admission.Request) (Answer, error) {
	b.mu.Lock()
	first := tk.request()
	b.mu.Unlock()
	if err := admission.CheckRepeat(&first, &req); err != nil {
		return Answer{}, fmt.Errorf("deferral: request id %q: %w", req.RequestID, err)
	}
	if tk.stored != nil {
		select {
		case <-tk.stored:
		case <-ctx.Done():
			return Answer{}, fmt.Errorf("deferral: waiting for the ticket of request id %q: %w", req.RequestID, ctx.Err())
		}
		if tk.storeErr != nil {
			return Answer{}, fmt.Errorf("deferral: storing ticket: %w", tk.storeErr)
		}
	}
	b.mu.Lock()
	why := tk.why
	b.mu.Unlock()
	d := admission.Decision{Outcome: admission.Deferred, Reason: why}
	d.Trace.Tenant, d.Trace.Model = req.Tenant, req.Model
	return Answer{Decision: d, Ticket: tk.rec.ID}, nil
}

// reserve counts tk against the bounds before it is stored, and notes its
// request id so that a concurrent repeat joins it. It returns the ticket
// a concurrent request with the same id reserved first, or why not when a
// bound is reached.
func (b *Backlog) reserve(tk *ticket, key requestKey, cfg admission.DeferralConfig) (*ticket, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if key.id != "" {
		if other := b.mu.byRequest[key]; other != nil {
			return other, ""
		}
	}
	line := b.lineLocked(key.tenant)
	n := line.held
	switch {
	case n >= cfg.MaxPerTenant:
		return nil, fmt.Sprintf("deferred backlog of tenant %q holds %d tickets, its bound deferral.max_per_tenant", key.tenant, n)
	case b.mu.total >= cfg.MaxTotal:
		return nil, fmt.Sprintf("deferred backlog holds %d tickets, its bound deferral.max_total", b.mu.total)
	}
	line.held++
	b.mu.total++
	if key.id != "" {
		b.mu.byRequest[key] = tk
	}
	return nil, ""
}

func (b *Backlog) unreserve(tk *ticket, key requestKey) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.uncountLocked(key.tenant)
	b.unlinkRequestLocked(tk)
}

// unlinkRequestLocked forgets tk's request id, if it is tk's.
func (b *Backlog) unlinkRequestLocked(tk *ticket) {
	key := requestKey{tk.rec.Work.Tenant, tk.rec.Work.RequestID}
	if b.mu.byRequest[key] == tk {
		delete(b.mu.byRequest, key)
	}
}

func (b *Backlog) uncountLocked(tenant string) {
	l := b.lineLocked(tenant)
	if l.held--; l.held <= 0 {
		delete(b.mu.perTenant, tenant)
	}
	b.mu.total--
}

// enqueueLocked puts a pending ticket in the fair order and the deadline
// heap. cost is its weighted tokens.
func (b *Backlog) enqueueLocked(tk *ticket, cost int64) {
	b.mu.held[tk.rec.ID] = tk
	tk.item = wfq.Item{
		Cost:   uint64(max(cost, 1)),
		Weight: uint64(max(b.weightOf(tk.rec.Work.Tenant), 1)),
		Flow:   wfq.FlowKey{Tenant: tk.rec.Work.Tenant},
		Value:  tk,
	}
	if err := b.mu.queue.Enqueue(&tk.item); err != nil {
		// The queue has no bounds: only a ticket enqueued twice fails.
		b.log.Error("deferral: ticket enqueued twice", "ticket", tk.rec.ID, "err", err)
		return
	}
	b.mu.deadlines.Push(tk)
	tk.age = ageRef{tk: tk, idx: -1}
	b.lineLocked(tk.rec.Work.Tenant).byAge.Push(&tk.age)
}

// unpendLocked takes a pending ticket out of the tenant's age order, once
// it has left the fair queue (admitted, expired, cancelled).
func (b *Backlog) unpendLocked(tk *ticket) {
	if l := b.mu.perTenant[tk.rec.Work.Tenant]; l != nil {
		l.byAge.Remove(&tk.age)
	}
}

func (b *Backlog) weightOf(tenant string) int64 {
	if info, ok := b.engine.Tenant(tenant); ok {
		return info.Weight
	}
	return 1
}

// grantRec is a ticket a grant pass took from the fair order: admitted
// for claimer c with decision d, or (c nil) ended with its reason.
type grantRec struct {
	tk *ticket
	c  *claimer
	d  admission.Decision
}

// tried is what the engine answered one head of the fair order.
type tried struct {
	tk *ticket
	// take: the head leaves the order (admitted, or ended: ended says
	// why). Otherwise why is the reason it waits, and holdsOthers whether
	// the heads behind it wait too.
	take        bool
	ended       string
	d           admission.Decision
	why         admission.Reason
	holdsOthers bool
}

// try asks the engine about one head, without the backlog's lock.
func (b *Backlog) try(ctx context.Context, tk *ticket) tried {
	d, err := b.engine.Admit(ctx, tk.request())
	switch {
	case err != nil:
		// Invalid now (its model left the catalog): it expires with
		// the reason.
		return tried{tk: tk, take: true, ended: err.Error()}
	case d.Outcome == admission.Deferred:
		// A head held back by capacity holds the capacity it waits
		// for: the heads behind it in fair order are not tried (else
		// smaller tickets take every refill and a large one waits
		// forever, and shares drift from the weights). One held back by
		// its own tenant's limits (quota, concurrency, budget) is passed
		// over.
		return tried{tk: tk, why: d.Reason, holdsOthers: d.Reason == admission.ReasonCapacityExceeded || d.Reason == admission.ReasonInteractiveFirst}
	case d.Outcome == admission.Rejected && !everRefused(d.Reason):
		// What passes (an engine shutting down, shared state out of
		// reach or over the tenant's quota there): the ticket waits,
		// and so, for what holds every ticket, do the heads behind it.
		return tried{tk: tk, why: d.Reason, holdsOthers: d.Reason != admission.ReasonQuotaExceeded}
	case d.Outcome == admission.Rejected:
		return tried{tk: tk, take: true, ended: "refused: " + d.Reason.String()}
	}
	return tried{tk: tk, take: true, d: d}
}

// grantOne takes one ticket from the fair order: it picks the heads a
// worker would take (at most scanLimit a band) under the lock, asks the
// engine about them in order without it until one is taken or holds the
// rest, and serves that one under the lock again. more is false when no
// head was taken; g is empty when the head taken had left the order
// meanwhile, or its worker had (then the next heads may be tried).
func (b *Backlog) grantOne(ctx context.Context) (g grantRec, more bool) {
	b.mu.Lock()
	var heads []*ticket
	if b.freeClaimersLocked() {
		b.mu.queue.Dequeue(func(it *wfq.Item) bool {
			if tk := it.Value.(*ticket); b.claimerForLocked(&tk.rec.Work) != nil {
				heads = append(heads, tk)
			}
			return false // only looking: nothing leaves the order here
		}, scanLimit)
	}
	b.mu.Unlock()
	var passed []tried
	var took tried
	for _, tk := range heads {
		t := b.try(ctx, tk)
		if t.take {
			took = t
			break
		}
		passed = append(passed, t)
		if t.holdsOthers {
			break
		}
	}

	b.mu.Lock()
	for _, t := range passed {
		t.tk.why = t.why
	}
	tk := took.tk
	var c *claimer
	if tk != nil && took.ended == "" {
		c = b.claimerForLocked(&tk.rec.Work)
	}
	// A worker gone meanwhile leaves the ticket in its place; one that
	// left the order meanwhile (cancelled, expired) is not served.
	if tk == nil {
		b.mu.Unlock()
		return grantRec{}, false
	}
	if (took.ended == "" && c == nil) || !b.mu.queue.Serve(&tk.item) {
		b.mu.Unlock()
		if took.ended == "" {
			b.engine.RevokeLease("", took.d.LeaseID)
		}
		return grantRec{}, true
	}
	b.mu.deadlines.Remove(tk)
	b.unpendLocked(tk)
	if took.ended != "" {
		tk.rec.Reason = took.ended
		b.mu.Unlock()
		return grantRec{tk: tk}, true
	}
	b.lineLocked(tk.rec.Work.Tenant).claimed++
	c.free--
	tk.claimer = c
	b.mu.byLease[took.d.LeaseID] = tk
	b.mu.Unlock()
	return grantRec{tk: tk, c: c, d: took.d}, true
}

// grant admits up to grantBatch pending tickets in fair order for the
// workers that have room, writes their claims and hands them over. It
// reports whether any ticket moved on (handed over, or ended): then the
// caller tries again; a pass whose every claim write failed waits for the
// next drain instead.
//
// The engine is asked without the backlog's lock (in strict mode each
// Admit is a round trip to Redis, and Admit, Claim, Get and Cancel must
// not wait behind a batch of them): the heads to try are chosen under the
// lock, decided without it, and the one granted is served under it again
// in the place it held (wfq.Queue.Serve), unless it left the queue
// meanwhile (cancelled, expired), when its admission is revoked.
func (b *Backlog) grant(ctx context.Context) bool {
	b.granting.Lock() // one pass at a time: a head is tried by one pass
	defer b.granting.Unlock()
	var grants []grantRec
	for len(grants) < grantBatch {
		g, more := b.grantOne(ctx)
		if !more {
			break
		}
		if g.tk != nil {
			grants = append(grants, g)
		}
	}
	if len(grants) == 0 {
		return false
	}
	ttl := b.engine.LeaseTTL()
	var wg sync.WaitGroup
	var moved atomic.Bool
	for i := range grants {
		g := &grants[i]
		if g.c == nil {
			b.finish(ctx, g.tk, StateExpired, g.tk.rec.Reason)
			moved.Store(true)
			continue
		}
		at := b.clk.Now()
		claim := Claim{LeaseID: g.d.LeaseID, Domain: g.d.Domain, Model: g.d.Model, At: at, Expires: at.Add(ttl)}
		wg.Go(func() {
			if b.hand(ctx, g.tk, g.c, g.d, claim) {
				moved.Store(true)
			}
		})
	}
	wg.Wait()
	return moved.Load()
}

// everRefused reports whether the engine refuses a deferrable request for
// reason whatever the wait: the ticket ends. The engine answers any other
// refusal for what passes, and the ticket waits.
func everRefused(reason admission.Reason) bool {
	switch reason {
	case admission.ReasonUnknownTenant, admission.ReasonRequestTooLarge, admission.ReasonCapacityExceeded:
		return true
	}
	return false
}

// hand writes an admitted ticket's claim and gives it to its worker; it
// reports whether the ticket moved on (handed over, or found final). A
// ticket cancelled meanwhile (through another replica), a store that
// failed, or a worker gone takes the admission back.
func (b *Backlog) hand(ctx context.Context, tk *ticket, c *claimer, d admission.Decision, claim Claim) bool {
	cur, ok, err := b.store.Claim(ctx, tk.rec.ID, claim)
	if err != nil {
		b.log.Warn("deferral: writing a claim", "ticket", tk.rec.ID, "err", err)
	}
	b.mu.Lock()
	_, present := b.mu.claimers[c]
	if err == nil && ok && present {
		tk.rec.State, tk.rec.Claim = StateClaimed, claim
		select {
		case c.out <- Delivery{Record: tk.rec, Decision: d}: // a slot was taken for it
			b.counts.Claimed.Add(1)
			b.mu.Unlock()
			return true
		default:
			// A slot freed by an expired lease while its delivery
			// was still unsent: the worker is not reading. Never
			// block under the lock; the ticket waits for another.
			tk.rec.State, tk.rec.Claim = StatePending, Claim{}
		}
	}
	b.engine.RevokeLease("", d.LeaseID)
	delete(b.mu.byLease, d.LeaseID)
	c.free++
	tk.claimer = nil
	switch {
	case err == nil && (ok || tk.unsure != 0 && cur.ClaimedWith(tk.unsure)):
		// Claimed in the store: by this write with the worker gone, or
		// by an earlier one of this replica's. Pending again.
		lease := claim.LeaseID
		if !ok {
			lease = cur.Claim.LeaseID
		}
		b.mu.Unlock()
		b.requeue(ctx, tk, lease)
		return false
	case err == nil && cur.State.Final(): // cancelled meanwhile
		b.lineLocked(tk.rec.Work.Tenant).claimed--
		b.endLocked(tk, cur.State, cur.Reason, claim.At)
		b.mu.Unlock()
		return true
	case err == nil:
		// Claimed by another replica, which adopted the ticket while
		// this one's hold on it lapsed: it is that replica's now.
		b.lineLocked(tk.rec.Work.Tenant).claimed--
		b.forgetLocked(tk)
		b.mu.Unlock()
		return true
	}
	// The store failed: pending again, as it is there, or claimed by
	// this write whose answer was lost, which the next claim finds.
	tk.unsure = claim.LeaseID
	b.lineLocked(tk.rec.Work.Tenant).claimed--
	b.enqueueLocked(tk, int64(tk.item.Cost))
	b.mu.Unlock()
	return false
}

// forgetLocked lets go of a ticket another replica holds now: its state
// is the store's to answer.
func (b *Backlog) forgetLocked(tk *ticket) {
	if _, ok := b.mu.held[tk.rec.ID]; !ok {
		return
	}
	delete(b.mu.held, tk.rec.ID)
	b.uncountLocked(tk.rec.Work.Tenant)
	b.unlinkRequestLocked(tk)
}

func (b *Backlog) freeClaimersLocked() bool {
	for c := range b.mu.claimers {
		if c.free > 0 {
			return true
		}
	}
	return false
}

func (b *Backlog) claimerForLocked(w *Work) *claimer {
	var best *claimer
	for c := range b.mu.claimers {
		if c.free > 0 && c.accepts(w) && (best == nil || c.free > best.free) {
			best = c
		}
	}
	return best
}

// request rebuilds the Admit request of a ticket. The engine sees no
// request id: the ticket is the idempotency of deferred work (a ticket
// delivered again after its lease expired is admitted afresh, its first
// lease settled as unused).
func (tk *ticket) request() admission.Request {
	w := &tk.rec.Work
	return admission.Request{
		Tenant: w.Tenant, Model: w.Model, PromptTokens: w.PromptTokens, MaxOutputTokens: w.MaxOutputTokens,
		Priority: admission.Priority(w.Priority), AcceptDowngrade: w.AcceptDowngrade,
		ExpectedCachedTokens: w.ExpectedCachedTokens, Deferrable: true, Ticketed: true,
	}
}

func workOf(req admission.Request) Work {
	return Work{
		RequestID: req.RequestID, Tenant: req.Tenant, Model: req.Model, PromptTokens: req.PromptTokens,
		MaxOutputTokens: req.MaxOutputTokens, Priority: int32(req.Priority), AcceptDowngrade: req.AcceptDowngrade,
		ExpectedCachedTokens: req.ExpectedCachedTokens,
	}
}

// expire ends the pending tickets whose defer_within has passed, brings
// back parked ones whose old lease would have ended, and forgets final
// ones past retention.
func (b *Backlog) expire(ctx context.Context) {
	now := b.clk.Now()
	var overdue, back []*ticket
	b.mu.Lock()
	for b.mu.deadlines.Len() > 0 && !b.mu.deadlines.Peek().rec.Deadline.After(now) {
		tk := b.mu.deadlines.Pop()
		b.mu.queue.Remove(&tk.item)
		b.unpendLocked(tk)
		overdue = append(overdue, tk)
	}
	kept := b.mu.parked[:0]
	for _, tk := range b.mu.parked {
		if tk.rec.Claim.Expires.After(now) {
			kept = append(kept, tk)
		} else {
			back = append(back, tk)
		}
	}
	b.mu.parked = kept
	for len(b.mu.final) > 0 && now.Sub(b.mu.final[0].ended) > retainFinal {
		tk := b.mu.final[0]
		b.mu.final = b.mu.final[1:]
		delete(b.mu.finalByID, tk.rec.ID)
		b.unlinkRequestLocked(tk)
	}
	b.mu.Unlock()
	// Written side by side, so that the store groups them into few
	// commits: tickets of one batch share a deadline and expire together.
	var wg sync.WaitGroup
	sem := make(chan struct{}, finishParallel)
	for _, tk := range overdue {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			b.finish(ctx, tk, StateExpired, fmt.Sprintf("not admitted within %v (last held back by %v)",
				tk.rec.Deadline.Sub(tk.rec.Created), tk.why))
		})
	}
	wg.Wait()
	for _, tk := range back {
		b.requeue(ctx, tk, tk.rec.Claim.LeaseID)
	}
}

// finish writes a ticket's final state and lets it go.
func (b *Backlog) finish(ctx context.Context, tk *ticket, state State, reason string) {
	at := b.clk.Now()
	// A final state the store missed would show the ticket unfinished to
	// another replica and to a restart: retried a few times, a store that
	// times out under load (Redis' call timeout) gets another chance.
	err := retried(ctx, func() error { return b.store.Finish(ctx, tk.rec.ID, state, reason, at) })
	if err != nil {
		b.log.Warn("deferral: finishing a ticket", "ticket", tk.rec.ID, "state", state, "err", err)
	}
	b.mu.Lock()
	b.endLocked(tk, state, reason, at)
	b.mu.Unlock()
}

// detached is ctx without its cancellation, bounded by writeTimeout: for
// a ticket's write that must not end with its caller.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
}

// retried runs write, and again 10 ms, 20 ms, … later while it fails, up
// to writeRetries more times while ctx lasts; a ticket the store does not
// have is not tried again. It returns the last error.
func retried(ctx context.Context, write func() error) error {
	err := write()
	for try := 0; err != nil && !errors.Is(err, ErrNotFound) && try < writeRetries; try++ {
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(10<<try) * time.Millisecond):
			err = write()
		}
	}
	return err
}

// endLocked moves a held ticket to its final state in memory.
func (b *Backlog) endLocked(tk *ticket, state State, reason string, at time.Time) {
	if _, ok := b.mu.held[tk.rec.ID]; !ok {
		return
	}
	delete(b.mu.held, tk.rec.ID)
	b.uncountLocked(tk.rec.Work.Tenant)
	switch state {
	case StateDone:
		b.counts.Done.Add(1)
	case StateExpired:
		b.counts.Expired.Add(1)
	case StateCancelled:
		b.counts.Cancelled.Add(1)
	}
	tk.rec.State, tk.rec.Reason, tk.rec.Finished, tk.ended = state, reason, at, at
	b.mu.final = append(b.mu.final, tk)
	b.mu.finalByID[tk.rec.ID] = tk
}

// requeue puts a ticket claimed with leaseID back to pending: the lease
// ended without a Release (the worker died), the ticket was not handed
// over, or a restart parked it.
func (b *Backlog) requeue(ctx context.Context, tk *ticket, leaseID uint64) {
	err := b.store.Unclaim(ctx, tk.rec.ID, leaseID)
	if err != nil {
		b.log.Warn("deferral: unclaiming a ticket", "ticket", tk.rec.ID, "err", err)
	}
	b.counts.Redelivered.Add(1)
	b.mu.Lock()
	if err != nil {
		tk.unsure = leaseID // still claimed there, maybe: the next claim takes it back
	}
	tk.rec.State, tk.rec.Claim, tk.claimer = StatePending, Claim{}, nil
	b.lineLocked(tk.rec.Work.Tenant).claimed--
	cost := tk.item.Cost
	b.enqueueLocked(tk, int64(cost))
	b.mu.Unlock()
	b.nudge()
}

// leaseExpired hears from the engine that a deferred lease reached its TTL
// unreleased: the ticket goes back to pending.
func (b *Backlog) leaseExpired(leaseID uint64) {
	b.mu.Lock()
	tk := b.mu.byLease[leaseID]
	if tk != nil {
		delete(b.mu.byLease, leaseID)
		if tk.claimer != nil {
			tk.claimer.free++
		}
	}
	b.mu.Unlock()
	if tk != nil {
		b.requeue(context.Background(), tk, leaseID)
	}
}

// Released tells the backlog that the lease of a deferred ticket was
// released (admission.ReleaseResult.Deferred): the ticket is done. The
// write does not end with ctx: a worker whose call timed out has been
// charged, and a ticket left claimed in the store would run again.
func (b *Backlog) Released(ctx context.Context, leaseID uint64) {
	b.mu.Lock()
	tk := b.mu.byLease[leaseID]
	if tk != nil {
		delete(b.mu.byLease, leaseID)
		if tk.claimer != nil {
			tk.claimer.free++
		}
		b.lineLocked(tk.rec.Work.Tenant).claimed--
	}
	b.mu.Unlock()
	if tk != nil {
		wctx, cancel := detached(ctx)
		defer cancel()
		b.finish(wctx, tk, StateDone, "")
		b.nudge()
	}
}

// Claim registers a worker and calls send for each ticket admitted for it,
// until ctx ends or send fails. A ticket whose send failed is taken back
// (its lease revoked, the ticket pending again); tickets sent and not yet
// released stay the worker's until Release or their lease's TTL.
func (b *Backlog) Claim(ctx context.Context, opts ClaimOptions, send func(Delivery) error) error {
	c := &claimer{opts: opts, free: max(opts.MaxInFlight, 1)}
	c.out = make(chan Delivery, c.free)
	if len(opts.Tenants) > 0 {
		c.tenant = make(map[string]bool, len(opts.Tenants))
		for _, t := range opts.Tenants {
			c.tenant[t] = true
		}
	}
	if len(opts.Models) > 0 {
		c.model = make(map[string]bool, len(opts.Models))
		for _, m := range opts.Models {
			c.model[m] = true
		}
	}
	b.mu.Lock()
	if b.mu.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	b.mu.claimers[c] = struct{}{}
	b.mu.Unlock()
	b.nudge()
	defer b.leave(c)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-b.quit:
			return ErrClosed
		case d := <-c.out:
			if !b.live(d) {
				continue // its lease ended unsent: the ticket is pending again
			}
			if err := send(d); err != nil {
				b.takeBack(d)
				return fmt.Errorf("deferral: sending to a worker: %w", err)
			}
		}
	}
}

// live reports whether a delivery's lease is still the ticket's.
func (b *Backlog) live(d Delivery) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.byLease[d.Record.Claim.LeaseID] != nil
}

// leave unregisters a claimer and takes back what it was never sent.
func (b *Backlog) leave(c *claimer) {
	b.mu.Lock()
	delete(b.mu.claimers, c)
	b.mu.Unlock()
	for {
		select {
		case d := <-c.out:
			b.takeBack(d)
		default:
			b.nudge()
			return
		}
	}
}

// takeBack undoes a delivery no worker received.
func (b *Backlog) takeBack(d Delivery) {
	if !b.engine.RevokeLease("", d.Record.Claim.LeaseID) {
		return // expired meanwhile: leaseExpired requeues it
	}
	b.mu.Lock()
	tk := b.mu.byLease[d.Record.Claim.LeaseID]
	delete(b.mu.byLease, d.Record.Claim.LeaseID)
	b.mu.Unlock()
	if tk != nil {
		b.requeue(context.Background(), tk, d.Record.Claim.LeaseID)
	}
}

// Get returns a ticket: held ones from memory, others from the store.
// allow, if set, is asked whether the caller may see the ticket's tenant.
func (b *Backlog) Get(ctx context.Context, id string, allow func(tenant string) bool) (Record, error) {
	b.mu.Lock()
	tk := b.mu.held[id]
	if tk == nil {
		tk = b.mu.finalByID[id]
	}
	var rec Record
	if tk != nil {
		rec = tk.rec
	}
	b.mu.Unlock()
	if tk == nil {
		var err error
		if rec, err = b.store.Get(ctx, id); err != nil {
			return Record{}, err
		}
	}
	if allow != nil && !allow(rec.Work.Tenant) {
		return Record{}, fmt.Errorf("ticket %s: %w", id, ErrNotYours)
	}
	return rec, nil
}

// Waiting is why a pending ticket is still waiting: what last held it back.
func (b *Backlog) Waiting(id string) admission.Reason {
	b.mu.Lock()
	defer b.mu.Unlock()
	if tk := b.mu.held[id]; tk != nil {
		return tk.why
	}
	return admission.ReasonNone
}

// Cancel ends a pending ticket at the submitter's request. A claimed one
// is ErrClaimed; a final one is returned as it is.
func (b *Backlog) Cancel(ctx context.Context, id string, allow func(tenant string) bool) (Record, error) {
	b.mu.Lock()
	tk := b.mu.held[id]
	if tk == nil {
		b.mu.Unlock()
		rec, err := b.store.Get(ctx, id)
		if err != nil {
			return Record{}, err
		}
		if allow != nil && !allow(rec.Work.Tenant) {
			return Record{}, fmt.Errorf("ticket %s: %w", id, ErrNotYours)
		}
		switch rec.State {
		case StateClaimed:
			return rec, fmt.Errorf("ticket %s: %w", id, ErrClaimed)
		case StatePending:
			// Held by another replica: the store's state decides, and
			// that replica's claim of it fails.
			wctx, cancel := detached(ctx)
			defer cancel()
			if err := b.store.Finish(wctx, id, StateCancelled, "cancelled by the submitter", b.clk.Now()); err != nil {
				return Record{}, err
			}
			rec, err := b.store.Get(wctx, id)
			if err == nil && rec.State == StateClaimed { // claimed meanwhile
				return rec, fmt.Errorf("ticket %s: %w", id, ErrClaimed)
			}
			return rec, err
		}
		return rec, nil
	}
	switch {
	case allow != nil && !allow(tk.rec.Work.Tenant):
		b.mu.Unlock()
		return Record{}, fmt.Errorf("ticket %s: %w", id, ErrNotYours)
	case tk.rec.State != StatePending || !tk.item.Queued():
		rec := tk.rec
		b.mu.Unlock()
		return rec, fmt.Errorf("ticket %s: %w", id, ErrClaimed)
	}
	b.mu.queue.Remove(&tk.item)
	b.mu.deadlines.Remove(tk)
	b.unpendLocked(tk)
	b.mu.Unlock()
	wctx, cancel := detached(ctx)
	defer cancel()
	b.finish(wctx, tk, StateCancelled, "cancelled by the submitter")
	b.mu.Lock()
	defer b.mu.Unlock()
	return tk.rec, nil
}

// adopt takes into the backlog the store's unfinished tickets it does not
// hold: pending ones in fair order, claimed ones parked until their lease
// would have ended (then delivered again).
func (b *Backlog) adopt(ctx context.Context) error {
	recs, err := b.store.Adopt(ctx)
	if err != nil {
		return fmt.Errorf("deferral: adopting tickets: %w", err)
	}
	if len(recs) == 0 {
		return nil
	}
	b.mu.Lock()
	for _, rec := range recs {
		if _, ok := b.mu.held[rec.ID]; ok {
			continue
		}
		tk := &ticket{rec: rec, heapIdx: -1}
		line := b.lineLocked(rec.Work.Tenant)
		line.held++
		b.mu.total++
		if rec.Work.RequestID != "" {
			b.mu.byRequest[requestKey{rec.Work.Tenant, rec.Work.RequestID}] = tk
		}
		cost := b.engine.WeightedTokens(rec.Work.PromptTokens, rec.Work.MaxOutputTokens)
		if rec.State == StateClaimed {
			b.mu.held[rec.ID] = tk
			tk.item.Cost = uint64(max(cost, 1))
			b.mu.parked = append(b.mu.parked, tk)
			line.claimed++
			continue
		}
		b.enqueueLocked(tk, cost)
	}
	b.mu.Unlock()
	b.log.Info("deferral: adopted tickets", "tickets", len(recs))
	b.nudge()
	return nil
}

// nudge wakes the drain loop.
func (b *Backlog) nudge() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// TenantBacklog is one tenant's part of the backlog.
type TenantBacklog struct {
	Tenant           string
	Pending, Claimed int
	Oldest           time.Time     // the oldest pending ticket's submission (zero: none)
	OldestAge        time.Duration // how long it has waited, on the backlog's clock
}

// Tenants returns each tenant's held tickets, for metrics and sluicectl:
// it costs the tenants with a backlog, not their tickets.
func (b *Backlog) Tenants() []TenantBacklog {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clk.Now()
	out := make([]TenantBacklog, 0, len(b.mu.perTenant))
	for name, l := range b.mu.perTenant {
		tb := TenantBacklog{Tenant: name, Pending: l.byAge.Len(), Claimed: l.claimed}
		if tb.Pending+tb.Claimed == 0 {
			continue // only additions under way
		}
		if oldest := l.byAge.Peek(); oldest != nil {
			tb.Oldest = oldest.tk.rec.Created
			tb.OldestAge = now.Sub(tb.Oldest)
		}
		out = append(out, tb)
	}
	return out
}

// newTicketID returns 128 random bits in hex: a ticket can be looked up
// only by a caller that was told its id.
func newTicketID() string {
	var b [16]byte
	_, _ = cryptorand.Read(b[:]) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b[:])
}
