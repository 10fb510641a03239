package drill

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/load"
)

// DeferredReport is deferred-burst's account of the burst: each bursting
// tenant's requests and tickets, the burst loss of either half, the
// backlog's drain and the order in which its work was claimed.
type DeferredReport struct {
	// Factor and BurstS are the burst's multiple of the bursting tenants'
	// rate and its length; Workers, WorkerInFlight and WorkerRunMs the
	// worker pool's Claim streams a replica, their max_in_flight and how
	// long each ticket ran.
	Factor         float64       `json:"factor"`
	BurstS         float64       `json:"burstS"`
	Workers        int           `json:"workersPerReplica"`
	WorkerInFlight int           `json:"workerMaxInFlight"`
	WorkerRunMs    float64       `json:"workerRunMs"`
	Tenants        []BurstTenant `json:"tenants"`
	// InteractiveLossPct and DeferrableLossPct are the burst loss of
	// either half: the share of the burst's interactive requests refused
	// (what the whole burst would lose without deferral), and of its
	// deferrable ones refused or whose ticket was never done.
	InteractiveLossPct float64 `json:"interactiveLossPct"`
	DeferrableLossPct  float64 `json:"deferrableLossPct"`
	// Tickets were issued, Done of them DONE by GetTicket at the end;
	// PeakBacklog is the most pending at once.
	Tickets     int64 `json:"tickets"`
	Done        int64 `json:"ticketsDone"`
	PeakBacklog int64 `json:"peakBacklog"`
	// DrainS is from the burst's end to the last ticket done; nil when
	// some ticket was not done within DrainWithin.
	DrainS *float64 `json:"drainS"`
	// Fair is every whole second from the burst's end in which two or more
	// tenants were backlogged on one replica throughout: each one's share
	// of the weighted tokens claimed there against its weight's share.
	// WorstGapPct is the largest difference, in percentage points, and
	// WorstExcessPct the largest beyond its second's grain.
	Fair           []FairSecond `json:"fairSeconds,omitempty"`
	WorstGapPct    float64      `json:"worstShareGapPct"`
	WorstExcessPct float64      `json:"worstShareExcessPct"`
	// Lost counts the lost deferrable requests by why; ReleaseErrors and
	// Errors the workers' failed Releases and Claim streams by code.
	Lost          []LostCount      `json:"lost,omitempty"`
	ReleaseErrors map[string]int64 `json:"releaseErrors,omitempty"`
	Errors        map[string]int64 `json:"errors,omitempty"`
}

// LostCount is how many deferrable requests were lost for one reason
// ("refused QUEUE_FULL", "ticket EXPIRED").
type LostCount struct {
	Why   string `json:"why"`
	Count int64  `json:"count"`
}

// BurstTenant is one bursting tenant's burst: its interactive and
// deferrable requests and what became of them.
type BurstTenant struct {
	Tenant string `json:"tenant"`
	Weight int64  `json:"weight"`
	// Replica is the replica whose Claim streams took its tickets.
	Replica            string `json:"replica,omitempty"`
	Interactive        int64  `json:"interactiveSent"`
	InteractiveRefused int64  `json:"interactiveRefused"`
	Deferrable         int64  `json:"deferrableSent"`
	// AtOnce were admitted at once (run by the load, as interactive ones
	// are); Deferred got a ticket, Done of those ended DONE; Lost were
	// refused, got no decision, or their ticket did not end DONE.
	AtOnce   int64 `json:"deferrableAdmitted"`
	Deferred int64 `json:"deferred"`
	Done     int64 `json:"ticketsDone"`
	Lost     int64 `json:"deferrableLost"`
	// ClaimedTokens is the weighted tokens its workers were handed.
	ClaimedTokens int64 `json:"claimedTokens"`
}

// FairSecond is one second of the fair order's check on one replica.
// GrainPct is the largest claim's share of the second's work: a fair
// queue serves whole requests, so a tenant's share may be off its
// weight's by one request (the lag bound of weighted fair queueing), and
// a second with few claims is coarse.
type FairSecond struct {
	At       float64       `json:"atS"`
	Replica  string        `json:"replica"`
	GrainPct float64       `json:"grainPct"`
	Shares   []TenantShare `json:"shares"`
}

// TenantShare is a backlogged tenant's share of one second's claimed work
// against its weight's share of the backlogged tenants' weights.
type TenantShare struct {
	Tenant    string  `json:"tenant"`
	SharePct  float64 `json:"sharePct"`
	WeightPct float64 `json:"weightSharePct"`
}

// ownLimits are the refusals by a tenant's own limits, not by others'
// traffic: a tenant offered more than its quota is refused these rightly.
var ownLimits = map[string]bool{"QUOTA_EXCEEDED": true, "BURST_CREDIT_EXHAUSTED": true, "BURST_CREDIT_FROZEN": true,
	"CONCURRENCY_EXCEEDED": true, "BUDGET_EXHAUSTED": true, "REQUEST_TOO_LARGE": true}

// judgeDeferred adds deferred-burst's promises: no deferrable request
// lost, the interactive tenants within their share untouched by the burst,
// the backlog drained, and its work claimed in its tenants' weights.
func (r *run) judgeDeferred(answers []answer) {
	b := r.burst
	if b == nil {
		return
	}
	b.mu.Lock()
	claims := slices.Clone(b.claims)
	states := maps.Clone(b.tickets)
	unread := len(b.ticketErr)
	rep := &DeferredReport{Factor: r.o.BurstFactor, BurstS: secs(r.o.BurstFor), Workers: r.o.Workers, WorkerInFlight: r.o.WorkerInFlight,
		WorkerRunMs: float64(r.o.WorkerRun) / 1e6, ReleaseErrors: maps.Clone(b.relErr), Errors: maps.Clone(b.streamErr)}
	b.mu.Unlock()
	r.rep.Deferred = rep
	idx := map[string]int{}
	for _, m := range r.o.BurstTenants {
		idx[m.Tenant] = len(rep.Tenants)
		rep.Tenants = append(rep.Tenants, BurstTenant{Tenant: m.Tenant, Weight: r.pols[m.Tenant].weight})
	}
	var interactive, refused, deferrable, lost int64
	lostWhy := map[string]int64{}
	for i := range answers {
		a := &answers[i]
		j, ok := idx[a.tenant]
		if !ok || a.sent < r.fault || a.sent >= r.begun {
			continue
		}
		bt := &rep.Tenants[j]
		if !a.deferrable {
			bt.Interactive++
			if !a.admitted() {
				bt.InteractiveRefused++
			}
			continue
		}
		bt.Deferrable++
		why := ""
		switch {
		case a.admitted():
			bt.AtOnce++
		case a.code != codes.OK:
			why = "no decision: " + a.code.String()
		case a.decision == admissionv1.Decision_DEFERRED && a.ticket == "":
			why = "DEFERRED without a ticket"
		case a.decision == admissionv1.Decision_DEFERRED:
			bt.Deferred++
			rep.Tickets++
			st, read := states[a.ticket]
			switch {
			case st == admissionv1.TicketState_TICKET_DONE:
				bt.Done++
				rep.Done++
			case read:
				why = "ticket " + strings.TrimPrefix(st.String(), "TICKET_")
			default:
				why = "ticket unread"
			}
		default:
			why = "refused " + a.reason
		}
		if why != "" {
			bt.Lost++
			lostWhy[why]++
		}
	}
	for _, bt := range rep.Tenants {
		interactive += bt.Interactive
		refused += bt.InteractiveRefused
		deferrable += bt.Deferrable
		lost += bt.Lost
	}
	rep.InteractiveLossPct, rep.DeferrableLossPct = pct(refused, interactive), pct(lost, deferrable)
	if b.drained >= 0 {
		d := secs(b.drained - r.begun)
		rep.DrainS = &d
	}
	r.fairOrder(rep, answers, claims, idx)

	add := func(name string, held bool, format string, args ...any) {
		r.rep.Promises = append(r.rep.Promises, Promise{Name: name, Held: held, Detail: fmt.Sprintf(format, args...)})
	}
	var whys []string
	for _, k := range sortedKeys(lostWhy) {
		rep.Lost = append(rep.Lost, LostCount{Why: k, Count: lostWhy[k]})
		whys = append(whys, fmt.Sprintf("%d %s", lostWhy[k], k))
	}
	relOK := "every worker Release answered OK"
	if len(rep.ReleaseErrors) > 0 {
		relOK = "worker Releases failed: " + codeCounts(rep.ReleaseErrors)
	}
	if lost == 0 {
		add("no deferrable request lost", deferrable > 0 && len(rep.ReleaseErrors) == 0,
			"%d deferrable in the burst: %d admitted at once, %d deferred, every ticket DONE by GetTicket; %s; burst loss: deferrable %.1f%%, interactive %.1f%%",
			deferrable, deferrable-rep.Tickets, rep.Tickets, relOK, rep.DeferrableLossPct, rep.InteractiveLossPct)
	} else {
		add("no deferrable request lost", false, "%d of %d deferrable in the burst lost (%s; %d tickets unread); %s; burst loss: deferrable %.1f%%, interactive %.1f%%",
			lost, deferrable, strings.Join(whys, ", "), unread, relOK, rep.DeferrableLossPct, rep.InteractiveLossPct)
	}
	r.judgeUntouched(answers, add)
	switch {
	case rep.Tickets == 0:
		add("backlog drained", false, "no request was deferred: the burst never outran what its tenants may run at once")
	case rep.DrainS == nil:
		add("backlog drained", false, "%d of %d tickets not done %v after the burst's end (peak backlog %d)", rep.Tickets-int64(b.doneOf(r.tickets())), rep.Tickets, r.o.DrainWithin, rep.PeakBacklog)
	default:
		add("backlog drained", true, "%d tickets, peak backlog %d: the last done %.2fs after the burst's end (bound %v)", rep.Tickets, rep.PeakBacklog, *rep.DrainS, r.o.DrainWithin)
	}
	if len(rep.Fair) == 0 {
		add("backlog drains in its tenants' weights", false, "no whole second after the burst with two tenants backlogged on one replica (tenants' replicas: %s): nothing to compare; a longer burst, or bursting tenants on one replica, shows it", replicasOf(rep.Tenants))
		return
	}
	worst, at := worstShare(rep.Fair)
	add("backlog drains in its tenants' weights", rep.WorstExcessPct <= 100*r.o.ShareTolerance,
		"%d seconds with two or more tenants backlogged on one replica: each one's share of the work claimed within one claim and %.1f points of its weight's (worst: %s %.1f%% against %.1f%% at %.0fs, one claim %.1f points there; bound %.0f points)",
		len(rep.Fair), rep.WorstExcessPct, worst.Tenant, worst.SharePct, worst.WeightPct, at.At, at.GrainPct, 100*r.o.ShareTolerance)
}

// judgeUntouched adds the promise that the burst did not touch the mix's
// interactive tenants within their share: during the burst, one offered no
// more than its quota is never refused, one offered more only by its own
// limits, and every floor held every second.
func (r *run) judgeUntouched(answers []answer, add func(string, bool, string, ...any)) {
	span := (r.begun - r.fault).Seconds()
	held := true
	var parts []string
	for _, m := range r.o.Tenants {
		if slices.ContainsFunc(r.o.BurstTenants, func(x load.Mix) bool { return x.Tenant == m.Tenant }) {
			continue // a bursting tenant's own burst is judged above
		}
		var sent, offered, refused, byOwn int64
		for i := range answers {
			a := &answers[i]
			if a.tenant != m.Tenant || a.sent < r.fault || a.sent >= r.begun {
				continue
			}
			sent++
			offered += a.weight
			switch {
			case a.admitted():
			case a.code == codes.OK && ownLimits[a.reason]:
				byOwn++
			default:
				refused++
			}
		}
		within := span > 0 && float64(offered)/span <= float64(r.pols[m.Tenant].rate)
		if within {
			refused += byOwn
			parts = append(parts, fmt.Sprintf("%s %d of %d refused (within its quota)", m.Tenant, refused, sent))
		} else {
			parts = append(parts, fmt.Sprintf("%s %d of %d refused for others (over its quota: %d by its own limits)", m.Tenant, refused, sent, byOwn))
		}
		held = held && refused == 0
	}
	var floors []string
	for _, p := range r.rep.Phases {
		if p.Name != PhaseDuring {
			continue
		}
		for _, f := range p.Floors {
			held = held && f.Held == f.Seconds
			floors = append(floors, fmt.Sprintf("%s %d/%d s", f.Tenant, f.Held, f.Seconds))
		}
	}
	if len(floors) > 0 {
		parts = append(parts, "floors held "+strings.Join(floors, ", "))
	}
	add("interactive within share untouched", held, "during the burst: %s", strings.Join(parts, "; "))
}

// fairOrder finds the seconds from the burst's end in which two or more
// bursting tenants were backlogged on one replica throughout, and each
// one's share of the weighted tokens claimed there that second. The burst
// itself is left out: then the tenants are over their quotas, and the
// backlog passes over a tenant without quota by design (a tenant's own
// limit is not the fair order's to share).
func (r *run) fairOrder(rep *DeferredReport, answers []answer, claims []claimed, idx map[string]int) {
	first := map[string]time.Duration{} // ticket → its first claim
	replicas := map[string]map[string]int{}
	for _, c := range claims {
		if _, ok := first[c.ticket]; !ok {
			first[c.ticket] = c.at
		}
		if j, ok := idx[c.tenant]; ok {
			rep.Tenants[j].ClaimedTokens += c.weight
			if replicas[c.tenant] == nil {
				replicas[c.tenant] = map[string]int{}
			}
			replicas[c.tenant][c.replica]++
		}
	}
	for t, n := range replicas {
		best := ""
		for _, id := range sortedKeys(n) {
			if best == "" || n[id] > n[best] {
				best = id
			}
		}
		rep.Tenants[idx[t]].Replica = best
	}
	// Each ticket is pending from its DEFERRED answer (or its first claim,
	// when the worker heard first) to its first claim.
	type event struct {
		at   time.Duration
		step int64
	}
	perTenant := map[string][]event{}
	var all []event
	for i := range answers {
		a := &answers[i]
		if _, ok := idx[a.tenant]; !ok || a.ticket == "" {
			continue
		}
		from, end := a.answered, time.Duration(1<<62)
		if c, ok := first[a.ticket]; ok {
			from, end = min(from, c), c
		}
		perTenant[a.tenant] = append(perTenant[a.tenant], event{from, 1}, event{end, -1})
		all = append(all, event{from, 1}, event{end, -1})
	}
	order := func(x, y event) int {
		if x.at != y.at {
			return int(x.at - y.at)
		}
		return int(x.step - y.step) // an end before a start at one instant
	}
	slices.SortFunc(all, order)
	var n int64
	for _, e := range all {
		n += e.step
		rep.PeakBacklog = max(rep.PeakBacklog, n)
	}
	// busy are the spans in which a tenant had a ticket pending.
	busy := map[string][][2]time.Duration{}
	for t, evs := range perTenant {
		slices.SortFunc(evs, order)
		var n int64
		var from time.Duration
		for _, e := range evs {
			if n == 0 && e.step > 0 {
				from = e.at
			}
			if n += e.step; n == 0 {
				busy[t] = append(busy[t], [2]time.Duration{from, e.at})
			}
		}
	}
	backlogged := func(t string, from, to time.Duration) bool {
		for _, s := range busy[t] {
			if s[0] <= from && s[1] >= to {
				return true
			}
		}
		return false
	}
	groups := map[string][]string{}
	for _, bt := range rep.Tenants {
		if bt.Replica != "" {
			groups[bt.Replica] = append(groups[bt.Replica], bt.Tenant)
		}
	}
	for s := r.begun; s+time.Second <= r.ended; s += time.Second {
		for _, replica := range sortedKeys(groups) {
			var in []string
			for _, t := range groups[replica] {
				if backlogged(t, s, s+time.Second) {
					in = append(in, t)
				}
			}
			if len(in) < 2 {
				continue
			}
			got := map[string]int64{}
			var total, weights, grain int64
			for _, c := range claims {
				if c.replica == replica && c.at >= s && c.at < s+time.Second && slices.Contains(in, c.tenant) {
					got[c.tenant] += c.weight
					total += c.weight
					grain = max(grain, c.weight)
				}
			}
			if total == 0 {
				continue // nothing claimed: the drain promise judges a stall
			}
			for _, t := range in {
				weights += r.pols[t].weight
			}
			fs := FairSecond{At: secs(s), Replica: replica, GrainPct: pct(grain, total)}
			for _, t := range in {
				ts := TenantShare{Tenant: t, SharePct: pct(got[t], total), WeightPct: pct(r.pols[t].weight, weights)}
				rep.WorstGapPct = max(rep.WorstGapPct, ts.gap())
				rep.WorstExcessPct = max(rep.WorstExcessPct, ts.gap()-fs.GrainPct)
				fs.Shares = append(fs.Shares, ts)
			}
			rep.Fair = append(rep.Fair, fs)
		}
	}
}

// gap is how far the share is from its weight's, in percentage points.
func (s TenantShare) gap() float64 { return abs(s.SharePct - s.WeightPct) }

// worstShare is the share furthest from its weight's beyond its second's
// grain, and its second.
func worstShare(fair []FairSecond) (TenantShare, FairSecond) {
	var worst TenantShare
	var at FairSecond
	found := false
	for _, f := range fair {
		for _, s := range f.Shares {
			if !found || s.gap()-f.GrainPct > worst.gap()-at.GrainPct {
				worst, at, found = s, f, true
			}
		}
	}
	return worst, at
}

func replicasOf(ts []BurstTenant) string {
	var parts []string
	for _, t := range ts {
		parts = append(parts, t.Tenant+" "+dash(t.Replica))
	}
	return strings.Join(parts, ", ")
}

func codeCounts(m map[string]int64) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
	}
	return strings.Join(parts, ", ")
}

func pct(n, of int64) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// writeTable prints the burst's tenants, its loss, the drain and the fair
// order.
func (d *DeferredReport) writeTable(w io.Writer) error {
	fmt.Fprintf(w, "burst: %.0f× for %.1fs, every other request deferrable; workers: %d Claim streams a replica, %d in flight each, %.0f ms a run\n",
		d.Factor, d.BurstS, d.Workers, d.WorkerInFlight, d.WorkerRunMs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tWEIGHT\tREPLICA\tINTERACTIVE\tREFUSED\tDEFERRABLE\tAT ONCE\tDEFERRED\tDONE\tLOST\tCLAIMED TOKENS")
	for _, t := range d.Tenants {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", t.Tenant, t.Weight, dash(t.Replica), t.Interactive, t.InteractiveRefused,
			t.Deferrable, t.AtOnce, t.Deferred, t.Done, t.Lost, t.ClaimedTokens)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	fmt.Fprintf(w, "burst loss: interactive %.1f%% refused; deferrable %.1f%% refused or never done\n", d.InteractiveLossPct, d.DeferrableLossPct)
	drain := "not drained"
	if d.DrainS != nil {
		drain = fmt.Sprintf("drained %.2fs after the burst's end", *d.DrainS)
	}
	fmt.Fprintf(w, "backlog: %d tickets, %d done, peak %d pending; %s\n", d.Tickets, d.Done, d.PeakBacklog, drain)
	if len(d.ReleaseErrors) > 0 || len(d.Errors) > 0 {
		fmt.Fprintf(w, "workers: Releases failed %s; Claim streams broke %s\n", dash(codeCounts(d.ReleaseErrors)), dash(codeCounts(d.Errors)))
	}
	if len(d.Fair) > 0 {
		worst, at := worstShare(d.Fair)
		fmt.Fprintf(w, "fair order: %d seconds with two or more tenants backlogged on one replica; worst %s %.1f%% of the work claimed against %.1f%% of the weights (at %.0fs, one claim %.1f points)\n",
			len(d.Fair), worst.Tenant, worst.SharePct, worst.WeightPct, at.At, at.GrainPct)
	}
	return nil
}
