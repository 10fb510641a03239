package admission

import (
	"math"
	"slices"

	"github.com/sluice-sched/sluice/internal/indexheap"
)

// tierShares decides whose turn it is at a model tier that more tenants
// want than it can serve. The fair queue orders requests by all the
// service their tenants get, whatever the tier; a tenant that accepts
// lower tiers is served in full either way, so the queue alone says nothing
// of who gets the top tier. tierShares keeps, per model, each contending
// tenant's use of that model over its weight (VTC, Sheng et al., OSDI 2024,
// with one set of counters per model) and gives the model to the
// least-used:
//
//   - model m is contended for a window (queue.tier_share_window) after it
//     last was full: a request whose turn it was did not fit on it (and
//     some domain could hold it there). Only then are there turns; a tier
//     with room serves whoever asks;
//   - a tenant contends for m while it has a queued request for m (that m
//     could ever hold) and for the window after it last wanted m and did
//     not get it — queued for it, or degraded from it — or got it while m
//     was contended;
//   - each grant of m while m is contended adds ⌈cost·2¹⁶/weight⌉ to its
//     tenant's use (fixed point, as wfq's tags), and makes that tenant a
//     contender for the window;
//   - a tenant that starts contending is lifted to the least use among the
//     contenders, so time away earns no credit (VTC's counter lift);
//   - while m is contended, a request that accepts lower tiers may take m
//     only on its tenant's turn: when the tenant does not contend for it,
//     or its use is the least among those who do. Otherwise it takes a
//     lower tier (at once on arrival or at its turn in the queue; with
//     queue.degrade_after set, from then when queued), and m is left for
//     the tenant whose turn it is. A request
//     with no lower tier takes m whenever it fits: it has no choice, and
//     its grants count all the same.
//
// While two tenants both want more of m than they get, their uses stay
// within one request's increment of each other, so their shares of m go
// by weight (8:2 → 4:1) and the lower weight degrades first.
//
// Contenders leave lazily, when they come to the least use (the only one
// that matters); a model's counters are forgotten when nobody contends for
// it any more.
type tierShares struct {
	models map[string]*tierLedger // by model name: only models somebody contends for
	window int64                  // queue.tier_share_window, ns
}

// tierLedger is one model's counters.
type tierLedger struct {
	entries    map[string]*tierUse               // by tenant: the contenders
	contenders indexheap.Heap[tierUse, *tierUse] // the same, least use first
	full       int64                             // engine time the model last did not fit a request whose turn it was
	wasFull    bool                              // full is set
}

// contended reports whether the model was full within window of now.
func (l *tierLedger) contended(now, window int64) bool {
	return l.wasFull && now-l.full < window
}

// tierUse is one tenant's use of one model.
type tierUse struct {
	tenant  string
	used    uint64 // Σ ⌈cost·2¹⁶/weight⌉ of its grants of the model, lifted
	waiting int    // its queued requests for the model
	active  int64  // engine time it last wanted the model and did not get it, or got it while others contended
	heapIdx int    // in contenders, or -1
}

// Less orders contenders by use (indexheap.Element).
func (u *tierUse) Less(v *tierUse) bool { return u.used < v.used }

// HeapIndex is u's place among the contenders (indexheap.Element).
func (u *tierUse) HeapIndex() *int { return &u.heapIdx }

// contending reports whether u still contends at now, for window ns after
// it last wanted the model.
func (u *tierUse) contending(now, window int64) bool {
	return u.waiting > 0 || now-u.active < window
}

// ledger returns model's ledger, made if need be.
func (s *tierShares) ledger(model string) *tierLedger {
	if s.models == nil {
		s.models = make(map[string]*tierLedger)
	}
	l := s.models[model]
	if l == nil {
		l = &tierLedger{entries: make(map[string]*tierUse)}
		s.models[model] = l
	}
	return l
}

// full records that model was full at now — a request whose turn it was
// did not fit on it, or one was kept from it that it would not have held
// or for a tenant waiting for it — so that it is contended for the window.
func (s *tierShares) full(now int64, model string) {
	l := s.ledger(model)
	l.full, l.wasFull = now, true
}

// want records that tenant wanted model at now and did not get it (yet):
// it was queued for it (queued: one more request waiting) or degraded.
func (s *tierShares) want(now int64, model, tenant string, queued bool) {
	u := s.ledger(model).enter(now, s.window, tenant)
	u.active = now
	if queued {
		u.waiting++
	}
}

// enter returns tenant's entry, making it a contender, lifted to the least
// use, if it was not one.
func (l *tierLedger) enter(now, window int64, tenant string) *tierUse {
	u := l.entries[tenant]
	if u == nil {
		u = &tierUse{tenant: tenant, used: l.least(now, window), active: now}
		l.entries[tenant] = u
		l.contenders.Push(u)
	}
	return u
}

// leave counts one fewer queued request of tenant for model; the tenant
// keeps contending for the window.
func (s *tierShares) leave(now int64, model, tenant string) {
	if l := s.models[model]; l != nil {
		if u := l.entries[tenant]; u != nil && u.waiting > 0 {
			u.waiting--
			u.active = now
		}
	}
}

// charge records a grant of model to tenant, of cost weighted tokens at
// weight. A grant of a contended model makes its tenant a contender (it
// has the tier others want); a grant of a model with room is nobody's
// business.
func (s *tierShares) charge(now int64, model, tenant string, cost, weight int64) {
	if len(s.models) == 0 { // the common case: nobody wants more of any tier
		return
	}
	l := s.models[model]
	if l == nil || !l.contended(now, s.window) {
		return
	}
	u := l.enter(now, s.window, tenant)
	u.active = now
	u.used = addUse(u.used, cost, weight)
	l.contenders.Fix(u)
}

// turn reports whether tenant may take model at now: the model is not
// contended, or the tenant does not contend for it, or its use is the
// least among those who do.
func (s *tierShares) turn(now int64, model, tenant string) bool {
	if len(s.models) == 0 {
		return true
	}
	l := s.models[model]
	if l == nil {
		return true
	}
	least := l.least(now, s.window)
	if !l.contended(now, s.window) {
		if l.contenders.Len() == 0 {
			delete(s.models, model)
		}
		return true
	}
	u := l.entries[tenant]
	return u == nil || !u.contending(now, s.window) || u.used <= least
}

// leastWaiting reports whether the tenant whose turn it is at model has a
// request queued for it.
func (s *tierShares) leastWaiting(model string) bool {
	l := s.models[model]
	return l != nil && l.contenders.Len() > 0 && l.contenders.Peek().waiting > 0
}

// least drops the contenders that no longer contend from the bottom of the
// heap and returns the smallest use among the rest (0 when none is left).
// An entry dropped at or below the least is forgotten: the lift would
// bring it back at the least anyway.
func (l *tierLedger) least(now, window int64) uint64 {
	for u := l.contenders.Peek(); u != nil; u = l.contenders.Peek() {
		if u.contending(now, window) {
			return u.used
		}
		l.contenders.Pop()
		delete(l.entries, u.tenant)
	}
	return 0
}

// tierHold is some models' ledgers as they were, to put back with Cancel:
// deciding whose turn it is drops contenders that no longer contend and
// forgets a ledger nobody contends for, and a decision that is only
// explained must leave even that as it found it.
type tierHold struct {
	s     *tierShares
	saved []heldLedger
}

type heldLedger struct {
	model string
	l     *tierLedger // nil: the model had no ledger
	full  int64
	was   bool
	uses  []*tierUse // its contenders, in heap order
	vals  []tierUse  // and what each held
}

// hold keeps the ledgers of models (each once) for Cancel.
func (s *tierShares) hold(models []*modelState) tierHold {
	h := tierHold{s: s}
	for _, m := range models {
		l := s.models[m.name]
		hl := heldLedger{model: m.name, l: l}
		if l != nil {
			hl.full, hl.was = l.full, l.wasFull
			hl.uses = slices.Clone(l.contenders.All())
			for _, u := range hl.uses {
				hl.vals = append(hl.vals, *u)
			}
		}
		h.saved = append(h.saved, hl)
	}
	return h
}

// Cancel puts the held ledgers back as they were when hold was called.
func (h *tierHold) Cancel() {
	s := h.s
	for i := len(h.saved) - 1; i >= 0; i-- { // a model held twice ends as it first was
		hl := &h.saved[i]
		if hl.l == nil {
			delete(s.models, hl.model)
			continue
		}
		if s.models == nil {
			s.models = make(map[string]*tierLedger)
		}
		l := hl.l
		s.models[hl.model] = l
		l.full, l.wasFull = hl.full, hl.was
		l.contenders.Restore(hl.uses)
		clear(l.entries)
		for j, u := range hl.uses {
			*u = hl.vals[j]
			l.entries[u.tenant] = u
		}
	}
}

// addUse adds ⌈cost·2¹⁶/weight⌉ to used, saturating.
func addUse(used uint64, cost, weight int64) uint64 {
	c, w := uint64(max(cost, 1)), uint64(max(weight, 1))
	if c > math.MaxUint64>>16 {
		return math.MaxUint64
	}
	inc := (c<<16 + w - 1) / w
	if used > math.MaxUint64-inc {
		return math.MaxUint64
	}
	return used + inc
}
