package metrics

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/topology"
)

// benchConfig has one tenant whose quotas never bind, so every Admit is a
// full decision that admits at once.
const benchConfig = `
tiers:
  bench:
    rps: {rate: 1e9, burst: 1e9}
    tokens: {rate: 1e12, burst: 1e12}
tenants:
  router: {tier: bench}
`

// observedEngine is an engine on benchConfig observed by a fresh Metrics,
// closed at the test's end.
func observedEngine(t *testing.T) (*Metrics, *admission.Engine) {
	t.Helper()
	cfg, err := config.Parse("bench", []byte(benchConfig))
	if err != nil {
		t.Fatal(err)
	}
	m := New(Options{})
	eng, err := admission.New(cfg, topology.Simulated(), admission.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	return m, eng
}

// TestInstrumentedAdmitAllocatesNothing: measuring Admit adds no allocation
// to a decision made at once (the engine's own is 0).
func TestInstrumentedAdmitAllocatesNothing(t *testing.T) {
	m, eng := observedEngine(t)
	in := m.Instrument(eng)
	ctx := context.Background()
	req := admission.Request{Tenant: "router", Model: "small", PromptTokens: 10, MaxOutputTokens: 1}
	step := func() {
		d, err := in.Admit(ctx, req)
		if err != nil || d.Outcome != admission.Admitted {
			t.Fatalf("Admit: %v %v", d, err)
		}
		if _, err := in.Release(ctx, admission.Release{LeaseID: d.LeaseID, OutputTokens: 1, Outcome: admission.ReleaseOK}); err != nil {
			t.Fatal(err)
		}
	}
	step() // resolve the tenant's series and the model's histogram once
	if n := testing.AllocsPerRun(200, step); n != 0 {
		t.Fatalf("Admit+Release through the metrics: %v allocations per call, want 0", n)
	}
	if got := testutil.ToFloat64(m.tenants.vecs.decisions.WithLabelValues("router", "ADMITTED", "REASON_UNSPECIFIED")); got < 200 {
		t.Fatalf("router admitted %v", got)
	}
}

// TestClampedReleasesAreCounted: a Release reporting more than
// limits.release_overrun_multiple times its admission is counted under its
// tenant in sluice_release_overrun_clamped_total; one within it is not.
func TestClampedReleasesAreCounted(t *testing.T) {
	m, eng := observedEngine(t)
	ctx := context.Background()
	for _, out := range []int64{4 * 5, 1<<63 - 1, 4*5 + 1} {
		d, err := eng.Admit(ctx, admission.Request{Tenant: "router", Model: "small", PromptTokens: 10, MaxOutputTokens: 5})
		if err != nil || d.Outcome != admission.Admitted {
			t.Fatalf("Admit: %v %v", d, err)
		}
		if _, err := eng.Release(ctx, admission.Release{LeaseID: d.LeaseID, OutputTokens: out}); err != nil {
			t.Fatal(err)
		}
	}
	want := `
# HELP sluice_release_overrun_clamped_total Releases per tenant that reported more tokens than limits.release_overrun_multiple times what the lease admitted, charged at that bound.
# TYPE sluice_release_overrun_clamped_total counter
sluice_release_overrun_clamped_total{tenant="other"} 0
sluice_release_overrun_clamped_total{tenant="router"} 2
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "sluice_release_overrun_clamped_total"); err != nil {
		t.Fatal(err)
	}
	// Each overrun charged is the bound's: 4 × 5 output tokens less the 5
	// admitted, at weight 4.
	if got := testutil.ToFloat64(m.overrun); got != 3*4*(4*5-5) {
		t.Errorf("overrun tokens %v, want %d", got, 3*4*(4*5-5))
	}
}

// TestRankKeepsTheBusiest: with room for two, the two busiest tenants since
// the last ranking are named, incumbents win ties, one-off tenants stay
// "other", and a tenant that loses its place loses its series.
func TestRankKeepsTheBusiest(t *testing.T) {
	m := New(Options{MaxTenantSeries: 2})
	s := m.tenants
	observe := func(tenant string, n int) {
		for range n {
			m.ObserveDecision(admission.Request{Tenant: tenant}, admission.Decision{Outcome: admission.Admitted})
		}
	}
	observe("a", 1)
	observe("b", 1) // a and b named at once: there was room
	for i := range 20 {
		observe(fmt.Sprintf("one-off-%d", i), 1) // fills the candidates (8) and decays them
	}
	observe("busy", 5)
	m.ObserveDecision(admission.Request{Tenant: "ghost"}, admission.Decision{Outcome: admission.Rejected, Reason: admission.ReasonUnknownTenant})
	s.rank()
	if got := fmt.Sprint(s.names()); got != "[a busy]" {
		t.Fatalf("named after ranking: %s, want [a busy] (busy by traffic; a over b and the one-offs by incumbency, then name)", got)
	}
	if n := testutil.CollectAndCount(m.tenants.vecs.decisions, "sluice_tenant_decisions_total"); n == 0 {
		t.Fatal("no series")
	}
	for _, l := range []string{"b", "ghost", "one-off-0"} {
		if testutil.ToFloat64(m.tenants.vecs.decisions.WithLabelValues(l, "ADMITTED", "REASON_UNSPECIFIED")) != 0 {
			t.Errorf("%s has a series of its own", l)
		}
		m.tenants.vecs.decisions.DeleteLabelValues(l, "ADMITTED", "REASON_UNSPECIFIED") // undo the probe
	}
	if got := testutil.ToFloat64(m.tenants.vecs.decisions.WithLabelValues(OtherTenant, "REJECTED", "UNKNOWN_TENANT")); got != 1 {
		t.Errorf("an unknown tenant counts as other: %v", got)
	}
	// Nobody waiting: ranking keeps the names.
	s.rank()
	if got := fmt.Sprint(s.names()); got != "[a busy]" {
		t.Fatalf("named after a quiet ranking: %s", got)
	}
}

// BenchmarkAdmit compares the engine's Admit with the instrumented one (the
// same decision plus its latency, tenant and model series) in the same run.
func BenchmarkAdmit(b *testing.B) {
	cfg, err := config.Parse("bench", []byte(benchConfig))
	if err != nil {
		b.Fatal(err)
	}
	for _, instrumented := range []bool{false, true} {
		name := "engine"
		if instrumented {
			name = "instrumented"
		}
		b.Run(name, func(b *testing.B) {
			m := New(Options{})
			eng, err := admission.New(cfg, topology.Simulated(), admission.WithObserver(m))
			if err != nil {
				b.Fatal(err)
			}
			defer eng.Close()
			admit := eng.Admit
			if instrumented {
				admit = m.Instrument(eng).Admit
			}
			ctx := context.Background()
			req := admission.Request{Tenant: "router", Model: "small", PromptTokens: 10, MaxOutputTokens: 1}
			b.ReportAllocs()
			for b.Loop() {
				d, err := admit(ctx, req)
				if err != nil || d.Outcome != admission.Admitted {
					b.Fatalf("Admit: %v %v", d, err)
				}
				if _, err := eng.Release(ctx, admission.Release{LeaseID: d.LeaseID, OutputTokens: 1, Outcome: admission.ReleaseOK}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Every reason the engine names has a pre-built counter: a reason added
// after the last one the counters were sized for would be dropped silently.
func TestEveryReasonHasACounter(t *testing.T) {
	if name := admission.Reason(maxReason).String(); !strings.HasPrefix(name, "Reason(") {
		t.Fatalf("reason %d (%s) has no decision counter: maxReason must follow the last reason", maxReason, name)
	}
	if name := admission.Reason(maxReason - 1).String(); strings.HasPrefix(name, "Reason(") {
		t.Fatalf("maxReason %d is past the last reason", maxReason)
	}
}

// sluice_build_info says what the binary was built from.
func TestBuildInfo(t *testing.T) {
	m := New(Options{})
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "sluice_build_info" {
			continue
		}
		got := map[string]string{}
		for _, l := range f.GetMetric()[0].GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if f.GetMetric()[0].GetGauge().GetValue() != 1 || got["version"] == "" || got["revision"] == "" || !strings.HasPrefix(got["goversion"], "go") {
			t.Errorf("sluice_build_info %v = %v", got, f.GetMetric()[0].GetGauge().GetValue())
		}
		return
	}
	t.Error("no sluice_build_info")
}
