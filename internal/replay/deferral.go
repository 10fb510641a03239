package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/deferral"
)

// Deferred work in a replay.
//
// Under sluice a row marked deferrable (Row.Deferrable) is decided by a
// deferral.Backlog on the replay's engine and clock, its tickets in a
// MemStore: admitted at once when it fits on the capacity interactive
// traffic leaves, else answered DEFERRED with a ticket. One simulated
// worker pool holds a Claim; each delivery starts serving its request in
// the domain the backlog's admission named, exactly as an admitted request,
// and its lease is released (then Backlog.Released) when the request
// completes. The backlog's timed work (Backlog.Step) runs as its drain loop
// does in sluiced: every stepEvery, and at once after a ticket is issued
// or deferred work is released, after the engine's own Tick of that
// instant. The replay runs until no ticket is pending (each ticket ends by
// its defer_within at the latest). The baselines treat deferrable rows as
// any other request.

// stepEvery is how often the backlog steps without being woken: its drain
// loop's period in sluiced (deferral's drainEvery), for capacity that
// refills without an event.
const stepEvery = int64(20 * time.Millisecond)

// backlogWorkers is how many deliveries the simulated workers hold at
// once: more than the test cluster ever runs, so that capacity, not the
// workers, sets the drain.
const backlogWorkers = 8192

// backlog is sluice's deferred work in a replay.
type backlog struct {
	p      *sluicePolicy
	b      *deferral.Backlog
	grants *grantOrder
	within time.Duration
	cancel context.CancelFunc
	done   chan error
	in     chan deferral.Delivery

	byTicket map[string]*simReq // pending tickets
	pending  []int              // pending tickets by tenant
	npending int
	// order is each tenant's tickets in submission order, the order of
	// its lane in the backlog: the first still pending is its head.
	order [][]string
	// own marks, for one Step, the tenants with pending tickets that it
	// granted nothing and whose head waits for the tenant's own limits
	// (its quota, say): they do not compete for capacity.
	own []bool
	// The backlog's counts as last read: claimed (delivered), expired,
	// redelivered.
	claimed, expired, redelivered uint64
	nextStep                      int64
	nudged                        bool
	drainedAt                     int64 // when the last pending ticket left
	redeliveries                  int

	// Fairness while two tenants or more hold pending tickets, by tenant:
	// the deferred weighted tokens admitted, and what their weights owed
	// them of those grants (each grant split by the weights of the
	// tenants pending then).
	got, owed []float64
}

// grantOrder is the engine's observer while a backlog runs: it numbers
// the admissions of deferrable requests, so that the deliveries of one
// Step (handed to the worker by concurrent goroutines) are served in the
// order the backlog granted them.
type grantOrder struct {
	mu  sync.Mutex
	n   int
	seq map[uint64]int // lease → its grant's number
}

func newGrantOrder() *grantOrder { return &grantOrder{seq: map[uint64]int{}} }

// ObserveDecision numbers a deferrable request's admission.
func (g *grantOrder) ObserveDecision(req admission.Request, d admission.Decision) {
	if !req.Deferrable || d.LeaseID == 0 || d.Outcome == admission.Rejected {
		return
	}
	g.mu.Lock()
	g.n++
	g.seq[d.LeaseID] = g.n
	g.mu.Unlock()
}

// ObserveRelease implements admission.Observer.
func (g *grantOrder) ObserveRelease(admission.Release, admission.ReleaseResult) {}

// take returns the number of lease's grant and forgets it.
func (g *grantOrder) take(lease uint64) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := g.seq[lease]
	delete(g.seq, lease)
	return n
}

// waitedCtx is a context that says when Done is first asked for: Claim
// asks only once it has registered its worker, so the replay knows the
// worker is there before its first Step (whether a Step came first would
// otherwise be the scheduler's choice, not the replay's).
type waitedCtx struct {
	context.Context
	once   sync.Once
	waited chan struct{}
}

// Done implements context.Context.
func (c *waitedCtx) Done() <-chan struct{} {
	c.once.Do(func() { close(c.waited) })
	return c.Context.Done()
}

// newBacklog starts p's backlog and its worker; order must be the engine's
// observer.
func newBacklog(p *sluicePolicy, order *grantOrder) (*backlog, error) {
	d := &backlog{
		p: p, grants: order, within: p.s.opts.DeferWithin,
		order: make([][]string, len(p.s.tenants)), own: make([]bool, len(p.s.tenants)),
		b:        deferral.New(p.eng, deferral.NewMemStore(), p.clk, slog.New(slog.DiscardHandler)),
		done:     make(chan error, 1),
		in:       make(chan deferral.Delivery),
		byTicket: map[string]*simReq{},
		pending:  make([]int, len(p.s.tenants)),
		got:      make([]float64, len(p.s.tenants)),
		owed:     make([]float64, len(p.s.tenants)),
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	wc := &waitedCtx{Context: ctx, waited: make(chan struct{})}
	go func() {
		d.done <- d.b.Claim(wc, deferral.ClaimOptions{MaxInFlight: backlogWorkers}, func(dl deferral.Delivery) error {
			select {
			case d.in <- dl:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	select {
	case <-wc.waited:
		return d, nil
	case err := <-d.done:
		cancel()
		return nil, fmt.Errorf("deferral worker: %w", err)
	}
}

// submit decides a deferrable request through the backlog.
func (d *backlog) submit(r *simReq) error {
	p := d.p
	req := admission.Request{
		Tenant: r.row.Tenant, Model: r.row.Model, PromptTokens: r.row.Prompt, MaxOutputTokens: r.row.Output,
		AcceptDowngrade: p.lower[r.row.Model], Deferrable: true, DeferWithin: d.within,
	}
	a, err := d.b.Admit(context.Background(), req)
	var inv *admission.InvalidArgumentError
	switch {
	case errors.As(err, &inv):
		return fmt.Errorf("trace line %d: the engine refused the deferrable request as invalid: %w", r.row.Line, err)
	case err != nil:
		return fmt.Errorf("trace line %d: %w", r.row.Line, err)
	case a.Decision.Outcome != admission.Deferred:
		d.grants.take(a.Decision.LeaseID) // admitted at once: no delivery to order
		return p.decide(r, a.Decision)
	}
	r.backlogged = true
	d.byTicket[a.Ticket] = r
	d.order[r.tenant] = append(d.order[r.tenant], a.Ticket)
	d.pending[r.tenant]++
	d.npending++
	d.nudged = true // Admit wakes the drain loop
	return nil
}

// wake is when the backlog next steps; -1 while no ticket is pending.
func (d *backlog) wake() int64 {
	if d.npending == 0 {
		return -1
	}
	if d.nudged {
		return d.p.s.now
	}
	return d.nextStep
}

// tick steps the backlog when it is due or was woken, serves what it
// delivered and answers the tickets that ended unserved.
func (d *backlog) tick(now int64) error {
	c := d.b.Counts()
	if n := c.Redelivered.Load(); n != d.redelivered {
		// A lease reached its TTL unreleased: its ticket is pending
		// again (the engine's Tick said so to the backlog).
		d.redelivered = n
		d.recount()
	}
	if d.npending == 0 || !d.nudged && now < d.nextStep {
		return nil
	}
	d.nudged, d.nextStep = false, now+stepEvery
	ctx := context.Background()
	d.b.Step(ctx)
	n := c.Claimed.Load() - d.claimed
	d.claimed += n
	got := make([]deferral.Delivery, n)
	for i := range got {
		got[i] = <-d.in
	}
	seq := make(map[uint64]int, len(got))
	granted := make([]bool, len(d.pending))
	for _, dl := range got {
		seq[dl.Decision.LeaseID] = d.grants.take(dl.Decision.LeaseID)
		if r := d.byTicket[dl.Record.ID]; r != nil {
			granted[r.tenant] = true
		}
	}
	slices.SortFunc(got, func(a, b deferral.Delivery) int { return seq[a.Decision.LeaseID] - seq[b.Decision.LeaseID] })
	for i, k := range d.pending {
		d.own[i] = false
		if k > 0 && !granted[i] {
			d.own[i] = ownLimit(d.b.Waiting(d.head(i)))
		}
	}
	for _, dl := range got {
		if err := d.deliver(ctx, dl); err != nil {
			return err
		}
	}
	if x := c.Expired.Load(); x != d.expired {
		d.expired = x
		if err := d.expire(ctx); err != nil {
			return err
		}
	}
	if d.npending == 0 {
		d.drainedAt = now
	}
	return nil
}

// deliver serves one delivery: its request starts in the domain named.
func (d *backlog) deliver(ctx context.Context, dl deferral.Delivery) error {
	r := d.byTicket[dl.Record.ID]
	if r == nil {
		// Delivered again after its lease expired in an engine: the work
		// runs already, so the worker settles the second lease unused.
		d.redeliveries++
		d.p.eng.RevokeLease("", dl.Decision.LeaseID)
		d.b.Released(ctx, dl.Decision.LeaseID)
		return nil
	}
	delete(d.byTicket, dl.Record.ID)
	d.account(r)
	return d.p.decide(r, dl.Decision)
}

// head returns tenant i's oldest pending ticket ("" if none), dropping
// the ones before it that are no longer pending.
func (d *backlog) head(i int) string {
	q := d.order[i]
	for len(q) > 0 && d.byTicket[q[0]] == nil {
		q = q[1:]
	}
	d.order[i] = q
	if len(q) == 0 {
		return ""
	}
	return q[0]
}

// account counts a grant of r's tenant for fairness, then takes its
// ticket out of the pending ones. The tenants that compete are those
// with pending tickets not held by their own limits.
func (d *backlog) account(r *simReq) {
	w := d.p.s.rec.t
	var sum float64
	n := 0
	for i, k := range d.pending {
		if k > 0 && !d.own[i] {
			sum += float64(w[i].weight)
			n++
		}
	}
	if n >= 2 {
		tok := float64(r.weighted)
		d.got[r.tenant] += tok
		for i, k := range d.pending {
			if k > 0 && !d.own[i] {
				d.owed[i] += tok * float64(w[i].weight) / sum
			}
		}
	}
	d.pending[r.tenant]--
	d.npending--
}

// expire answers the tickets that ended without a delivery: defer_within
// passed (DEADLINE_UNMEETABLE), or the engine refused the request when
// its turn came (the reason it gave).
func (d *backlog) expire(ctx context.Context) error {
	var ended []*simReq
	reasons := map[*simReq]admission.Reason{}
	for id, r := range d.byTicket {
		rec, err := d.b.Get(ctx, id, nil)
		if err != nil {
			return fmt.Errorf("ticket of trace line %d: %w", r.row.Line, err)
		}
		if rec.State == deferral.StatePending || rec.State == deferral.StateClaimed {
			continue
		}
		delete(d.byTicket, id)
		ended = append(ended, r)
		reasons[r] = admission.ReasonDeadlineUnmeetable
		for x := admission.Reason(1); x <= admission.LastReason; x++ {
			if rec.Reason == "refused: "+x.String() {
				reasons[r] = x
			}
		}
	}
	slices.SortFunc(ended, func(a, b *simReq) int { return a.id - b.id })
	for _, r := range ended {
		d.pending[r.tenant]--
		d.npending--
		if err := d.p.s.decided(r, admission.Rejected, reasons[r], "", "", 0); err != nil {
			return err
		}
	}
	return nil
}

// recount reads the pending tickets per tenant from the backlog.
func (d *backlog) recount() {
	clear(d.pending)
	d.npending = 0
	for _, tb := range d.b.Tenants() {
		if i, ok := d.p.s.tix[tb.Tenant]; ok {
			d.pending[i] += tb.Pending
			d.npending += tb.Pending
		}
	}
}

// released ends r's ticket: its deferred lease was released.
func (d *backlog) released(r *simReq) {
	d.b.Released(context.Background(), r.lease)
	d.nudged = true // Released wakes the drain loop
}

// close stops the worker.
func (d *backlog) close() {
	d.cancel()
	<-d.done
}

// DeferralReport is what became of a replay's deferrable rows: under
// sluice tickets of its deferred backlog, under the baselines ordinary
// requests (the "before": refused or out of time, they are lost).
type DeferralReport struct {
	// Burst counts the bursts' rows (Row.Burst), Deferrable those of them
	// marked deferrable, Interactive the others.
	Burst       int `json:"burstRequests"`
	Deferrable  int `json:"deferrable"`
	Interactive int `json:"burstInteractive"`
	// Lost counts the deferrable rows never served: refused, their
	// ticket ended unserved (TICKET_ and the reason: its defer_within
	// passed, DEADLINE_UNMEETABLE, or refused when its turn came), or
	// unanswered at the end (NOT_DONE); LostBy splits them so.
	Lost   int            `json:"deferrableLost"`
	LostBy map[string]int `json:"deferrableLostBy,omitempty"`
	// InteractiveLost counts the bursts' other rows refused.
	InteractiveLost int `json:"burstInteractiveLost"`
	// Tickets counts the deferrable rows answered DEFERRED (sluice only);
	// TicketWait* is their wait in the backlog, arrival to admission, of
	// those admitted, in ms. It is not in the tenant's queue wait.
	Tickets       int     `json:"tickets"`
	TicketWaitP50 float64 `json:"ticketWaitP50Ms"`
	TicketWaitP99 float64 `json:"ticketWaitP99Ms"`
	TicketWaitMax float64 `json:"ticketWaitMaxMs"`
	// DrainS is how long after the last deferrable arrival the backlog
	// held a pending ticket (0: never past it). Over that drain,
	// DrainRate is the deferred weighted tokens admitted per second and
	// InteractiveRate the other requests'.
	DrainS          float64 `json:"drainS"`
	DrainRate       float64 `json:"drainTokensPerS"`
	InteractiveRate float64 `json:"drainInteractiveTokensPerS"`
	// Of the tenants not bursting (all of them when every one bursts):
	// refusals within share and floor violation seconds, as the verdict
	// counts them; BurstFloorViolations is the bursting tenants'.
	WithinShareRefused   int `json:"withinShareRefused"`
	FloorViolations      int `json:"floorViolationSeconds"`
	BurstFloorViolations int `json:"burstFloorViolationSeconds"`
	// Redelivered counts tickets delivered again after their lease
	// expired unreleased (their work ran once: the second lease is
	// settled unused).
	Redelivered int `json:"redelivered"`
	// Shares are each tenant's share of the deferred work admitted while
	// two tenants or more held pending tickets, beside what their weights
	// give it (sluice only; none when no two tenants waited together).
	Shares []DeferralShare `json:"shares,omitempty"`
}

// DeferralShare is one tenant's part of the deferred work admitted while
// two tenants or more held pending tickets.
type DeferralShare struct {
	Tenant string `json:"tenant"`
	Weight int64  `json:"weight"`
	// Tokens is its deferred weighted tokens admitted then; Share that
	// over every tenant's.
	Tokens int64   `json:"tokens"`
	Share  float64 `json:"share"`
	// Fair is its weighted share: each grant's tokens split by the
	// weights of the tenants holding pending tickets at the time, its
	// part summed, over all the tokens.
	Fair float64 `json:"fair"`
}

// Off is how far the share is from the fair one, relative to it.
func (sh *DeferralShare) Off() float64 {
	if sh.Fair == 0 {
		return 0
	}
	return sh.Share/sh.Fair - 1
}

// deferralReport builds the replay's DeferralReport; rep is its Report
// without it.
func deferralReport(s *sim, rep *Report) *DeferralReport {
	dr := &DeferralReport{LostBy: map[string]int{}}
	bursting := make([]bool, len(s.tenants))
	wait := newHist()
	last := int64(-1)
	for i := range s.reqs {
		r := &s.reqs[i]
		if r.row == nil {
			continue
		}
		if r.row.Burst {
			dr.Burst++
			bursting[r.tenant] = true
		}
		if r.backlogged {
			dr.Tickets++
			if r.answered && r.outcome != admission.Rejected {
				_ = wait.RecordValue(max((r.admitAt-r.arrive)/int64(time.Microsecond), 1))
			}
		}
		switch {
		case r.row.Deferrable:
			dr.Deferrable++
			last = max(last, r.arrive)
			lost := ""
			switch {
			case !r.answered:
				lost = "NOT_DONE"
			case r.outcome == admission.Rejected && r.backlogged:
				lost = "TICKET_" + r.reason.String()
			case r.outcome == admission.Rejected:
				lost = r.reason.String()
			}
			if lost != "" {
				dr.Lost++
				dr.LostBy[lost]++
			}
		case r.row.Burst:
			dr.Interactive++
			if r.answered && r.outcome == admission.Rejected {
				dr.InteractiveLost++
			}
		}
	}
	dr.TicketWaitP50, dr.TicketWaitP99 = ms(wait, 50), ms(wait, 99)
	dr.TicketWaitMax = float64(wait.Max()) / 1000
	if wait.TotalCount() == 0 {
		dr.TicketWaitMax = 0
	}
	if !slices.Contains(bursting, false) {
		clear(bursting) // every tenant bursts: count them all
	}
	for i := range rep.Tenants {
		t := &rep.Tenants[i]
		if bursting[i] {
			dr.BurstFloorViolations += t.FloorViolations
			continue
		}
		dr.WithinShareRefused += t.WithinShareRefused
		dr.FloorViolations += t.FloorViolations
	}
	sp, ok := s.pol.(*sluicePolicy)
	if !ok || sp.def == nil {
		return dr
	}
	d := sp.def
	dr.Redelivered = d.redeliveries
	if d.drainedAt > last && last >= 0 {
		dr.DrainS = float64(d.drainedAt-last) / 1e9
		var deferred, other int64
		for i := range s.reqs {
			r := &s.reqs[i]
			if r.row == nil || !r.answered || r.outcome == admission.Rejected || r.admitAt < last || r.admitAt > d.drainedAt {
				continue
			}
			if r.backlogged {
				deferred += r.weighted
			} else {
				other += r.weighted
			}
		}
		dr.DrainRate, dr.InteractiveRate = float64(deferred)/dr.DrainS, float64(other)/dr.DrainS
	}
	var total float64
	for _, g := range d.got {
		total += g
	}
	for i, g := range d.got {
		if total == 0 || d.owed[i] == 0 {
			continue
		}
		dr.Shares = append(dr.Shares, DeferralShare{
			Tenant: s.tenants[i], Weight: s.rec.t[i].weight, Tokens: int64(g), Share: g / total, Fair: d.owed[i] / total,
		})
	}
	return dr
}

// deferralTable is the comparison's table of deferrable work, a row per
// policy (nil when no report has deferrable rows), and the shares' table
// of each policy that has them.
func (c *Comparison) deferralTable() (head []string, rows [][]string, shares []shareTable) {
	for _, r := range c.Reports {
		d := r.Deferral
		if d == nil {
			continue
		}
		if head == nil {
			head = []string{"policy", "deferrable", "lost", "lost %", "lost by", "interactive", "lost", "lost %", "tickets", "ticket wait p50 ms", "p99 ms", "max ms",
				"drained after s", "drain tok/s", "interactive tok/s", "refusals within share", "floor viol s", "burster floor viol s", "redelivered"}
		}
		row := []string{r.Policy, fmt.Sprint(d.Deferrable), fmt.Sprint(d.Lost), share(d.Lost, d.Deferrable), lostBy(d.LostBy),
			fmt.Sprint(d.Interactive), fmt.Sprint(d.InteractiveLost), share(d.InteractiveLost, d.Interactive), fmt.Sprint(d.Tickets)}
		if d.Tickets > 0 {
			row = append(row, fmt.Sprintf("%.1f", d.TicketWaitP50), fmt.Sprintf("%.1f", d.TicketWaitP99), fmt.Sprintf("%.1f", d.TicketWaitMax),
				fmt.Sprintf("%.1f", d.DrainS), fmt.Sprintf("%.0f", d.DrainRate), fmt.Sprintf("%.0f", d.InteractiveRate))
		} else {
			row = append(row, "-", "-", "-", "-", "-", "-") // no backlog: nothing waited in one
		}
		row = append(row, fmt.Sprint(d.WithinShareRefused), fmt.Sprint(d.FloorViolations), fmt.Sprint(d.BurstFloorViolations), fmt.Sprint(d.Redelivered))
		rows = append(rows, row)
		if len(d.Shares) > 0 {
			st := shareTable{Policy: r.Policy, Head: []string{"tenant", "weight", "deferred tokens", "share", "weighted share", "off by"}}
			for _, sh := range d.Shares {
				st.Rows = append(st.Rows, []string{sh.Tenant, fmt.Sprint(sh.Weight), fmt.Sprint(sh.Tokens),
					fmt.Sprintf("%.1f%%", 100*sh.Share), fmt.Sprintf("%.1f%%", 100*sh.Fair), fmt.Sprintf("%+.1f%%", 100*sh.Off())})
			}
			shares = append(shares, st)
		}
	}
	return head, rows, shares
}

// shareTable is one policy's shares of deferred work.
type shareTable struct {
	Policy string
	Head   []string
	Rows   [][]string
}

// share is n of of as a percentage; "-" of none.
func share(n, of int) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}

// lostBy lists why deferrable rows were lost, sorted, as "WHY:n …".
func lostBy(m map[string]int) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	if len(ks) == 0 {
		return "-"
	}
	slices.Sort(ks)
	for i, k := range ks {
		ks[i] = fmt.Sprintf("%s:%d", k, m[k])
	}
	return strings.Join(ks, " ")
}

// writeDeferral writes the deferral tables, if the comparison has any.
func (c *Comparison) writeDeferral(tw io.Writer) {
	head, rows, shares := c.deferralTable()
	if head == nil {
		return
	}
	fmt.Fprintf(tw, "\ndeferrable work: %s\n", c.deferralSummary())
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	for _, st := range shares {
		fmt.Fprintf(tw, "%s: deferred work admitted while two tenants or more waited in the backlog for capacity\n", st.Policy)
		fmt.Fprintln(tw, strings.Join(st.Head, "\t"))
		for _, row := range st.Rows {
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
	}
}

// deferralMeasures are the verdict's lines on deferrable work: the
// deferrable requests lost decide; the bursts' interactive requests lost
// are shown beside. None without deferrable rows.
func (c *Comparison) deferralMeasures(measure func(name, of, better string, value func(*Report) (float64, string)) Measure) (deciding, other []Measure) {
	if !slices.ContainsFunc(c.Reports, func(r *Report) bool { return r.Deferral != nil }) {
		return nil, nil
	}
	lost := func(n, of func(*DeferralReport) int) func(*Report) (float64, string) {
		return func(r *Report) (float64, string) {
			d := r.Deferral
			if d == nil {
				return 0, "-"
			}
			x := 0.0
			if of(d) > 0 {
				x = float64(n(d)) / float64(of(d))
			}
			return x, fmt.Sprintf("%d of %d (%s)", n(d), of(d), share(n(d), of(d)))
		}
	}
	deciding = []Measure{measure("deferrable requests lost", "the bursts' deferrable requests", "lower",
		lost(func(d *DeferralReport) int { return d.Lost }, func(d *DeferralReport) int { return d.Deferrable }))}
	other = []Measure{measure("interactive burst requests lost", "the bursts' other requests", "",
		lost(func(d *DeferralReport) int { return d.InteractiveLost }, func(d *DeferralReport) int { return d.Interactive }))}
	return deciding, other
}

// htmlDeferral is the deferral tables as the HTML report shows them.
type htmlDeferral struct {
	Summary string
	Head    []string
	Rows    [][]string
	Shares  []shareTable
}

// htmlDeferral returns the deferral tables for the HTML report; nil
// without deferrable rows.
func (c *Comparison) htmlDeferral() *htmlDeferral {
	head, rows, shares := c.deferralTable()
	if head == nil {
		return nil
	}
	return &htmlDeferral{Summary: c.deferralSummary(), Head: head, Rows: rows, Shares: shares}
}

// deferralSummary says what the deferral table counts.
func (c *Comparison) deferralSummary() string {
	for _, r := range c.Reports {
		if d := r.Deferral; d != nil {
			return fmt.Sprintf("%d of the bursts' %d requests deferrable (sluice: its backlog; the others: ordinary requests); interactive: the bursts' other %d",
				d.Deferrable, d.Burst, d.Interactive)
		}
	}
	return ""
}
