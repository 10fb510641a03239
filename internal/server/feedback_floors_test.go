package server

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/client"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/clock"
)

// slowableEngine serves vLLM's metrics with a waiting queue and a KV use
// the test sets.
type slowableEngine struct {
	waiting    atomic.Int64
	kvPermille atomic.Int64
	srv        *httptest.Server
}

func newSlowableEngine(t *testing.T) *slowableEngine {
	e := &slowableEngine{}
	e.kvPermille.Store(420)
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama-405b"} 24.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama-405b"} %d.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama-405b"} %.3f
`, e.waiting.Load(), float64(e.kvPermille.Load())/1000)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// The requests every tenant sends: large, 60 prompt tokens and one output
// token, 64 weighted tokens. A floor's reserve holds a weighted token as a
// prompt token of the largest model, so these cost the domain about what
// the reserve holds for them.
const (
	floorPrompt, floorOutput = 60, 1
	floorWeighted            = floorPrompt + 4*floorOutput
	// floorStep is how far the manual clock moves between two rounds of
	// requests.
	floorStep = 50 * time.Millisecond
	hog       = "hog" // the tenant without a floor
)

// floorRun is a live sluiced on a manual clock with one HGX H200 domain,
// d1, whose engine serves metrics over HTTP, tenants with floors on it
// and one without (hog) that takes all the rest.
type floorRun struct {
	t      *testing.T
	srv    *Server
	c      *client.Client
	clk    *clock.Manual
	engine *slowableEngine
	floors map[string]int64 // weighted tokens/s, by tenant
	// order is who asks in each round: hog first, then the floors,
	// the largest first.
	order []string
	// window is how long the last steps call took on the clock.
	window time.Duration
}

func startFloorRun(t *testing.T, floors map[string]int64) *floorRun {
	dir := t.TempDir()
	engine := newSlowableEngine(t)
	topo := fmt.Sprintf("domains:\n  - {id: d1, kind: hgx, gpu: H200, gpus_per_node: 8, nodes: 1, engines: [{metrics: %q, kind: vllm}]}\n", engine.srv.URL+"/metrics")
	// No request waits in the queue (the margin outlasts every deadline):
	// each is admitted or refused at once, on the manual clock.
	cfg := "feedback: {stale: 5s, spread_choices: 1}\nqueue: {deadline_margin: 1h}\ntiers:\n" +
		"  open: {rps: {rate: 1e6, burst: 1e6}, tokens: {rate: 1e9, burst: 1e9}, weight: 1}\n"
	tenants := "tenants:\n  " + hog + ": {tier: open}\n"
	r := &floorRun{t: t, engine: engine, floors: floors, order: []string{hog}}
	for name, floor := range floors {
		cfg += fmt.Sprintf("  %s: {rps: {rate: 1e6, burst: 1e6}, tokens: {rate: 1e9, burst: 1e9}, weight: 1, floor: %d}\n", name, floor)
		tenants += fmt.Sprintf("  %s: {tier: %s}\n", name, name)
		r.order = append(r.order, name)
	}
	slices.SortFunc(r.order[1:], func(a, b string) int { return int(floors[b] - floors[a]) })
	topoPath, cfgPath := filepath.Join(dir, "cluster.yaml"), filepath.Join(dir, "sluice.yaml")
	for path, body := range map[string]string{topoPath: topo, cfgPath: cfg + tenants} {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r.clk = clock.NewManual(time.Now())
	r.srv, r.c, _, _ = start(t, Options{ConfigPath: cfgPath, Topology: topoPath, Clock: r.clk,
		Engines: EngineMetricsOptions{Period: 10 * time.Millisecond}})
	return r
}

// domain is d1 as the engine describes it.
func (r *floorRun) domain() admission.DomainInfo {
	for _, d := range r.srv.Engine().Domains() {
		if d.ID == "d1" {
			return d
		}
	}
	r.t.Fatal("no domain d1")
	return admission.DomainInfo{}
}

// step moves the clock on by floorStep, waits for the engine's reading at
// the new time (a millisecond or two later where a read was in flight), runs the engine's control step, and then has each tenant
// in turn (r.order) admit (and release) requests until one is refused. It returns the weighted tokens admitted, by tenant.
func (r *floorRun) step() map[string]int64 {
	r.t.Helper()
	r.clk.Advance(floorStep)
	// A read in flight when the clock moved carries the new time and the
	// engine's values from before: a millisecond more, and the next read
	// carries the values set.
	for {
		eventually(r.t, func() bool { return r.domain().EngineMetricsAge == 0 })
		if d := r.domain(); d.EngineQueue == float64(r.engine.waiting.Load()) && d.EngineKVUsage == float64(r.engine.kvPermille.Load())/1000 {
			break
		}
		r.clk.Advance(time.Millisecond)
	}
	r.srv.Engine().Tick()
	admitted := make(map[string]int64)
	for _, tenant := range r.order {
		for n := 0; r.admit(tenant); n++ {
			admitted[tenant] += floorWeighted
			if n > 10000 {
				r.t.Fatalf("%s admitted %d requests in one step", tenant, n)
			}
		}
	}
	return admitted
}

// steps runs n steps and sums what each tenant was admitted.
func (r *floorRun) steps(n int) map[string]int64 {
	r.t.Helper()
	start := r.clk.Now()
	defer func() { r.window = r.clk.Now().Sub(start) }()
	sum := make(map[string]int64)
	for range n {
		for tenant, w := range r.step() {
			sum[tenant] += w
		}
	}
	return sum
}

// admit asks for one request of tenant's, releases it at once if admitted,
// and reports whether it was.
func (r *floorRun) admit(tenant string) bool {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := r.c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: tenant, Model: "large", PromptTokens: floorPrompt, MaxOutputTokens: floorOutput})
	if err != nil {
		r.t.Fatalf("Admit %s: %v", tenant, err)
	}
	if resp.GetDecision() != admissionv1.Decision_ADMITTED {
		return false
	}
	if _, err := r.c.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: resp.GetLeaseId(), PromptTokens: floorPrompt, OutputTokens: floorOutput,
		Outcome: admissionv1.Outcome_OUTCOME_OK}); err != nil {
		r.t.Fatalf("Release %s: %v", tenant, err)
	}
	return true
}

// slowDown has the engines report a queue that grows by two each step and
// a KV cache 95% full, as slowed engines do, runs steps until the factor
// reaches its bound (the guard's cuts, down to the floors' reserve, and
// the busy windows' calibration below it), and then n steps more. It returns what each tenant
// was admitted over all of them and over the last n, and how long (on the
// clock) all of them and the fall took.
func (r *floorRun) slowDown(n int) (all, last map[string]int64, held, fall time.Duration) {
	r.t.Helper()
	start := r.clk.Now()
	r.engine.kvPermille.Store(950)
	all = make(map[string]int64)
	add := func(m map[string]int64) {
		for tenant, w := range m {
			all[tenant] += w
		}
	}
	for steps := 1; r.domain().CapacityFactor > 0.25+1e-9; steps++ {
		if steps > 1500 { // fifteen calibration windows
			r.t.Fatalf("the factor is %v after %d steps of slowed engines, want the 0.25 bound", r.domain().CapacityFactor, steps)
		}
		r.engine.waiting.Add(2)
		add(r.step())
	}
	if !r.domain().EngineSaturated {
		r.t.Fatalf("engines slowed (queue %d, KV 95%%): the guard does not hold d1", r.engine.waiting.Load())
	}
	fall = r.clk.Now().Sub(start)
	last = r.steps(n)
	add(last)
	return all, last, r.clk.Now().Sub(start), fall
}

// floorsShortGauge is sluice_domain_floors_short for d1.
func (r *floorRun) floorsShortGauge() float64 {
	return value(r.t, scrape(r.t, r.srv), "sluice_domain_floors_short", map[string]string{"domain": "d1"})
}

// A domain whose engines slow down mid-run keeps every floor on it: while
// the guard holds it and the factor falls to its bound, each floor tenant
// is admitted its floor's worth over the window, to within one request,
// and the tenant without a floor, which had the rest of the domain before,
// is what is held back. The corrected capacity still carries the floors,
// so none is reported short.
func TestSlowedDomainKeepsEveryFloor(t *testing.T) {
	// 700 weighted tokens/s, about a fifth of the domain's prefill as the
	// model gives it: within the quarter the factor falls to.
	r := startFloorRun(t, map[string]int64{"small": 100, "mid": 250, "big": 350})
	before := r.steps(20)
	if before[hog] == 0 {
		t.Fatalf("engines clear: hog admitted nothing (%v), want it to take what the floors leave", before)
	}
	all, last, held, fall := r.slowDown(80)
	for tenant, floor := range r.floors {
		// The floor's refill over the steps held, less one request: the
		// floor bucket's level left at the end is below one request.
		want := int64(float64(floor)*held.Seconds()) - floorWeighted
		if all[tenant] < want {
			t.Errorf("%s (floor %d/s) admitted %d weighted tokens over the %v d1 was held (the factor falling over %v of it), want ≥ %d: %.0f%% of its floor",
				tenant, floor, all[tenant], held, fall, want, 100*float64(all[tenant])/(float64(floor)*held.Seconds()))
		}
		if w := int64(float64(floor) * r.window.Seconds()); last[tenant] < w-floorWeighted {
			t.Errorf("%s (floor %d/s) admitted %d weighted tokens over the last %v at the factor's bound, want ≥ %d", tenant, floor, last[tenant], r.window, w-floorWeighted)
		}
	}
	if all[hog] != 0 {
		t.Errorf("hog, without a floor, admitted %d weighted tokens while d1's engines were slowed, want 0: it is what the guard holds back", all[hog])
	}
	if d := r.domain(); d.FloorsShort {
		t.Errorf("factor %v: floors reported short, want them carried (%+v)", d.CapacityFactor, d)
	}
	if got := r.floorsShortGauge(); got != 0 {
		t.Errorf("sluice_domain_floors_short{domain=d1} = %v, want 0", got)
	}
}

// slowedShort runs floors of about half the domain's prefill as the model
// gives it (twice what a quarter of it carries) through a slowdown that
// takes the factor to its bound, past the seconds the domain's full
// buckets take the floors' excess over its rate, and then a window of
// 100 steps (5 s). It returns the run, what the floors ask of the model's prefill,
// how long the window took on the clock, and what each tenant was
// admitted in it.
func slowedShort(t *testing.T) (r *floorRun, frac float64, window time.Duration, last map[string]int64) {
	r = startFloorRun(t, map[string]int64{"small": 300, "mid": 600, "big": 900})
	frac = r.domain().ReservedFrac // of the prefill the model gives
	r.steps(10)
	r.slowDown(200)
	last = r.steps(100)
	return r, frac, r.window, last
}

// A domain whose engines slow down until its measured capacity cannot
// carry its floors says so (FloorsShort, sluice_domain_floors_short), and
// the tenant without a floor stays held back.
func TestSlowedDomainShortOfItsFloorsSaysSo(t *testing.T) {
	r, frac, _, last := slowedShort(t)
	d := r.domain()
	if !d.FloorsShort {
		t.Errorf("factor %v, floors %.0f%% of the model's prefill: FloorsShort is false, want it reported", d.CapacityFactor, 100*frac)
	}
	if got := r.floorsShortGauge(); got != 1 {
		t.Errorf("sluice_domain_floors_short{domain=d1} = %v, want 1", got)
	}
	if last[hog] != 0 {
		t.Errorf("hog, without a floor, admitted %d weighted tokens with the floors short, want 0", last[hog])
	}
}

// What a domain short of its floors carries is shared by the floor
// tenants in proportion to their floors: the largest floor, asking before
// the others in every round, does not take it all.
func TestSlowedDomainShortOfItsFloorsSharesWhatIsLeft(t *testing.T) {
	r, frac, window, last := slowedShort(t)
	// The share of every floor the domain carries at its factor: its
	// prefill over the floors' (prefill binds for these requests).
	share := r.domain().CapacityFactor / frac
	var report []string
	for _, tenant := range r.order[1:] {
		report = append(report, fmt.Sprintf("%s (floor %d/s): %d", tenant, r.floors[tenant], last[tenant]))
	}
	for _, tenant := range r.order[1:] {
		floor := float64(r.floors[tenant]) * window.Seconds()
		// Its share of what the domain carried, less a fifth for the
		// order of the requests within a step and their size.
		if want := 0.8*floor*share - floorWeighted; float64(last[tenant]) < want {
			t.Errorf("%s (floor %d/s) admitted %d weighted tokens over %v with the floors short (the domain carries %.0f%% of them), want ≥ %.0f, %.0f%% of its floor; all: %s",
				tenant, r.floors[tenant], last[tenant], window, 100*share, want, 100*float64(last[tenant])/floor, strings.Join(report, ", "))
		}
	}
}
