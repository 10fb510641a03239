package admission

import (
	"fmt"
	"time"

	"github.com/sluice-sched/sluice/internal/rendezvous"
	"github.com/sluice-sched/sluice/internal/tokenbucket"
	"github.com/sluice-sched/sluice/pd"
)

// placer is the room that chooses where a request runs. It owns the
// catalog's models with their degrade chains, the NVLink domains with their
// capacity, drain marks and health, and the floor reserves spread over
// them. A placement is one domain and one model tier: a request is never
// split across domains.
type placer struct {
	cfg       *Config
	cat       *pd.Catalog
	models    map[string]*modelState
	modelList []*modelState
	maxWeight int64 // the highest tenant weight: degradation headroom is relative to it

	domains     []*domainState
	byID        map[string]*domainState
	drainedAway map[string]string // drain reasons of domains not in the cluster: drained when they (re)appear
	gen         uint64            // bumped whenever placement weights or eligibility change
	floorTotal  int64             // Σ configured floors, weighted tokens/s

	// During dispatch: domains reserved for queued heads that do not fit.
	blocked []*domainState
}

// modelState is a catalog model with its degrade chain resolved to indexes.
type modelState struct {
	idx   int
	name  string
	model *pd.Model
	chain []int // lower tiers, in degrade order
}

// placement is where a request goes: one domain, one model, its cost there.
type placement struct {
	dom   *domainState
	model *modelState
	cost  pd.Cost
	tier  int // 0: the requested model; i: the i-th accepted lower tier
	floor bool
}

// outcome is the answer of an admission placed at pl: DEGRADED on a lower
// tier.
func (pl *placement) outcome() Outcome {
	if pl.tier > 0 {
		return Degraded
	}
	return Admitted
}

// orderCache holds one tenant's rendezvous order of domains per model
// index, valid while the placer's generation stays the same.
type orderCache struct {
	keyHash []uint64
	orders  [][]int
	gen     []uint64
}

// reset sizes the cache for a catalog and empties it.
func (c *orderCache) reset(tenant string, models []*modelState) {
	n := len(models)
	c.keyHash = make([]uint64, n)
	c.orders = make([][]int, n)
	c.gen = make([]uint64, n)
	for i, m := range models {
		c.keyHash[i] = rendezvous.Hash(tenant + "/" + m.name)
	}
}

func (p *placer) rebuildModels() {
	names := p.cat.Names()
	p.models = make(map[string]*modelState, len(names))
	p.modelList = make([]*modelState, len(names))
	for i, n := range names {
		m, _ := p.cat.Get(n)
		ms := &modelState{idx: i, name: n, model: m}
		p.models[n] = ms
		p.modelList[i] = ms
	}
	for _, ms := range p.modelList {
		for _, lower := range p.cat.DegradeChain(ms.name) {
			ms.chain = append(ms.chain, p.models[lower].idx)
		}
	}
}

// resolve checks a request against the catalog and the config's limits
// and fills r's tokens and tiers: its model, then the lower tiers it
// accepts in degrade-chain order, whatever order it listed them in.
func (p *placer) resolve(req *Request, r *pending) error {
	m, ok := p.models[req.Model]
	if !ok {
		return &InvalidArgumentError{Field: "model", Reason: fmt.Sprintf("unknown model %q (known: %v)", req.Model, p.cat.Names())}
	}
	if err := validateLimits(req, &p.cfg.Limits); err != nil {
		return err
	}
	r.prompt, r.output = req.PromptTokens, req.MaxOutputTokens
	r.tierBuf[0] = m
	for i, name := range req.AcceptDowngrade {
		lower, ok := p.models[name]
		if !ok {
			return &InvalidArgumentError{Field: fmt.Sprintf("accept_downgrade[%d]", i), Reason: fmt.Sprintf("unknown model %q", name)}
		}
		if !contains(m.chain, lower.idx) {
			return &InvalidArgumentError{Field: fmt.Sprintf("accept_downgrade[%d]", i), Reason: fmt.Sprintf("%q is not a lower tier of %q", name, m.name)}
		}
	}
	n := 1
	for _, li := range m.chain {
		for _, name := range req.AcceptDowngrade {
			if p.modelList[li].name == name && !containsModel(r.tierBuf[:n], li) {
				r.tierBuf[n] = p.modelList[li]
				n++
			}
		}
	}
	r.ntiers = n
	return nil
}

// reresolve points a queued request at the current catalog's models after
// a reload; lower tiers that are gone or no longer in the chain are
// dropped. It reports false when the requested model itself is gone.
func (p *placer) reresolve(r *pending) bool {
	m, ok := p.models[r.tierBuf[0].name]
	if !ok {
		return false
	}
	old := r.tierBuf
	r.tierBuf[0] = m
	n := 1
	for _, li := range m.chain {
		for _, o := range old[1:r.ntiers] {
			if p.modelList[li].name == o.name {
				r.tierBuf[n] = p.modelList[li]
				n++
			}
		}
	}
	r.ntiers = n
	return true
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func containsModel(ms []*modelState, idx int) bool {
	for _, m := range ms {
		if m.idx == idx {
			return true
		}
	}
	return false
}

// order returns the rendezvous order of eligible domains for (tenant,
// model), weighted by domain health; cached until placement changes.
func (p *placer) order(t *tenantState, m *modelState) []int {
	c := &t.orders
	if c.gen[m.idx] == p.gen && c.orders[m.idx] != nil {
		return c.orders[m.idx]
	}
	nodes := make([]rendezvous.Node, 0, len(p.domains))
	idx := make([]int, 0, len(p.domains))
	for i, d := range p.domains {
		if d.eligible() {
			nodes = append(nodes, rendezvous.Node{ID: d.ID(), Weight: d.health.weight})
			idx = append(idx, i)
		}
	}
	order := rendezvous.Order(c.keyHash[m.idx], nodes, make([]int, 0, len(nodes)))
	for i, o := range order {
		order[i] = idx[o]
	}
	c.orders[m.idx], c.gen[m.idx] = order, p.gen
	return order
}

// find returns the first domain, in rendezvous order, whose prefill bucket,
// decode bucket and KV gauge all fit the request, trying its tiers from the
// from-th up to before the upto-th (0, 1: the requested model only; 0,
// r.ntiers: every accepted lower tier too; floor: from the floor reserve).
// A request that accepts lower tiers must leave headroom on its requested
// tier, more for low-weight tenants, so that low-weight tenants degrade
// first. rec, if not nil, notes each (tier, domain) looked at (Explain).
func (p *placer) find(now int64, r *pending, floor bool, from, upto int, rec *recorder) (placement, bool) {
	for ti := from; ti < min(upto, r.ntiers); ti++ {
		m := r.tierBuf[ti]
		for _, di := range p.order(r.tenant, m) {
			d := p.domains[di]
			if p.isBlocked(d) {
				continue
			}
			cost, err := d.cap.Cost(m.model, r.prompt, r.output)
			fits := err == nil && d.cap.Fits(now, p.withHeadroom(r, ti, d, cost), floor)
			if rec != nil {
				rec.tried(now, m, d, floor, cost, err, fits)
			}
			if fits {
				return placement{dom: d, model: m, cost: cost, tier: ti, floor: floor}, true
			}
		}
	}
	return placement{}, false
}

// withHeadroom is what r's ti-th tier needs of d to be placed there: its
// cost, plus, on the requested tier of a request that accepts lower ones,
// the headroom it must leave.
func (p *placer) withHeadroom(r *pending, ti int, d *domainState, cost pd.Cost) pd.Cost {
	if ti != 0 || r.ntiers == 1 {
		return cost
	}
	if h := *p.cfg.DegradeHeadroom * (1 - float64(r.tenant.policy.Weight)/float64(p.maxWeight)); h > 0 {
		cost.PrefillFLOP += int64(h * float64(d.cap.PrefillBurst()))
		cost.DecodeBytes += int64(h * float64(d.cap.DecodeBurst()))
		_, kvLimit := d.cap.KV()
		cost.KVBytes += int64(h * float64(kvLimit))
	}
	return cost
}

// outlook is what placement can say of a request that fits nowhere now.
type outlook struct {
	ever         bool          // some eligible domain's shared part could hold one of its tiers
	own          bool          // one could hold its requested tier
	drainingOnly bool          // if not: only draining domains could
	wait         time.Duration // the shortest wait until one of its tiers fits on its own
	first        pd.Cost       // the requested tier's cost on the first domain that could hold it
}

// outlook looks at every domain for a request that fits nowhere now.
func (p *placer) outlook(now int64, r *pending) outlook {
	o := outlook{wait: tokenbucket.Never}
	for ti, m := range r.tiers() {
		for _, d := range p.domains {
			if d.removed {
				continue
			}
			cost, err := d.cap.Cost(m.model, r.prompt, r.output)
			if err != nil || !d.cap.CanEverFit(cost) {
				continue
			}
			if !d.eligible() {
				o.drainingOnly = true
				continue
			}
			w := d.cap.RetryAfter(now, cost, false)
			if w == tokenbucket.Never { // only the floor reserve could hold it
				continue
			}
			if !o.own && ti == 0 {
				o.first, o.own = cost, true
			}
			o.ever = true
			o.wait = min(o.wait, w)
		}
	}
	if o.ever {
		o.drainingOnly = false
	}
	return o
}

// fitsQueued tries to place a queued request for the dispatcher. A head
// that does not fit reserves the domain it waits for: requests behind it
// (larger finish tags) may be placed only elsewhere. Without this, small
// requests would take every refill and starve a large one at the head;
// with it, one domain serves strictly in tag order and several domains
// backfill around the waiting head (EASY backfilling).
//
// A queued request that accepts lower tiers is offered them only from its
// degradeAt on: until then it waits in the fair order for its requested
// tier. And it is offered its requested tier only when it is its tenant's
// turn there (turn, from tierShares); when it is not, it holds no domain
// for it: the tier is kept for the tenant whose turn it is.
func (p *placer) fitsQueued(now int64, w *waiter, turn bool) bool {
	from, upto := 0, 1
	if now >= w.degradeAt {
		upto = w.p.ntiers
	}
	if !turn {
		from = 1
	}
	if from >= upto {
		return false
	}
	pl, ok := p.find(now, &w.p, false, from, upto, nil)
	if !ok {
		if turn {
			if d := p.reservedFor(now, w); d != nil {
				p.blocked = append(p.blocked, d)
			}
		}
		return false
	}
	w.pl = pl
	return true
}

// reservedFor is the domain a queued request that does not fit waits for:
// the first in its rendezvous order for its requested model that could
// ever hold it.
func (p *placer) reservedFor(now int64, w *waiter) *domainState {
	m := w.p.tierBuf[0]
	for _, di := range p.order(w.p.tenant, m) {
		d := p.domains[di]
		if cost, err := d.cap.Cost(m.model, w.p.prompt, w.p.output); err == nil && d.cap.RetryAfter(now, cost, false) != tokenbucket.Never {
			return d
		}
	}
	return nil
}

// isBlocked reports whether the dispatcher has reserved d for a queued
// request ahead of the one being placed.
func (p *placer) isBlocked(d *domainState) bool {
	for _, b := range p.blocked {
		if b == d {
			return true
		}
	}
	return false
}

// eligibleRates sums the soft-capacity rates of the domains open to new
// placements.
func (p *placer) eligibleRates() (prefill, decode float64) {
	for _, d := range p.domains {
		if d.eligible() {
			prefill += float64(d.cap.PrefillRate())
			decode += float64(d.cap.DecodeRate())
		}
	}
	return prefill, decode
}

// stepHealth moves cut weights back up, one step per StepEvery after the
// cool-down.
func (p *placer) stepHealth(now int64) {
	changed := false
	for _, d := range p.domains {
		changed = d.health.step(&p.cfg.Health, now) || changed
	}
	if changed {
		p.gen++
	}
}

// recordOutcome feeds a Release outcome into the domain's health.
func (p *placer) recordOutcome(d *domainState, now int64, failed bool) {
	if d.health.record(&p.cfg.Health, now, failed) {
		p.changed()
	}
}
