package replay

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-sched/sluice/admission"
)

// engineInvariants checks the engines of s at one instant: KV within
// capacity and equal to what the batch's requests hold, the batch within
// its bounds, no count negative.
func engineInvariants(s *sim) error {
	for _, d := range s.domains {
		e := d.eng
		var kv, tokens int64
		for _, r := range d.prefill.reqs {
			kv += r.cost.KVBytes
			tokens += r.row.Prompt
		}
		for _, r := range d.decode.reqs {
			kv += r.cost.KVBytes
		}
		switch {
		case e.kvHeld < 0 || e.kvHeld > e.kvCap:
			return fmt.Errorf("%s at %d: KV held %d of %d", d.id, s.now, e.kvHeld, e.kvCap)
		case kv != e.kvHeld:
			return fmt.Errorf("%s at %d: the batch holds %d B of KV, the engine counts %d", d.id, s.now, kv, e.kvHeld)
		case e.running < 0 || e.running > e.maxBatch:
			return fmt.Errorf("%s at %d: %d running, batch %d", d.id, s.now, e.running, e.maxBatch)
		case len(d.prefill.reqs)+len(d.decode.reqs) != e.running:
			return fmt.Errorf("%s at %d: %d in prefill and %d in decode, %d running", d.id, s.now, len(d.prefill.reqs), len(d.decode.reqs), e.running)
		case e.queued() < 0 || e.inPrefill != tokens:
			return fmt.Errorf("%s at %d: queue %d, %d tokens in prefill counted, %d there", d.id, s.now, e.queued(), e.inPrefill, tokens)
		}
	}
	return nil
}

// TestEngineConservation replays small random traces on small random
// engines under each policy: at every instant the engines' KV stays
// within capacity and their counts are consistent; at the end every
// admitted request has completed and been released exactly once, its
// time to first token within its duration, every refused one never, and
// every engine is empty.
func TestEngineConservation(t *testing.T) {
	cfg, cl := setup(t)
	tenants := []string{"acme", "globex", "initech", "hooli"}
	models := []string{"large", "medium", "small"}
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 40).Draw(t, "requests")
		rows := make([]Row, n)
		at := time.Duration(0)
		for i := range rows {
			at += time.Duration(rapid.IntRange(0, 500).Draw(t, "gap ms")) * time.Millisecond
			rows[i] = Row{At: at, Tenant: rapid.SampledFrom(tenants).Draw(t, "tenant"), Model: rapid.SampledFrom(models).Draw(t, "model"),
				Prompt: int64(rapid.IntRange(1, 9000).Draw(t, "prompt")), Output: int64(rapid.IntRange(1, 600).Draw(t, "output")), Line: i + 2}
		}
		eng := EngineOptions{
			Capacity:      rapid.SampledFrom([]float64{0.05, 0.3, 0.6, 1, 1.5, 3}).Draw(t, "capacity"),
			MaxBatch:      rapid.IntRange(1, 8).Draw(t, "batch"),
			PrefillTokens: int64(rapid.IntRange(1, 10000).Draw(t, "prefill tokens")),
			Report:        time.Duration(rapid.IntRange(10, 200).Draw(t, "report ms")) * time.Millisecond,
			OpenLoop:      rapid.Bool().Draw(t, "open loop"),
		}
		if rapid.Bool().Draw(t, "change") {
			eng.Changes = []EngineChange{{Domain: cl.Domains[rapid.IntRange(0, len(cl.Domains)-1).Draw(t, "domain")].ID,
				At: time.Duration(rapid.IntRange(0, 10000).Draw(t, "change ms")) * time.Millisecond, Capacity: rapid.SampledFrom([]float64{0.1, 0.5, 2}).Draw(t, "to")}}
		}
		policy := rapid.SampledFrom([]string{PolicySluice, PolicyFIFO, PolicyTenantBuckets, PolicyThreshold}).Draw(t, "policy")
		deadline := time.Duration(rapid.IntRange(0, 3000).Draw(t, "deadline ms")) * time.Millisecond
		s, err := newSim(rows, Options{Policy: policy, Config: cfg, Cluster: cl, Deadline: deadline, Downgrade: rapid.Bool().Draw(t, "downgrade"), Engine: eng})
		if err != nil {
			t.Fatal(err)
		}
		defer s.pol.close()
		s.onEvent = func() error { return engineInvariants(s) }
		if err := s.run(rows); err != nil {
			t.Fatal(err)
		}
		for i := range s.reqs {
			r := &s.reqs[i]
			switch {
			case !r.answered:
				t.Fatalf("line %d: never answered", r.row.Line)
			case r.outcome == admission.Rejected && r.releases != 0:
				t.Fatalf("line %d: refused, released %d times", r.row.Line, r.releases)
			case r.outcome == admission.Rejected:
			case r.releases != 1:
				t.Fatalf("line %d: admitted, released %d times", r.row.Line, r.releases)
			case r.doneAt == 0 || r.firstAt < r.startAt || r.startAt < r.admitAt || r.firstAt > r.doneAt:
				t.Fatalf("line %d: admitted %d, started %d, first token %d, done %d", r.row.Line, r.admitAt, r.startAt, r.firstAt, r.doneAt)
			}
		}
		for _, d := range s.domains {
			if d.eng.busy() || d.eng.kvHeld != 0 || d.eng.inPrefill != 0 {
				t.Fatalf("%s holds requests at the end: %d running, %d waiting, %d B of KV", d.id, d.eng.running, d.eng.queued(), d.eng.kvHeld)
			}
		}
		rep := s.rec.report(s)
		if rep.Spanning != 0 || rep.Engines.ExpiredLeases != 0 {
			t.Fatalf("spanning %d, expired leases %d", rep.Spanning, rep.Engines.ExpiredLeases)
		}
	})
}

// The code trace at 10×, on engines that sustain 0.6 of what the model
// says, under sluice with its capacity loop open and closed.
var (
	slowOnce           sync.Once
	slowOpen, slowLoop *Report
	slowErr            error
)

func slowEngines(t *testing.T) (open, closed *Report) {
	t.Helper()
	slowOnce.Do(func() {
		cfg, cl := setup(t)
		rows := codeRows(t, TraceOptions{Speed: 10})
		run := func(open bool) *Report {
			r, err := Run(rows, Options{Policy: PolicySluice, Config: cfg, Cluster: cl, Deadline: 2 * time.Second, Engine: EngineOptions{Capacity: 0.6, OpenLoop: open}})
			if err != nil && slowErr == nil {
				slowErr = err
			}
			return r
		}
		slowOpen, slowLoop = run(true), run(false)
	})
	if slowErr != nil {
		t.Fatal(slowErr)
	}
	return slowOpen, slowLoop
}

// TestClosedLoopShortensEngineQueues: engines slower than the model
// queue what the model admits when the loop is open; with the loop
// closed, every domain's engine queue p99 is shorter, and the factors
// the loop ends at are below the model's.
func TestClosedLoopShortensEngineQueues(t *testing.T) {
	open, closed := slowEngines(t)
	if open.Engines.Loop != "open" || closed.Engines.Loop != "closed" {
		t.Fatalf("loops %q and %q", open.Engines.Loop, closed.Engines.Loop)
	}
	for i, o := range open.Engines.Domains {
		c := closed.Engines.Domains[i]
		t.Logf("%s: engine queue p99 open %.0f, closed %.0f (factor %.2f)", o.ID, o.QueueP99, c.QueueP99, c.Factor)
		if c.QueueP99 >= o.QueueP99 {
			t.Errorf("%s: engine queue p99 closed %.0f, open %.0f: want closed < open", o.ID, c.QueueP99, o.QueueP99)
		}
		if o.Factor != 1 {
			t.Errorf("%s: the open loop moved the factor to %v", o.ID, o.Factor)
		}
	}
	if closed.Engines.QueueP99 >= open.Engines.QueueP99 {
		t.Errorf("worst engine queue p99 closed %.0f, open %.0f", closed.Engines.QueueP99, open.Engines.QueueP99)
	}
}

// TestThresholdNeverPicksASaturatedDomain replays the code trace at 10× on
// slow engines under the threshold rule: no request goes to a domain whose
// last report was past a threshold while another's was not, some wait
// because every domain is, and the engine queues stay near the threshold.
func TestThresholdNeverPicksASaturatedDomain(t *testing.T) {
	cfg, cl := setup(t)
	rows := codeRows(t, TraceOptions{Speed: 10, To: 20 * time.Minute})
	s, err := newSim(rows, Options{Policy: PolicyThreshold, Config: cfg, Cluster: cl, Deadline: 2 * time.Second, Engine: EngineOptions{Capacity: 0.6}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.pol.close()
	th := s.pol.(*threshold)
	qT, kvT := cfg.Feedback.QueueThreshold, cfg.Feedback.KVThreshold
	sat := func(g admission.EngineSignal) bool { return g.Queue > qT || g.KVUsage > kvT }
	dispatched, waited := 0, 0
	th.onDispatch = func(r *simReq, domain int, _ []admission.EngineSignal) {
		dispatched++
		if !sat(s.signals[domain]) {
			return
		}
		for i, g := range s.signals {
			if i != domain && !sat(g) {
				t.Errorf("line %d at %d ns: sent to %s (%+v) while %s was under the thresholds (%+v)", r.row.Line, s.now, s.domains[domain].id, s.signals[domain], s.domains[i].id, g)
			}
		}
	}
	s.onEvent = func() error {
		if th.queued() > 0 && !slices.ContainsFunc(s.signals, func(g admission.EngineSignal) bool { return !sat(g) }) {
			waited++
		}
		return nil
	}
	if err := s.run(rows); err != nil {
		t.Fatal(err)
	}
	rep := s.rec.report(s)
	if dispatched == 0 || waited == 0 {
		t.Errorf("%d dispatched, %d instants waiting on saturated domains: the replay does not saturate", dispatched, waited)
	}
	if q := rep.Engines.QueueP99; q > 2*qT {
		t.Errorf("engine queue p99 %.0f under the threshold rule, threshold %g", q, qT)
	}
}

func TestEngineReplayIsDeterministic(t *testing.T) {
	cfg, cl := setup(t)
	rows := codeRows(t, TraceOptions{Speed: 10, To: 10 * time.Minute})
	opts := Options{Config: cfg, Cluster: cl, Deadline: 2 * time.Second,
		Engine: EngineOptions{Capacity: 0.8, Changes: []EngineChange{{Domain: "hgx-2", At: 20 * time.Second, Capacity: 0.4}}}}
	table := func() []byte {
		return compareReports(t, rows, opts, EnginePolicies, (*Comparison).WriteJSON, (*Comparison).WriteTable)
	}
	a := table()
	if !bytes.Equal(a, table()) {
		t.Fatal("two replays with engines of the same input differ")
	}
	for _, want := range []string{"policy threshold", "engines at 0.8× the model, loop closed", "change hgx-2 at 20.0 s to 0.4×", "engine queue p99"} {
		if !bytes.Contains(a, []byte(want)) {
			t.Errorf("the table lacks %q", want)
		}
	}
}

// TestEngineServiceModel checks one request alone on an engine: it waits
// for nothing, prefills at capacity × the pd rate ÷ soft_fraction, then
// decodes at the same multiple, and reports its time to first token.
func TestEngineServiceModel(t *testing.T) {
	cfg, cl := setup(t)
	rows := []Row{{Tenant: "acme", Model: "large", Prompt: 2000, Output: 100, Line: 2}}
	r, err := Run(rows, Options{Policy: PolicyFIFO, Config: cfg, Cluster: cl, Engine: EngineOptions{Capacity: 1.4}})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newSim(rows, Options{Policy: PolicyFIFO, Config: cfg, Cluster: cl})
	m, _ := s.cat.Get("large")
	d := s.domains[0]
	c, _ := d.cap.Cost(m, 2000, 100)
	scale := 1.4 / cfg.Capacity.SoftFraction // 2× the soft rates
	prefill := float64(c.PrefillFLOP) / (float64(d.prefillRate) * scale)
	want := prefill + float64(c.DecodeBytes)/(float64(d.decodeRate)*scale)
	if diff := r.Seconds - want; diff < 0 || diff > 2e-9 {
		t.Errorf("one request took %.9f s, want prefill+decode %.9f s", r.Seconds, want)
	}
	if got := r.Engines.TTFTP99 / 1000; got < prefill*0.99 || got > prefill*1.01 {
		t.Errorf("TTFT %.6f s, want its prefill %.6f s", got, prefill)
	}
	if got := r.Engines.AloneP99 / 1000; got < prefill*0.99 || got > prefill*1.01 {
		t.Errorf("prefill alone p99 %.6f s, want its prefill %.6f s", got, prefill)
	}
	if r.Engines.WithinSLO != 1 || r.Engines.Domains[0].Admitted != 1 {
		t.Errorf("within SLO %v, admitted %d", r.Engines.WithinSLO, r.Engines.Domains[0].Admitted)
	}
}

// TestEngineWaitsForKVAndBatch: a batch of one serves requests one after
// the other, the second's time to first token including its wait.
func TestEngineWaitsForKVAndBatch(t *testing.T) {
	cfg, cl := setup(t)
	cl.Domains = cl.Domains[:1]
	rows := []Row{{Tenant: "acme", Model: "small", Prompt: 1000, Output: 50, Line: 2}, {Tenant: "globex", Model: "small", Prompt: 1000, Output: 50, Line: 3}}
	one, err := Run(rows[:1], Options{Policy: PolicyFIFO, Config: cfg, Cluster: cl, Engine: EngineOptions{Capacity: 1, MaxBatch: 1}})
	if err != nil {
		t.Fatal(err)
	}
	two, err := Run(rows, Options{Policy: PolicyFIFO, Config: cfg, Cluster: cl, Engine: EngineOptions{Capacity: 1, MaxBatch: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if d := two.Seconds - 2*one.Seconds; d < -2e-9 || d > 2e-9 {
		t.Errorf("two requests in a batch of one took %.9f s, one alone %.9f s", two.Seconds, one.Seconds)
	}
	if got, want := two.Engines.TTFTP99, one.Seconds*1000+one.Engines.TTFTP99; got < want*0.99 || got > want*1.01 {
		t.Errorf("the second's TTFT %.3f ms, want the first's duration and its own prefill, %.3f ms", got, want)
	}
	if got, want := two.Engines.AloneP99, one.Engines.TTFTP99; got < want*0.99 || got > want*1.01 {
		t.Errorf("prefill alone p99 %.3f ms with a wait before it, want its prefill %.3f ms", got, want)
	}
}

func TestRecovery(t *testing.T) {
	const p = int64(100 * time.Millisecond)
	for _, c := range []struct {
		series     []int32
		at         int64
		over, back float64
	}{
		{[]int32{0, 0, 0, 0}, 0, -1, -1},
		{[]int32{9, 0, 0, 0, 0, 0, 0}, p, -1, -1},                     // past it only before the change
		{[]int32{0, 6, 7, 3, 0, 0, 0, 0, 0, 0}, 0, 0.1, 0.3},          // back at once, to the end
		{[]int32{0, 6, 1, 9, 2, 2, 2, 2, 2, 2, 2}, 0, 0.1, 0.4},       // a short dip does not count
		{[]int32{0, 6, 7, 8, 9, 9, 9, 9, 9, 9, 9}, 0, 0.1, -1},        // never back
		{[]int32{0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0}, 150e6, 0.15, 0.25}, // mid-period change
	} {
		over, back := recovery(c.series, p, c.at, 5, 5*p)
		if !near(over, c.over) || !near(back, c.back) {
			t.Errorf("recovery(%v, at %d) = %v, %v; want %v, %v", c.series, c.at, over, back, c.over, c.back)
		}
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func TestEngineOptionErrors(t *testing.T) {
	cfg, cl := setup(t)
	rows := []Row{{Tenant: "acme", Model: "small", Prompt: 10, Output: 1, Line: 2}}
	for _, c := range []struct {
		opts Options
		want string
	}{
		{Options{Policy: PolicyThreshold}, "policy threshold reads the engines"},
		{Options{Policy: PolicyClairvoyant}, "policy clairvoyant reads the engines"},
		{Options{Policy: PolicySluice, Engine: EngineOptions{Capacity: 1, Changes: []EngineChange{{Domain: "nope", Capacity: 1}}}}, `no domain "nope"`},
		{Options{Policy: PolicySluice, Engine: EngineOptions{Changes: []EngineChange{{Domain: "hgx-1", Capacity: 1}}}}, "needs --engine-capacity"},
		{Options{Policy: PolicySluice, Engine: EngineOptions{Capacity: 1e6}}, "--engine-capacity 1e+06"},
	} {
		c.opts.Config, c.opts.Cluster = cfg, cl
		if _, err := Run(rows, c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err %v, want %q", c.opts.Engine, err, c.want)
		}
	}
	for _, c := range []struct{ in, want string }{
		{"hgx-1@10s", "no DOMAIN@TIME=CAPACITY"},
		{"hgx-1@ten=0.5", `time "ten"`},
		{"hgx-1@10s=0", `capacity "0"`},
		{"@10s=1", "no DOMAIN@TIME=CAPACITY"},
	} {
		if _, err := ParseEngineChange(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseEngineChange(%q): %v, want %q", c.in, err, c.want)
		}
	}
	if c, err := ParseEngineChange("rack@a@1m30s=0.5"); err != nil || c != (EngineChange{Domain: "rack@a", At: 90 * time.Second, Capacity: 0.5}) {
		t.Errorf("ParseEngineChange: %+v, %v", c, err)
	}
}
