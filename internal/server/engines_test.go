package server

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission/client"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// vllmEngine serves vLLM's metrics with a waiting queue the test sets.
type vllmEngine struct {
	waiting atomic.Int64
	srv     *httptest.Server
}

func newVLLMEngine(t *testing.T) *vllmEngine {
	e := &vllmEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 24.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} %d.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 0.42
`, e.waiting.Load())
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// sluiced reads the engines the topology names over HTTP: one domain's
// engines saying "saturated" move placement off it, and it comes back once
// they clear.
func TestEngineMetricsMovePlacement(t *testing.T) {
	dir := t.TempDir()
	engines := map[string]*vllmEngine{"d1": newVLLMEngine(t), "d2": newVLLMEngine(t)}
	topo := "domains:\n"
	for _, id := range []string{"d1", "d2"} {
		topo += fmt.Sprintf("  - {id: %s, kind: hgx, gpu: H200, gpus_per_node: 8, nodes: 1, engines: [{metrics: %q, kind: vllm}]}\n", id, engines[id].srv.URL+"/metrics")
	}
	cfg := "feedback: {stale: 5s}\ntiers:\n  std: {rps: {rate: 1000, burst: 1000}, tokens: {rate: 1e9, burst: 1e9}, weight: 1}\ntenants:\n  acme: {tier: std}\n"
	topoPath, cfgPath := filepath.Join(dir, "cluster.yaml"), filepath.Join(dir, "sluice.yaml")
	for path, body := range map[string]string{topoPath: topo, cfgPath: cfg} {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	srv, c, _, _ := start(t, Options{ConfigPath: cfgPath, Topology: topoPath, Engines: EngineMetricsOptions{Period: 20 * time.Millisecond}})
	placed := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "acme", Model: "medium", PromptTokens: 1000, MaxOutputTokens: 100})
		if err != nil {
			t.Fatalf("Admit: %v", err)
		}
		if resp.GetDecision() != admissionv1.Decision_ADMITTED {
			t.Fatalf("Admit: %v", resp)
		}
		releaseLease(t, c, resp.GetLeaseId())
		return resp.GetDomain()
	}
	first := placed()
	other := map[string]string{"d1": "d2", "d2": "d1"}[first]
	saturated := func(id string) bool {
		for _, d := range srv.Engine().Domains() {
			if d.ID == id {
				return d.EngineSaturated
			}
		}
		return false
	}

	engines[first].waiting.Store(12)
	eventually(t, func() bool { return saturated(first) })
	fams := scrape(t, srv)
	for _, c := range []struct {
		name, domain string
		want         float64
	}{{"sluice_domain_engine_saturated", first, 1}, {"sluice_domain_engine_queue", first, 12}, {"sluice_domain_engine_saturated", other, 0}} {
		if got := value(t, fams, c.name, map[string]string{"domain": c.domain}); got != c.want {
			t.Errorf("%s{domain=%q} = %v, want %v", c.name, c.domain, got, c.want)
		}
	}
	for range 10 {
		if got := placed(); got != other {
			t.Fatalf("%s's engines wait 12 requests: placed on %s, want %s", first, got, other)
		}
	}
	engines[first].waiting.Store(0)
	eventually(t, func() bool { return !saturated(first) })
	if got := placed(); got != first {
		t.Errorf("%s's engines clear again: placed on %s, want back on %s", first, got, first)
	}
}

// releaseLease releases a lease of 1000 prompt and 100 output tokens.
func releaseLease(t *testing.T, c *client.Client, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: id, PromptTokens: 1000, OutputTokens: 100, Outcome: admissionv1.Outcome_OUTCOME_OK}); err != nil {
		t.Fatalf("Release: %v", err)
	}
}
