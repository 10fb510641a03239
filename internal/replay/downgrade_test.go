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

// On the code trace at 10× the test cluster is saturated in bursts, with
// seconds between them: without lower tiers the largest tenant's requests
// for large wait up to its deadline and run in the gaps. With them, a
// request that large can still serve before its deadline waits for it as
// well, and only what large cannot serve in time is degraded: the GPUs do
// at least as much work, and no tenant is admitted less. (Degrading every
// request that waits past a fixed 100 ms leaves them idle between the
// bursts: 51% against 90%.)
func TestDowngradeKeepsUtilizationOnTheCodeTrace(t *testing.T) {
	cfg, cl := setup(t)
	c, err := CompareDowngrade(codeRows(t, TraceOptions{Speed: 10}), Options{Config: cfg, Cluster: cl})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("utilization %.2f%% without lower tiers, %.2f%% with (over %.1f s and %.1f s)", 100*c.UtilNot, 100*c.UtilAllowed, c.Not.Seconds, c.Allowed.Seconds)
	if c.UtilNot < 0.8 {
		t.Fatalf("utilization without lower tiers %.1f%%: the replay no longer saturates the cluster", 100*c.UtilNot)
	}
	if c.UtilAllowed < c.UtilNot {
		t.Errorf("utilization %.2f%% with lower tiers, below %.2f%% without", 100*c.UtilAllowed, 100*c.UtilNot)
	}
	t.Logf("least ratio of admitted weighted tokens, with ÷ without: %s %.3f", c.LeastTenant, c.LeastRatio)
	if c.LeastRatio < 1 {
		t.Errorf("%s admitted %.3f× the weighted tokens with lower tiers", c.LeastTenant, c.LeastRatio)
	}
	admitted := map[string]int{}
	for _, tr := range c.Not.Tenants {
		admitted[tr.Name] = tr.Admitted + tr.Degraded
	}
	degraded := 0
	for _, tr := range c.Allowed.Tenants {
		got := tr.Admitted + tr.Degraded
		degraded += tr.Degraded
		t.Logf("%s: %d admitted without lower tiers, %d with (%d degraded)", tr.Name, admitted[tr.Name], got, tr.Degraded)
		if got < admitted[tr.Name] {
			t.Errorf("%s: %d admitted with lower tiers, fewer than %d without", tr.Name, got, admitted[tr.Name])
		}
	}
	if degraded == 0 {
		t.Error("nothing degraded: the test means nothing")
	}
}
