package admission

import (
	"time"

	"github.com/sluice-sched/sluice/internal/rendezvous"
	"github.com/sluice-sched/sluice/internal/tokenbucket"
	"github.com/sluice-sched/sluice/pd"
)

// modelState is a catalog model with its degrade chain resolved to indexes.
type modelState struct {
	idx   int
	name  string
	model *pd.Model
	chain []int // lower tiers, in degrade order
}

func (e *Engine) rebuildModelsLocked() {
	names := e.mu.cat.Names()
	e.mu.models = make(map[string]*modelState, len(names))
	e.mu.modelList = make([]*modelState, len(names))
	for i, n := range names {
		m, _ := e.mu.cat.Get(n)
		ms := &modelState{idx: i, name: n, model: m}
		e.mu.models[n] = ms
		e.mu.modelList[i] = ms
	}
	for _, ms := range e.mu.modelList {
		for _, lower := range e.mu.cat.DegradeChain(ms.name) {
			ms.chain = append(ms.chain, e.mu.models[lower].idx)
		}
	}
}

// placement is where a request goes: one domain, one model, its cost there.
type placement struct {
	dom   *domainState
	model *modelState
	cost  pd.Cost
	tier  int // 0: the requested model; i: the i-th accepted lower tier
	floor bool
}

// orderLocked returns the rendezvous order of eligible domains for
// (tenant, model), weighted by domain health; cached until placement changes.
func (e *Engine) orderLocked(t *tenantState, m *modelState) []int {
	if t.orderGen[m.idx] == e.mu.placeGen && t.orders[m.idx] != nil {
		return t.orders[m.idx]
	}
	nodes := make([]rendezvous.Node, 0, len(e.mu.domains))
	idx := make([]int, 0, len(e.mu.domains))
	for i, d := range e.mu.domains {
		if d.eligible() {
			nodes = append(nodes, rendezvous.Node{ID: d.ID(), Weight: d.health.weight})
			idx = append(idx, i)
		}
	}
	order := rendezvous.Order(t.keyHash[m.idx], nodes, make([]int, 0, len(nodes)))
	for i, o := range order {
		order[i] = idx[o]
	}
	t.orders[m.idx], t.orderGen[m.idx] = order, e.mu.placeGen
	return order
}

// placeLocked finds the first domain, in rendezvous order, whose prefill
// bucket, decode bucket and KV gauge all fit the request, trying the
// requested model and then each accepted lower tier. A request that accepts
// lower tiers must leave headroom on its requested tier (more for low-weight
// tenants) so that low-weight tenants degrade first.
func (e *Engine) placeLocked(now int64, t *tenantState, r *pending, floor bool) (placement, bool) {
	return e.placeFromLocked(now, t, r, floor, 0)
}

// placeFromLocked is placeLocked trying tiers from the first-th on.
func (e *Engine) placeFromLocked(now int64, t *tenantState, r *pending, floor bool, first int) (placement, bool) {
	for ti, m := range r.tiers() {
		if ti < first {
			continue
		}
		var headroom float64
		if ti == 0 && r.ntiers > 1 {
			headroom = *e.mu.cfg.DegradeHeadroom * (1 - float64(t.policy.Weight)/float64(e.mu.maxWeight))
		}
		for _, di := range e.orderLocked(t, m) {
			d := e.mu.domains[di]
			if e.blockedLocked(d) {
				continue
			}
			cost, err := d.cap.Cost(m.model, r.prompt, r.output)
			if err != nil {
				continue
			}
			need := cost
			if headroom > 0 {
				need.PrefillFLOP += int64(headroom * float64(d.cap.PrefillBurst()))
				need.DecodeBytes += int64(headroom * float64(d.cap.DecodeBurst()))
				_, kvLimit := d.cap.KV()
				need.KVBytes += int64(headroom * float64(kvLimit))
			}
			if d.cap.Fits(now, need, floor) {
				return placement{dom: d, model: m, cost: cost, tier: ti, floor: floor}, true
			}
		}
	}
	return placement{}, false
}

// capacityOutlookLocked says, for a request that fits nowhere now, whether
// it could ever fit the shared part of an eligible domain (if not, whether a
// draining one could hold it), and the shortest wait until one of its tiers
// fits on its own.
func (e *Engine) capacityOutlookLocked(now int64, r *pending) (ever, drainingOnly bool, wait time.Duration, first pd.Cost) {
	wait = tokenbucket.Never
	for ti, m := range r.tiers() {
		for _, d := range e.mu.domains {
			if d.removed {
				continue
			}
			cost, err := d.cap.Cost(m.model, r.prompt, r.output)
			if err != nil || !d.cap.CanEverFit(cost) {
				continue
			}
			if !d.eligible() {
				drainingOnly = true
				continue
			}
			w := d.cap.RetryAfter(now, cost, false)
			if w == tokenbucket.Never { // only the floor reserve could hold it
				continue
			}
			if !ever && ti == 0 {
				first = cost
			}
			ever = true
			wait = min(wait, w)
		}
	}
	if ever {
		drainingOnly = false
	}
	return ever, drainingOnly, wait, first
}

// chargePlacementLocked charges the domain and opens a lease.
func (e *Engine) chargePlacementLocked(now int64, t *tenantState, r *pending, p placement) uint64 {
	p.dom.cap.Charge(now, p.cost)
	p.dom.inFlight++
	t.inFlight++
	if p.floor {
		t.floor.Take(now, r.weighted)
	}
	return e.mu.leases.add(lease{
		tenant: t, dom: p.dom, modelName: p.model.name,
		cost: p.cost, prompt: r.prompt, output: r.output, weighted: r.weighted,
		outWeight: e.mu.cfg.OutputTokenWeight, floor: p.floor,
		gates: r.gates, granted: now, expires: now + int64(e.mu.cfg.Leases.TTL.Duration),
	})
}

// blockedLocked reports whether the dispatcher has reserved d for a queued
// request ahead of the one being placed.
func (e *Engine) blockedLocked(d *domainState) bool {
	for _, b := range e.mu.blocked {
		if b == d {
			return true
		}
	}
	return false
}
