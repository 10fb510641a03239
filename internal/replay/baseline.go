package replay

import (
	"fmt"
	"math"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/tokenbucket"
	"github.com/sluice-sched/sluice/pd"
)

// baseline is what admission looks like without Sluice, on the same
// capacity model: each domain's pd soft capacity (prefill and decode
// buckets, KV gauge, no floor reserves), one FIFO queue whose head is
// admitted to the fitting domain with the most prefill left, and at most
// one gate in front:
//
//   - fifo: none; every request joins the queue.
//   - global-bucket: one token bucket for the cluster, in weighted tokens,
//     sized to the cluster's soft prefill capacity at the trace's average
//     cost: rate = Σ domains' prefill FLOP/s × Σ rows' weighted tokens /
//     Σ rows' prefill FLOPs, burst = rate × capacity.burst_seconds (what
//     an operator would set as "the cluster's tokens/s"); a request it
//     cannot pay is refused QUOTA_EXCEEDED.
//   - tenant-buckets: each tenant's own token bucket (rate and burst from
//     its tier, no burst credit), QUOTA_EXCEEDED when empty; no fair
//     queue and no floors.
//
// Queued requests are refused DEADLINE_UNMEETABLE when their deadline
// passes (the config's queue.default_wait without --deadline), and
// QUEUE_FULL beyond queue.max_total. Requests are never degraded.
type baseline struct {
	s       *sim
	kind    string
	caps    []*pd.DomainCapacity
	queue   fifo // deadlines are arrival + a constant, so also in deadline order
	global  tokenbucket.Bucket
	buckets []tokenbucket.Bucket // by tenant index
	wait    int64
	max     int
}

func newBaseline(s *sim, kind string, rows []Row) *baseline {
	b := &baseline{s: s, kind: kind, wait: int64(s.opts.Config.Queue.DefaultWait.Duration), max: s.opts.Config.Queue.MaxTotal}
	for _, d := range s.domains {
		b.caps = append(b.caps, d.cap) // the sim's own copies: the engine never sees them
	}
	rate := globalRate(s, rows)
	burstSeconds := s.opts.Config.Capacity.BurstSeconds
	if burstSeconds <= 0 {
		burstSeconds = pd.DefaultConfig().BurstSeconds
	}
	b.global = tokenbucket.New(rate, int64(float64(rate)*burstSeconds), 0, 0)
	for _, t := range s.tenants {
		p, _ := s.opts.Config.Policy(t)
		b.buckets = append(b.buckets, tokenbucket.New(int64(p.Tokens.Rate), int64(p.Tokens.Burst), 0, 0))
	}
	return b
}

func (b *baseline) submit(now int64, r *simReq) error {
	if r.deadline == 0 {
		r.deadline = now + b.wait
	}
	switch b.kind {
	case PolicyGlobalBucket:
		if !b.global.Allow(now, r.weighted) {
			return b.s.decided(r, admission.Rejected, admission.ReasonQuotaExceeded, "", "", 0)
		}
	case PolicyTenantBuckets:
		if !b.buckets[r.tenant].Allow(now, r.weighted) {
			return b.s.decided(r, admission.Rejected, admission.ReasonQuotaExceeded, "", "", 0)
		}
	}
	m, _ := b.s.cat.Get(r.row.Model)
	ever := false
	for _, c := range b.caps {
		if cost, err := c.Cost(m, r.row.Prompt, r.row.Output); err == nil && c.CanEverFit(cost) {
			ever = true
			break
		}
	}
	if !ever {
		return b.s.decided(r, admission.Rejected, admission.ReasonCapacityExceeded, "", "", 0)
	}
	if !b.queue.admit(r, b.max) {
		return b.s.decided(r, admission.Rejected, admission.ReasonQueueFull, "", "", 0)
	}
	return b.dispatch(now)
}

// dispatch admits queue heads while one fits, after refusing the heads
// whose deadline has passed.
func (b *baseline) dispatch(now int64) error {
	for r := b.queue.peek(); r != nil; r = b.queue.peek() {
		if r.deadline <= now {
			b.queue.pop()
			if err := b.s.decided(r, admission.Rejected, admission.ReasonDeadlineUnmeetable, "", "", 0); err != nil {
				return err
			}
			continue
		}
		m, _ := b.s.cat.Get(r.row.Model)
		best, bestLevel := -1, int64(math.MinInt64)
		var bestCost pd.Cost
		for i, c := range b.caps {
			cost, err := c.Cost(m, r.row.Prompt, r.row.Output)
			if err != nil || !c.Fits(now, cost, true) {
				continue
			}
			if lvl, _ := c.Levels(now); lvl > bestLevel {
				best, bestLevel, bestCost = i, lvl, cost
			}
		}
		if best < 0 {
			return nil // head-of-line: the FIFO waits for its head
		}
		b.queue.pop()
		b.caps[best].Charge(now, bestCost)
		if err := b.s.decided(r, admission.Admitted, admission.ReasonNone, b.s.domains[best].id, r.row.Model, uint64(r.id)+1); err != nil {
			return err
		}
	}
	return nil
}

func (b *baseline) tick(now int64) {
	if err := b.dispatch(now); err != nil {
		b.s.rec.fail(err)
	}
}

func (b *baseline) release(now int64, r *simReq) error {
	if r.domain < 0 {
		return fmt.Errorf("released a request with no domain")
	}
	// The trace's output is what was charged: nothing to settle but KV.
	b.caps[r.domain].Release(now, r.cost, r.cost)
	return b.dispatch(now)
}

func (b *baseline) observe(int64, []admission.EngineSignal) {}

func (b *baseline) queued() int { return b.queue.len() }

func (b *baseline) close() {}

// globalRate is the global bucket's rate: the cluster's prefill FLOP/s
// in weighted tokens at the rows' average FLOPs per weighted token.
func globalRate(s *sim, rows []Row) int64 {
	var flops, tokens, capacity float64
	for _, d := range s.domains {
		capacity += float64(d.prefillRate)
	}
	if len(s.domains) == 0 {
		return 0
	}
	c := s.domains[0].cap
	for i := range rows {
		m, _ := s.cat.Get(rows[i].Model)
		cost, err := c.Cost(m, rows[i].Prompt, rows[i].Output)
		if err != nil {
			continue
		}
		flops += float64(cost.PrefillFLOP)
		tokens += float64(rows[i].Prompt + s.outW*rows[i].Output)
	}
	if flops == 0 {
		return 0
	}
	return int64(capacity * tokens / flops)
}
