package replay

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/topology"
)

// TestFeedbackTable builds the capacity loop's target table on a quarter
// of the code trace: every target has its figures and a verdict, the
// replays are the ones it names, and the same input prints the same table.
// (The halving defaults to the first domain halfway through: 44 s of the
// 89 s the window takes at 10×.)
func TestFeedbackTable(t *testing.T) {
	cfg, cl := setup(t)
	spreadCfg, _, err := Setup(spreadConfig, testCluster, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts := func() FeedbackOptions {
		return FeedbackOptions{Trace: "code", Seed: 1, Speed: 10, Rows: codeRows(t, TraceOptions{Speed: 10, To: 15 * time.Minute}),
			SpreadTrace: "code", SpreadSpeed: 1, SpreadRows: codeRows(t, TraceOptions{To: 15 * time.Minute}),
			Many:   &SpreadMix{Name: "16 tenants", Rows: manyRows(t, codeTrace, 15*time.Minute), Config: spreadCfg},
			Config: cfg, Cluster: cl, Deadline: 2 * time.Second}
	}
	print := func() (*FeedbackTable, []byte) {
		tab, err := RunFeedbackTable(opts())
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := tab.WriteTable(&b); err != nil {
			t.Fatal(err)
		}
		return tab, b.Bytes()
	}
	tab, text := print()
	if _, again := print(); !bytes.Equal(text, again) {
		t.Fatal("two tables of the same input differ")
	}
	t.Log("\n" + string(text))
	targets := map[string]bool{}
	for _, r := range tab.Targets {
		bound := r.Met == "within reach" || r.Met == "out of reach"
		if r.Met != "met" && r.Met != "NOT MET" && r.Met != "-" && !bound || r.Measured == "" || r.Closed == "" && !bound {
			t.Errorf("row %+v", r)
		}
		if r.Met != "-" {
			targets[r.Row+": "+r.Target] = true
		}
	}
	for _, want := range []string{"engine 1.5×: ≥ 1.3", "engine 1.5×: ≥ 1.3 for both targets", "engine 0.6×: ≥ 0.85", "engine 0.6×: closed ≤ 5 and < open", "engine 0.6×: closed 0", "engine 0.6×: closed ≤ threshold", "engine 0.6×: ≥ 0.85 for both targets",
		"engine 1× → hgx-1 0.5× at 44s: closed ≤ 5 s", "spread ×1, engine 1×: ≤ 1.5",
		"spread ×1, engine 1×, 16 tenants: ≤ 1.5", "spread ×1, engine 1×, 16 tenants: ≥ 50%",
		"downgrade vs not, deadline 2s: ≥ 1", "downgrade vs not, deadline 30s: ≥ 1"} {
		if !targets[want] {
			t.Errorf("no target %q among %v", want, targets)
		}
	}
	names := map[string]string{}
	clairvoyant := map[string]int{}
	for _, r := range tab.Runs {
		names[r.Name] = r.Engines.Loop
		if name, _, ok := strings.Cut(r.Name, " clairvoyant within the SLO, budget "); ok && r.Policy == PolicyClairvoyant {
			clairvoyant[name]++
		}
		if r.Engines == nil || r.Engines.Capacity <= 0 {
			t.Errorf("run %s without its engines", r.Name)
		}
	}
	for name, loop := range map[string]string{"engine 0.6× closed": "closed", "engine 0.6× open": "open", "engine 1.5× threshold": "", "halving open": "open",
		"spread closed": "closed", "spread closed, 16 tenants": "closed", "downgrade allowed, deadline 2s": "closed",
		"downgrade not allowed, deadline 30s": "closed"} {
		if got, ok := names[name]; !ok || got != loop {
			t.Errorf("run %q: loop %q (present %v), want %q", name, got, ok, loop)
		}
	}
	if clairvoyant["engine 0.6×"] != 1 || clairvoyant["engine 1.5×"] != 1 || len(clairvoyant) != 2 {
		t.Errorf("clairvoyant replays within the SLO %v, want one on each engines' capacity", clairvoyant)
	}
	var b bytes.Buffer
	if err := tab.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back FeedbackTable
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || len(back.Targets) != len(tab.Targets) {
		t.Errorf("JSON: %v, %d targets", err, len(back.Targets))
	}
	for _, want := range []string{"capacity loop targets: code ×10", "also with 16 tenants", "sluice closed", "NOT MET", "factors at the end"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("the table lacks %q", want)
		}
	}
}

// spreadConfig is the spread rows' config: manyMix's tenants, placement
// over four choices on a smoother load.
const (
	spreadConfig = "../../testdata/replay/spread-config.yaml"
	convTrace    = "../../testdata/traces/AzureLLMInferenceTrace_conv.csv"
)

// manyMix is testMix with each tenant split into four of a quarter its share.
func manyMix(t testing.TB) []MixEntry {
	t.Helper()
	base, err := ParseMix(testMix)
	if err != nil {
		t.Fatal(err)
	}
	var mix []MixEntry
	for _, e := range base {
		for i := 1; i <= 4; i++ {
			mix = append(mix, MixEntry{Tenant: fmt.Sprintf("%s-%d", e.Tenant, i), Model: e.Model, Share: e.Share / 4})
		}
	}
	return mix
}

func manyRows(t testing.TB, trace string, to time.Duration) []Row {
	t.Helper()
	rows, err := LoadTrace(trace, TraceOptions{Mix: manyMix(t), Seed: 1, To: to})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// The conversation trace at 1× on equal domains, with sixteen tenants
// under the spread config: the busiest domain is at most 1.5× the least
// busy, and every tenant keeps at least half its admissions on its first
// choice (the spread targets of docs/capacity-feedback.md).
func TestManyTenantsSpreadAndKeepTheirFirstDomain(t *testing.T) {
	cfg, cl, err := Setup(spreadConfig, testCluster, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := spreadWithin(t, manyRows(t, convTrace, 0), cfg, cl)
	if e.FirstShareMin < 0.5 {
		t.Errorf("a tenant has %.1f%% of its admissions on its first choice, want ≥ 50%%", 100*e.FirstShareMin)
	}
}

// The conversation trace at 1× on equal domains, with the four tenants
// and the config of the table: acme alone is 87% of the prefill work,
// and placement still spreads it so that the busiest domain is at most
// 1.5× the least busy (the spread target of docs/capacity-feedback.md;
// half of acme's admissions on its first choice could not be, with it).
func TestATenantThatIsMostOfTheLoadSpreadsOverEqualDomains(t *testing.T) {
	cfg, cl := setup(t)
	mix, err := ParseMix(testMix)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := LoadTrace(convTrace, TraceOptions{Mix: mix, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	spreadWithin(t, rows, cfg, cl)
}

// spreadWithin replays rows at 1× on engines under sluice with a 2 s
// deadline, checks that the busiest domain is at most 1.5× the least
// busy, and returns the engines' report.
func spreadWithin(t *testing.T, rows []Row, cfg admission.Config, cl topology.Cluster) *EngineReport {
	t.Helper()
	r, err := Run(rows, Options{Policy: PolicySluice, Config: cfg, Cluster: cl, Deadline: 2 * time.Second, Engine: EngineOptions{Capacity: 1}})
	if err != nil {
		t.Fatal(err)
	}
	e := r.Engines
	t.Logf("spread %.2f, least share on the first choice %.1f%%", e.Spread, 100*e.FirstShareMin)
	if e.Spread <= 0 || e.Spread > 1.5 {
		t.Errorf("busiest ÷ least busy domain %.2f, want ≤ 1.5", e.Spread)
	}
	return e
}
