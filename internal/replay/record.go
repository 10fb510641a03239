package replay

import (
	"math"
	"slices"
	"sort"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/sluice-sched/sluice/admission"
)

// Report is one policy's replay, per tenant and per domain. Rates are
// weighted tokens per second (prompt + output weight × output), the unit
// of quotas and floors.
type Report struct {
	Policy   string         `json:"policy"`
	Seconds  float64        `json:"seconds"` // simulated time, first arrival to last completion
	Requests int            `json:"requests"`
	Tenants  []TenantReport `json:"tenants"`
	Domains  []DomainReport `json:"domains"`
	// Spanning counts admissions whose answer did not name exactly one
	// domain of the cluster; it must be 0.
	Spanning int `json:"spanningRequests"`
	// Jain is Jain's fairness index of x_i = achieved_i / target_i over the
	// tenants with a target: 1 when each got its weighted fair share.
	Jain float64 `json:"jainIndex"`
	// MaxServiceDiff is the largest difference in weighted service between
	// two tenants over an interval in which both were backlogged
	// (normalised by weight, in tokens of the lighter of the two); VTC
	// bounds it by VTCBound = 2 × the largest request's weighted tokens.
	MaxServiceDiff float64 `json:"maxServiceDiff"`
	VTCBound       float64 `json:"vtcBound"`
	// Engines is what the simulated serving engines measured; nil with
	// them off.
	Engines *EngineReport `json:"engines,omitempty"`
	// Deferral is what became of the deferrable rows (Row.Deferrable);
	// nil without them.
	Deferral *DeferralReport `json:"deferral,omitempty"`
}

// TenantReport is one tenant's outcome.
type TenantReport struct {
	Name     string         `json:"name"`
	Weight   int64          `json:"weight"`
	Floor    int64          `json:"floor"`
	Requests int            `json:"requests"`
	Admitted int            `json:"admitted"`
	Degraded int            `json:"degraded"`
	Rejected map[string]int `json:"rejected"` // by reason
	WaitP50  float64        `json:"waitP50Ms"`
	WaitP95  float64        `json:"waitP95Ms"`
	WaitP99  float64        `json:"waitP99Ms"`
	WaitMax  float64        `json:"waitMaxMs"`
	// FloorViolations counts the seconds in which the tenant had unmet
	// demand (a request refused for a reason other than its own limits,
	// or one waiting a second or more) and was admitted less than its
	// floor.
	FloorViolations int `json:"floorViolationSeconds"`
	// WithinShareRefused counts the tenant's refusals not by its own
	// limits in seconds when its demand was within its weighted fair
	// share (0 < demand ≤ target): what the verdict calls refusals within
	// share.
	WithinShareRefused int `json:"withinShareRefused"`
	// Wasserstein2 is the 2-Wasserstein distance between the
	// distributions of the achieved and the target per-second rates.
	Wasserstein2 float64 `json:"wasserstein2"`
	// Achieved, Target and Demand are per simulated second: admitted
	// weighted tokens, the weighted max-min fair share of what was
	// admitted in total that second given each tenant's demand, and the
	// demand (backlog + arrivals − refusals by the tenant's own limits).
	Achieved []int64 `json:"achievedPerS"`
	Target   []int64 `json:"targetPerS"`
	Demand   []int64 `json:"demandPerS"`
	// WaitMaxPerS is the longest queue wait of the requests admitted in
	// each second, in ms: the wait curve over time.
	WaitMaxPerS []float64 `json:"waitMaxMsPerS"`
}

// Refused returns the tenant's refusals, all reasons.
func (t *TenantReport) Refused() int {
	n := 0
	for _, c := range t.Rejected {
		n += c
	}
	return n
}

// DomainReport is one domain's use of its soft capacity.
type DomainReport struct {
	ID          string  `json:"id"`
	Admitted    int     `json:"admitted"`
	PrefillUtil float64 `json:"prefillUtilization"` // busy share of its prefill FLOP/s
	DecodeUtil  float64 `json:"decodeUtilization"`  // busy share of its decode bytes/s
	// PrefillPerS is the prefill busy share per second (for plots).
	PrefillPerS []float64 `json:"prefillUtilizationPerS"`
}

// ownLimit reports whether a refusal is the tenant's own doing (its quota,
// credit, a frozen credit, budget, concurrency, or a request larger than
// its quota can ever lend), which the fair share and
// the floor do not count as unmet demand.
func ownLimit(r admission.Reason) bool {
	switch r {
	case admission.ReasonQuotaExceeded, admission.ReasonBurstCreditExhausted, admission.ReasonBurstCreditFrozen, admission.ReasonBudgetExhausted,
		admission.ReasonConcurrencyExceeded, admission.ReasonUnknownTenant, admission.ReasonRequestTooLarge:
		return true
	}
	return false
}

// ownLimitUnder is ownLimit for policy: global-bucket's refusals are
// QUOTA_EXCEEDED too, but its bucket is the cluster's, not the tenant's.
func ownLimitUnder(policy string) func(admission.Reason) bool {
	if policy == PolicyGlobalBucket {
		return func(r admission.Reason) bool { return r != admission.ReasonQuotaExceeded && ownLimit(r) }
	}
	return ownLimit
}

// tenantRec accumulates one tenant's outcome.
type tenantRec struct {
	weight, floor int64
	requests      int
	admitted      int
	degraded      int
	rejected      map[admission.Reason]int
	wait          *hdrhistogram.Histogram // µs
	waitMax       int64
	queued        int
	service       float64 // admitted weighted tokens / weight
	achieved      []int64 // per second
	arrived       []int64
	ownRefused    []int64
	refused       []int64 // all refusals, tokens
	unmet         []bool
	notOwn        []int   // refusals not by the tenant's own limits, per second
	waitPerS      []int64 // longest wait admitted per second, ns
}

func grow[T any](s []T, i int) []T {
	for len(s) <= i {
		var z T
		s = append(s, z)
	}
	return s
}

// pairRec tracks the service difference of two tenants while both are
// backlogged: the least and the most it has been since both were.
type pairRec struct {
	minD, maxD float64
}

// recorder collects what a replay measures as the simulation runs.
type recorder struct {
	s        *sim
	t        []*tenantRec
	backlog  []int                       // tenants with queued requests
	pairs    map[[2]int]*pairRec         // pairs of backlogged tenants
	own      func(admission.Reason) bool // whether a refusal is the tenant's own limit
	spanning int
	maxCost  int64
	maxDiff  float64
	endAt    int64
	err      error
}

func newRecorder(s *sim) *recorder {
	r := &recorder{s: s, own: ownLimitUnder(s.opts.Policy)}
	for _, name := range s.tenants {
		p, _ := s.opts.Config.Policy(name)
		r.t = append(r.t, &tenantRec{
			weight: max(p.Weight, 1), floor: p.Floor,
			rejected: map[admission.Reason]int{},
			wait:     hdrhistogram.New(1, int64(24*time.Hour/time.Microsecond), 3), // µs
		})
	}
	r.pairs = map[[2]int]*pairRec{}
	return r
}

func (r *recorder) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func sec(t int64) int { return int(t / int64(time.Second)) }

func (r *recorder) arrived(q *simReq) {
	t := r.t[q.tenant]
	t.requests++
	s := sec(q.arrive)
	t.arrived = grow(t.arrived, s)
	t.arrived[s] += q.weighted
	r.maxCost = max(r.maxCost, q.weighted)
}

func (r *recorder) queued(q *simReq) {
	q.wasQueued = true
	r.t[q.tenant].queued++
	r.touch(q.tenant)
}

// answered records q's answer at the simulation's now.
func (r *recorder) answered(q *simReq, model string) {
	t := r.t[q.tenant]
	now := r.s.now
	s := sec(now)
	switch q.outcome {
	case admission.Rejected:
		t.rejected[q.reason]++
		if r.own(q.reason) {
			t.ownRefused = grow(t.ownRefused, s)
			t.ownRefused[s] += q.weighted
		} else {
			t.unmet = grow(t.unmet, s)
			t.unmet[s] = true
			t.notOwn = grow(t.notOwn, s)
			t.notOwn[s]++
		}
		t.refused = grow(t.refused, s)
		t.refused[s] += q.weighted
	default:
		if q.outcome == admission.Degraded || model != q.row.Model {
			t.degraded++
		} else {
			t.admitted++
		}
		if !q.backlogged {
			// A ticket waited in the deferred backlog, not in the queue:
			// its wait is the deferral report's.
			w := (now - q.arrive) / int64(time.Microsecond)
			_ = t.wait.RecordValue(max(w, 0))
			t.waitMax = max(t.waitMax, now-q.arrive)
			t.waitPerS = grow(t.waitPerS, s)
			t.waitPerS[s] = max(t.waitPerS[s], now-q.arrive)
		}
		t.achieved = grow(t.achieved, s)
		t.achieved[s] += q.weighted
		t.service += float64(q.weighted) / float64(t.weight)
	}
	// A request that waited a second or more left demand unmet in every
	// second it waited past the first. A ticket's wait does not: deferred
	// work runs above the floors' reserve by design, so the floor is not
	// owed to it.
	for x := sec(q.arrive + int64(time.Second)); !q.backlogged && x <= sec(now-1) && now-q.arrive > int64(time.Second); x++ {
		t.unmet = grow(t.unmet, x)
		t.unmet[x] = true
	}
	if q.wasQueued {
		t.queued--
	}
	r.touch(q.tenant)
}

// touch updates the service differences of tenant i's pairs after an
// event of i. A request admitted from the queue counts as service while
// its tenant was backlogged (it was queued until that instant), so the
// pairs are updated before a tenant whose queue just emptied leaves the
// backlog. Only pairs of backlogged tenants are kept: the work is
// O(backlogged tenants) per event and the memory O(their pairs).
func (r *recorder) touch(i int) {
	at := slices.Index(r.backlog, i)
	if at < 0 && r.t[i].queued > 0 {
		r.backlog = append(r.backlog, i)
		at = len(r.backlog) - 1
	}
	if at < 0 {
		return
	}
	for _, j := range r.backlog {
		if j == i {
			continue
		}
		a, b := r.t[min(i, j)], r.t[max(i, j)]
		d := (a.service - b.service) * float64(min(a.weight, b.weight))
		k := pairKey(i, j)
		p, ok := r.pairs[k]
		if !ok {
			r.pairs[k] = &pairRec{minD: d, maxD: d}
			continue
		}
		p.minD, p.maxD = math.Min(p.minD, d), math.Max(p.maxD, d)
		r.maxDiff = math.Max(r.maxDiff, p.maxD-p.minD)
	}
	if r.t[i].queued == 0 {
		r.backlog = slices.Delete(r.backlog, at, at+1)
		for _, j := range r.backlog {
			delete(r.pairs, pairKey(i, j))
		}
	}
}

func pairKey(i, j int) [2]int { return [2]int{min(i, j), max(i, j)} }

func (r *recorder) end(now int64) { r.endAt = now }

// report turns the records into a Report.
func (r *recorder) report(s *sim) *Report {
	rep := &Report{Policy: s.opts.Policy, Seconds: float64(r.endAt) / 1e9, Spanning: r.spanning,
		MaxServiceDiff: r.maxDiff, VTCBound: 2 * float64(r.maxCost)}
	n := sec(r.endAt) + 1
	// Per-second demand: what was queued at the end of the last second,
	// plus arrivals, less refusals by the tenant's own limits.
	demand := make([][]int64, len(r.t))
	for i, t := range r.t {
		t.achieved, t.arrived, t.ownRefused, t.refused, t.unmet = grow(t.achieved, n-1), grow(t.arrived, n-1), grow(t.ownRefused, n-1), grow(t.refused, n-1), grow(t.unmet, n-1)
		demand[i] = make([]int64, n)
		var backlog int64
		for x := 0; x < n; x++ {
			demand[i][x] = max(backlog+t.arrived[x]-t.ownRefused[x], 0)
			backlog = max(backlog+t.arrived[x]-t.achieved[x]-t.refused[x], 0)
		}
	}
	target := make([][]int64, len(r.t))
	for i := range target {
		target[i] = make([]int64, n)
	}
	ds := make([]int64, len(r.t))
	ws := make([]int64, len(r.t))
	for x := 0; x < n; x++ {
		var total int64
		for i, t := range r.t {
			total += t.achieved[x]
			ds[i], ws[i] = demand[i][x], t.weight
		}
		for i, v := range waterfill(total, ds, ws) {
			target[i][x] = v
		}
	}
	var sumX, sumX2 float64
	nx := 0
	for i, t := range r.t {
		tr := TenantReport{
			Name: s.tenants[i], Weight: t.weight, Floor: t.floor, Requests: t.requests,
			Admitted: t.admitted, Degraded: t.degraded, Rejected: map[string]int{},
			Achieved: t.achieved[:n], Target: target[i], Demand: demand[i],
		}
		t.waitPerS = grow(t.waitPerS, n-1)
		for x := 0; x < n; x++ {
			tr.WaitMaxPerS = append(tr.WaitMaxPerS, float64(t.waitPerS[x])/1e6)
		}
		for reason, c := range t.rejected {
			tr.Rejected[reason.String()] = c
		}
		if t.wait.TotalCount() > 0 {
			tr.WaitP50 = float64(t.wait.ValueAtQuantile(50)) / 1000
			tr.WaitP95 = float64(t.wait.ValueAtQuantile(95)) / 1000
			tr.WaitP99 = float64(t.wait.ValueAtQuantile(99)) / 1000
			tr.WaitMax = float64(t.waitMax) / 1e6
		}
		if t.floor > 0 {
			for x := 0; x < n; x++ {
				if t.unmet[x] && t.achieved[x] < t.floor {
					tr.FloorViolations++
				}
			}
		}
		for x, c := range t.notOwn {
			if x < n && tr.Demand[x] > 0 && tr.Target[x] >= tr.Demand[x] {
				tr.WithinShareRefused += c
			}
		}
		tr.Wasserstein2 = wasserstein2(tr.Achieved, tr.Target)
		var a, g int64
		for x := 0; x < n; x++ {
			a += tr.Achieved[x]
			g += tr.Target[x]
		}
		if g > 0 {
			xi := float64(a) / float64(g)
			sumX += xi
			sumX2 += xi * xi
			nx++
		}
		rep.Requests += t.requests
		rep.Tenants = append(rep.Tenants, tr)
	}
	if nx > 0 && sumX2 > 0 {
		rep.Jain = sumX * sumX / (float64(nx) * sumX2)
	}
	for _, d := range s.domains {
		dr := DomainReport{ID: d.id, Admitted: d.admitted}
		switch {
		case d.eng != nil:
			// Of the engine's true rates, which a change may have moved.
			dr.PrefillUtil = d.prefill.units / max(d.prefill.avail, 1)
			dr.DecodeUtil = d.decode.units / max(d.decode.avail, 1)
		case r.endAt > 0:
			dr.PrefillUtil = d.prefill.units / (d.prefill.rate * float64(r.endAt) / 1e9)
			dr.DecodeUtil = d.decode.units / (d.decode.rate * float64(r.endAt) / 1e9)
		}
		busy := grow(d.prefill.busy, n-1)
		for x := 0; x < n; x++ {
			dr.PrefillPerS = append(dr.PrefillPerS, float64(busy[x])/1e9)
		}
		rep.Domains = append(rep.Domains, dr)
	}
	if s.erec != nil {
		rep.Engines = s.erec.report(rep)
	}
	if s.deferrable > 0 {
		rep.Deferral = deferralReport(s, rep)
	}
	return rep
}

// waterfill splits total among demands by weight, max-min fairly: no one
// gets more than its demand, and what a satisfied tenant leaves is shared
// by the others in proportion to their weights.
func waterfill(total int64, demand, weight []int64) []int64 {
	out := make([]int64, len(demand))
	idx := make([]int, 0, len(demand))
	for i, d := range demand {
		if d > 0 {
			idx = append(idx, i)
		}
	}
	// Satisfy in order of demand per weight; the rest share what is left.
	sort.SliceStable(idx, func(a, b int) bool {
		x, y := idx[a], idx[b]
		return demand[x]*weight[y] < demand[y]*weight[x] // demand per weight, exactly
	})
	left := float64(total)
	var wsum float64
	for _, i := range idx {
		wsum += float64(weight[i])
	}
	for _, i := range idx {
		share := left * float64(weight[i]) / wsum
		give := math.Min(share, float64(demand[i]))
		out[i] = int64(math.Round(give))
		left -= give
		wsum -= float64(weight[i])
	}
	return out
}

// wasserstein2 is the 2-Wasserstein distance between the empirical
// distributions of a and b (equal lengths): the root mean square
// difference of their sorted values.
func wasserstein2(a, b []int64) float64 {
	if len(a) == 0 || len(a) != len(b) {
		return 0
	}
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	var s float64
	for i := range x {
		d := float64(x[i] - y[i])
		s += d * d
	}
	return math.Sqrt(s / float64(len(x)))
}
