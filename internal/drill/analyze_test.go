package drill

import (
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	"github.com/sluice-sched/sluice/admission/sharing"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/load"
)

// scripted is a drain drill over answers written by hand: 10 s, the mark at
// 3 s, the undrain at 6 s; gold (floor 700 tokens/s) sends 10 requests of
// 140 tokens a second, placed on d2 (d1 before the mark and after the
// undrain); bronze (7,000 tokens/s) sends 100 a second and gets 50.
func scripted() *run {
	o := Defaults()
	o.Tenants = o.Tenants[:1]
	o.Tenants = append(o.Tenants, Defaults().Tenants[2]) // gold, bronze
	r := &run{f: &Fleet{Replicas: 2, Interval: 100 * time.Millisecond}, o: o, mark: 3 * time.Second,
		rep: &Report{Drill: DrainDomain}, rec: newRecorder(time.Now(), nil, 4), domain: "d1",
		fault: 3 * time.Second, mend: 6 * time.Second, begun: 6 * time.Second, ended: 10 * time.Second,
		pols: map[string]policy{"gold": {floor: 700, rate: 100000, burst: 100000}, "bronze": {rate: 7000, burst: 7000}}}
	for ms := 0; ms < 10000; ms += 10 {
		at := time.Duration(ms) * time.Millisecond
		a := answer{sent: at, answered: at + time.Millisecond, tenant: "bronze", weight: 140, decision: admissionv1.Decision_REJECTED, reason: "QUOTA_EXCEEDED"}
		if ms%20 == 0 {
			a.decision, a.reason, a.domain = admissionv1.Decision_ADMITTED, "", "d2"
		}
		r.rec.answers = append(r.rec.answers, a)
		if ms%100 == 0 {
			dom := "d2"
			if at < r.mark || at >= r.mend {
				dom = "d1"
			}
			r.rec.answers = append(r.rec.answers, answer{sent: at, answered: at + time.Millisecond, tenant: "gold", weight: 140,
				decision: admissionv1.Decision_ADMITTED, domain: dom, replica: "replica-1"})
		}
	}
	return r
}

func promiseOf(t *testing.T, r *run, name string) Promise {
	t.Helper()
	for _, p := range r.rep.Promises {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no promise %q in %+v", name, r.rep.Promises)
	return Promise{}
}

// A clean run holds every promise, with the measures the script implies.
func TestAnalyzeCleanDrain(t *testing.T) {
	r := scripted()
	r.analyze(DrainDomain)
	for _, p := range r.rep.Promises {
		if !p.Held {
			t.Errorf("%s broke: %s", p.Name, p.Detail)
		}
	}
	before, during, after := r.rep.Phases[0], r.rep.Phases[1], r.rep.Phases[2]
	if before.Sent != 330 || before.Admitted != 180 || before.Refusals["QUOTA_EXCEEDED"] != 150 {
		t.Errorf("before: sent %d, admitted %d, refusals %v; want 330, 180, 150 QUOTA_EXCEEDED", before.Sent, before.Admitted, before.Refusals)
	}
	if *before.OnTarget != 30 || *during.OnTarget != 0 || *during.Forbidden != 0 || *after.OnTarget != 40 {
		t.Errorf("on d1: %d before, %d during (%d forbidden), %d after; want 30, 0, 0, 40", *before.OnTarget, *during.OnTarget, *during.Forbidden, *after.OnTarget)
	}
	// One exact bucket of 7,000 tokens/s, empty at 3 s, admits a request of
	// 140 every 20 ms from 3.02 s: 149 of them.
	if q := during.Quota; q.Admitted != 21000 || q.Quota != 149*140 || q.Overshoot != 0 || q.Under != 0 {
		t.Errorf("during quota: %+v; want 21000 admitted against the exact bucket's 20860, no overshoot", q)
	}
	if f := after.Floors; len(f) != 1 || f[0].Held != 4 || f[0].Seconds != 4 {
		t.Errorf("after floors: %+v; want gold held 4 of 4 seconds", f)
	}
	if r.rep.RecoverSeconds == nil || *r.rep.RecoverSeconds != 0 {
		t.Errorf("time to recover %v; want 0 (nothing was lost)", r.rep.RecoverSeconds)
	}
}

// Placements on the drained domain count once the grace after the mark has
// passed, and break the promise naming the first; a lost answer, one past
// its deadline, a floor missed and a failed Release break theirs.
func TestAnalyzeCatchesBrokenPromises(t *testing.T) {
	r := scripted()
	ans := r.rec.answers
	for i := range ans {
		a := &ans[i]
		switch {
		case a.tenant == "gold" && a.sent >= 4*time.Second && a.sent < 5*time.Second:
			a.domain = "d1" // a replica that ignores the drain, for a second
		case a.tenant == "gold" && a.sent == 3200*time.Millisecond:
			a.domain = "d1" // within the grace: allowed
		case a.tenant == "gold" && a.sent >= 7*time.Second && a.sent < 8*time.Second:
			a.decision, a.reason, a.domain = admissionv1.Decision_REJECTED, "CAPACITY_EXCEEDED", ""
		}
	}
	ans[3].code, ans[5].code = codes.Unavailable, codes.DeadlineExceeded
	r.rec.releases = append(r.rec.releases, release{at: 8 * time.Second, code: codes.NotFound})
	r.analyze(DrainDomain)
	if n := *r.rep.Phases[1].Forbidden; n != 10 {
		t.Errorf("placements after the mark: %d; want the 10 of the fifth second (not the one within the grace)", n)
	}
	p := promiseOf(t, r, "no placement after the mark")
	if p.Held || !strings.Contains(p.Detail, "the first sent at 4.000s") {
		t.Errorf("no placement after the mark: %+v; want broken, naming the first at 4.000s", p)
	}
	if p := promiseOf(t, r, "no answer lost"); p.Held || !strings.Contains(p.Detail, "1 of") {
		t.Errorf("no answer lost: %+v; want broken by the UNAVAILABLE", p)
	}
	if r.rep.Phases[0].PastDeadline != 1 {
		t.Errorf("past deadline before: %d; want 1", r.rep.Phases[0].PastDeadline)
	}
	if p := promiseOf(t, r, "floors held every second"); p.Held || !strings.Contains(p.Detail, "after gold 3/4") {
		t.Errorf("floors held every second: %+v; want gold missing one second after", p)
	}
	if p := promiseOf(t, r, "no lease lost"); p.Held || !strings.Contains(p.Detail, "NotFound") {
		t.Errorf("no lease lost: %+v; want broken by the NOT_FOUND Release", p)
	}
}

// Every BURST_CREDIT_EXHAUSTED must point at the end of one open period:
// one answer whose retry_after is a second off breaks the promise.
func TestCreditRetryAfterJudged(t *testing.T) {
	r := scripted()
	r.o.BreakerOpen = 3 * time.Second
	r.pols["spiky"] = policy{rate: 3000, burst: 3000, credit: 3000}
	for i, at := range []time.Duration{4000, 4100, 4200, 4300} {
		at *= time.Millisecond
		ra := 7*time.Second - at
		if i == 2 {
			ra += time.Second
		}
		r.rec.answers = append(r.rec.answers, answer{sent: at, answered: at, tenant: "spiky", weight: 140,
			decision: admissionv1.Decision_REJECTED, reason: "BURST_CREDIT_EXHAUSTED", retryAfter: ra})
	}
	r.f.Router = nil
	r.judgeCreditAnswers("spiky", 4*time.Second)
	if p := promiseOf(t, r, "breaker opens"); !p.Held {
		t.Errorf("breaker opens: %+v", p)
	}
	if p := promiseOf(t, r, "Retry-After is the breaker's"); p.Held || !strings.Contains(p.Detail, "within 1s") {
		t.Errorf("Retry-After is the breaker's: %+v; want broken by the answer 1s off", p)
	}
}

// A drill's trace segment starts at an offset into the trace (the same for
// the same seed), keeps the trace's gaps, and goes round again at its end.
func TestTraceFromGoesRound(t *testing.T) {
	trace := []load.Arrival{{At: 0, Tenant: "a"}, {At: time.Second, Tenant: "b"}, {At: 3 * time.Second, Tenant: "c"}}
	const cover = 20 * time.Second // six laps and a bit
	got := traceFrom(trace, 7, cover)
	if again := traceFrom(trace, 7, cover); !slices.Equal(got, again) {
		t.Fatalf("the same seed gave two segments: %v and %v", got, again)
	}
	if got[0].At < 0 || got[0].At > 3*time.Second || got[len(got)-1].At >= cover || got[len(got)-1].At < cover-3*time.Second {
		t.Fatalf("segment %v: want calls from within one trace of the start to within one of %v", got, cover)
	}
	// The trace's gaps, round: a→b 1s, b→c 2s, c→the next lap's a 1ms.
	next := map[string]struct {
		tenant string
		gap    time.Duration
	}{"a": {"b", time.Second}, "b": {"c", 2 * time.Second}, "c": {"a", time.Millisecond}}
	for i := 1; i < len(got); i++ {
		if want := next[got[i-1].Tenant]; got[i].Tenant != want.tenant || got[i].At-got[i-1].At != want.gap {
			t.Fatalf("call %d: %s %v after %s; want %s %v after it", i, got[i].Tenant, got[i].At-got[i-1].At, got[i-1].Tenant, want.tenant, want.gap)
		}
	}
}

// The quota promise's lower bound is what one exact token bucket, empty at
// the phase's start, admits of the same requests: a lull refills nothing
// past the burst.
func TestBucketAdmits(t *testing.T) {
	at := func(ms int) answer { return answer{sent: time.Duration(ms) * time.Millisecond, weight: 50} }
	asked := []answer{at(10000), at(1000), at(0), at(1100), at(1000)} // out of order, as answers come back
	// rate 100/s, burst 100: 0 s empty (no); 1 s 100 (yes, yes); 1.1 s 10 (no); 10 s full again at 100 (yes).
	if got := bucketAdmits(asked, 0, 100, 100); got != 150 {
		t.Fatalf("bucketAdmits = %d, want 150", got)
	}
}

// kill-replica's promise: the member TTL where etcd says when a replica
// is gone, SilentHoldRounds intervals of silence where nothing does; ten
// intervals more either way, and two seconds at least.
func TestReclaimBound(t *testing.T) {
	w := 100 * time.Millisecond
	for _, tc := range []struct {
		f    *Fleet
		want time.Duration
	}{
		{&Fleet{Interval: w, MemberTTL: 5 * time.Second, Etcd: &clientv3.Client{}}, 5*time.Second + 3*time.Second},
		{&Fleet{Interval: w, MemberTTL: 5 * time.Second}, sharing.SilentHoldRounds*w + 3*time.Second},
		{&Fleet{Interval: time.Second, MemberTTL: 30 * time.Second, Etcd: &clientv3.Client{}}, 30*time.Second + 10*time.Second},
	} {
		if got, _ := tc.f.reclaimBound(); got != tc.want {
			t.Errorf("etcd %v: bound %v, want %v", tc.f.Etcd != nil, got, tc.want)
		}
	}
}

// faulted is a kill-replica drill over answers written by hand: 12 s, the
// fault from 3 s, held from 3.5 s to 6 s; gold and bronze each send 100
// requests a second, answered in 1 ms, all admitted; answers sent from
// 3 s until slowAfter seconds past the fault's end take 45 ms.
func faulted(slowAfter int) *run {
	r := scripted()
	r.rep.Drill, r.domain, r.mark = KillReplica, "", -1
	r.held, r.ended = 3500*time.Millisecond, 12*time.Second
	r.rec.answers = nil
	slowTo := r.begun + time.Duration(slowAfter)*time.Second
	for ms := 0; ms < 12000; ms += 10 {
		at := time.Duration(ms) * time.Millisecond
		lat := time.Millisecond
		if at >= r.fault && at < slowTo {
			lat = 45 * time.Millisecond
		}
		for _, t := range []string{"gold", "bronze"} {
			r.rec.answers = append(r.rec.answers, answer{sent: at, answered: at + lat, tenant: t, weight: 10, decision: admissionv1.Decision_ADMITTED})
		}
	}
	return r
}

// Recovery counts from the fault's end: Admits 45× slower for 3 s after it
// are 3 s to recover (and break the promise at a bound of 2 s); a fault
// that moves nothing past its end recovers in 0 s.
func TestRecoveryFromTheFaultsEnd(t *testing.T) {
	r := faulted(3)
	r.o.RecoverWithin = 2 * time.Second
	r.analyze(KillReplica)
	if rs := r.rep.RecoverSeconds; rs == nil || *rs != 3 {
		t.Fatalf("time to recover %v; want 3 s (the slow seconds after the fault's end)", rs)
	}
	if p := promiseOf(t, r, "recovered"); p.Held || !strings.Contains(p.Detail, "3s after the fault's end at 6.00s") {
		t.Errorf("recovered: %+v; want broken, 3 s after the end at 6.00s", p)
	}
	if f := r.rep.Fault; f == nil || *f != (FaultSpan{AskedS: 3, BeganS: 3, HeldS: 3.5, EndedS: 6, SpanS: 2.5}) {
		t.Errorf("fault span %+v; want asked 3 s, began 3 s, held 3.5–6 s (2.5 s)", f)
	}

	r = faulted(0)
	r.analyze(KillReplica)
	if rs := r.rep.RecoverSeconds; rs == nil || *rs != 0 {
		t.Fatalf("time to recover %v; want 0 s (nothing moved past the fault's end)", rs)
	}
	if p := promiseOf(t, r, "recovered"); !p.Held {
		t.Errorf("recovered: %+v; want held", p)
	}

	// Refused, not slow: a second whose share admitted is under 85% of
	// before's is not back either.
	r = faulted(0)
	for i := range r.rec.answers {
		if a := &r.rec.answers[i]; a.sent >= 6*time.Second && a.sent < 7*time.Second && a.tenant == "gold" {
			a.decision, a.reason = admissionv1.Decision_REJECTED, "CAPACITY_EXCEEDED"
		}
	}
	r.analyze(KillReplica)
	if rs := r.rep.RecoverSeconds; rs == nil || *rs != 1 {
		t.Fatalf("time to recover %v; want 1 s (half refused in the first second after the end)", rs)
	}

	// Slow to the drill's end: never.
	r = faulted(6)
	r.analyze(KillReplica)
	if rs := r.rep.RecoverSeconds; rs != nil {
		t.Fatalf("time to recover %v; want nil (never back)", *rs)
	}
	if p := promiseOf(t, r, "recovered"); p.Held || !strings.Contains(p.Detail, "no second back") {
		t.Errorf("recovered: %+v; want broken, no second back", p)
	}
}

// admitBronze admits the first n of bronze's refused requests sent from
// 3 s (the drain's during phase): n·140 tokens more than its rate.
func admitBronze(r *run, n int) {
	for i := range r.rec.answers {
		if a := &r.rec.answers[i]; n > 0 && a.tenant == "bronze" && a.sent >= 3*time.Second && !a.admitted() {
			a.decision, a.reason, a.domain = admissionv1.Decision_ADMITTED, "", "d2"
			n--
		}
	}
}

// The quota promise holds the tenant to one exact bucket (7,000 tokens/s,
// burst 7,000, full at the start) plus the mode's bound: batched with two
// replicas, (N−1)·R·W = 700 tokens and one request of 140. Bronze admitted
// at its rate keeps its bucket full, so 54 requests more (7,560 tokens)
// are 700 beyond it, within; 62 more (8,680) are 1,820 beyond, broken; in
// strict mode the bound is one request, and 700 beyond breaks it.
func TestQuotaJudgedOnTheModesBound(t *testing.T) {
	for _, tc := range []struct {
		mode   string
		extra  int
		excess int64
		held   bool
	}{
		{ModeBatched, 0, 0, true},
		{ModeBatched, 54, 700, true},
		{ModeBatched, 62, 1820, false},
		{ModeStrict, 54, 700, false},
		{ModeStrict, 49, 0, true},
	} {
		r := scripted()
		r.f.Mode = tc.mode
		admitBronze(r, tc.extra)
		r.analyze(DrainDomain)
		q := r.rep.Phases[1].Quota
		if q.Excess < tc.excess-1 || q.Excess > tc.excess+1 {
			t.Errorf("%s, %d more: %d tokens beyond one exact bucket; want %d", tc.mode, tc.extra, q.Excess, tc.excess)
		}
		if e := r.rep.Phases[0].Quota.Excess; e != 0 {
			t.Errorf("%s, %d more: %d tokens beyond the bucket before; want 0 (its burst is the bucket's)", tc.mode, tc.extra, e)
		}
		wantBound := map[string]string{ModeBatched: "batched (N−1)·R·W = 1·7000·100ms + one request = 840 tokens", ModeStrict: "strict one request = 140 tokens"}[tc.mode]
		p := promiseOf(t, r, "quota kept")
		if p.Held != tc.held || !strings.Contains(p.Detail, wantBound) {
			t.Errorf("%s, %d more: quota kept %+v; want held %v, naming the bound %q", tc.mode, tc.extra, p, tc.held, wantBound)
		}
	}
}
