package admission

import (
	"fmt"
	"math"
	"slices"
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
	maxWeight int64         // the highest tenant weight: degradation headroom is relative to it
	weights   map[int64]int // configured tenants by weight, so that maxWeight follows one tenant's change

	domains     []*domainState
	byID        map[string]*domainState
	drainedAway map[string]string // drain reasons of domains not in the cluster: drained when they (re)appear
	floorTotal  int64             // Σ configured floors, weighted tokens/s
	// floorShare is the share of every floor the eligible domains' corrected
	// capacity carries, in parts per million (changed); floorShareGiven is
	// the share last given to the active tenants (shareFloorsLocked).
	floorShare, floorShareGiven int64

	// Placement order: the domains' rendezvous tree, weighted by placeWeight,
	// and a cursor for walks past a tenant's first choice (one at a time,
	// under the engine's lock). gen is bumped whenever a weight changes:
	// the tenants' cached first choices are then stale.
	tree   *rendezvous.Tree
	cursor rendezvous.Cursor
	gen    uint64

	recovering []*domainState // domains whose health weight is cut: stepHealth's work
	rates      ratesCache     // Σ rates of the eligible domains
	feedbackAt int64          // engine time of the capacity loops' last step
	// leastLoad is the least load of the cluster's domains, drained ones
	// included, as the loops' last step left them (loads move only
	// then); 0 before the first and after the domains change. A request
	// whose choices are not loaded past it has no domain further to
	// weigh, and walks none (lookFurther).
	leastLoad float64
	// relayed: the shared state relays engine readings between replicas
	// (Engine.RelayEngineReadings); find notes the domains it weighs
	// (capacityLoop.look).
	relayed bool

	// During dispatch: domains reserved for queued heads that do not fit.
	blocked []*domainState
	// awaited are the domains reserved at the end of the last dispatch
	// pass for heads that wait for them alone (no lower tier to take),
	// kept until the next pass; awaiting collects them during a pass.
	// avoiding is set during findFloor's first look, which passes over
	// them and the domains the capacity guard holds; passedOver says it
	// did, so that a second look is needed only then.
	awaited, awaiting    []*domainState
	avoiding, passedOver bool
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
	// tierShare is the share of the request's weighted tokens its quota
	// pays on this tier (tierShare): wholeShare on the requested one.
	tierShare int32
}

// outcome is the answer of an admission placed at pl: DEGRADED on a lower
// tier.
func (pl *placement) outcome() Outcome {
	if pl.tier > 0 {
		return Degraded
	}
	return Admitted
}

// orderCache holds, per model index, one tenant's rendezvous key and its
// first two choices of domain, valid while the placer's generation stays
// the same: the domains most placements try. 24 bytes per model, whatever
// the cluster's size.
type orderCache []firstChoice

// firstChoice is a (tenant, model)'s rendezvous key and first two domains.
type firstChoice struct {
	keyHash uint64
	gen     uint64 // the placer's generation they were chosen at; 0: not yet
	domain  int32  // index in placer.domains; -1: no domain is eligible
	second  int32  // the next in its order; -1: none
}

// reset sizes the cache for a catalog and empties it.
func (c *orderCache) reset(tenant string, models []*modelState) {
	*c = make(orderCache, len(models))
	for i, m := range models {
		(*c)[i].keyHash = rendezvous.Hash(tenant + "/" + m.name)
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
	if err := validateLimits(req, &p.cfg.Limits, &p.cfg.Deferral); err != nil {
		return err
	}
	r.prompt, r.cached, r.output = req.PromptTokens, req.ExpectedCachedTokens, req.MaxOutputTokens
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

// firstTwo returns (tenant, model)'s first two choices of domain by
// rendezvous, cached until a placement weight changes; nil when no (second)
// domain is eligible.
func (p *placer) firstTwo(t *tenantState, m *modelState) (first, second *domainState) {
	c := &t.orders[m.idx]
	if c.gen != p.gen {
		c.domain, c.second, c.gen = -1, -1, p.gen
		p.cursor.Walk(p.tree, c.keyHash)
		if i, ok := p.cursor.Next(); ok {
			c.domain = int32(i)
		}
		if i, ok := p.cursor.Next(); ok {
			c.second = int32(i)
		}
	}
	if c.domain < 0 {
		return nil, nil
	}
	if c.second < 0 || p.cfg.Feedback.SpreadChoices < 2 {
		return p.domains[c.domain], nil
	}
	return p.domains[c.domain], p.domains[c.second]
}

// walk starts the placer's cursor on (tenant, model)'s rendezvous order of
// the eligible domains; next takes them one by one. The first is first's.
func (p *placer) walk(t *tenantState, m *modelState) {
	p.cursor.Walk(p.tree, t.orders[m.idx].keyHash)
}

// next returns the walk's next domain; nil once it is done.
func (p *placer) next() *domainState {
	if i, ok := p.cursor.Next(); ok {
		return p.domains[i]
	}
	return nil
}

// placeWeight is d's weight in the rendezvous tree: its health weight
// times its size (the model's prefill rate of the whole domain, in
// PFLOP/s) while it is eligible, 0 (no placement) when it is not. A
// domain is a tenant's first choice in proportion to what it can serve:
// an NVL72 rack, with 22 HGX nodes' prefill, is the first choice of 22
// times as many (tenant, model) keys. The size is the model's, before the
// capacity factor, so that a moving factor reshuffles no first choices.
func placeWeight(d *domainState) float64 {
	if !d.eligible() {
		return 0
	}
	prefill, _ := d.cap.PriorRates()
	return d.health.weight * max(float64(prefill)/1e15, minPlaceSize)
}

// minPlaceSize is the least size placeWeight gives an eligible domain, so
// that one whose rates round to nothing still ranks.
const minPlaceSize = 1e-6

// reweigh gives d its current placement weight in the tree; the cached
// first choices go stale if it moved.
func (p *placer) reweigh(d *domainState) {
	if w := placeWeight(d); w != p.tree.Weight(d.idx) {
		p.tree.SetWeight(d.idx, w)
		p.gen++
	}
}

// rebuildTree builds the rendezvous tree over the cluster's domains (after
// commitDomains).
func (p *placer) rebuildTree() {
	hashes := make([]uint64, len(p.domains))
	p.recovering = p.recovering[:0]
	for i, d := range p.domains {
		d.idx, hashes[i] = i, d.hash
		if d.health.weight < 1 {
			p.recovering = append(p.recovering, d)
		}
	}
	p.tree = rendezvous.NewTree(hashes)
	for _, d := range p.domains {
		p.tree.SetWeight(d.idx, placeWeight(d))
	}
	p.gen++
	p.leastLoad = 0 // a new domain's load is 0 until the next step
}

// find returns the first domain, in rendezvous order, whose prefill bucket,
// decode bucket and KV gauge all fit the request, trying the tiers of plan
// (floor: from the floor reserve).
// Of the order's first feedback.spread_choices (the power of two choices
// by default), the least loaded goes first once the first's load passes
// it by feedback.spread_margin of that load (loadedPast), so that a
// tenant's prefixes stay on a few domains while equal domains share the
// load. Two choices are cached per (tenant, model); more are walked for
// each request (choices). When every choice is loaded past a domain
// further down the order, the least loaded such domain joins them
// (lookFurther). The order is weighted by each domain's size
// (placeWeight).
// A request that accepts lower tiers must leave headroom on its requested
// tier, more for low-weight tenants, so that low-weight tenants degrade
// first. m sees each (tier, domain) looked at.
func (p *placer) find(now int64, r *pending, floor bool, plan tierPlan, m decisionMode) (placement, bool) {
	for ti := plan.from; ti < min(plan.upto, r.ntiers); ti++ {
		ms := r.tierBuf[ti]
		cand, n, walked := p.choices(r.tenant, ms)
		if n == 0 {
			continue
		}
		if p.relayed {
			for _, d := range cand[:n] {
				// Their loads and guards decide first: their engines'
				// readings matter here (not those of the domains tried
				// past the choices: a request that fits nowhere would
				// want the whole fleet's).
				d.loop.look(now, &p.cfg.Feedback)
			}
		}
		k := n // the choices
		n, walked = p.lookFurther(r, ms, &cand, n, walked)
		p.leastLoadedFirst(cand[:n])
		for _, d := range cand[:n] {
			if pl, ok := p.try(now, r, floor, ti, d, m); ok {
				return pl, true
			}
		}
		// None fits: the rest of the order, from just past the choices
		// (walked there only now: most placements fit a candidate).
		if !walked {
			p.walk(r.tenant, ms)
			for range k {
				p.next()
			}
		}
		for d := p.next(); d != nil; d = p.next() {
			if pl, ok := p.try(now, r, floor, ti, d, m); ok {
				return pl, true
			}
		}
	}
	return placement{}, false
}

// choices returns (tenant, model)'s first feedback.spread_choices domains
// in rendezvous order: the cached first two, or more from a walk, which is
// then left just after them (walked).
func (p *placer) choices(t *tenantState, m *modelState) (cand candidates, n int, walked bool) {
	if k := p.cfg.Feedback.SpreadChoices; k > 2 {
		p.walk(t, m)
		for n < k {
			d := p.next()
			if d == nil {
				break
			}
			cand[n] = d
			n++
		}
		return cand, n, true
	}
	first, second := p.firstTwo(t, m)
	if first != nil {
		cand[n] = first
		n++
	}
	if second != nil {
		cand[n] = second
		n++
	}
	return cand, n, false
}

// candidates are the domains a placement weighs by load: a tenant's
// choices, and one further (lookFurther).
type candidates [MaxSpreadChoices + 1]*domainState

// lookFurther adds to a request's n choices the least loaded of the
// domains further down its rendezvous order (at most lookFurtherDepth
// further) that every choice is loaded past: a tenant whose first domains
// are busy goes to idle capacity rather than queue behind its prefixes,
// and each tenant to its own further domains, not all of them to one. The
// least loaded, not the first found: a tenant that is most of the load
// fills the idlest domain it can reach first, where the first found may be
// nearly as busy as its choices. Each domain is weighed with r on it
// (placedLoad): a node a twentieth of a rack's size takes the same prompt
// as twenty times its load, and a burst that looked at a node idle at the
// last step would otherwise all land there before the next. walked says
// whether the placer's cursor stands just past the choices; lookFurther
// returns the number of candidates and whether it still does (it walks
// only when some domain in the cluster is loaded less by the margin).
func (p *placer) lookFurther(r *pending, m *modelState, cand *candidates, n int, walked bool) (int, bool) {
	if n == 0 || p.cfg.Feedback.SpreadChoices < 2 { // 1: first fit
		return n, walked
	}
	least := cand[0].loop.load
	for _, d := range cand[1:n] {
		least = min(least, d.loop.load)
	}
	if !p.loadedPast(least, p.leastLoad) {
		return n, walked // no domain in the cluster is loaded less by the margin
	}
	// The choices with r on them: a further domain is taken where it
	// stays below the least of them by the margin of that one's load.
	leastWith, base := math.Inf(1), 0.0
	for _, d := range cand[:n] {
		if l := p.placedLoad(r, m, d); l < leastWith {
			leastWith, base = l, d.loop.load
		}
	}
	if !walked {
		p.walk(r.tenant, m)
		for range n {
			p.next() // the choices
		}
	}
	found, best := false, 0.0
	for range lookFurtherDepth {
		d := p.next()
		if d == nil {
			break
		}
		l := p.placedLoad(r, m, d)
		if leastWith-l > p.spreadMargin(base) && (!found || l < best) {
			cand[n], best, found = d, l, true
		}
	}
	if found {
		n++
	}
	return n, false
}

// placedLoad is d's load with r placed on it: its load and r's share of
// the next reading of it (the use r's cost adds in one period, weighed
// feedback.load_smoothing), at the model's rates of the whole domain,
// before the factor, as the rendezvous weights are: a moving factor
// reshuffles nothing, and on domains of one size r adds alike.
func (p *placer) placedLoad(r *pending, m *modelState, d *domainState) float64 {
	cost, err := d.cap.CostCached(m.model, r.prompt, r.cached, r.output)
	if err != nil {
		return d.loop.load
	}
	fb := &p.cfg.Feedback
	prefill, decode := d.cap.PriorRates()
	period := int64(fb.Period.Duration)
	return d.loop.load + fb.LoadSmoothing*max(used(cost.PrefillFLOP, prefill, period), used(cost.DecodeBytes, decode, period))
}

// lookFurtherDepth bounds how far past its choices a placement looks for
// a less loaded domain: a few steps of O(log domains) each.
const lookFurtherDepth = 8

// leastLoadedFirst moves the least loaded of cand to its front once the
// first is loaded past it (loadedPast); the rest keep their order.
func (p *placer) leastLoadedFirst(cand []*domainState) {
	best := 0
	for i := range cand {
		if cand[i].loop.load < cand[best].loop.load {
			best = i
		}
	}
	if best > 0 && p.loadedPast(cand[0].loop.load, cand[best].loop.load) {
		d := cand[best]
		copy(cand[1:best+1], cand[:best])
		cand[0] = d
	}
}

// loadedPast reports whether a domain's load a passes another's, b, by
// feedback.spread_margin of a: the margin is relative, so that a tenant
// that is most of the load spreads it over equal domains at a light load
// as at a heavy one (an absolute margin of a tenth of a domain lets a
// domain at 0.2 stay twice as busy as one at 0.1). Below spreadLoadFloor
// the margin is of that floor: on nearly idle domains a difference of
// noise, relative to nothing, moves no request.
func (p *placer) loadedPast(a, b float64) bool {
	return a-b > p.spreadMargin(a)
}

// spreadMargin is the margin by which a domain at load a is loaded past
// another (loadedPast).
func (p *placer) spreadMargin(a float64) float64 {
	return p.cfg.Feedback.SpreadMargin * max(a, spreadLoadFloor)
}

// spreadLoadFloor is the least load the spread margin is relative to: at
// the default margin, a difference under a hundredth of a domain never
// moves a request.
const spreadLoadFloor = 0.1

// try reports whether r's ti-th tier fits d now, and where; m sees the
// try.
func (p *placer) try(now int64, r *pending, floor bool, ti int, d *domainState, m decisionMode) (placement, bool) {
	ms := r.tierBuf[ti]
	if p.isBlocked(d) {
		m.reserved(ms, d, floor)
		return placement{}, false
	}
	if p.avoiding && slices.Contains(p.awaited, d) {
		p.passedOver = true
		m.reserved(ms, d, floor)
		return placement{}, false
	}
	cost, err := d.cap.CostCached(ms.model, r.prompt, r.cached, r.output)
	// Engines saturated: the guard keeps the domain to its floors.
	held := holdNone
	if !floor || p.avoiding { // a floor passes a hold, but looks for a clear domain first
		held = d.loop.hold(now, &p.cfg.Feedback)
		p.passedOver = p.passedOver || floor && held != holdNone
	}
	fits := err == nil && held == holdNone && d.cap.Fits(now, p.withHeadroom(r, ti, d, cost), floor)
	m.tried(now, ms, d, floor, held, cost, err, fits)
	if !fits {
		return placement{}, false
	}
	share := int32(wholeShare)
	if ti > 0 {
		share = tierShare(r.tierBuf[0].model, ms.model)
	}
	return placement{dom: d, model: ms, cost: cost, tier: ti, floor: floor, tierShare: share}, true
}

// withHeadroom is what r's ti-th tier needs of d to be placed there: its
// cost, plus the headroom it must leave: on the requested tier of a
// request that accepts lower ones, more for lower weights; for deferred
// work, deferral.headroom, kept for interactive requests.
func (p *placer) withHeadroom(r *pending, ti int, d *domainState, cost pd.Cost) pd.Cost {
	if !r.deferred && (ti != 0 || r.ntiers == 1) {
		return cost // the common case: no headroom
	}
	h := 0.0
	if ti == 0 && r.ntiers > 1 {
		h = *p.cfg.DegradeHeadroom * (1 - float64(r.tenant.policy.Weight)/float64(p.maxWeight))
	}
	if r.deferred {
		h += p.cfg.Deferral.Headroom
	}
	if h > 0 {
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
	// ownWait is the same for its requested tier, with the headroom a
	// request that accepts lower tiers leaves there (withHeadroom).
	ownWait time.Duration
	first   pd.Cost // the requested tier's cost on the first domain that could hold it
	lower   pd.Cost // its first lower tier's cost that a domain could hold, on the first such
}

// outlook looks at every domain for a request that fits nowhere now.
func (p *placer) outlook(now int64, r *pending) outlook {
	o := outlook{wait: tokenbucket.Never, ownWait: tokenbucket.Never}
	for ti, m := range r.tiers() {
		for _, d := range p.domains {
			if d.removed {
				continue
			}
			cost, err := d.cap.CostCached(m.model, r.prompt, r.cached, r.output)
			if r.deferred {
				// Deferred work must fit with the headroom it leaves, or
				// it never runs: refused, not deferred forever.
				cost = p.withHeadroom(r, 1, d, cost) // tier 1: the deferral headroom alone
			}
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
			switch {
			case ti == 0:
				if !o.own {
					o.first, o.own = cost, true
				}
				o.ownWait = min(o.ownWait, p.ownRetry(now, r, d, cost, w))
			case o.lower == pd.Cost{}:
				o.lower = cost
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

// ownRetry is how long until r's requested tier fits d with the headroom
// it must leave there (withHeadroom), given retry, the wait without it.
func (p *placer) ownRetry(now int64, r *pending, d *domainState, cost pd.Cost, retry time.Duration) time.Duration {
	if r.ntiers == 1 || r.deferred || retry == tokenbucket.Never {
		return retry
	}
	return d.cap.RetryAfter(now, p.withHeadroom(r, 0, d, cost), false)
}

// tierServesBy reports whether some eligible domain's shared part refills
// for r's requested tier (with its headroom) within left: at the head of
// the queue, a lower bound of its wait. It stops at the first that does.
func (p *placer) tierServesBy(now int64, r *pending, left time.Duration) bool {
	m := r.tierBuf[0]
	for _, d := range p.domains {
		if !d.eligible() {
			continue
		}
		cost, err := d.cap.CostCached(m.model, r.prompt, r.cached, r.output)
		if err != nil {
			continue
		}
		if p.ownRetry(now, r, d, cost, d.cap.RetryAfter(now, cost, false)) <= left {
			return true
		}
	}
	return false
}

// fitsQueued tries to place a queued request for the dispatcher. A head
// that does not fit reserves the domain it waits for: requests behind it
// (larger finish tags) may be placed only elsewhere. Without this, small
// requests would take every refill and starve a large one at the head;
// with it, one domain serves strictly in tag order and several domains
// backfill around the waiting head (EASY backfilling). A head that waits
// for its requested tier takes a lower one as soon as no domain's capacity
// refills for the tier before its deadline, or when it is not its tenant's
// turn there: the tier is kept for the tenant whose turn it is.
func (p *placer) fitsQueued(now int64, w *waiter, turn bool) (placement, bool) {
	if !turn && now < w.degradeAt && p.cfg.Queue.DegradeAfter == nil {
		w.degradeAt = now
	}
	plan := queuedTiers(now, w, turn)
	if plan.from >= plan.upto {
		return placement{}, false
	}
	pl, ok := p.find(now, &w.p, false, plan, admitting())
	if !ok && plan.upto < w.p.ntiers && !p.tierServesBy(now, &w.p, time.Duration(w.deadline-now)) {
		w.degradeAt = now
		plan = tierPlan{from: 1, upto: w.p.ntiers} // its requested tier did not fit
		pl, ok = p.find(now, &w.p, false, plan, admitting())
	}
	if !ok && turn {
		if d := p.reservedFor(now, w, plan.from); d != nil {
			p.blocked = append(p.blocked, d)
			if w.p.ntiers == 1 {
				p.awaiting = append(p.awaiting, d)
			}
		}
	}
	return pl, ok
}

// queuedTiers plans the tiers a queued request may try: its lower tiers
// only from its degradeAt on (until then it waits in the fair order for
// its requested tier, which fitsQueued brings forward when the tier cannot
// serve it in time), and its requested tier only on its tenant's turn
// there (turn, from tierShares); when it is not, it holds no domain for
// it: the tier is kept for the tenant whose turn it is. One queued for its
// lower tiers (waiter.lowerOnly) tries those alone.
func queuedTiers(now int64, w *waiter, turn bool) tierPlan {
	plan := tierPlan{from: 0, upto: 1}
	if now >= w.degradeAt {
		plan.upto = w.p.ntiers
	}
	if !turn || w.lowerOnly {
		plan.from = 1
	}
	return plan
}

// reservedFor is the domain a queued request that does not fit waits for:
// the first in its rendezvous order for its ti-th tier (the first it
// tries) that could ever hold it.
func (p *placer) reservedFor(now int64, w *waiter, ti int) *domainState {
	m := w.p.tierBuf[ti]
	p.walk(w.p.tenant, m)
	for d := p.next(); d != nil; d = p.next() {
		if cost, err := d.cap.CostCached(m.model, w.p.prompt, w.p.cached, w.p.output); err == nil && d.cap.RetryAfter(now, cost, false) != tokenbucket.Never {
			return d
		}
	}
	return nil
}

// findFloor places a request within its tenant's floor, new or queued: on
// a domain whose engines are clear and that no queued head waits for, if
// one holds it; else on any. A floor skips the queue and passes the
// capacity guard, so it waits for no head and no hold, but where another
// domain's reserve holds it, it adds to no saturated engines and takes no
// refill a head waits for: that domain recovers, and its head is admitted,
// sooner.
func (p *placer) findFloor(now int64, r *pending, plan tierPlan, m decisionMode) (placement, bool) {
	p.avoiding, p.passedOver = true, false
	pl, ok := p.find(now, r, true, plan, m)
	p.avoiding = false
	if ok || !p.passedOver { // the second look would try the same domains alike
		return pl, ok
	}
	return p.find(now, r, true, plan, m)
}

// endPass ends a dispatch pass: the domains its heads wait for alone are
// awaited until the next (or until a queued request leaves otherwise).
func (p *placer) endPass() {
	p.blocked = p.blocked[:0]
	p.awaited, p.awaiting = append(p.awaited[:0], p.awaiting...), p.awaiting[:0]
}

// unawait forgets the awaited domains: a queued request left the queue
// between passes, or the domains changed; the next pass says again.
func (p *placer) unawait() { p.awaited = p.awaited[:0] }

// isBlocked reports whether the dispatcher has reserved d for a queued
// request ahead of the one being placed.
func (p *placer) isBlocked(d *domainState) bool { return slices.Contains(p.blocked, d) }

// ratesCache is the sum of the soft-capacity rates of the domains open to
// new placements, for the waiting room's estimates of a wait: summed again
// after a weight changes, or once per ratesEvery of engine time (the
// engine's tick; warm-up moves the rates continuously, by a few percent a
// second at most), instead of once per estimate (a mass expiry asks once
// per request).
type ratesCache struct {
	prefill, decode float64
	at              int64  // engine time of the sum
	gen             uint64 // placer generation of the sum, plus one; 0: stale
}

// ratesEvery is how long a sum of the eligible rates serves.
const ratesEvery = int64(10 * time.Millisecond)

// eligibleRates returns the sum of the eligible domains' rates.
func (p *placer) eligibleRates() (prefill, decode float64) {
	c := &p.rates
	if c.gen != p.gen+1 {
		c.prefill, c.decode, c.gen = 0, 0, p.gen+1
		for _, d := range p.domains {
			if d.eligible() {
				c.prefill += float64(d.cap.PrefillRate())
				c.decode += float64(d.cap.DecodeRate())
			}
		}
	}
	return c.prefill, c.decode
}

// tick does placement's timed work: cut health weights move back up, one
// step per StepEvery after the cool-down, and the sum of eligible rates
// ages.
func (p *placer) tick(now int64) {
	if now-p.rates.at >= ratesEvery {
		p.rates.gen, p.rates.at = 0, now
	}
	kept := p.recovering[:0]
	for _, d := range p.recovering {
		if d.health.step(&p.cfg.Health, now) {
			p.reweigh(d)
		}
		if d.health.weight < 1 {
			kept = append(kept, d)
		}
	}
	clear(p.recovering[len(kept):])
	p.recovering = kept
}

// recordOutcome feeds a Release outcome into the domain's health.
func (p *placer) recordOutcome(d *domainState, now int64, failed bool) {
	wasWhole := d.health.weight >= 1
	if d.health.record(&p.cfg.Health, now, failed) {
		if wasWhole && !d.removed {
			p.recovering = append(p.recovering, d)
		}
		p.reweigh(d)
	}
}
