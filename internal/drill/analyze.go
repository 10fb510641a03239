package drill

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// Phase names.
const (
	PhaseBefore = "before"
	PhaseDuring = "during"
	PhaseAfter  = "after"
)

// analyze cuts the recorded answers into phases, measures each and judges
// the promises. Answers belong to the phase in which they were sent, so a
// slow answer counts where its request was made.
func (r *run) analyze(name string) {
	d := drillNamed(name)
	answers, releases := r.rec.snapshot()
	bounds := []struct {
		name     string
		from, to time.Duration
	}{{PhaseBefore, 0, r.fault}, {PhaseDuring, r.fault, r.begun}, {PhaseAfter, r.begun, r.ended}}
	starts := make([]time.Duration, len(bounds))
	for i, b := range bounds {
		starts[i] = b.from
	}
	excess := r.excessByPhase(answers, starts)
	var before *PhaseReport
	for i, b := range bounds {
		p := r.measure(b.name, b.from, b.to, answers, releases, d)
		if p.Quota != nil {
			p.Quota.Excess = excess[i]
		}
		if before == nil {
			before = p
		} else if before.P50Ms > 0 {
			c50, c99 := p.P50Ms/before.P50Ms, p.P99Ms/before.P99Ms
			p.P50Change, p.P99Change = &c50, &c99
		}
		r.rep.Phases = append(r.rep.Phases, p)
	}
	r.rep.RecoverSeconds = r.recovery(answers)
	r.rep.Fault = r.faultSpan()
	if d.judge != nil {
		d.judge(r, answers)
	}
	r.judge(d, answers, releases)
}

// measure is one phase's report.
func (r *run) measure(phase string, from, to time.Duration, answers []answer, releases []release, d *drillSpec) *PhaseReport {
	p := &PhaseReport{Name: phase, From: secs(from), To: secs(to), Refusals: map[string]int64{}, Errors: map[string]int64{},
		ReleaseErrors: map[string]int64{}}
	var lat []time.Duration
	for i := range answers {
		a := &answers[i]
		if a.sent < from || a.sent >= to {
			continue
		}
		p.Sent++
		switch {
		case a.code == codes.DeadlineExceeded:
			p.PastDeadline++
		case a.code != codes.OK:
			p.Lost++
			p.Errors[a.code.String()]++
		case a.admitted():
			p.Admitted++
		case a.decision == admissionv1.Decision_DEFERRED:
			p.Deferred++
		default:
			p.Rejected++
			p.Refusals[a.reason]++
		}
		if a.code == codes.OK {
			lat = append(lat, a.answered-a.sent)
		}
	}
	if d := to - from; d > 0 {
		p.AdmittedPerSec = float64(p.Admitted) / d.Seconds()
	}
	slices.Sort(lat)
	p.P50Ms, p.P99Ms = quantileMs(lat, 0.50), quantileMs(lat, 0.99)
	for _, rel := range releases {
		if rel.at >= from && rel.at < to && rel.code != codes.OK && !r.excusedRelease(d, rel) {
			p.ReleaseErrors[rel.code.String()]++
		}
	}
	// Floors, per whole second of the phase.
	for _, m := range r.o.Tenants {
		pol := r.pols[m.Tenant]
		if pol.floor <= 0 {
			continue
		}
		fr := FloorReport{Tenant: m.Tenant, Floor: pol.floor}
		for s := from; s+time.Second <= to; s += time.Second {
			var offered, admitted int64
			for i := range answers {
				a := &answers[i]
				if a.tenant != m.Tenant || a.sent < s || a.sent >= s+time.Second {
					continue
				}
				offered += a.weight
				if a.admitted() {
					admitted += a.weight
				}
			}
			fr.Seconds++
			if float64(admitted) >= (1-r.o.FloorTolerance)*float64(min(pol.floor, offered)) {
				fr.Held++
			}
		}
		p.Floors = append(p.Floors, fr)
	}
	// The quota tenant.
	if pol, ok := r.pols[r.o.QuotaTenant]; ok && r.inMix(r.o.QuotaTenant) && to > from {
		var offered, admitted int64
		var asked []answer
		for i := range answers {
			a := &answers[i]
			if a.tenant == r.o.QuotaTenant && a.sent >= from && a.sent < to {
				offered += a.weight
				asked = append(asked, *a)
				if a.admitted() {
					admitted += a.weight
				}
			}
		}
		quota := int64(float64(pol.rate) * (to - from).Seconds())
		bound, mode, boundText := r.quotaBound(pol, asked)
		upper := quota + pol.burst + bound
		// The least the fleet owes it: what one exact token bucket of its
		// rate and burst, empty at the phase's start, would admit of the
		// same requests — min(quota, offered) under steady demand, less
		// under a bursty one (a trace's), whose lulls refill nothing past
		// the burst.
		lower := bucketAdmits(asked, from, pol.rate, pol.burst)
		q := &QuotaReport{Tenant: r.o.QuotaTenant, Admitted: admitted, Quota: lower, Upper: upper, Bound: bound, Mode: mode, BoundText: boundText}
		if quota > 0 {
			if admitted > quota {
				q.Overshoot = 100 * float64(admitted-quota) / float64(quota)
			}
			if admitted < lower && lower > 0 {
				q.Under = 100 * float64(lower-admitted) / float64(lower)
			}
		}
		p.Quota = q
	}
	if r.domain != "" {
		var on, forbidden int64
		for i := range answers {
			a := &answers[i]
			if a.sent < from || a.sent >= to || !a.admitted() || a.domain != r.domain {
				continue
			}
			on++
			if r.forbidden(a) {
				forbidden++
			}
		}
		p.OnTarget = &on
		if phase == PhaseDuring {
			p.Forbidden = &forbidden
		}
	}
	return p
}

// bucketAdmits is the weighted tokens an exact token bucket of rate per
// second and burst, empty at from, admits of asked in the order they were
// sent.
func bucketAdmits(asked []answer, from time.Duration, rate, burst int64) int64 {
	sort.Slice(asked, func(i, j int) bool { return asked[i].sent < asked[j].sent })
	level, at, admitted := 0.0, from, int64(0)
	for _, a := range asked {
		level = min(float64(burst), level+float64(rate)*(a.sent-at).Seconds())
		at = a.sent
		if w := float64(a.weight); w <= level {
			level -= w
			admitted += a.weight
		}
	}
	return admitted
}

// The fleet's shared-state modes, for the quota promise's bound.
const (
	ModeBatched  = "batched"
	ModeStrict   = "strict"
	ModeEmbedded = "embedded"
)

// quotaBound is what the fleet's mode allows the quota tenant beyond one
// exact token bucket (docs/shared-state.md): batched, (N−1)·R·W; strict
// and embedded, nothing. Each adds one request (the largest asked: a
// decision's instant is known only to within its answer) and the tenant's
// burst credit. It returns the bound in tokens, the mode, and the bound in
// words.
func (r *run) quotaBound(pol policy, asked []answer) (int64, string, string) {
	var one int64
	for _, a := range asked {
		one = max(one, a.weight)
	}
	mode := r.f.Mode
	if mode == "" {
		mode = ModeBatched
	}
	var bound int64
	text := "one request"
	if mode == ModeBatched {
		n := int64(max(r.f.Replicas, 1))
		bound = (n - 1) * int64(float64(pol.rate)*r.f.Interval.Seconds())
		text = fmt.Sprintf("(N−1)·R·W = %d·%d·%v + one request", n-1, pol.rate, r.f.Interval)
	}
	bound += one
	if pol.credit > 0 {
		bound += pol.credit
		text += " + credit"
	}
	return bound, mode, fmt.Sprintf("%s %s = %d tokens", mode, text, bound)
}

// excessByPhase is, for each phase (starts: their starts, in order), the
// most the quota tenant had been admitted at any instant beyond one exact
// token bucket of its rate and burst, full at the drill's start, charged
// the fleet's admissions of it at the times they were answered (the latest
// a decision can have been made, so the most refill). What the bucket owes
// when a phase starts is forgiven, so that each phase is judged on its
// own: the excess is what the phase added.
func (r *run) excessByPhase(answers []answer, starts []time.Duration) []int64 {
	out := make([]int64, len(starts))
	pol, ok := r.pols[r.o.QuotaTenant]
	if !ok {
		return out
	}
	var took []answer
	for _, a := range answers {
		if a.tenant == r.o.QuotaTenant && a.admitted() {
			took = append(took, a)
		}
	}
	sort.SliceStable(took, func(i, j int) bool { return took[i].answered < took[j].answered })
	phase := func(at time.Duration) int {
		i := 0
		for i+1 < len(starts) && at >= starts[i+1] {
			i++
		}
		return i
	}
	level, at, cur := float64(pol.burst), time.Duration(0), 0
	for _, a := range took {
		p := phase(a.sent)
		if p > cur {
			cur, level = p, max(level, 0)
		}
		level = min(float64(pol.burst), level+float64(pol.rate)*(a.answered-at).Seconds())
		at = max(at, a.answered)
		level -= float64(a.weight)
		if owed := int64(-level); owed > out[p] {
			out[p] = owed
		}
	}
	return out
}

// forbidden reports whether a placed the request where the drill forbids
// it: on the drained (or departed) domain, sent from the grace after the
// mark and answered before the recovery action began, so that it was
// decided while the mark held (one sent just before the undrain may be
// decided just after it, rightly).
func (r *run) forbidden(a *answer) bool {
	return r.domain != "" && r.mark >= 0 && a.admitted() && a.domain == r.domain &&
		a.sent >= r.mark+r.o.Grace && a.answered < r.mend
}

// excusedRelease reports whether a failed Release is the drill's own doing:
// a lease of the replica the drill killed (its leases died with it).
func (r *run) excusedRelease(d *drillSpec, rel release) bool {
	return d.leasesDie && rel.replica == r.rep.Target
}

func (r *run) inMix(tenant string) bool {
	for _, m := range r.o.Tenants {
		if m.Tenant == tenant {
			return true
		}
	}
	return false
}

// quantileMs is the q-quantile of sorted durations, in milliseconds.
func quantileMs(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return float64(sorted[i]) / 1e6
}

// stretch is what the promise of recovery reads of the mix's requests sent
// in one stretch of the drill: how many, the share admitted, and the Admit
// latencies of those answered.
type stretch struct {
	sent     int
	share    float64
	p50, p99 float64 // ms
}

// measureStretch measures the mix's requests sent in [from, to).
func (r *run) measureStretch(answers []answer, from, to time.Duration) stretch {
	var s stretch
	admitted := 0
	var lat []time.Duration
	for i := range answers {
		a := &answers[i]
		if a.sent < from || a.sent >= to || !r.inMix(a.tenant) {
			continue
		}
		s.sent++
		if a.admitted() {
			admitted++
		}
		if a.code == codes.OK {
			lat = append(lat, a.answered-a.sent)
		}
	}
	if s.sent > 0 {
		s.share = float64(admitted) / float64(s.sent)
	}
	slices.Sort(lat)
	s.p50, s.p99 = quantileMs(lat, 0.50), quantileMs(lat, 0.99)
	return s
}

// steady is the mix before the fault, less its first second (or half),
// when buckets that started full admit a burst; ok is false when there is
// no such stretch or nothing was admitted in it.
func (r *run) steady(answers []answer) (stretch, bool) {
	from := min(time.Second, r.fault/2)
	if r.fault <= from {
		return stretch{}, false
	}
	s := r.measureStretch(answers, from, r.fault)
	return s, s.share > 0
}

// back reports whether one second of the mix is within the promise of
// recovery: its share admitted at least RecoverFraction of steady's, its
// p50 and p99 at most RecoverLatency times steady's plus RecoverSlack. A
// share, not a rate, so that a load whose rate moves (a trace's) recovers
// to what it asks, not to what it asked before.
func (r *run) back(s, steady stretch) bool {
	slack := float64(r.o.RecoverSlack) / 1e6
	return s.share >= r.o.RecoverFraction*steady.share &&
		s.p50 <= r.o.RecoverLatency*steady.p50+slack && s.p99 <= r.o.RecoverLatency*steady.p99+slack
}

// recovery is the whole seconds from the fault's end (the recovery action
// done) to the first second of the mix's load back within the promise
// (back), in per-second buckets from that end: 0 when the first second is
// back, nil when none is before the drill's end. A second in which the
// mix sent nothing says nothing and is passed over.
func (r *run) recovery(answers []answer) *float64 {
	steady, ok := r.steady(answers)
	if !ok {
		return nil
	}
	for b := r.begun; b+time.Second <= r.ended; b += time.Second {
		if s := r.measureStretch(answers, b, b+time.Second); s.sent > 0 && r.back(s, steady) {
			sec := (b - r.begun).Seconds()
			return &sec
		}
	}
	return nil
}

// faultSpan is when the fault was asked for, took hold and ended; nil for
// a drill that never began one.
func (r *run) faultSpan() *FaultSpan {
	if r.fault <= 0 || r.begun < r.fault {
		return nil
	}
	held := max(r.held, r.fault)
	return &FaultSpan{AskedS: secs(r.o.During), BeganS: secs(r.fault), HeldS: secs(held), EndedS: secs(r.begun), SpanS: secs(r.begun - held)}
}

// judge adds the promises every drill checks, and its own.
func (r *run) judge(d *drillSpec, answers []answer, releases []release) {
	add := func(name string, held bool, format string, args ...any) {
		r.rep.Promises = append(r.rep.Promises, Promise{Name: name, Held: held, Detail: fmt.Sprintf(format, args...)})
	}
	var lost, sent, late int64
	lateOK := true
	var relErr []string
	floorsOK, quotaOK := true, true
	var worst *QuotaReport // the phase with the most beyond one exact bucket
	var worstPhase string
	var floorMiss, quotaMiss []string
	for _, p := range r.rep.Phases {
		lost += p.Lost
		sent += p.Sent
		late += p.PastDeadline
		if float64(p.PastDeadline) > r.o.LateBudget*float64(p.Sent) {
			lateOK = false
		}
		for code, n := range p.ReleaseErrors {
			relErr = append(relErr, fmt.Sprintf("%s: %d %s", p.Name, n, code))
		}
		for _, f := range p.Floors {
			if f.Held < f.Seconds {
				floorsOK = false
				floorMiss = append(floorMiss, fmt.Sprintf("%s %s %d/%d s", p.Name, f.Tenant, f.Held, f.Seconds))
			}
		}
		if q := p.Quota; q != nil {
			switch {
			case q.Excess > q.Bound || q.Admitted > q.Upper:
				quotaOK = false
				quotaMiss = append(quotaMiss, fmt.Sprintf("%s: %d tokens beyond one exact bucket, over the bound (%s)", p.Name, q.Excess, q.BoundText))
			case q.Under > 100*r.o.Undershoot:
				quotaOK = false
				quotaMiss = append(quotaMiss, fmt.Sprintf("%s: %d tokens, %.1f%% under the %d one exact bucket empty at the phase's start admits (bound %.0f%%)", p.Name, q.Admitted, q.Under, q.Quota, 100*r.o.Undershoot))
			}
			if worst == nil || q.Excess > worst.Excess {
				worst, worstPhase = q, p.Name
			}
		}
	}
	add("no answer lost", lost == 0, "%d of %d Admits got no decision", lost, sent)
	add("answers before their deadline", lateOK, "%d of %d past their deadline (budget %.2g%% a phase)", late, sent, 100*r.o.LateBudget)
	if floorsOK {
		add("floors held every second", true, "every floor tenant, every second of every phase")
	} else {
		add("floors held every second", false, "missed: %s", strings.Join(floorMiss, "; "))
	}
	if r.inMix(r.o.QuotaTenant) {
		if quotaOK {
			most := ""
			if worst != nil {
				most = fmt.Sprintf("; most beyond it %d tokens (%s), bound %s", worst.Excess, worstPhase, worst.BoundText)
			}
			add("quota kept", true, "%s in every phase at least %.0f%% of what one exact bucket empty at its start admits, and never beyond one exact bucket full at the drill's start by more than the bound%s", r.o.QuotaTenant, 100*(1-r.o.Undershoot), most)
		} else {
			add("quota kept", false, "%s", strings.Join(quotaMiss, "; "))
		}
	}
	detail := "every Release answered OK"
	if d.leasesDie {
		detail += " (leases of the killed replica excepted: they died with it)"
	}
	if len(relErr) > 0 {
		detail = strings.Join(relErr, "; ")
	}
	add("no lease lost", len(relErr) == 0, "%s", detail)
	within := fmt.Sprintf("share admitted ≥ %.0f%% of before's, p50 and p99 ≤ %.3g× before's + %v", 100*r.o.RecoverFraction, r.o.RecoverLatency, r.o.RecoverSlack)
	if st, ok := r.steady(answers); ok {
		within += fmt.Sprintf("; before: %.0f%%, %.2f ms, %.2f ms", 100*st.share, st.p50, st.p99)
	}
	if rs := r.rep.RecoverSeconds; rs != nil {
		add("recovered", *rs <= r.o.RecoverWithin.Seconds(), "first second back (%s) %.0fs after the fault's end at %.2fs (bound %v)", within, *rs, secs(r.begun), r.o.RecoverWithin)
	} else {
		add("recovered", false, "no second back (%s) from the fault's end at %.2fs to the drill's end at %.2fs", within, secs(r.begun), secs(r.ended))
	}
	if r.domain == "" {
		return
	}
	during := r.rep.Phases[1]
	what := d.departure
	first := ""
	for i := range answers {
		if a := &answers[i]; r.forbidden(a) {
			first = fmt.Sprintf(" (the first sent at %.3fs, %.3fs after %s, granted by %s)", secs(a.sent), secs(a.sent-r.mark), what, a.replica)
			break
		}
	}
	add("no placement after "+what, *during.Forbidden == 0, "%d placements on %s of requests sent from %v after %s and answered before the recovery action%s", *during.Forbidden, r.domain, r.o.Grace, what, first)
	var onDomain, failed int64
	for _, rel := range releases {
		if rel.domain == r.domain && r.mark >= 0 && rel.granted < r.mark && rel.at >= r.mark {
			onDomain++
			if rel.code != codes.OK {
				failed++
			}
		}
	}
	add("leases there complete", failed == 0, "%d leases granted on %s before the mark and released after it, %d failed", onDomain, r.domain, failed)
	if b, a := *r.rep.Phases[0].OnTarget, *r.rep.Phases[2].OnTarget; b > 0 {
		add(d.back, a > 0, "%d placements on %s before, %d after", b, r.domain, a)
	}
}
