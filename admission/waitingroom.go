package admission

import (
	"context"
	"math"
	"time"

	"github.com/sluice-sched/sluice/internal/indexheap"
	"github.com/sluice-sched/sluice/internal/tokenbucket"
	"github.com/sluice-sched/sluice/wfq"
)

// dispatchScanLimit is how many heads the dispatcher looks past when the
// smallest finish tag does not fit anywhere (see wfq.Queue.Dequeue).
const dispatchScanLimit = 8

// waitingRoom holds the requests that fit nowhere yet: the weighted fair
// queue (package wfq) in which they wait for capacity, their deadlines,
// the estimated work queued, and the idempotency records that let a
// retried request find its answer. The engine's dispatcher takes requests
// out in fair order as capacity frees.
type waitingRoom struct {
	queue     *wfq.Queue
	deadlines indexheap.Heap[waiter, *waiter] // the queued requests by deadline
	// Σ estimated prefill FLOPs, decode bytes and weighted tokens of the
	// queued requests: the fair queue counts positions in weighted tokens,
	// these turn them into time.
	backlogPrefill, backlogDecode, backlogTokens int64
	idem                                         idempotency
	tiers                                        tierShares    // whose turn it is at a tier many wait for
	wake                                         chan struct{} // nudges the dispatcher loop (Engine.Run)
}

// waiter is a request waiting in the fair queue.
type waiter struct {
	p        pending
	item     wfq.Item
	enqueued int64
	deadline int64
	heapIdx  int // in the deadlines heap, or -1
	// degradeAt: from then on it may take a lower tier it accepts: at
	// once, after queue.degrade_after, or else its deadline, which
	// placer.fitsQueued brings forward once its tier cannot serve it in
	// time (waitsForTier).
	degradeAt int64
	// lowerOnly: it does not wait for its requested tier, and no lower
	// tier fitted when it came: it waits among the requests for its first
	// lower tier (that tier's flow, not behind its own requests for the
	// requested one) and takes the best lower tier that fits at its turn.
	lowerOnly bool
	wait      time.Duration // the wait its position predicted at enqueue
	estimate  [2]int64      // backlog contribution: prefill FLOPs, decode bytes
	pl        placement
	queued    bool
	contends  bool          // for its requested tier, in tierShares: some domain could ever hold it there
	refs      int           // callers waiting on it: the first plus idempotent duplicates
	done      chan struct{} // closed once decision is set
	decision  Decision
}

// Less orders waiters by deadline (indexheap.Element).
func (w *waiter) Less(v *waiter) bool { return w.deadline < v.deadline }

// HeapIndex is w's place in the deadlines heap (indexheap.Element).
func (w *waiter) HeapIndex() *int { return &w.heapIdx }

// enter queues w; it fails when the queue's bounds are reached.
func (r *waitingRoom) enter(w *waiter) error {
	if err := r.queue.Enqueue(&w.item); err != nil {
		return err
	}
	w.queued = true
	w.p.tenant.queued++
	r.backlogPrefill += w.estimate[0]
	r.backlogDecode += w.estimate[1]
	r.backlogTokens += w.p.weighted
	r.deadlines.Push(w)
	if w.contends {
		r.tiers.want(w.enqueued, w.p.tierBuf[0].name, w.p.tenant.name, true)
	}
	r.wakeDispatcher()
	return nil
}

// leave takes w out of the room's bookkeeping once the queue no longer
// holds it. Its request id, if any, stops finding it: an admission is
// remembered by its lease from here, a rejection not at all.
func (r *waitingRoom) leave(now int64, w *waiter) {
	if w.p.hasID && r.idem.queued[w.p.idem] == w {
		delete(r.idem.queued, w.p.idem)
	}
	w.queued = false
	w.p.tenant.queued--
	r.backlogPrefill -= w.estimate[0]
	r.backlogDecode -= w.estimate[1]
	r.backlogTokens -= w.p.weighted
	r.deadlines.Remove(w)
	if w.contends {
		r.tiers.leave(now, w.p.tierBuf[0].name, w.p.tenant.name)
	}
}

// next takes out of the fair queue the request with the smallest finish
// tag that fits (critical band first), or returns nil when none does. The
// caller grants it, then calls leave.
func (r *waitingRoom) next(fits func(*waiter) bool) *waiter {
	it := r.queue.Dequeue(func(it *wfq.Item) bool { return fits(it.Value.(*waiter)) }, dispatchScanLimit)
	if it == nil {
		return nil
	}
	return it.Value.(*waiter)
}

// reject answers a queued request with a refusal and cancels its charge.
// The caller closes w.done.
func (r *waitingRoom) reject(now int64, w *waiter, why refusal) {
	r.queue.Remove(&w.item)
	r.leave(now, w)
	w.p.Cancel(now)
	w.decision = rejected(why.reason, why.retry)
	w.decision.Queued = time.Duration(now - w.enqueued)
	tenantTrace(&w.decision.Trace, &w.p, now)
	w.decision.Trace.EstimatedWait = w.wait

}

// enqueue puts a request that fits nowhere now into the waiting room, or
// rejects it at once when it never could fit (o, placement's outlook),
// when its deadline (budget from now) cannot be met or when the queue is
// full. rates are the eligible domains' combined rates, which the queued
// work drains at. waits: a request that accepts lower tiers waits for its
// requested tier (waitsForTier); else it is queued for its lower tiers
// (waiter.lowerOnly). Its verdict is the queued waiter or the refusal; m
// queues it (decisionMode.queueLocked).
func (room *waitingRoom) enqueue(now int64, budget time.Duration, r *pending, o outlook, rates func() (float64, float64), q *QueueConfig, m decisionMode, waits bool) verdict {
	t := r.tenant
	if !o.ever {
		if o.drainingOnly {
			return refuse(refusal{ReasonDomainDraining, 0})
		}
		return refuse(refusal{ReasonCapacityExceeded, 0})
	}
	// Its wait: the queued work the fair queue serves before it, at the
	// eligible domains' rates, then its own refill time.
	lowerOnly := !waits && r.ntiers > 1
	flow := wfq.FlowKey{Tenant: t.name, Model: r.tierBuf[0].name}
	if lowerOnly {
		flow.Model = r.tierBuf[1].name
	}
	ahead := room.queue.WorkAhead(flow, uint64(r.weighted), uint64(t.policy.Weight), r.critical)
	estimate := addSat(room.workWait(ahead, rates), o.wait)
	deadline := now + int64(budget)
	if estimate > budget {
		return verdict{why: refusal{ReasonDeadlineUnmeetable, estimate}, wait: estimate}
	}
	w := &waiter{p: *r, enqueued: now, deadline: deadline, refs: 1, done: make(chan struct{}), lowerOnly: lowerOnly}
	switch {
	case lowerOnly:
		w.degradeAt = now
	case q.DegradeAfter != nil:
		w.degradeAt = min(now+int64(q.DegradeAfter.Duration), deadline)
	default:
		w.degradeAt = deadline // until its tier cannot serve it in time (placer.fitsQueued)
	}
	w.item = wfq.Item{
		Flow:     flow,
		Cost:     uint64(r.weighted),
		Weight:   uint64(t.policy.Weight),
		Critical: r.critical,
		Value:    w,
	}
	w.estimate = [2]int64{o.first.PrefillFLOP, o.first.DecodeBytes}
	if lowerOnly {
		w.estimate = [2]int64{o.lower.PrefillFLOP, o.lower.DecodeBytes}
	}
	w.contends = o.own && !lowerOnly
	w.wait = estimate
	if err := m.queueLocked(room, now, w); err != nil {
		return verdict{why: refusal{ReasonQueueFull, estimate}, wait: estimate}
	}
	return verdict{w: w}
}

// waitsForTier reports whether r, which accepts lower tiers and fits
// nowhere now (o, placement's outlook), waits in the fair order for its
// requested tier rather than take a lower one at once: when the tier can
// serve it within budget (its wait for the tier, tierWait) and its
// tenant's quota is not in debt. A tenant in debt (on burst credit) does
// not wait: a waiting request keeps its whole charge for as long as it
// waits, and debt not repaid within the credit's window opens the
// tenant's breaker; on a lower tier it pays the tier's share (tierShare),
// and the debt is repaid sooner. Nor does a request the queue has no room
// for wait.
func (room *waitingRoom) waitsForTier(now int64, r *pending, o outlook, rates func() (float64, float64), budget time.Duration) bool {
	if !r.critical && r.tenant.tokens.Level(now) < 0 {
		return false
	}
	k := wfq.FlowKey{Tenant: r.tenant.name, Model: r.tierBuf[0].name}
	if room.queue.Check(&wfq.Item{Flow: k, Critical: r.critical}) != nil {
		return false
	}
	return room.tierWait(r, k, o, rates) <= budget
}

// tierWait estimates how long r waits for its requested tier in the fair
// order: at least the work tagged before it (WorkAhead) or, in the normal
// band, the work its own flow has queued, all of which is ahead of it
// (wfq's FlowCost, which the virtual time does not move), served at rates;
// and at least the time its tier takes to refill for it on the soonest
// domain (o.ownWait).
func (room *waitingRoom) tierWait(r *pending, k wfq.FlowKey, o outlook, rates func() (float64, float64)) time.Duration {
	ahead := room.queue.WorkAhead(k, uint64(r.weighted), uint64(r.tenant.policy.Weight), r.critical)
	if own := room.queue.FlowCost(k); !r.critical {
		ahead = max(ahead, own+min(uint64(r.weighted), math.MaxUint64-own))
	}
	return max(room.workWait(ahead, rates), o.ownWait)
}

// waitingAhead is the number of queued requests a new request r would have
// ahead of it in the fair order: all of them, or the critical band's for
// a critical one.
func (room *waitingRoom) waitingAhead(r *pending) int {
	if r.critical {
		return room.queue.CriticalLen()
	}
	return room.queue.Len()
}

// waitBudget is how long a request may wait: until the earliest of the
// caller's deadline (gRPC or request field, less the answer margin) and the
// default wait, which also keeps far-off deadlines from overflowing.
func waitBudget(ctx context.Context, wall time.Time, req *Request, q *QueueConfig) time.Duration {
	budget := q.DefaultWait.Duration
	if dl, ok := ctx.Deadline(); ok {
		budget = min(budget, dl.Sub(wall)-q.DeadlineMargin.Duration)
	}
	if !req.Deadline.IsZero() {
		budget = min(budget, req.Deadline.Sub(wall)-q.DeadlineMargin.Duration)
	}
	return budget
}

// overdue returns a queued request whose deadline has come, if any.
func (r *waitingRoom) overdue(now int64) *waiter {
	if w := r.deadlines.Peek(); w != nil && w.deadline <= now {
		return w
	}
	return nil
}

// waiters returns every queued request.
func (r *waitingRoom) waiters() []*waiter {
	var ws []*waiter
	r.queue.Each(func(it *wfq.Item) { ws = append(ws, it.Value.(*waiter)) })
	return ws
}

// workWait estimates how long the fair queue takes to serve work weighted
// tokens of what is queued, at rates (the eligible domains' combined soft
// capacity): the work's share of the queued prefill FLOPs and decode bytes,
// at their rates.
func (r *waitingRoom) workWait(work uint64, rates func() (prefill, decode float64)) time.Duration {
	if work == 0 || r.backlogTokens <= 0 {
		return 0
	}
	prefillRate, decodeRate := rates()
	if prefillRate <= 0 || decodeRate <= 0 {
		return tokenbucket.Never
	}
	share := min(float64(work)/float64(r.backlogTokens), 1)
	secs := share * max(float64(r.backlogPrefill)/prefillRate, float64(r.backlogDecode)/decodeRate)
	if secs*float64(time.Second) >= float64(tokenbucket.Never) {
		return tokenbucket.Never
	}
	return time.Duration(secs * float64(time.Second))
}

// positionWait is workWait for a queued request: the work tagged before it.
func (r *waitingRoom) positionWait(w *waiter, rates func() (prefill, decode float64)) time.Duration {
	return r.workWait(r.queue.WorkBefore(w.item.FinishTag(), w.item.Critical), rates)
}

// wakeDispatcher nudges Run without blocking.
func (r *waitingRoom) wakeDispatcher() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}
