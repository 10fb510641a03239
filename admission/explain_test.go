package admission

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-sched/sluice/internal/tokenbucket"
)

// Explain says what Admit would do, gate by gate and domain by domain, and
// changes nothing: not the tenant's buckets, not the domains, not the queue.
func TestExplainChangesNothing(t *testing.T) {
	cfg := testConfig()
	p := cfg.Tiers["bronze"]
	p.Tokens = Limit{Rate: 100, Burst: 1000}
	cfg.Tiers["bronze"] = p
	h := newHarness(t, cfg, hgxCluster(t, 2))
	h.admit(req("b", "small", 10, 10)) // b's state is live: Explain must copy it
	state := func() (any, any, int, int) { return h.e.Tenants(), h.e.Domains(), h.e.QueueLen(), h.e.LeaseCount() }
	t1, d1, q1, l1 := state()
	ctx := context.Background()

	x, err := h.e.Explain(ctx, req("a", "medium", 1000, 100))
	if err != nil {
		t.Fatal(err)
	}
	if x.Outcome != "ADMITTED" || x.Domain == "" || x.Model != "medium" || len(x.Gates) != 6 || len(x.Placement) == 0 || !x.Placement[len(x.Placement)-1].Fits {
		t.Fatalf("a request that fits: %+v", x)
	}
	for _, g := range x.Gates {
		if !g.Passed || !g.Reached {
			t.Errorf("gate %s: %+v, want passed", g.Gate, g)
		}
	}
	// b asks more than its bucket holds now (950 of 1000): refused at the
	// token gate, the rest not reached.
	x, err = h.e.Explain(ctx, req("b", "small", 960, 5))
	if err != nil {
		t.Fatal(err)
	}
	if x.Outcome != "REJECTED" || x.Reason != ReasonQuotaExceeded || x.RetryAfter <= 0 {
		t.Fatalf("over quota: %+v", x)
	}
	passed := map[string]bool{}
	reached := map[string]bool{}
	for _, g := range x.Gates {
		passed[g.Gate], reached[g.Gate] = g.Passed, g.Reached
	}
	if !passed["rps"] || passed["tokens"] || !reached["tokens"] || reached["concurrency"] {
		t.Fatalf("over quota, gates: %+v", x.Gates)
	}
	if x, _ := h.e.Explain(ctx, req("nobody", "small", 10, 10)); x.Reason != ReasonUnknownTenant {
		t.Fatalf("unknown tenant: %+v", x)
	}
	if _, err := h.e.Explain(ctx, req("a", "no-such-model", 10, 10)); !isInvalid(err, "model") {
		t.Fatalf("unknown model: %v, want invalid model", err)
	}
	t2, d2, q2, l2 := state()
	if !reflect.DeepEqual(t1, t2) || !reflect.DeepEqual(d1, d2) || q1 != q2 || l1 != l2 {
		t.Fatalf("Explain changed the engine:\n%+v\n%+v", t1, t2)
	}
	// With the domains full, a request would queue, and says how long.
	h.saturate("a", "large", 4000, 10)
	x, _ = h.e.Explain(ctx, req("a", "large", 4000, 10))
	if x.Outcome != "QUEUED" || x.EstimatedWait <= 0 {
		t.Fatalf("on a full cluster: %+v, want QUEUED with an estimated wait", x)
	}
	for _, pc := range x.Placement {
		if pc.Fits {
			t.Errorf("on a full cluster, %s fits: %+v", pc.Domain, pc)
		}
	}
}

// Explain says when a domain it looks at is warming up after a return.
func TestExplainShowsWarmup(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	if err := h.e.Drain("d1", "swap"); err != nil {
		t.Fatal(err)
	}
	if err := h.e.Undrain("d1"); err != nil {
		t.Fatal(err)
	}
	x, err := h.e.Explain(context.Background(), req("a", "small", 10, 10))
	if err != nil {
		t.Fatal(err)
	}
	if len(x.Placement) == 0 || !strings.Contains(x.Placement[0].Detail, "warming up: 25.0% of its shared capacity, whole in 1m0s") {
		t.Fatalf("placement after an undrain: %+v, want the warm-up", x.Placement)
	}
}

// Explain names an operator's credit freeze at the token gate.
func TestExplainShowsCreditFreeze(t *testing.T) {
	cfg := testConfig()
	p := cfg.Tiers["bronze"]
	p.Tokens = Limit{Rate: 100, Burst: 1000}
	p.BurstCredit = BurstCredit{Multiple: 10}
	cfg.Tiers["bronze"] = p
	h := newHarness(t, cfg, hgxCluster(t, 1))
	h.e.FreezeCreditFor(time.Minute, "incident")
	x, err := h.e.Explain(context.Background(), req("b", "small", 1500, 10))
	if err != nil {
		t.Fatal(err)
	}
	if x.Outcome != "REJECTED" || x.Reason != ReasonBurstCreditFrozen || x.RetryAfter != time.Minute {
		t.Fatalf("over quota while frozen: %+v, want BURST_CREDIT_FROZEN until the freeze ends", x)
	}
	for _, g := range x.Gates {
		if g.Gate == "tokens" && (g.Passed || !strings.Contains(g.Detail, "frozen by an operator")) {
			t.Fatalf("token gate: %+v", g)
		}
	}
}

// Explain says when a degradable request is kept from its tier because it
// is not its tenant's turn there, and leaves the tier's contention as it
// was (a request not on its turn marks a full tier contended again).
func TestExplainShowsNotItsTurn(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	now := h.e.nowLocked()
	tiers := &h.e.mu.room.tiers
	tiers.full(now, "large")
	tiers.want(now, "large", "b", false)     // b wants large, at the least use
	tiers.charge(now, "large", "a", 1000, 1) // a has had some
	full := tiers.models["large"].full
	r := req("a", "large", 10, 10)
	r.AcceptDowngrade = []string{"medium"}
	x, err := h.e.Explain(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	// The tier is kept for b: a takes medium at once (with
	// queue.degrade_after set, it would wait that long in the fair order
	// first).
	if x.Outcome != "DEGRADED" || x.Model != "medium" || len(x.Placement) == 0 || !strings.Contains(x.Placement[0].Detail, "not tenant a's turn at large") {
		t.Fatalf("a, not its turn at large: %+v, want DEGRADED to medium and the reason", x)
	}
	if tiers.models["large"].full != full {
		t.Fatal("Explain marked large full")
	}
}

// Explain asks the fair queue's bounds as Admit does: with the flow's one
// place taken, a request that would wait is QUEUE_FULL, not QUEUED.
func TestExplainSaysQueueFull(t *testing.T) {
	cfg := testConfig()
	cfg.Queue.MaxPerFlow = 1
	h := newHarness(t, cfg, hgxCluster(t, 1))
	h.saturate("a", "large", 4000, 10)
	if _, w := h.submit(req("a", "large", 4000, 10)); w == nil {
		t.Fatal("on a full cluster, a request did not queue")
	}
	x, err := h.e.Explain(context.Background(), req("a", "large", 4000, 10))
	if err != nil {
		t.Fatal(err)
	}
	d, _ := h.submit(req("a", "large", 4000, 10))
	if x.Outcome != "REJECTED" || x.Reason != ReasonQueueFull || d.Reason != ReasonQueueFull || x.RetryAfter != d.RetryAfter {
		t.Fatalf("with the flow's queue full: Explain %+v, Admit %+v", x, d)
	}
}

// Explain runs Admit's own decision, so for any engine state and request
// its verdict — outcome, reason, Retry-After, domain and model — is what
// Submit then answers (QUEUED for a request Submit leaves waiting; a
// request id seen before answers as Admit repeats it). And it changes
// nothing: beside the explained engine runs a twin that gets the same
// calls but never an Explain, and after every step the two agree on every
// decision, every observed answer and their whole state — tenants' buckets,
// domains' buckets, leases, idempotency records, the fair queue's virtual
// times and backlog, the tier shares.
func TestExplainAgreesWithAdmit(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		mk := drawExplainConfig(t)
		twin := [2]*explainTwin{}
		for i := range twin {
			tw := &explainTwin{}
			tw.h = newHarness(t, mk(), hgxCluster(t, 2))
			tw.h.e.observer = &tw.obs
			twin[i] = tw
		}
		x, y := twin[0], twin[1] // x is explained, y never
		ctx := context.Background()
		explain := func(r Request) (Explanation, error) {
			x.obs.explaining = true
			xp, err := x.h.e.Explain(ctx, r)
			x.obs.explaining = false
			if x.obs.during != 0 {
				t.Fatalf("Explain(%+v) was observed as an answer", r)
			}
			return xp, err
		}
		var asked []Request
		for range rapid.IntRange(1, 120).Draw(t, "steps") {
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op <= 3: // explain, then admit on both; a few times over, to fill domains and queue
				r := drawExplainRequest(t, x.h.clk.Now())
				if len(asked) > 0 && rapid.IntRange(0, 3).Draw(t, "again") == 0 {
					r = rapid.SampledFrom(asked).Draw(t, "retry") // a retry, with its request id if any
				}
				asked = append(asked, r)
				for range rapid.SampledFrom([]int{1, 1, 2, 6}).Draw(t, "times") {
					xp, xerr := explain(r)
					dx, tx, errx := x.h.e.Submit(ctx, r)
					dy, ty, erry := y.h.e.Submit(ctx, r)
					checkExplained(t, r, xp, xerr, dx, tx, errx)
					x.took(dx, tx, errx)
					y.took(dy, ty, erry)
					sameAnswer(t, "Submit", x, y, dx, dy, errx, erry)
					if (tx == nil) != (ty == nil) {
						t.Fatalf("Submit(%+v): queued on one twin only", r)
					}
				}
			case op == 4: // an Explain alone
				_, _ = explain(drawExplainRequest(t, x.h.clk.Now()))
			case op == 5:
				dt := rapid.SampledFrom([]time.Duration{0, 10 * time.Millisecond, 100 * time.Millisecond, time.Second, 3 * time.Second}).Draw(t, "advance")
				x.h.advance(dt)
				y.h.advance(dt)
			case op == 6:
				if len(x.leases) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(x.leases)-1).Draw(t, "lease")
				rel := Release{PromptTokens: rapid.Int64Range(0, 4000).Draw(t, "prompt"), OutputTokens: rapid.Int64Range(0, 1000).Draw(t, "output"),
					Outcome: rapid.SampledFrom([]ReleaseOutcome{ReleaseOK, ReleaseError}).Draw(t, "outcome")}
				rel.LeaseID = x.leases[i]
				rx, errx := x.h.e.Release(ctx, rel)
				rel.LeaseID = y.leases[i]
				ry, erry := y.h.e.Release(ctx, rel)
				if !reflect.DeepEqual(rx, ry) || fmt.Sprint(errx) != fmt.Sprint(erry) {
					t.Fatalf("Release: %+v %v, twin %+v %v", rx, errx, ry, erry)
				}
			case op == 7: // a queued caller takes its answer, or gives up
				if len(x.tickets) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(x.tickets)-1).Draw(t, "ticket")
				tx, ty := x.tickets[i], y.tickets[i]
				x.tickets, y.tickets = slices.Delete(x.tickets, i, i+1), slices.Delete(y.tickets, i, i+1)
				if tx.Answered() != ty.Answered() {
					t.Fatal("a ticket answered on one twin only")
				}
				wctx, cancel := context.WithCancel(ctx)
				if !tx.Answered() {
					cancel() // it gives up (with its answer there, Await would pick either at random)
				}
				dx, dy := x.h.e.Await(wctx, tx), y.h.e.Await(wctx, ty)
				cancel()
				x.took(dx, nil, nil)
				y.took(dy, nil, nil)
				sameAnswer(t, "Await", x, y, dx, dy, nil, nil)
			case op == 8:
				dom := rapid.SampledFrom([]string{"d1", "d2"}).Draw(t, "domain")
				if rapid.Bool().Draw(t, "drain") {
					_, _ = x.h.e.Drain(dom, "test"), y.h.e.Drain(dom, "test")
				} else {
					_, _ = x.h.e.Undrain(dom), y.h.e.Undrain(dom)
				}
			case op == 9:
				if rapid.Bool().Draw(t, "freeze") {
					x.h.e.FreezeCreditFor(2*time.Second, "test")
					y.h.e.FreezeCreditFor(2*time.Second, "test")
				} else {
					x.h.e.ThawCredit()
					y.h.e.ThawCredit()
				}
			}
			sameState(t, x.h.e, y.h.e)
			if len(x.obs.seen) != len(y.obs.seen) || !reflect.DeepEqual(x.obs.seen, y.obs.seen) {
				t.Fatalf("observed answers differ:\n%+v\n%+v", x.obs.seen, y.obs.seen)
			}
		}
		// Shutting down: Explain says so, as Admit does.
		x.h.e.Close()
		r := drawExplainRequest(t, x.h.clk.Now())
		xp, xerr := explain(r)
		dx, tx, errx := x.h.e.Submit(ctx, r)
		checkExplained(t, r, xp, xerr, dx, tx, errx)
		y.h.e.Close()
	})
}

// explainTwin is one of the two engines of TestExplainAgreesWithAdmit and
// what its callers hold: leases and queued tickets, in the same order on
// both twins.
type explainTwin struct {
	h       *harness
	obs     answerLog
	leases  []uint64
	tickets []*Ticket
}

// took keeps what an answer gave the caller: a lease, or a ticket.
func (tw *explainTwin) took(d Decision, tk *Ticket, err error) {
	switch {
	case err != nil:
	case tk != nil:
		tw.tickets = append(tw.tickets, tk)
	case d.LeaseID != 0 && !slices.Contains(tw.leases, d.LeaseID):
		tw.leases = append(tw.leases, d.LeaseID)
	}
}

// answerLog is an Observer that keeps every answer, lease ids left out
// (each twin draws its own), and counts those seen during an Explain.
type answerLog struct {
	seen       []Decision
	explaining bool
	during     int
}

func (l *answerLog) ObserveDecision(_ Request, d Decision) {
	if l.explaining {
		l.during++
	}
	d.LeaseID = 0
	l.seen = append(l.seen, d)
}

func (l *answerLog) ObserveRelease(Release, ReleaseResult) {}

// drawExplainConfig draws a config that makes every gate and every answer
// reachable on two HGX domains: tight or loose quotas, burst credit,
// budgets, concurrency limits, a critical band, a floor, small queue bounds
// and deadlines. It returns a maker: each twin gets its own copy. Domains
// return whole (no warm-up): a ramp moves with every read of a domain,
// Explain's as much as Admit's, so the twins would drift apart by reading.
func drawExplainConfig(t *rapid.T) func() Config {
	big := Limit{Rate: 1e9, Burst: 1e9}
	policy := func(name string, weight int64) TierPolicy {
		return TierPolicy{
			Weight:         weight,
			RPS:            rapid.SampledFrom([]Limit{big, big, {Rate: 2, Burst: 4}}).Draw(t, name+".rps"),
			Tokens:         rapid.SampledFrom([]Limit{big, {Rate: 2000, Burst: 20000}, {Rate: 500, Burst: 5000}}).Draw(t, name+".tokens"),
			MaxConcurrency: rapid.SampledFrom([]int64{0, 0, 2, 5}).Draw(t, name+".concurrency"),
			Floor:          rapid.SampledFrom([]int64{0, 0, 400}).Draw(t, name+".floor"),
			BurstCredit:    rapid.SampledFrom([]BurstCredit{{}, {Multiple: 4, Window: Duration{2 * time.Second}, BreakerOpen: Duration{5 * time.Second}}}).Draw(t, name+".credit"),
			Budget:         rapid.SampledFrom([]Budget{{}, {DailyUSD: 0.05}}).Draw(t, name+".budget"),
			Critical:       rapid.SampledFrom([]Limit{{}, {Rate: 2000, Burst: 10000}}).Draw(t, name+".critical"),
		}
	}
	gold, bronze := policy("gold", 4), policy("bronze", 1)
	q := QueueConfig{
		MaxPerFlow:      rapid.SampledFrom([]int{1, 1, 2}).Draw(t, "queue.max_per_flow"),
		MaxTotal:        rapid.SampledFrom([]int{2, 2, 4, 1000}).Draw(t, "queue.max_total"),
		MaxCritical:     rapid.SampledFrom([]int{1, 1000}).Draw(t, "queue.max_critical"),
		DefaultWait:     Duration{rapid.SampledFrom([]time.Duration{time.Second, 10 * time.Second}).Draw(t, "queue.default_wait")},
		DegradeAfter:    rapid.SampledFrom([]*Duration{nil, {0}, {100 * time.Millisecond}}).Draw(t, "queue.degrade_after"),
		TierShareWindow: &Duration{rapid.SampledFrom([]time.Duration{0, 5 * time.Second}).Draw(t, "queue.tier_share_window")},
	}
	maxIDs := rapid.SampledFrom([]int{0, 4}).Draw(t, "leases.max_idempotency_records")
	return func() Config {
		cfg := testConfig()
		cfg.Tiers = map[string]TierPolicy{"gold": gold, "bronze": bronze}
		cfg.Queue = q
		cfg.Queue.DegradeAfter, cfg.Queue.TierShareWindow = clonePtr(q.DegradeAfter), ptr(*q.TierShareWindow)
		cfg.Leases.MaxIdempotencyRecords = maxIDs
		cfg.Warmup.Period = &Duration{}
		return cfg
	}
}

// drawExplainRequest draws a request of any tenant (one unknown), model,
// size, lower tiers, priority, request id (from a few, so that some
// repeat, some with another body) and deadline.
func drawExplainRequest(t *rapid.T, wall time.Time) Request {
	r := Request{
		Tenant:          rapid.SampledFrom([]string{"a", "b", "c", "nobody"}).Draw(t, "tenant"),
		Model:           rapid.SampledFrom([]string{"large", "medium", "small"}).Draw(t, "model"),
		PromptTokens:    rapid.SampledFrom([]int64{100, 1000, 4000, 8000, 30000}).Draw(t, "prompt"),
		MaxOutputTokens: rapid.SampledFrom([]int64{10, 100, 1000}).Draw(t, "output"),
		Priority:        rapid.SampledFrom([]Priority{0, PriorityNormal, PriorityCritical}).Draw(t, "priority"),
		RequestID:       rapid.SampledFrom([]string{"", "", "", "r1", "r2"}).Draw(t, "id"),
	}
	lower := map[string][]string{"large": {"medium", "small"}, "medium": {"small"}}[r.Model]
	for _, m := range lower {
		if rapid.Bool().Draw(t, "accept "+m) {
			r.AcceptDowngrade = append(r.AcceptDowngrade, m)
		}
	}
	if dl := rapid.SampledFrom([]time.Duration{0, 50 * time.Millisecond, 500 * time.Millisecond, 5 * time.Second}).Draw(t, "deadline"); dl > 0 {
		r.Deadline = wall.Add(dl)
	}
	return r
}

// checkExplained fails unless Explain's answer xp (or error) is what
// Submit answered: d, or a ticket, or an error; and unless its gates read
// as screen runs them: those reached passed, but for at most one that
// refused (then the answer is REJECTED), and none reached after it.
func checkExplained(t *rapid.T, r Request, xp Explanation, xerr error, d Decision, tk *Ticket, err error) {
	t.Helper()
	if len(xp.Gates) > 1 {
		refused := -1
		for i, g := range xp.Gates {
			switch {
			case g.Passed && !g.Reached, g.Reached && refused >= 0, !g.Reached && refused < 0:
				t.Fatalf("%+v: gate %d of %+v", r, i, xp.Gates)
			case g.Reached && !g.Passed:
				refused = i
			}
		}
		if refused >= 0 && xp.Outcome != "REJECTED" {
			t.Fatalf("%+v: a gate refused, yet %s: %+v", r, xp.Outcome, xp.Gates)
		}
		if len(xp.Gates) != int(numGates) {
			t.Fatalf("%+v: %d gates, want %d", r, len(xp.Gates), numGates)
		}
	}
	switch {
	case xerr != nil || err != nil:
		if fmt.Sprint(xerr) != fmt.Sprint(err) {
			t.Fatalf("%+v: Explain erred %v, Submit %v", r, xerr, err)
		}
	case tk != nil:
		if xp.Outcome != "QUEUED" {
			t.Fatalf("%+v: Explain says %+v, Submit queued it", r, xp)
		}
		if repeat := len(xp.Gates) == 1 && xp.Gates[0].Gate == "idempotency"; !repeat && xp.EstimatedWait != tk.w.wait {
			t.Fatalf("%+v: Explain estimates a wait of %v, the queue %v", r, xp.EstimatedWait, tk.w.wait)
		}
	case xp.Outcome != d.Outcome.String() || xp.Reason != d.Reason || xp.RetryAfter != d.RetryAfter ||
		xp.Domain != d.Domain || xp.Model != d.Model || xp.Floor != d.Trace.Floor || (d.Outcome == Rejected && xp.EstimatedWait != d.Trace.EstimatedWait):
		t.Fatalf("%+v: Explain says %s %s (retry %v) on %q %q floor %v (wait %v), Submit %s %s (retry %v) on %q %q floor %v (wait %v)\n%+v",
			r, xp.Outcome, xp.Reason, xp.RetryAfter, xp.Domain, xp.Model, xp.Floor, xp.EstimatedWait,
			d.Outcome, d.Reason, d.RetryAfter, d.Domain, d.Model, d.Trace.Floor, d.Trace.EstimatedWait, xp)
	}
}

// sameAnswer fails unless the twins answered alike: the same decision,
// with leases in the same slots.
func sameAnswer(t *rapid.T, call string, x, y *explainTwin, dx, dy Decision, errx, erry error) {
	t.Helper()
	if fmt.Sprint(errx) != fmt.Sprint(erry) {
		t.Fatalf("%s: %v, twin %v", call, errx, erry)
	}
	var lx, ly uint32
	if dx.LeaseID != 0 && dy.LeaseID != 0 {
		lx, ly = x.h.e.LeaseNumber(dx.LeaseID), y.h.e.LeaseNumber(dy.LeaseID)
	}
	if lx != ly || (dx.LeaseID == 0) != (dy.LeaseID == 0) {
		t.Fatalf("%s: lease #%d, twin #%d", call, lx, ly)
	}
	dx.LeaseID, dy.LeaseID = 0, 0
	if !reflect.DeepEqual(dx, dy) {
		t.Fatalf("%s: lease #%d %+v\ntwin: lease #%d %+v", call, lx, dx, ly, dy)
	}
}

// sameState fails unless the two engines hold the same state, down to
// each bucket's remainder.
func sameState(t *rapid.T, x, y *Engine) {
	t.Helper()
	if a, b := x.Tenants(), y.Tenants(); !reflect.DeepEqual(a, b) {
		t.Fatalf("tenants differ:\n%+v\n%+v", a, b)
	}
	if a, b := x.Domains(), y.Domains(); !reflect.DeepEqual(a, b) {
		t.Fatalf("domains differ:\n%+v\n%+v", a, b)
	}
	if x.QueueLen() != y.QueueLen() || x.LeaseCount() != y.LeaseCount() {
		t.Fatalf("queued %d, leases %d; twin %d, %d", x.QueueLen(), x.LeaseCount(), y.QueueLen(), y.LeaseCount())
	}
	nx, ex := x.IdempotencyRecords()
	ny, ey := y.IdempotencyRecords()
	if nx != ny || ex != ey {
		t.Fatalf("idempotency records %d (%d evicted), twin %d (%d)", nx, ex, ny, ey)
	}
	type internals struct {
		V, CritV  uint64
		Flows     int
		Backlog   [3]int64
		QueuedIDs int
		Tiers     tierShares
		Tenants   map[string]tenantState
		Frozen    time.Duration
		Buckets   []tokenbucket.Bucket
		InFlight  []int
		Health    []health
	}
	read := func(e *Engine) internals {
		e.mu.Lock()
		defer e.mu.Unlock()
		room := &e.mu.room
		in := internals{
			V: room.queue.VirtualTime(), CritV: room.queue.CriticalVirtualTime(), Flows: room.queue.Flows(),
			Backlog:   [3]int64{room.backlogPrefill, room.backlogDecode, room.backlogTokens},
			QueuedIDs: len(room.idem.queued), Tiers: room.tiers, Tenants: map[string]tenantState{},
			// What is left of a freeze: an ended one is forgotten by whoever reads it first.
			Frozen: e.mu.gates.frozenLocked(e.nowLocked()),
		}
		for name, ts := range e.mu.gates.tenants {
			cp := *ts
			cp.orders = nil // a cache of first choices: reading fills it
			in.Tenants[name] = cp
		}
		for _, d := range e.mu.place.domains {
			in.Buckets = append(in.Buckets, d.cap.Bucket(false), d.cap.Bucket(true))
			in.InFlight = append(in.InFlight, int(d.inFlight))
			in.Health = append(in.Health, d.health)
		}
		return in
	}
	a, b := read(x), read(y)
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	for i := range va.NumField() {
		if fa, fb := va.Field(i).Interface(), vb.Field(i).Interface(); !reflect.DeepEqual(fa, fb) {
			t.Fatalf("engine state differs in %s:\n%+v\ntwin:\n%+v", va.Type().Field(i).Name, fa, fb)
		}
	}
}
