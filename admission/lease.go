package admission

import (
	"container/heap"
	"context"
	"fmt"
	"time"

	"github.com/sluice-sched/sluice/pd"
)

// lease is an admitted request holding domain capacity until Release or expiry.
type lease struct {
	tenant    *tenantState
	dom       *domainState
	modelName string  // resolved again at release: the catalog may have been reloaded
	cost      pd.Cost // what the domain was charged
	prompt    int64
	output    int64 // max output tokens admitted
	weighted  int64 // weighted tokens charged
	outWeight int64 // output token weight at grant time
	floor     bool  // also charged to the tenant's floor bucket
	gates     gateCharge
	granted   int64
	expires   int64
	committed bool // strict mode: the store may hold its charge; Release settles there
}

// waiterHeap orders queued requests by deadline (container/heap).
type waiterHeap []*waiter

func (h waiterHeap) Len() int           { return len(h) }
func (h waiterHeap) Less(i, j int) bool { return h[i].deadline < h[j].deadline }
func (h waiterHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}

// Push implements heap.Interface.
func (h *waiterHeap) Push(x any) {
	w := x.(*waiter)
	w.heapIdx = len(*h)
	*h = append(*h, w)
}

// Pop implements heap.Interface.
func (h *waiterHeap) Pop() any {
	s := *h
	w := s[len(s)-1]
	s[len(s)-1] = nil
	*h = s[:len(s)-1]
	w.heapIdx = -1
	return w
}

func (h *waiterHeap) push(w *waiter) { heap.Push(h, w) }

func (h *waiterHeap) remove(w *waiter) {
	if w.heapIdx >= 0 && w.heapIdx < len(*h) && (*h)[w.heapIdx] == w {
		heap.Remove(h, w.heapIdx)
	}
}

// idemEntry remembers an admission (or a queued request) under its request id.
type idemEntry struct {
	tenant   string
	decision Decision
	w        *waiter // non-nil while the request is queued
	expires  int64
}

type idemExpiry struct {
	id string
	at int64
}

func (e *Engine) rememberLocked(now int64, requestID, tenant string, d Decision) {
	exp := now + int64(e.mu.cfg.Leases.IdempotencyTTL.Duration)
	e.mu.idem[requestID] = idemEntry{tenant: tenant, decision: d, expires: exp}
	e.mu.idemExp = append(e.mu.idemExp, idemExpiry{id: requestID, at: exp})
}

// expireIdempotencyLocked forgets request ids older than the TTL. Entries
// expire in insertion order because the TTL is one constant.
func (e *Engine) expireIdempotencyLocked(now int64) {
	q := e.mu.idemExp
	i := e.mu.idemOff
	for ; i < len(q) && q[i].at <= now; i++ {
		if ent, ok := e.mu.idem[q[i].id]; ok && ent.w == nil && ent.expires <= now {
			delete(e.mu.idem, q[i].id)
		}
		q[i] = idemExpiry{}
	}
	e.mu.idemOff = i
	if i > 1024 && i > len(q)/2 {
		n := copy(q, q[i:])
		e.mu.idemExp = q[:n]
		e.mu.idemOff = 0
	}
}

// expireLeasesLocked frees the capacity of leases past their expiry, as if
// released with every admitted token used.
func (e *Engine) expireLeasesLocked(now int64) {
	for {
		l, ok := e.mu.leases.popExpired(now)
		if !ok {
			return
		}
		l.dom.cap.Release(now, l.cost, l.cost)
		e.closeLeaseLocked(&l)
	}
}

func (e *Engine) closeLeaseLocked(l *lease) {
	l.dom.inFlight--
	l.tenant.inFlight--
}

// Release ends a lease: the domain gets back what was charged for output
// never generated (and is charged for any overrun), the KV is freed, the
// tenant's token bucket and budget are settled to the actual tokens, and the
// outcome feeds the domain's health. Releasing twice returns ErrLeaseNotFound
// and changes nothing.
func (e *Engine) Release(ctx context.Context, rel Release) (ReleaseResult, error) {
	switch {
	case rel.LeaseID == 0:
		return ReleaseResult{}, &InvalidArgumentError{Field: "lease_id", Reason: "must not be empty"}
	case rel.PromptTokens < 0:
		return ReleaseResult{}, &InvalidArgumentError{Field: "prompt_tokens", Reason: fmt.Sprintf("must be ≥ 0, got %d", rel.PromptTokens)}
	case rel.OutputTokens < 0:
		return ReleaseResult{}, &InvalidArgumentError{Field: "output_tokens", Reason: fmt.Sprintf("must be ≥ 0, got %d", rel.OutputTokens)}
	case rel.Outcome != 0 && rel.Outcome != ReleaseOK && rel.Outcome != ReleaseError:
		return ReleaseResult{}, &InvalidArgumentError{Field: "outcome", Reason: fmt.Sprintf("unknown outcome %d", rel.Outcome)}
	}
	e.mu.Lock()
	// Counts past the request limits are charged at the limit: the lease
	// must still be settled, and the limits keep the arithmetic bounded.
	lim := &e.mu.cfg.Limits
	rel.PromptTokens = min(rel.PromptTokens, lim.MaxPromptTokens)
	rel.OutputTokens = min(rel.OutputTokens, lim.MaxOutputTokens)
	l, ok := e.mu.leases.remove(rel.LeaseID)
	if !ok {
		e.mu.Unlock()
		return ReleaseResult{}, ErrLeaseNotFound
	}
	now := e.nowLocked()
	wall := e.base.Add(time.Duration(now))
	prompt := rel.PromptTokens
	if prompt == 0 {
		prompt = l.prompt
	}
	actual := l.cost
	m, known := e.mu.models[l.modelName]
	if known {
		if c, err := l.dom.cap.Cost(m.model, prompt, rel.OutputTokens); err == nil {
			actual = c
		}
	}
	l.dom.cap.Release(now, l.cost, actual)
	e.closeLeaseLocked(&l)

	t := l.tenant
	weighted := prompt + l.outWeight*rel.OutputTokens
	diff := l.weighted - weighted // > 0: refund; < 0: overrun
	bucket := &t.tokens
	if l.gates.critical {
		bucket = &t.critical
	}
	if diff > 0 {
		bucket.Refund(now, diff)
		if l.floor {
			t.floor.Refund(now, diff)
		}
	} else if diff < 0 {
		before := bucket.Level(now)
		bucket.Take(now, -diff)
		if bucket == &t.tokens {
			t.noteDebt(before, now)
		}
	}
	e.rollBudgetLocked(t, wall)
	cost := l.gates.budget // a model no longer in the catalog keeps its admitted price
	if known {
		cost = e.mu.cat.PriceMicros(m.model, prompt, rel.OutputTokens)
	}
	e.adjustSpendLocked(t, l.gates.day, l.gates.month, cost-l.gates.budget)
	var settle *StrictSettle
	var pending chan struct{}
	if e.shared != nil && e.shared.opts.Mode == SharedStrict {
		settle = e.strictSettleLocked(&l, rel.LeaseID, weighted, actual)
		pending = e.mu.commits[rel.LeaseID]
	}
	if e.recordOutcomeLocked(l.dom, now, rel.Outcome == ReleaseError) {
		e.placementChangedLocked()
	}
	res := ReleaseResult{
		Domain:           l.dom.ID(),
		Model:            l.modelName,
		RefundedTokens:   diff,
		ActualCostMicros: cost,
		HeldFor:          time.Duration(now - l.granted),
	}
	answered := e.dispatchLocked(now, nil)
	e.mu.Unlock()
	e.finish(answered)
	if settle != nil {
		e.settleStrict(ctx, settle, pending)
	}
	if e.observer != nil {
		e.observer.ObserveRelease(rel, res)
	}
	return res, nil
}
