package replay

import (
	"testing"
)

// On the conversation trace at 30× the test cluster is saturated: without
// lower tiers the largest tenant runs its quota into debt and is refused
// three requests in four. Accepting lower tiers must raise the cluster's
// utilization and every tenant's admissions, never lower them: a degraded
// admission is charged its granted tier's share of the quota, so it does
// not cost the tenant more than waiting would.
func TestDowngradeRaisesUtilizationAndEveryTenantsAdmissions(t *testing.T) {
	cfg, cl := setup(t)
	mix, err := ParseMix(testMix)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := LoadTrace(convTrace, TraceOptions{Mix: mix, Seed: 1, Speed: 30})
	if err != nil {
		t.Fatal(err)
	}
	run := func(downgrade bool) *Report {
		t.Helper()
		r, err := Run(rows, Options{Policy: PolicySluice, Config: cfg, Cluster: cl, Downgrade: downgrade})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	waiting, degrading := run(false), run(true)
	uw, ud := utilization(waiting), utilization(degrading)
	t.Logf("utilization %.1f%% without lower tiers, %.1f%% with", 100*uw, 100*ud)
	if uw < 0.7 {
		t.Fatalf("utilization without lower tiers %.1f%%: the replay no longer saturates the cluster", 100*uw)
	}
	if ud < uw {
		t.Errorf("utilization %.1f%% with lower tiers, below %.1f%% without", 100*ud, 100*uw)
	}
	admitted := map[string]int{}
	for _, tr := range waiting.Tenants {
		admitted[tr.Name] = tr.Admitted + tr.Degraded
	}
	for _, tr := range degrading.Tenants {
		got := tr.Admitted + tr.Degraded
		t.Logf("%s: %d admitted without lower tiers, %d with (%d degraded)", tr.Name, admitted[tr.Name], got, tr.Degraded)
		if got < admitted[tr.Name] {
			t.Errorf("%s: %d admitted with lower tiers, fewer than %d without", tr.Name, got, admitted[tr.Name])
		}
	}
}
