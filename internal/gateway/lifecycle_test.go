package gateway

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
)

// newLifecycle is a Gateway over a real engine on the simulated cluster,
// every domain given one endpoint.
func newLifecycle(t testing.TB, clk clock.Clock) (*Gateway, *admission.Engine) {
	t.Helper()
	cfg, err := config.Default()
	if err != nil {
		t.Fatal(err)
	}
	cluster := topology.Simulated()
	for i := range cluster.Domains {
		cluster.Domains[i].Engines = []topology.Engine{{Metrics: "http://127.0.0.1:9/metrics", Kind: "vllm", Address: fmt.Sprintf("10.0.%d.1:8000", i)}}
	}
	eng, err := admission.New(cfg, cluster, admission.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	g := New(eng, Options{Clock: clk})
	g.SetModels(pd.DefaultModels())
	g.SetTopology(cluster)
	return g, eng
}

// However a stream ends — whole, cancelled before or after the answer,
// mid-response, reset, with an upstream error — no lease is left behind.
func TestNoLeaseLeftBehind(t *testing.T) {
	clk := clock.NewManual(time.Unix(1e9, 0))
	g, eng := newLifecycle(t, clk)
	rng := rand.New(rand.NewPCG(7, 7))
	ctx := context.Background()
	forwarded := 0
	for i := range 10000 {
		clk.Advance(20 * time.Millisecond) // the tenants' buckets refill as traffic would see
		x := g.Start()
		if v := x.RequestHeaders("/v1/chat/completions", func(h string) string {
			if h == DefaultTenantHeader {
				return []string{"acme", "globex", "initech"}[i%3]
			}
			return ""
		}); v != nil {
			t.Fatalf("headers: %s", v.Message)
		}
		x.AppendBody([]byte(`{"model":"large","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hello there"}]}`))
		switch rng.IntN(8) {
		case 0: // the stream ends before the decision
			x.Abort(OutcomeClientCancel)
			continue
		}
		v := x.Decide(ctx)
		if !v.Forward() {
			if i < 3 {
				t.Logf("refused: %d %s", v.Status, v.Message)
			}
			x.Abort(OutcomeClientCancel)
			continue
		}
		forwarded++
		switch rng.IntN(6) {
		case 0: // cancelled before any answer
			x.Abort(OutcomeClientCancel)
		case 1: // upstream 500
			x.ResponseHeaders(500, "application/json")
			x.ResponseBody([]byte(`{"error":"x"}`), true)
		case 2: // reset mid-stream
			x.ResponseHeaders(200, "text/event-stream")
			x.ResponseBody([]byte(`data: {"choices":[{"delta":{"content":"a"}}]}`+"\n\ndata: {\"cho"), false)
			x.Abort(OutcomeUpstreamError)
		case 3: // client gone mid-stream
			x.ResponseHeaders(200, "text/event-stream")
			x.ResponseBody([]byte(`data: {"choices":[{"delta":{"content":"a"}}]}`+"\n\n"), false)
			x.Abort(OutcomeClientCancel)
		default: // whole, then a late Abort that does nothing
			x.ResponseHeaders(200, "text/event-stream")
			x.ResponseBody([]byte(`data: {"choices":[{"delta":{"content":"a"}}]}`+"\n\n"), false)
			x.ResponseBody([]byte(`data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1}}`+"\n\ndata: [DONE]\n\n"), true)
			x.Abort(OutcomeClientCancel)
		}
		if x.Outcome() == OutcomeNone {
			t.Fatalf("exchange %d not ended", i)
		}
	}
	if forwarded < 5000 {
		t.Errorf("only %d of 10000 exchanges were admitted and forwarded", forwarded)
	}
	if n := eng.LeaseCount(); n != 0 {
		t.Errorf("%d leases left after 10000 exchanges", n)
	}
	for _, eps := range g.picker.byDomain {
		for _, e := range eps {
			if n := e.inFlight.Load(); n != 0 {
				t.Errorf("endpoint %s counts %d in flight", e.address, n)
			}
		}
	}
}

// degradingEngine grants every request on the lowest tier it accepts.
type degradingEngine struct{ released []admission.Release }

func (d *degradingEngine) Admit(_ context.Context, req admission.Request) (admission.Decision, error) {
	m := req.Model
	if n := len(req.AcceptDowngrade); n > 0 {
		m = req.AcceptDowngrade[n-1]
	}
	out := admission.Admitted
	if m != req.Model {
		out = admission.Degraded
	}
	return admission.Decision{Outcome: out, LeaseID: 1, Domain: "d1", Model: m}, nil
}

func (d *degradingEngine) Release(_ context.Context, rel admission.Release) (admission.ReleaseResult, error) {
	d.released = append(d.released, rel)
	return admission.ReleaseResult{}, nil
}

// A degraded grant rewrites the body's model to the lower tier's served
// name and routes to an engine that serves it.
func TestDegradeRewritesTheModel(t *testing.T) {
	eng := &degradingEngine{}
	g := New(eng, Options{})
	models := pd.DefaultModels()
	models[0].ServedNames = []string{"llama-405b"}
	models[1].ServedNames = []string{"llama-70b", "meta-llama/Llama-3.1-70B"}
	g.SetModels(models)
	g.SetTopology(topology.Cluster{Domains: []topology.Domain{{ID: "d1", Engines: []topology.Engine{
		{Metrics: "http://a/m", Kind: "vllm", Address: "10.0.0.1:80", Models: []string{"llama-405b"}},
		{Metrics: "http://b/m", Kind: "vllm", Address: "10.0.0.2:80", Models: []string{"llama-70b"}},
	}}}})
	x := g.Start()
	x.RequestHeaders("/v1/chat/completions", func(h string) string {
		return map[string]string{DefaultTenantHeader: "acme", DefaultDowngradeHeader: "meta-llama/Llama-3.1-70B"}[h]
	})
	x.AppendBody([]byte(`{"model":"llama-405b","messages":[{"role":"user","content":"hi"}]}`))
	v := x.Decide(context.Background())
	if !v.Forward() || !v.Degraded || v.Endpoint != "10.0.0.2:80" || !strings.Contains(string(v.Body), `"model":"llama-70b"`) {
		t.Fatalf("degraded verdict %+v body %s", v, v.Body)
	}
	x.ResponseHeaders(200, "application/json")
	x.ResponseBody([]byte(`{"usage":{"prompt_tokens":12,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}`), true)
	if len(eng.released) != 1 || eng.released[0].PromptTokens != 12 || eng.released[0].OutputTokens != 3 || eng.released[0].CachedPromptTokens != 4 {
		t.Errorf("released %+v", eng.released)
	}
}
