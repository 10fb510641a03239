package replay

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestFeedbackTable builds the capacity loop's target table on a quarter
// of the code trace: every target has its figures and a verdict, the
// replays are the ones it names, and the same input prints the same table.
// (The halving defaults to the first domain halfway through: 44 s of the
// 89 s the window takes at 10×.)
func TestFeedbackTable(t *testing.T) {
	cfg, cl := setup(t)
	opts := func() FeedbackOptions {
		return FeedbackOptions{Trace: "code", Seed: 1, Speed: 10, Rows: codeRows(t, TraceOptions{Speed: 10, To: 15 * time.Minute}),
			SpreadTrace: "code", SpreadSpeed: 1, SpreadRows: codeRows(t, TraceOptions{To: 15 * time.Minute}),
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
		if r.Met != "met" && r.Met != "NOT MET" && r.Met != "-" || r.Measured == "" || r.Closed == "" {
			t.Errorf("row %+v", r)
		}
		if r.Met != "-" {
			targets[r.Row+": "+r.Target] = true
		}
	}
	for _, want := range []string{"engine 1.5×: ≥ 1.3", "engine 0.6×: closed ≤ 5 and < open", "engine 0.6×: closed 0", "engine 0.6×: closed ≤ threshold",
		"engine 1× → hgx-1 0.5× at 44s: closed ≤ 5 s", "spread ×1, engine 1×: ≤ 1.5", "spread ×1, engine 1×: ≥ 50%"} {
		if !targets[want] {
			t.Errorf("no target %q among %v", want, targets)
		}
	}
	names := map[string]string{}
	for _, r := range tab.Runs {
		names[r.Name] = r.Engines.Loop
		if r.Engines == nil || r.Engines.Capacity <= 0 {
			t.Errorf("run %s without its engines", r.Name)
		}
	}
	for name, loop := range map[string]string{"engine 0.6× closed": "closed", "engine 0.6× open": "open", "engine 1.5× threshold": "", "halving open": "open", "spread closed": "closed"} {
		if got, ok := names[name]; !ok || got != loop {
			t.Errorf("run %q: loop %q (present %v), want %q", name, got, ok, loop)
		}
	}
	var b bytes.Buffer
	if err := tab.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back FeedbackTable
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || len(back.Targets) != len(tab.Targets) {
		t.Errorf("JSON: %v, %d targets", err, len(back.Targets))
	}
	for _, want := range []string{"capacity loop targets: code ×10", "sluice closed", "NOT MET", "factors at the end"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("the table lacks %q", want)
		}
	}
}
