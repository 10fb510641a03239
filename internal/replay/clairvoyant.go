package replay

import (
	"math"

	"github.com/sluice-sched/sluice/admission"
)

// clairvoyant is a dispatcher that knows what no admission service can:
// each engine's prefills to the FLOP, from the simulator itself. It sends
// a request to a domain only if, running that engine forward (its
// processor-shared prefill, its FIFO waiting queue and its prefill-token
// budget), the request's prefill and every prefill already there end
// within Budget of their dispatch; of the domains that allow it, the one
// with the most room. Any waiting request that fits goes, not only the
// head. It keeps the tenants' quotas (quotas), refusing what they do not
// hold as Sluice would, so that what it admits is what an admission
// service may; it has no floors and no model.
//
// It is a yardstick, not a rule to deploy: with its budget bisected to
// the largest whose TTFT p99 meets the SLO, the engines' utilization under
// it is the most this dispatcher finds within the SLO (FeedbackTable). It
// is greedy and does not know what arrives next. Where an engine's batch
// (MaxBatch) or KV cache holds its queue's head, which the traces here do
// not reach, it does not foresee the engine and sends nothing there; nor
// does it foresee a change of an engine's capacity.
//
// Requests over their quota are refused QUOTA_EXCEEDED at once; requests
// wait at most their deadline (refused DEADLINE_UNMEETABLE),
// beyond queue.max_total are refused QUEUE_FULL, and CAPACITY_EXCEEDED at
// once when no engine could ever run them. Requests are never degraded.
type clairvoyant struct {
	s      *sim
	quotas *quotas
	queue  []queuedReq // in arrival order, so by deadline
	wait   int64
	max    int
	budget float64 // seconds
	// room is, per domain, the most prefill work (FLOP) a request
	// dispatched now may bring there; stale marks the domains to foresee
	// again.
	room  []float64
	stale []bool
	least []float64 // per domain, the least work a queued request brings
	// sent counts the requests dispatched; late holds those sent to end
	// past the budget (lateShare of them at most).
	sent int
	late map[*simReq]bool
	// Scratch for foreseeing an engine.
	runBuf, waitBuf []prefillJob
	// onDispatch, when set, sees each dispatch with the room its domain
	// had (tests).
	onDispatch func(r *simReq, domain int, work, room float64)
}

// queuedReq is a queued request and its prefill FLOP on each domain
// (+Inf where it can never run).
type queuedReq struct {
	r    *simReq
	work []float64
}

// prefillJob is a prefill as foreseen: its work left (FLOP), its prompt
// tokens and how long from now it may take (seconds).
type prefillJob struct {
	work   float64
	tokens int64
	due    float64
}

func newClairvoyant(s *sim) *clairvoyant {
	cfg := &s.opts.Config
	return &clairvoyant{s: s, quotas: newQuotas(s), wait: int64(cfg.Queue.DefaultWait.Duration), max: cfg.Queue.MaxTotal,
		budget: s.eng.Budget.Seconds(), room: make([]float64, len(s.domains)), stale: make([]bool, len(s.domains)),
		least: make([]float64, len(s.domains)), late: map[*simReq]bool{}}
}

func (c *clairvoyant) submit(now int64, r *simReq) error {
	if r.deadline == 0 {
		r.deadline = now + c.wait
	}
	if !c.quotas.take(now, r) {
		return c.s.decided(r, admission.Rejected, admission.ReasonQuotaExceeded, "", "", 0)
	}
	work, ever := c.s.prefillWork(r)
	if !ever {
		c.quotas.refund(now, r)
		return c.s.decided(r, admission.Rejected, admission.ReasonCapacityExceeded, "", "", 0)
	}
	if len(c.queue) >= c.max {
		c.quotas.refund(now, r)
		return c.s.decided(r, admission.Rejected, admission.ReasonQueueFull, "", "", 0)
	}
	c.queue = append(c.queue, queuedReq{r: r, work: work})
	return c.dispatch(now)
}

// dispatch refuses the requests past their deadline and sends each
// waiting request that fits a domain to the one with the most room.
func (c *clairvoyant) dispatch(now int64) error {
	n := 0
	for n < len(c.queue) && c.queue[n].r.deadline <= now {
		c.quotas.refund(now, c.queue[n].r)
		if err := c.s.decided(c.queue[n].r, admission.Rejected, admission.ReasonDeadlineUnmeetable, "", "", 0); err != nil {
			return err
		}
		n++
	}
	c.queue = c.queue[n:]
	if len(c.queue) == 0 {
		return nil
	}
	for i := range c.stale {
		c.stale[i], c.least[i] = true, math.Inf(1)
	}
	for _, q := range c.queue {
		for i, w := range q.work {
			c.least[i] = min(c.least[i], w)
		}
	}
	keep := c.queue[:0]
	for _, q := range c.queue {
		best := -1
		for i, d := range c.s.domains {
			if c.stale[i] {
				c.room[i], c.stale[i] = c.roomOn(d, now, c.least[i]), false
			}
			if q.work[i] <= c.room[i] && (best < 0 || c.room[i]-q.work[i] > c.room[best]-q.work[best]) {
				best = i
			}
		}
		if best < 0 && c.tooLong(q) && float64(len(c.late)+1) <= lateShare*float64(c.sent+1) {
			best = c.lateOn(q, now)
		}
		if best < 0 {
			keep = append(keep, q)
			continue
		}
		c.sent++
		if c.onDispatch != nil {
			c.onDispatch(q.r, best, q.work[best], c.room[best])
		}
		c.stale[best] = true
		if err := c.s.decided(q.r, admission.Admitted, admission.ReasonNone, c.s.domains[best].id, q.r.row.Model, uint64(q.r.id)+1); err != nil {
			return err
		}
	}
	clear(c.queue[len(keep):])
	c.queue = keep
	return nil
}

// lateShare is the share of the requests it sends that the dispatcher
// may send to end past the budget: a TTFT p99 within the SLO lets 1% end
// past it, and a prompt too long to end within the budget even alone
// would otherwise never go. It sends one only where every other prefill
// still ends within the budget, and only while late ones are under this
// share of those it sent.
const lateShare = 0.009

// tooLong reports whether q's prefill alone takes longer than the budget
// on every domain that could run it.
func (c *clairvoyant) tooLong(q queuedReq) bool {
	for i, d := range c.s.domains {
		if q.work[i] <= c.budget*d.prefill.rate {
			return false
		}
	}
	return true
}

// lateOn sends q to end past the budget on the first domain where every
// other prefill still ends within it, and returns that domain; -1: none.
func (c *clairvoyant) lateOn(q queuedReq, now int64) int {
	for i, d := range c.s.domains {
		if !math.IsInf(q.work[i], 1) && c.foresee(d, now, q.work[i], math.Inf(1)) {
			c.late[q.r] = true
			return i
		}
	}
	return -1
}

// roomOn is the most prefill work a request dispatched on d now may
// bring, so that its prefill and every one already there end within the
// budget of their dispatch: bisected, as more work only delays them all.
// -1 when not even the least work a queued request brings fits, nothing
// does, or d's engine cannot be foreseen (the common case while the
// engines are saturated, found in one or two runs forward).
func (c *clairvoyant) roomOn(d *simDomain, now int64, least float64) float64 {
	if math.IsInf(least, 1) || !c.foresee(d, now, least, c.budget) {
		return -1
	}
	lo, hi := least, c.budget*d.prefill.rate // alone, it ends within the budget at most
	if c.foresee(d, now, hi, c.budget) {
		return hi
	}
	for range 16 {
		if mid := (lo + hi) / 2; c.foresee(d, now, mid, c.budget) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// foresee runs d's engine forward from now with a request of work FLOP of
// prefill added at the tail of its waiting queue (none for 0), which may
// take ownDue seconds: whether every prefill ends within its due (the
// budget from its dispatch; none for the late ones). An engine whose rate
// is 0, or whose batch or KV cache holds its queue's head, is not
// foreseen: false.
func (c *clairvoyant) foresee(d *simDomain, now int64, work, ownDue float64) bool {
	e, rate := d.eng, d.prefill.rate
	if rate <= 0 || e.queued() > 0 && e.inPrefill < e.budget {
		return false
	}
	d.prefill.advance(now)
	due := func(r *simReq) float64 {
		if c.late[r] {
			return math.Inf(1)
		}
		return c.budget - float64(now-r.admitAt)/1e9
	}
	run, wait := c.runBuf[:0], c.waitBuf[:0]
	var inPrefill int64
	for _, r := range d.prefill.reqs {
		run = append(run, prefillJob{work: max(r.finish-d.prefill.s, 0), tokens: r.row.Prompt, due: due(r)})
		inPrefill += r.row.Prompt
	}
	for _, r := range e.waiting.waiting() {
		wait = append(wait, prefillJob{work: float64(r.cost.PrefillFLOP), tokens: r.row.Prompt, due: due(r)})
	}
	if work > 0 {
		// Last in the queue: its tokens hold back no one behind it.
		wait = append(wait, prefillJob{work: work, due: ownDue})
	}
	c.waitBuf = wait[:0]
	ok, t := true, 0.0
	for ok && (len(run) > 0 || len(wait) > 0) {
		for len(wait) > 0 && inPrefill < e.budget { // the engine's fill
			run = append(run, wait[0])
			inPrefill += wait[0].tokens
			wait = wait[1:]
		}
		least := run[0].work
		for _, j := range run[1:] {
			least = min(least, j.work)
		}
		t += least * float64(len(run)) / rate
		left := run[:0]
		for _, j := range run {
			if j.work -= least; j.work > 1e-9*least {
				left = append(left, j)
				continue
			}
			inPrefill -= j.tokens
			ok = ok && t <= j.due+1e-9
		}
		run = left
	}
	c.runBuf = run[:0]
	return ok
}

func (c *clairvoyant) tick(now int64) {
	if err := c.dispatch(now); err != nil {
		c.s.rec.fail(err)
	}
}

func (c *clairvoyant) release(int64, *simReq) error { return nil }

func (c *clairvoyant) observe(now int64, _ []admission.EngineSignal) { c.tick(now) }

func (c *clairvoyant) queued() int { return len(c.queue) }

func (c *clairvoyant) close() {}
