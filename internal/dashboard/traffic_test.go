package dashboard_test

import (
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
