package dashboard_test

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/dashboard"
)

func answer(tenant string, o admission.Outcome, r admission.Reason, tokens int64) (admission.Request, admission.Decision) {
	return admission.Request{Tenant: tenant}, admission.Decision{Outcome: o, Reason: r, Trace: admission.Trace{Tenant: tenant, WeightedTokens: tokens}}
}

func TestTrafficRatesOverTheWindow(t *testing.T) {
	tr := dashboard.NewTraffic()
	t0 := time.Unix(1000, 0)
	tr.Sample(t0)
	// Second 1: 10 admitted (100 tokens each), 2 degraded, 3 refused.
	for range 10 {
		tr.ObserveDecision(answer("acme", admission.Admitted, admission.ReasonNone, 100))
	}
	for range 2 {
		tr.ObserveDecision(answer("acme", admission.Degraded, admission.ReasonNone, 50))
	}
	for range 3 {
		tr.ObserveDecision(answer("acme", admission.Rejected, admission.ReasonQuotaExceeded, 0))
	}
	tr.Sample(t0.Add(time.Second))
	r, ok := tr.RatesOf("acme")
	want := dashboard.Rates{Admitted: 10, Degraded: 2, Refused: 3, Tokens: 1100}
	if !ok || r != want {
		t.Fatalf("after 1 s: %+v, want %+v", r, want)
	}
	// Three quiet seconds: the burst is spread over the 4 s the window spans.
	for i := 2; i <= 4; i++ {
		tr.Sample(t0.Add(time.Duration(i) * time.Second))
	}
	if r, _ := tr.RatesOf("acme"); r.Admitted != 2.5 || r.Tokens != 275 {
		t.Fatalf("after 4 s: %+v, want 2.5 admitted/s, 275 tokens/s", r)
	}
	// Once the window has passed, the rate is 0.
	tr.Sample(t0.Add(5 * time.Second))
	tr.Sample(t0.Add(6 * time.Second))
	if r, _ := tr.RatesOf("acme"); r != (dashboard.Rates{}) {
		t.Fatalf("after the window: %+v", r)
	}
}

func TestTrafficForgetsIdleAndUnknownTenants(t *testing.T) {
	tr := dashboard.NewTraffic()
	t0 := time.Unix(1000, 0)
	tr.ObserveDecision(answer("nobody", admission.Rejected, admission.ReasonUnknownTenant, 0))
	if tr.Tracked() != 0 {
		t.Fatal("an UNKNOWN_TENANT answer made counters: any caller could grow the map")
	}
	tr.ObserveDecision(answer("acme", admission.Admitted, admission.ReasonNone, 1))
	for i := range 61 {
		tr.Sample(t0.Add(time.Duration(i) * time.Second))
	}
	if tr.Tracked() != 0 {
		t.Fatalf("a tenant idle for a minute still has counters (%d tracked)", tr.Tracked())
	}
	if _, ok := tr.RatesOf("acme"); ok {
		t.Fatal("an idle tenant still has rates")
	}
}

func TestTrafficObserveAllocatesNothing(t *testing.T) {
	tr := dashboard.NewTraffic()
	req, d := answer("acme", admission.Admitted, admission.ReasonNone, 100)
	tr.ObserveDecision(req, d)
	if n := testing.AllocsPerRun(1000, func() { tr.ObserveDecision(req, d) }); n != 0 {
		t.Fatalf("ObserveDecision allocates %v times per answer", n)
	}
}

// BenchmarkTrafficObserve is the cost the dashboard adds to every answer
// (outside the engine's lock), from parallel callers.
func BenchmarkTrafficObserve(b *testing.B) {
	tr := dashboard.NewTraffic()
	req, d := answer("acme", admission.Admitted, admission.ReasonNone, 100)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tr.ObserveDecision(req, d)
		}
	})
}

// Total sums every counted tenant's rates for the fleet strip.
func TestTrafficTotal(t *testing.T) {
	tr := dashboard.NewTraffic()
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tr.Sample(start)
	for i, tenant := range []string{"acme", "acme", "globex"} {
		d := admission.Decision{Outcome: admission.Admitted, Trace: admission.Trace{Tenant: tenant, WeightedTokens: 100}}
		if i == 2 {
			d.Outcome = admission.Rejected
		}
		tr.ObserveDecision(admission.Request{Tenant: tenant}, d)
	}
	tr.Sample(start.Add(time.Second))
	if got, want := tr.Total(), (dashboard.Rates{Admitted: 2, Refused: 1, Tokens: 200}); got != want {
		t.Errorf("Total = %+v, want %+v", got, want)
	}
}

// Refusals are ranked by reason over the window: each tenant's two
// commonest, every tenant's three commonest, at the rates they ran at.
func TestTrafficRefusalReasons(t *testing.T) {
	tr := dashboard.NewTraffic()
	t0 := time.Unix(1000, 0)
	tr.Sample(t0)
	refuse := func(tenant string, r admission.Reason, n int) {
		for range n {
			tr.ObserveDecision(answer(tenant, admission.Rejected, r, 0))
		}
	}
	refuse("acme", admission.ReasonQuotaExceeded, 6)
	refuse("acme", admission.ReasonConcurrencyExceeded, 4)
	refuse("acme", admission.ReasonBudgetExhausted, 2) // acme's third: not in its row
	refuse("globex", admission.ReasonQueueFull, 5)
	refuse("globex", admission.ReasonQuotaExceeded, 3)
	refuse("initech", admission.ReasonDeadlineUnmeetable, 1)
	tr.ObserveDecision(answer("hooli", admission.Admitted, admission.ReasonNone, 10))
	tr.Sample(t0.Add(2 * time.Second)) // the counts over 2 s
	rr := func(r admission.Reason, v float64) dashboard.ReasonRate {
		return dashboard.ReasonRate{Reason: r, PerSecond: v}
	}
	for _, tc := range []struct {
		tenant string
		want   []dashboard.ReasonRate
	}{
		{"acme", []dashboard.ReasonRate{rr(admission.ReasonQuotaExceeded, 3), rr(admission.ReasonConcurrencyExceeded, 2)}},
		{"globex", []dashboard.ReasonRate{rr(admission.ReasonQueueFull, 2.5), rr(admission.ReasonQuotaExceeded, 1.5)}},
		{"initech", []dashboard.ReasonRate{rr(admission.ReasonDeadlineUnmeetable, 0.5)}},
		{"hooli", []dashboard.ReasonRate{}},
		{"nobody", []dashboard.ReasonRate{}},
	} {
		if got := tr.RefusalsOf(tc.tenant); !slices.Equal(got, tc.want) {
			t.Errorf("%s's reasons %v, want %v", tc.tenant, got, tc.want)
		}
	}
	// Every tenant's: QUOTA_EXCEEDED 9 in 2 s, QUEUE_FULL 5, CONCURRENCY 4.
	want := []dashboard.ReasonRate{rr(admission.ReasonQuotaExceeded, 4.5), rr(admission.ReasonQueueFull, 2.5), rr(admission.ReasonConcurrencyExceeded, 2)}
	if got := tr.TopRefusals(); !slices.Equal(got, want) {
		t.Errorf("fleet reasons %v, want %v", got, want)
	}
	// Once the window has passed, none.
	for i := 3; i <= 7; i++ {
		tr.Sample(t0.Add(time.Duration(i) * time.Second))
	}
	if got := tr.TopRefusals(); len(got) != 0 {
		t.Errorf("fleet reasons after the window: %v", got)
	}
	if got := tr.RefusalsOf("acme"); len(got) != 0 {
		t.Errorf("acme's reasons after the window: %v", got)
	}
}

// The Admit p99 is over the intervals the rates span, and forgets the
// older ones.
func TestTrafficAdmitLatencyWindow(t *testing.T) {
	tr := dashboard.NewTraffic()
	t0 := time.Unix(1000, 0)
	tr.Sample(t0)
	if l := tr.AdmitLatency(); l != (dashboard.Latency{}) {
		t.Fatalf("latency before any call: %+v", l)
	}
	// First second: 1 ms to 100 ms, one call each.
	for ms := 1; ms <= 100; ms++ {
		tr.ObserveLatency(time.Duration(ms) * time.Millisecond)
	}
	tr.Sample(t0.Add(time.Second))
	if l := tr.AdmitLatency(); l.Count != 100 || !within(l.P99, 99*time.Millisecond, 0.01) {
		t.Fatalf("after the first second: %+v, want 100 calls, p99 99 ms", l)
	}
	// Second second: 900 fast calls. The window holds both: 1000 calls, of
	// which the 10 slowest are 91 to 100 ms.
	for range 900 {
		tr.ObserveLatency(50 * time.Microsecond)
	}
	tr.Sample(t0.Add(2 * time.Second))
	if l := tr.AdmitLatency(); l.Count != 1000 || !within(l.P99, 90*time.Millisecond, 0.01) {
		t.Fatalf("after the second: %+v, want 1000 calls, p99 90 ms", l)
	}
	// Three more seconds: the first second leaves the window (it spans the
	// last 4 intervals), leaving the fast calls.
	for i := 3; i <= 5; i++ {
		tr.Sample(t0.Add(time.Duration(i) * time.Second))
	}
	if l := tr.AdmitLatency(); l.Count != 900 || !within(l.P99, 50*time.Microsecond, 0.01) {
		t.Fatalf("once the slow second has left: %+v, want 900 calls, p99 50 µs", l)
	}
	tr.Sample(t0.Add(6 * time.Second))
	if l := tr.AdmitLatency(); l != (dashboard.Latency{}) {
		t.Fatalf("after the window: %+v", l)
	}
}

// within reports whether got is want to within frac of it.
func within(got, want time.Duration, frac float64) bool {
	return math.Abs(float64(got-want)) <= frac*float64(want)
}

func TestTrafficObserveRefusalAllocatesNothing(t *testing.T) {
	tr := dashboard.NewTraffic()
	req, d := answer("acme", admission.Rejected, admission.ReasonQuotaExceeded, 0)
	tr.ObserveDecision(req, d) // the first refusal makes the tenant's table
	if n := testing.AllocsPerRun(1000, func() { tr.ObserveDecision(req, d); tr.ObserveLatency(time.Millisecond) }); n != 0 {
		t.Fatalf("a refusal and its latency allocate %v times", n)
	}
}

// BenchmarkTrafficObserveLatency is the cost the dashboard adds to every
// timed Admit, from parallel callers.
func BenchmarkTrafficObserveLatency(b *testing.B) {
	tr := dashboard.NewTraffic()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tr.ObserveLatency(1500 * time.Microsecond)
		}
	})
}
