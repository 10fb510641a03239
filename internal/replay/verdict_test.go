package replay

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestVerdictOnCodeTraceBurst replays the code trace's burst (acme 15× for
// a minute) under every policy: sluice must be best on the refusals
// within share, the floors and the worst p99 wait of the tenants that do
// not burst, and best overall; Jain and W2 are shown but do not decide.
func TestVerdictOnCodeTraceBurst(t *testing.T) {
	cfg, cl := setup(t)
	b, err := ParseBurst(burstSpec)
	if err != nil {
		t.Fatal(err)
	}
	rows := codeRows(t, TraceOptions{Bursts: []Burst{b}})
	c, err := Compare("code", 1, rows, Options{Config: cfg, Cluster: cl, Deadline: 2 * time.Second}, Policies)
	if err != nil {
		t.Fatal(err)
	}
	c.Bursts = []Burst{b.InReplay(0, 1)}
	v := c.Verdict()
	var tb strings.Builder
	if err := c.WriteTable(&tb); err != nil {
		t.Fatal(err)
	}
	head, _, _ := strings.Cut(tb.String(), "\npolicy ")
	t.Log("\n" + head)
	if !slices.Equal(v.Bursting, []string{burster}) {
		t.Errorf("bursting = %v, want [%s]", v.Bursting, burster)
	}
	for _, name := range []string{"refusals within share", "floor violation seconds", "worst p99 wait"} {
		i := slices.IndexFunc(v.Measures, func(m Measure) bool { return m.Name == name })
		if i < 0 {
			t.Errorf("no measure %q", name)
			continue
		}
		if m := v.Measures[i]; !slices.Equal(m.Winners, []string{PolicySluice}) {
			t.Errorf("%s: best %v (%v), want sluice alone", name, m.Winners, m.Text)
		}
	}
	if !slices.Equal(v.Winners, []string{PolicySluice}) {
		t.Errorf("verdict: %s; want sluice", v.Summary)
	}
	if !strings.HasPrefix(tb.String(), "trace code:") || !strings.Contains(head, "verdict: sluice is best on") || !strings.Contains(head, "reward equal service") {
		t.Errorf("the table does not lead with the verdict and the note on Jain and W2:\n%s", head)
	}
	// The JSON leads with it too.
	var js bytes.Buffer
	if err := c.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Verdict Verdict `json:"verdict"`
	}
	if err := json.Unmarshal(js.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	// The HTML leads with the verdict's table, shades the burst and draws
	// the floors.
	var page strings.Builder
	if err := c.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	h := page.String()
	verdictAt, chartsAt := strings.Index(h, `<table class="verdict">`), strings.Index(h, "<svg")
	if verdictAt < 0 || chartsAt < verdictAt {
		t.Error("the HTML report does not lead with the verdict's table")
	}
	for _, want := range []string{"reward equal service", "<title>burst acme:15x:5m0s-6m0s</title>", ">floor 2000</text>", `<td class="best">0</td>`, "overflow-x:auto"} {
		if !strings.Contains(h, want) {
			t.Errorf("the HTML report lacks %q", want)
		}
	}
	if got.Verdict.Summary != v.Summary || !slices.Equal(got.Verdict.Bursting, v.Bursting) {
		t.Errorf("JSON verdict %q, bursting %v; want %q, %v", got.Verdict.Summary, got.Verdict.Bursting, v.Summary, v.Bursting)
	}
}

// TestVerdictTiesAndDirections checks the winners on hand-made reports:
// lower is better but for utilization, a tie names every policy tied, and
// a burster is left out of the per-tenant measures.
func TestVerdictTiesAndDirections(t *testing.T) {
	rep := func(policy string, p99 float64, floorViol, burstViol int, util float64) *Report {
		return &Report{Policy: policy, MaxServiceDiff: 1, VTCBound: 2,
			Domains: []DomainReport{{ID: "d", PrefillUtil: util}},
			Tenants: []TenantReport{
				{Name: "a", WaitP99: p99, FloorViolations: floorViol},
				{Name: "burster", WaitP99: 10 * p99, FloorViolations: burstViol, WithinShareRefused: burstViol},
			}}
	}
	c := &Comparison{Reports: []*Report{rep("x", 5, 0, 100, 0.2), rep("y", 9, 0, 0, 0.5)}}
	by := func(v *Verdict, name string) Measure {
		return v.Measures[slices.IndexFunc(v.Measures, func(m Measure) bool { return m.Name == name })]
	}
	v := c.Verdict()
	if w := by(v, "floor violation seconds").Winners; !slices.Equal(w, []string{"y"}) {
		t.Errorf("no burst named: floor winners %v, want [y] (the burster counts)", w)
	}
	// y wins, the service difference tied; x is named for what it wins
	// outright only.
	if !strings.HasPrefix(v.Summary, "y is best on 4 of 5 measures") || !strings.HasSuffix(v.Summary, "; x on worst p99 wait") {
		t.Errorf("no burst named: %q, want y best on 4 and x on its p99 alone", v.Summary)
	}
	c.Bursts = []Burst{{Tenant: "burster", Factor: 10, From: time.Second, To: 2 * time.Second}}
	v = c.Verdict()
	for name, want := range map[string][]string{
		"refusals within share":        {"x", "y"},
		"floor violation seconds":      {"x", "y"},
		"worst p99 wait":               {"x"},
		"utilization":                  {"y"},
		"max service diff / VTC bound": {"x", "y"},
	} {
		if got := by(v, name).Winners; !slices.Equal(got, want) {
			t.Errorf("%s: winners %v, want %v", name, got, want)
		}
	}
	if !slices.Equal(v.Winners, []string{"x", "y"}) || v.Wins != 4 || !strings.Contains(v.Summary, "x and y tie") {
		t.Errorf("verdict %v with %d wins (%s), want x and y tied with 4", v.Winners, v.Wins, v.Summary)
	}
	if one := (&Comparison{Reports: c.Reports[:1]}); one.Verdict() != nil {
		t.Error("a verdict of one policy")
	}
}

func TestBurstInReplay(t *testing.T) {
	b := Burst{Tenant: "a", Factor: 2, From: 300 * time.Second, To: 360 * time.Second}
	if got := b.InReplay(240*time.Second, 2); got.From != 30*time.Second || got.To != 60*time.Second {
		t.Errorf("InReplay(4m, 2) = %v-%v, want 30s-1m0s", got.From, got.To)
	}
}
