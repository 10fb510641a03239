package load_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/fleetgen"
	"github.com/sluice-sched/sluice/internal/load"
)

// startFleet runs a real sluiced in-process on the files fleetgen writes:
// domains NVL72 domains and tenants tenants.
func startFleet(t *testing.T, domains, tenants int) (fleetgen.Files, *grpc.ClientConn) {
	t.Helper()
	f, err := fleetgen.Write(t.TempDir(), fleetgen.Spec{Domains: domains, Tenants: tenants})
	if err != nil {
		t.Fatal(err)
	}
	_, conn := serve(t, f.Config, f.Topology)
	return f, conn
}

func poolOpts(pool string) load.Options {
	o := closedOpts()
	m, err := load.ParseTenantPools(pool)
	if err != nil {
		panic(err)
	}
	o.Tenants = m
	return o
}

// A pool's calls go to its names: each an existing tenant of the fleet
// (admitted, never UNKNOWN_TENANT), counted under the pattern's row with
// how many names were called, which is the count a manual tally makes.
func TestTenantPoolDrawsItsNames(t *testing.T) {
	f, conn := startFleet(t, 4, 300)
	c := newCounting(load.NewTarget(conn))
	r, err := load.Run(context.Background(), poolOpts(f.TenantPool), []load.Target{c})
	if err != nil {
		t.Fatal(err)
	}
	row := tenantResult(t, r, f.TenantFormat)
	if len(r.Tenants) != 1 || row.Pool != 300 || row.Requests != r.AdmitCalls || row.Admitted != r.AdmitCalls || r.AdmitCalls == 0 {
		t.Fatalf("rows %+v: want one row for the pool, every call admitted", r.Tenants)
	}
	if row.Distinct != int64(len(c.admits)) || row.Distinct < 2 {
		t.Errorf("distinct: tool %d, counted %d", row.Distinct, len(c.admits))
	}
	for name := range c.admits {
		var i int
		if _, err := fmt.Sscanf(name, f.TenantFormat, &i); err != nil || i < 0 || i >= 300 || fmt.Sprintf(f.TenantFormat, i) != name {
			t.Errorf("a call for %q: not one of the pool's names", name)
		}
	}
	var table bytes.Buffer
	if err := (&load.Report{Mode: load.ModeClosed, Load: r}).WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%s (%d of 300 called)", f.TenantFormat, row.Distinct); !strings.Contains(table.String(), want) {
		t.Errorf("the table lacks %q:\n%s", want, table.String())
	}
}

// In turn, the callers share one counter: n calls reach the first n names,
// each once, and Compare's rounds go on where the last one ended.
func TestTenantPoolInTurn(t *testing.T) {
	f, conn := startFleet(t, 4, 100_000)
	opts := poolOpts(f.TenantPool)
	opts.Sequential = true
	opts.Duration = 100 * time.Millisecond
	c := newCounting(load.NewTarget(conn))
	rep, err := load.Compare(context.Background(), opts, []load.Target{c}, nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	n := int(rep.Load.AdmitCalls)
	if n == 0 || n != len(c.admits) || rep.Load.Tenants[0].Distinct != int64(n) {
		t.Fatalf("%d calls reached %d names (tool: %d); want each name once", n, len(c.admits), rep.Load.Tenants[0].Distinct)
	}
	for i := range n {
		if name := fmt.Sprintf(f.TenantFormat, i); c.admits[name] != 1 {
			t.Fatalf("%d calls in turn: %s called %d times, want once", n, name, c.admits[name])
		}
	}
}

// Each of Compare's rounds draws other tenants: with one seed for all, the
// second would repeat the first's draws, and a pool's tenants would be
// warm from it on. Of a million names (most of them unknown to the
// server, which refuses them at once) two rounds call nearly as many
// distinct ones as they make calls.
func TestRoundsDrawOtherTenants(t *testing.T) {
	_, conn := startServer(t)
	opts := poolOpts("nobody-%d:1000000:small")
	opts.Duration = 100 * time.Millisecond
	rep, err := load.Compare(context.Background(), opts, []load.Target{load.NewTarget(conn)}, nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	row := rep.Load.Tenants[0]
	if row.Refusals["UNKNOWN_TENANT"] != row.Requests || row.Requests < 20 {
		t.Fatalf("row %+v: want every call refused UNKNOWN_TENANT", row)
	}
	if row.Distinct < row.Requests*9/10 {
		t.Errorf("two rounds: %d calls reached %d distinct names of a million; want nearly one each", row.Requests, row.Distinct)
	}
}

func TestParseTenantPools(t *testing.T) {
	m, err := load.ParseTenantPools("fleet-%06d:1000000:small,vip-%d:10:large:3")
	if err != nil {
		t.Fatal(err)
	}
	want := []load.Mix{{Tenant: "fleet-%06d", Model: "small", Share: 0.25, Pool: 1000000}, {Tenant: "vip-%d", Model: "large", Share: 0.75, Pool: 10}}
	if fmt.Sprint(m) != fmt.Sprint(want) {
		t.Errorf("ParseTenantPools: %+v, want %+v", m, want)
	}
	for _, bad := range []string{"", "fleet-%d", "fleet-%d:10", "fleet:10:small", "fleet-%d-%d:10:small", "fleet-%x:10:small",
		"fleet-%5d:10:small", "fleet-%d:0:small", "fleet-%d:x:small", "fleet-%d:10000001:small", "fleet-%d:10:", "fleet-%d:10:small:0",
		"fleet-%d:10:small:x", "fleet-%d%:10:small", "fleet-%%d:10:small", "fleet-%021d:10:small"} {
		if _, err := load.ParseTenantPools(bad); err == nil || !strings.Contains(err.Error(), "--tenant-pool") {
			t.Errorf("ParseTenantPools(%q): %v, want an error naming --tenant-pool", bad, err)
		}
	}
	for _, tc := range []struct {
		pattern string
		i       int
		want    string
	}{
		{"fleet-%06d", 42, "fleet-000042"}, {"t%d", 1234567, "t1234567"}, {"a%%b-%03d-x", 7, "a%b-007-x"}, {"%02d", 123, "123"},
	} {
		if got, err := load.PoolName(tc.pattern, tc.i); err != nil || got != tc.want || got != fmt.Sprintf(tc.pattern, tc.i) {
			t.Errorf("%q with %d: %q, %v; want %q, as fmt writes it", tc.pattern, tc.i, got, err, tc.want)
		}
	}
	o := closedOpts()
	o.Tenants = []load.Mix{{Tenant: "no-verb", Model: "small", Share: 1, Pool: 5}}
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--tenant-pool") {
		t.Errorf("a pool without a verb: %v", err)
	}
}

// Two entries of one pattern share its row, the larger count its size,
// whichever is drawn first.
func TestOnePatternTwoPools(t *testing.T) {
	_, conn := startServer(t)
	opts := poolOpts("nobody-%d:3:small:100,nobody-%d:1000:medium:1")
	opts.Duration = 100 * time.Millisecond
	c := newCounting(load.NewTarget(conn))
	r, err := load.Run(context.Background(), opts, []load.Target{c})
	if err != nil {
		t.Fatal(err)
	}
	row := tenantResult(t, r, "nobody-%d")
	if len(r.Tenants) != 1 || row.Pool != 1000 || row.Distinct != int64(len(c.admits)) || row.Distinct < 4 {
		t.Errorf("row %+v, %d names counted: want one row of 1000 names, the distinct count the manual one", row, len(c.admits))
	}
}

func TestValidatePools(t *testing.T) {
	o := closedOpts()
	o.Tenants = []load.Mix{{Tenant: "no-verb", Model: "small", Share: 1, Pool: 5}}
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--tenant-pool") {
		t.Errorf("a pool without a verb: %v", err)
	}
}

// The churn drains, cuts health weights and undrains, in turn, through the
// public API while the load runs: the server's domains say so (a cut
// weight on as many domains as it cut, none left draining once the run
// has ended) and the load meets no error and no refusal.
func TestChurnChangesPlacementDuringTheRun(t *testing.T) {
	f, conn := startFleet(t, 8, 200)
	target := load.NewTarget(conn)
	if _, err := load.NewChurn(context.Background(), conn, target, 0, 1); err == nil || !strings.Contains(err.Error(), "--churn-rate 0") {
		t.Errorf("rate 0: %v", err)
	}
	if _, err := load.NewChurn(context.Background(), conn, target, load.MaxChurnRate+1, 1); err == nil || !strings.Contains(err.Error(), "--churn-rate") {
		t.Errorf("rate past the bound: %v", err)
	}
	ch, err := load.NewChurn(context.Background(), conn, target, 100, 1)
	if err != nil {
		t.Fatal(err)
	}
	opts := poolOpts(f.TenantPool)
	opts.Duration, opts.Churn = 300*time.Millisecond, ch
	r, err := load.Run(context.Background(), opts, []load.Target{target})
	if err != nil {
		t.Fatal(err)
	}
	res := r.Churn
	if res == nil {
		t.Fatal("no churn in the result")
	}
	if res.Drains < 2 || res.HealthCuts < 2 || res.Undrains != res.Drains || len(res.Errors) != 0 || res.Domains != 8 {
		t.Fatalf("churn %+v: want drains, health cuts, every drain undone, no error", res)
	}
	if res.HealthCuts+res.HealthMisses > res.Drains+1 || res.Drains > res.HealthCuts+res.HealthMisses+1 {
		t.Errorf("churn %+v: want drains and health changes in turn", res)
	}
	list, err := admissionv1.NewOperatorClient(conn).ListDomains(context.Background(), &admissionv1.ListDomainsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cut, draining := 0, 0
	for _, d := range list.GetDomains() {
		if d.GetHealthWeight() < 1 {
			cut++
		}
		if d.GetDraining() {
			draining++
		}
	}
	if int64(cut) != res.HealthCuts || res.WeightCut != cut || draining != 0 || res.Draining != 0 {
		t.Errorf("server: %d domains with a cut weight, %d draining; churn cut %d and says %d, %d", cut, draining, res.HealthCuts, res.WeightCut, res.Draining)
	}
	if len(r.Errors) != 0 || len(r.Refusals) != 0 || r.Admissions != r.AdmitCalls {
		t.Errorf("load under churn: errors %v, refusals %v, %d of %d admitted", r.Errors, r.Refusals, r.Admissions, r.AdmitCalls)
	}
	var table bytes.Buffer
	if err := (&load.Report{Mode: load.ModeClosed, Load: r}).WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d drains, %d undrains, %d health cuts", res.Drains, res.Undrains, res.HealthCuts); !strings.Contains(table.String(), want) {
		t.Errorf("the table lacks %q:\n%s", want, table.String())
	}
}
