package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/internal/drill"
	"github.com/sluice-sched/sluice/internal/testdep"
)

// drillBinaries builds sluiced and sluice-agent for the self-contained
// fleet (without -race: they are the fleet, not the code under test here)
// and returns the flags that name them. Without redis-server the test is
// skipped, except under CI=true, where it fails.
func drillBinaries(t *testing.T) []string {
	t.Helper()
	testdep.Binary(t, "apt-get install -y redis-server", "redis-server")
	dir := t.TempDir()
	var flags []string
	for _, b := range []struct{ flag, pkg string }{
		{"--sluiced", "github.com/sluice-sched/sluice/cmd/sluiced"},
		{"--agent", "github.com/sluice-sched/sluice/cmd/sluice-agent"},
	} {
		out := filepath.Join(dir, filepath.Base(b.pkg))
		if msg, err := exec.Command("go", "build", "-o", out, b.pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, msg)
		}
		flags = append(flags, b.flag, out)
	}
	return flags
}

// shortPhases keep a drill to a few seconds a phase. The grace for a drain
// to reach every replica is a second, not the default half: the promise is
// about where placements go, and a slow CI machine should not fail it on
// speed alone.
var shortPhases = []string{"--before", "2s", "--during", "3s", "--after", "2s", "--grace", "1s"}

// drillJSON runs a drill with -o json and decodes its summary.
func drillJSON(t *testing.T, args ...string) (int, drill.Summary, string) {
	t.Helper()
	code, out, errs := sluicectl(append([]string{"drill", "-o", "json"}, args...)...)
	var sum drill.Summary
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatalf("drill %v: exit %d, output is not JSON: %v\n%s\n%s", args, code, err, out, errs)
	}
	// The keys are every command's: lowerCamelCase.
	var doc any
	_ = json.Unmarshal([]byte(out), &doc)
	if bad := badKeys(doc, ""); len(bad) > 0 {
		slices.Sort(bad)
		t.Errorf("drill %v -o json: keys not lowerCamelCase: %s", args, strings.Join(slices.Compact(bad), ", "))
	}
	return code, sum, errs
}

// filledDrillSummary is a drill summary with every field set (a pointer
// to a value, a slice and a map of one element each, down to the
// leaves): its JSON shows every key a report can have, omitempty or not.
func filledDrillSummary() *drill.Summary {
	var fill func(v reflect.Value)
	fill = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Pointer:
			v.Set(reflect.New(v.Type().Elem()))
			fill(v.Elem())
		case reflect.Struct:
			for i := range v.NumField() {
				if v.Type().Field(i).IsExported() {
					fill(v.Field(i))
				}
			}
		case reflect.Slice:
			v.Set(reflect.MakeSlice(v.Type(), 1, 1))
			fill(v.Index(0))
		case reflect.Map:
			e := reflect.New(v.Type().Elem()).Elem()
			fill(e)
			v.Set(reflect.MakeMap(v.Type()))
			v.SetMapIndex(reflect.ValueOf("k").Convert(v.Type().Key()), e)
		case reflect.String:
			v.SetString("x")
		case reflect.Bool:
			v.SetBool(true)
		case reflect.Int, reflect.Int64:
			v.SetInt(1)
		case reflect.Float64:
			v.SetFloat(1)
		}
	}
	var sum drill.Summary
	fill(reflect.ValueOf(&sum).Elem())
	return &sum
}

// promise finds a promise of a report by name.
func promise(t *testing.T, r *drill.Report, name string) drill.Promise {
	t.Helper()
	for _, p := range r.Promises {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("drill %s: no promise %q in %+v", r.Drill, name, r.Promises)
	return drill.Promise{}
}

// strayChildren lists the redis-server, sluiced and sluice-agent processes
// whose parent is this test process: a drill must stop every child it
// started before it returns.
func strayChildren(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil // no procfs: nothing to look at
	}
	me := strconv.Itoa(os.Getpid())
	var out []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		comm := s[strings.IndexByte(s, '(')+1 : i]
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == me && (comm == "sluiced" || comm == "sluice-agent" || strings.HasPrefix(comm, "redis-server")) {
			out = append(out, e.Name()+" "+comm)
		}
	}
	return out
}

// `drill all --self-contained` starts its own fleet (redis-server, an
// embedded etcd, four agents, two sluiced), runs every drill under load,
// and every promise holds; nothing it started outlives it.
func TestDrillAllSelfContained(t *testing.T) {
	bins := drillBinaries(t)
	// The fleet's logs go to errs, printed if a promise breaks.
	code, sum, errs := drillJSON(t, append(append([]string{"all", "--self-contained", "--fleet-log"}, bins...), shortPhases...)...)
	if left := strayChildren(t); len(left) > 0 {
		t.Errorf("children left running after the drill: %v", left)
	}
	if code != 0 || !sum.Held || len(sum.Errors) > 0 {
		for _, r := range sum.Reports {
			for _, p := range r.Promises {
				if !p.Held {
					t.Errorf("drill %s: %s broke: %s", r.Drill, p.Name, p.Detail)
				}
			}
			for _, p := range r.Phases {
				t.Logf("drill %s, %s: %d sent, %d admitted, refused %v, lost %d, errors %v", r.Drill, p.Name, p.Sent, p.Admitted, p.Refusals, p.Lost, p.Errors)
			}
		}
		t.Fatalf("drill all: exit %d, held %v, errors %v\n%s", code, sum.Held, sum.Errors, errs)
	}
	if len(sum.Reports) != len(drill.Names) {
		t.Fatalf("drill all ran %d drills, want %d (%v)", len(sum.Reports), len(drill.Names), drill.Names)
	}
	for i, r := range sum.Reports {
		if r.Drill != drill.Names[i] {
			t.Errorf("drill %d is %s, want %s", i, r.Drill, drill.Names[i])
		}
		if len(r.Phases) != 3 {
			t.Fatalf("drill %s: %d phases, want before, during, after", r.Drill, len(r.Phases))
		}
		for _, p := range r.Phases {
			if p.Sent == 0 || p.Admitted == 0 {
				t.Errorf("drill %s, %s: sent %d, admitted %d: the drill ran without load", r.Drill, p.Name, p.Sent, p.Admitted)
			}
			if len(p.Floors) != 2 || p.Quota == nil {
				t.Errorf("drill %s, %s: floors %+v, quota %+v: want gold's and silver's floors and bronze's quota measured", r.Drill, p.Name, p.Floors, p.Quota)
			}
		}
		for _, name := range []string{"no answer lost", "floors held every second", "quota kept", "recovered"} {
			promise(t, r, name)
		}
	}
	// The drain moved placements off the domain and back.
	dr := sum.Reports[0]
	promise(t, dr, "no placement after the mark")
	promise(t, dr, "returning domain warms up")
	if b, a := *dr.Phases[0].OnTarget, *dr.Phases[2].OnTarget; b == 0 || a == 0 {
		t.Errorf("drain-domain %s: %d placements before, %d after: the drained domain carried no load", dr.Target, b, a)
	}
	// The killed replica's share of the domains' KV came back to the
	// survivor within its promise (the member TTL and ten intervals).
	kr := sum.Reports[slices.Index(drill.Names, drill.KillReplica)]
	if p := promise(t, kr, "dead replica's capacity back"); !p.Held || kr.CapacityBackSeconds == nil {
		t.Errorf("kill-replica: %+v, back after %v s", p, kr.CapacityBackSeconds)
	}
	// The breaker opened and its refusals were seen.
	ce := sum.Reports[slices.Index(drill.Names, drill.CreditExhaustion)]
	if n := ce.Phases[1].Refusals["BURST_CREDIT_EXHAUSTED"]; n == 0 {
		t.Errorf("credit-exhaustion: no BURST_CREDIT_EXHAUSTED during the overload: %+v", ce.Phases[1].Refusals)
	}
	promise(t, ce, "Retry-After is the breaker's")
}

// A replica that ignores drains (started on a control-plane prefix of its
// own, so that no drain mark reaches it, yet a member of the fleet) keeps
// placing on the drained domain: the drain drill says so and exits
// non-zero.
func TestDrillCatchesAReplicaThatIgnoresDrains(t *testing.T) {
	bins := drillBinaries(t)
	args := append(append([]string{"drain-domain", "--self-contained", "--replicas", "1", "--fault", "ignore-drains"}, bins...), shortPhases...)
	code, sum, errs := drillJSON(t, args...)
	if left := strayChildren(t); len(left) > 0 {
		t.Errorf("children left running after the drill: %v", left)
	}
	if code != 1 || sum.Held || len(sum.Reports) != 1 {
		t.Fatalf("drain-domain with a replica ignoring drains: exit %d, held %v, %d reports; want exit 1, a broken promise\n%s", code, sum.Held, len(sum.Reports), errs)
	}
	r := sum.Reports[0]
	p := promise(t, r, "no placement after the mark")
	if p.Held || r.Phases[1].Forbidden == nil || *r.Phases[1].Forbidden == 0 {
		t.Errorf("no placement after the mark: %+v, %v placements after the mark; want it broken", p, r.Phases[1].Forbidden)
	}
	if p := promise(t, r, "drain applied within the grace"); p.Held {
		t.Errorf("drain applied within the grace held: %+v", p)
	}
	if !strings.Contains(errs, "a promise broke") {
		t.Errorf("stderr does not say a promise broke:\n%s", errs)
	}
	// Nothing else was broken: the drill pins the fault on the drain (a
	// replica that never drained the domain has no return to ramp either).
	for _, p := range r.Promises {
		if !p.Held && p.Name != "no placement after the mark" && p.Name != "drain applied within the grace" && p.Name != "returning domain warms up" {
			t.Errorf("%s broke as well: %s", p.Name, p.Detail)
		}
	}
}

// A short soak runs at least one drill (the seed picks which, its target
// and its phases) on a self-contained fleet, holds, and adds up its reports.
func TestDrillSoakSelfContained(t *testing.T) {
	bins := drillBinaries(t)
	args := append(append([]string{"soak", "--duration", "1s", "--self-contained", "--seed", "3"}, bins...), shortPhases...)
	code, sum, errs := drillJSON(t, args...)
	if left := strayChildren(t); len(left) > 0 {
		t.Errorf("children left running after the soak: %v", left)
	}
	if code != 0 || !sum.Held || len(sum.Reports) == 0 || sum.Totals == nil {
		t.Fatalf("soak: exit %d, held %v, %d reports, totals %+v\n%s", code, sum.Held, len(sum.Reports), sum.Totals, errs)
	}
	var sent int64
	drills := 0
	for _, r := range sum.Reports {
		for _, p := range r.Phases {
			sent += p.Sent
		}
	}
	for _, n := range sum.Totals.Drills {
		drills += n
	}
	if drills != len(sum.Reports) || sum.Totals.Sent != sent || sent == 0 || sum.Totals.Lost != 0 {
		t.Errorf("totals %+v: want %d drills and %d Admits sent, none lost", *sum.Totals, len(sum.Reports), sent)
	}
}

// Bad invocations are refused before any fleet is started or dialled.
func TestDrillFlagErrors(t *testing.T) {
	t.Setenv("SLUICE_ETCD", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"explode"}, `drill "explode"`},
		{[]string{"all", "hgx-1"}, "no TARGET"},
		{[]string{"soak", "hgx-1"}, "no TARGET"},
		{[]string{"kill-redis", "--duration", "1m"}, "--duration is the soak's"},
		{[]string{"soak", "--duration", "0s", "--self-contained"}, "--duration 0s"},
		{[]string{"drain-domain"}, "which fleet?"},
		{[]string{"drain-domain", "--self-contained", "--etcd", "http://127.0.0.1:1"}, "--etcd names a fleet"},
		{[]string{"drain-domain", "--sluiced", "x", "--server", "127.0.0.1:1"}, "--sluiced is for --self-contained"},
		{[]string{"drain-domain", "--self-contained", "--fault", "slow"}, `--fault "slow"`},
		{[]string{"drain-domain", "--server", "127.0.0.1:1", "--redis-mode", "eventual"}, `--redis-mode "eventual"`},
		{[]string{"drain-domain", "--self-contained", "--redis-mode", "strict"}, "--redis-mode names a fleet"},
		{[]string{"credit-exhaustion", "--server", "127.0.0.1:1"}, "--credit-tenant"},
		{[]string{"kill-redis", "--self-contained", "--rate", "0"}, "--rate"},
		{[]string{"deferred-burst", "--server", "127.0.0.1:1"}, "--burst-tenants"},
		{[]string{"deferred-burst", "--self-contained", "--burst-factor", "0.5"}, "--burst-factor"},
		{[]string{"deferred-burst", "--self-contained", "--burst-tenants", "corpus:large"}, "--burst-tenants"},
		{[]string{"drain-domain", "--server", "127.0.0.1:1", "-o", "xml"}, `-o "xml"`},
		{[]string{"drain-domain", "--self-contained", "--trace", "/nonexistent/trace.csv"}, "/nonexistent/trace.csv"},
	} {
		code, _, errs := sluicectl(append([]string{"drill"}, tc.args...)...)
		if code != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("drill %v: exit %d, %q; want an error containing %q", tc.args, code, errs, tc.want)
		}
	}
	// A missing NAME is the command line's error: exit 2.
	if code, _, errs := sluicectl("drill"); code != 2 || !strings.Contains(errs, "want a drill NAME") {
		t.Errorf("drill: exit %d, %q; want 2 and an error asking for a NAME", code, errs)
	}
}
