package replay

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/tokenbucket"
)

// quota is a tenant's proposed token bucket, in weighted tokens.
type quota struct{ rate, burst int64 }

// Wait is a tenant's time to admission in one replay: from a request's
// arrival to its admission, the time it waits for its quota's tokens
// included (see quotaClient). A refused request is never admitted: it
// counts as an infinite wait, so that a rate low enough to get requests
// refused never looks fast. The exception is a request larger than any
// domain's shared part (CAPACITY_EXCEEDED: it runs only on its tenant's
// floor reserve, when the floor bucket is full, which no quota changes);
// those are counted in NeverFit and left out. How many there are moves a
// little with the rate tried, as the floor bucket is full more or less
// often.
type Wait struct {
	// P99Ms is the 99th percentile (nearest rank) in ms over the requests
	// but NeverFit; -1 when more than 1% of them were refused, so that it
	// is infinite.
	P99Ms    float64        `json:"p99Ms"`
	Requests int            `json:"requests"`
	NeverFit int            `json:"neverFit,omitempty"`
	Refused  map[string]int `json:"refused,omitempty"` // by reason, NeverFit's included
}

// Never reports whether more than 1% of the requests were refused.
func (w Wait) Never() bool { return w.P99Ms < 0 }

// Meets reports whether the p99 is at most target ms.
func (w Wait) Meets(targetMs float64) bool { return !w.Never() && w.P99Ms <= targetMs }

// String is the p99 in ms, or why there is none.
func (w Wait) String() string {
	if !w.Never() {
		return fmt.Sprintf("%.1f", w.P99Ms)
	}
	n := -w.NeverFit
	for _, c := range w.Refused {
		n += c
	}
	return fmt.Sprintf("never (%.1f%% refused)", 100*float64(n)/float64(max(w.Requests-w.NeverFit, 1)))
}

// refusals lists the refusal reasons, sorted, as "REASON:n …"; "-" when
// none.
func (w Wait) refusals() string {
	if len(w.Refused) == 0 {
		return "-"
	}
	var out []string
	for _, r := range slices.Sorted(maps.Keys(w.Refused)) {
		out = append(out, fmt.Sprintf("%s:%d", r, w.Refused[r]))
	}
	return strings.Join(out, " ")
}

// quotaClient stands in front of the engine as the tenants' clients: each
// tenant's requests wait, in arrival order, until its quota's bucket holds
// their weighted tokens, then go to the engine. That is what a client that
// waits out QUOTA_EXCEEDED's Retry-After sees (the engine's own bucket
// refuses rather than queues), without the engine's refusals: the engine's
// bucket for the tenant is at least as large and refills the same way, so
// its token gate passes everything the client sends.
type quotaClient struct {
	inner   policy
	s       *sim
	buckets []tokenbucket.Bucket // by tenant index; rate 0: not held back
	waiting []fifo
	readyAt []int64 // by tenant: when the head of its waiting requests has its tokens
	n       int     // requests waiting for tokens, all tenants
	// event is the last instant the engine was handed a request or a
	// release: the engine's Tick runs at such instants and while it
	// queues, not at the millisecond ticks only the waiting requests ask
	// for (they would make an hour of backlog 3.6 million engine ticks).
	event int64
}

// newQuotaClient puts the quotas in front of s's policy.
func newQuotaClient(s *sim, quotas map[string]quota) *quotaClient {
	q := &quotaClient{inner: s.pol, s: s, buckets: make([]tokenbucket.Bucket, len(s.tenants)), waiting: make([]fifo, len(s.tenants)), readyAt: make([]int64, len(s.tenants)), event: -1}
	for i, t := range s.tenants {
		if l, ok := quotas[t]; ok {
			q.buckets[i] = tokenbucket.New(l.rate, l.burst, 0, 0)
		}
	}
	return q
}

func (q *quotaClient) submit(now int64, r *simReq) error {
	t := r.tenant
	b := &q.buckets[t]
	if b.Rate() == 0 || q.waiting[t].len() == 0 && b.Allow(now, r.weighted) {
		q.event = now
		return q.inner.submit(now, r)
	}
	if q.waiting[t].len() == 0 {
		q.readyAt[t] = now + int64(b.RetryAfter(now, r.weighted, 0))
	}
	q.waiting[t].push(r)
	q.n++
	return nil
}

// send passes every request whose tokens are there to the engine.
func (q *quotaClient) send(now int64) error {
	if q.n == 0 {
		return nil
	}
	for t := range q.waiting {
		w := &q.waiting[t]
		b := &q.buckets[t]
		if w.len() == 0 || now < q.readyAt[t] {
			continue
		}
		for r := w.peek(); r != nil && b.Allow(now, r.weighted); r = w.peek() {
			w.pop()
			q.n--
			q.event = now
			if err := q.inner.submit(now, r); err != nil {
				return err
			}
		}
		if r := w.peek(); r != nil {
			q.readyAt[t] = now + int64(b.RetryAfter(now, r.weighted, 0))
		}
	}
	return nil
}

func (q *quotaClient) tick(now int64) {
	if err := q.send(now); err != nil {
		q.s.rec.fail(err)
	}
	if q.n == 0 || q.event == now || q.inner.queued() > 0 {
		q.inner.tick(now)
	}
}

func (q *quotaClient) release(now int64, r *simReq) error {
	q.event = now
	return q.inner.release(now, r)
}

func (q *quotaClient) observe(now int64, signals []admission.EngineSignal) {
	q.inner.observe(now, signals)
}

// queued counts the requests waiting for tokens too: the event loop ticks
// every millisecond while any wait, which is when they are sent.
func (q *quotaClient) queued() int { return q.inner.queued() + q.n }

func (q *quotaClient) close() { q.inner.close() }

// withQuotas returns a copy of cfg in which each tenant of quotas has its
// token bucket: the rate at least the tenant's floor, as the config
// requires (the quota client holds the tenant to the proposed rate
// itself), the proposed burst.
func withQuotas(cfg admission.Config, quotas map[string]quota) admission.Config {
	out := cfg
	out.Tenants = maps.Clone(cfg.Tenants)
	for t, l := range quotas {
		tc := out.Tenants[t]
		p, _ := cfg.Policy(t)
		o := *tc.Overrides() // a copy: Overrides is shared
		o.Tokens = &admission.Limit{Rate: float64(max(l.rate, p.Floor)), Burst: float64(l.burst)}
		tc.TenantOverrides = &o
		out.Tenants[t] = tc
	}
	return out
}

// quotaReplay replays rows under the engine on cluster with each tenant of
// quotas held to its quota by a quotaClient, and returns each tenant's
// time to admission.
func quotaReplay(rows []Row, o *CheckOptions, quotas map[string]quota) (map[string]Wait, error) {
	s, err := newSim(rows, Options{Policy: PolicySluice, Config: withQuotas(o.Config, quotas), Cluster: o.Cluster})
	if err != nil {
		return nil, err
	}
	s.pol = newQuotaClient(s, quotas)
	defer s.pol.close()
	if err := s.run(rows); err != nil {
		return nil, err
	}
	waits := make([][]int64, len(s.tenants))
	out := map[string]Wait{}
	for i := range s.reqs {
		r := &s.reqs[i]
		t := s.tenants[r.tenant]
		w := out[t]
		w.Requests++
		if r.answered && r.outcome != admission.Rejected {
			waits[r.tenant] = append(waits[r.tenant], r.admitAt-r.arrive)
		} else {
			if w.Refused == nil {
				w.Refused = map[string]int{}
			}
			reason := "UNANSWERED" // the replay ended with it queued: never, as a refusal
			if r.answered {
				reason = r.reason.String()
			}
			w.Refused[reason]++
			if r.answered && r.reason == admission.ReasonCapacityExceeded {
				w.NeverFit++
			}
		}
		out[t] = w
	}
	for i, t := range s.tenants {
		w := out[t]
		ws := waits[i]
		slices.Sort(ws)
		// Nearest rank: the smallest wait that 99% of the requests are at
		// or below, the refused ones above every wait.
		k := int(math.Ceil(0.99 * float64(w.Requests-w.NeverFit)))
		switch {
		case k == 0:
			w.P99Ms = 0 // nothing it could wait for
		case k <= len(ws):
			w.P99Ms = float64(ws[k-1]) / 1e6
		default:
			w.P99Ms = -1
		}
		out[t] = w
	}
	return out, nil
}
