package enginesim

import (
	"io"
	"log/slog"
	"math"
	"testing"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/replay"
	"github.com/sluice-sched/sluice/topology"
)

func setup(t *testing.T) (admission.Config, topology.Cluster) {
	t.Helper()
	cfg, cl, err := replay.Setup("", "simulated", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return cfg, cl
}

// planFor plans the simulated cluster's engines at capacity.
func planFor(t *testing.T, capacity float64, perDomain int) []EngineConfig {
	t.Helper()
	cfg, cl := setup(t)
	plan, err := Plan(cl, cfg.Models, cfg.Capacity, PlanOptions{Capacity: capacity, PerDomain: perDomain, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

// workOf is a request's work on engine ec, at its domain's pd cost.
func workOf(t *testing.T, ec EngineConfig, model string, prompt, output int64) Work {
	t.Helper()
	m := modelNamed(ec.cat, model)
	c, err := ec.cap.Cost(m, prompt, output)
	if err != nil {
		t.Fatal(err)
	}
	return Work{Prompt: prompt, Output: output, PrefillFLOP: float64(c.PrefillFLOP), DecodeBytes: float64(c.DecodeBytes), KVBytes: c.KVBytes}
}

// runAlone runs one request of w on an idle engine of spec and returns its
// first token's and its completion's times.
func runAlone(t *testing.T, spec Spec, w Work) (first, done int64) {
	t.Helper()
	e, err := NewEngine(spec)
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.Add(0, w)
	if err != nil {
		t.Fatal(err)
	}
	for n := e.Next(); n >= 0; n = e.Next() {
		e.Advance(n)
	}
	if !e.Finished(r) || r.FirstAt <= 0 || r.DoneAt <= r.FirstAt {
		t.Fatalf("request not run through: first %d, done %d", r.FirstAt, r.DoneAt)
	}
	return r.FirstAt, r.DoneAt
}

// A request alone takes the same prefill and decode time on a simulated
// engine as on the replay's engine of the same domain and capacity.
func TestAloneMatchesReplay(t *testing.T) {
	cfg, cl := setup(t)
	const capacity = 0.6
	rows := []replay.Row{{Tenant: "acme", Model: "large", Prompt: 2000, Output: 100, Line: 2}}
	rep, err := replay.Run(rows, replay.Options{Policy: replay.PolicyFIFO, Config: cfg, Cluster: cl, Engine: replay.EngineOptions{Capacity: capacity}})
	if err != nil {
		t.Fatal(err)
	}
	domain := ""
	for _, d := range rep.Engines.Domains {
		if d.Admitted == 1 {
			domain = d.ID
		}
	}
	var ec *EngineConfig
	plan := planFor(t, capacity, 1)
	for i := range plan {
		if plan[i].Domain == domain {
			ec = &plan[i]
		}
	}
	if ec == nil {
		t.Fatalf("the replay ran the request on %q, which the plan has no engine for", domain)
	}
	first, done := runAlone(t, ec.Spec, workOf(t, *ec, "large", 2000, 100))
	if got := int64(math.Round(rep.Seconds * 1e9)); got != done {
		t.Errorf("completion at %d ns, the replay's at %d ns", done, got)
	}
	if ttft := rep.Engines.TTFTP50 * 1e6; math.Abs(ttft-float64(first)) > 0.001*float64(first) {
		t.Errorf("first token at %d ns, the replay's TTFT %.0f ns", first, ttft)
	}
}

// An engine at capacity 0.5 takes twice as long as at 1.0, in prefill and
// in decode.
func TestHalfCapacityTakesTwiceAsLong(t *testing.T) {
	full, half := planFor(t, 1, 1)[0], planFor(t, 0.5, 1)[0]
	w := workOf(t, full, "medium", 3000, 200)
	f1, d1 := runAlone(t, full.Spec, w)
	f2, d2 := runAlone(t, half.Spec, w)
	for _, c := range []struct {
		what       string
		full, half int64
	}{{"prefill", f1, f2}, {"decode", d1 - f1, d2 - f2}} {
		// Each time is rounded up to the nanosecond: the ratio is 2 within
		// that rounding.
		if d := c.half - 2*c.full; d < -2 || d > 2 {
			t.Errorf("%s: %d ns at 0.5, %d ns at 1.0: ratio %.9f, want 2", c.what, c.half, c.full, float64(c.half)/float64(c.full))
		}
	}
}

// Engines of a domain split its rates and KV evenly.
func TestPerDomainSplitsTheDomain(t *testing.T) {
	one, two := planFor(t, 1, 1), planFor(t, 1, 2)
	if len(two) != 2*len(one) {
		t.Fatalf("%d engines at 2 per domain, %d at 1", len(two), len(one))
	}
	a, b := one[0].Spec, two[0].Spec
	if b.PrefillRate != a.PrefillRate/2 || b.DecodeRate != a.DecodeRate/2 || b.KVBytes != a.KVBytes/2 {
		t.Errorf("one of two engines: %+v; the domain's one: %+v", b, a)
	}
	if two[1].Domain != two[0].Domain || two[1].Index != 1 {
		t.Errorf("the second engine is %s/%d, want %s/1", two[1].Domain, two[1].Index, two[0].Domain)
	}
}

// unit is an engine of 1e9 FLOP/s and 1e9 B/s: work W takes W ns alone.
var unit = Spec{PrefillRate: 1e9, DecodeRate: 1e9, KVBytes: 100, MaxBatch: 2, PrefillTokens: 8192}

// The batch shares its rates; a request that does not fit the batch or
// the KV waits, first come first served, and a cancelled one frees its
// place.
func TestEngineSharesAndQueues(t *testing.T) {
	e, err := NewEngine(unit)
	if err != nil {
		t.Fatal(err)
	}
	w := Work{Prompt: 10, Output: 11, PrefillFLOP: 1000, DecodeBytes: 1000, KVBytes: 40}
	a, _ := e.Add(0, w)
	b, _ := e.Add(0, w)
	c, _ := e.Add(0, w)
	if s := e.Stats(); s.Running != 2 || s.Waiting != 1 || s.KVUsage != 0.8 {
		t.Fatalf("after three adds: %+v, want 2 running, 1 waiting, KV 0.8", s)
	}
	e.Advance(1999)
	if a.FirstAt != 0 || e.Tokens(a) != 0 {
		t.Fatalf("a's first token before 2000 ns, sharing prefill with b")
	}
	e.Advance(2000)
	if a.FirstAt != 2000 || b.FirstAt != 2000 || e.Tokens(a) != 1 {
		t.Fatalf("first tokens at %d and %d, want 2000 (each prefill at half rate)", a.FirstAt, b.FirstAt)
	}
	e.Advance(3000) // half of each decode: 1 + 10/2 tokens
	if got := e.Tokens(a); got != 6 {
		t.Errorf("tokens half-way through decode: %d, want 6", got)
	}
	if at := e.TokenAt(a, 7); at != 3200 {
		t.Errorf("token 7 due at %d ns, want 3200 (one tenth of 1000 B at half rate)", at)
	}
	e.Cancel(3000, b)
	if s := e.Stats(); s.Running != 2 || s.Waiting != 0 {
		t.Fatalf("after cancelling b: %+v, want c in the batch", s)
	}
	for n := e.Next(); n >= 0; n = e.Next() {
		e.Advance(n)
	}
	// From 3000, a decodes its last 500 B alone while c prefills alone:
	// both at the full rates.
	if a.DoneAt != 3500 || c.FirstAt != 4000 {
		t.Errorf("a done at %d, c's first token at %d; want 3500 and 4000", a.DoneAt, c.FirstAt)
	}
	if c.DoneAt != 5000 || e.Tokens(c) != 11 {
		t.Errorf("c done at %d with %d tokens, want 5000 and 11", c.DoneAt, e.Tokens(c))
	}
	if _, err := e.Add(5000, Work{Output: 1, KVBytes: 101}); err == nil {
		t.Error("a request of more KV than the engine holds was queued")
	}
}
