package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/gateway"
	"github.com/sluice-sched/sluice/internal/openai/openaitest"
	"github.com/sluice-sched/sluice/topology"
)

// fakeEngine is an OpenAI-compatible engine: each answer is words
// content events (or one JSON answer) with a usage of promptTokens and
// words, and the header x-test-mode chooses a failure: "500" answers an
// error, "hang" sends one event and waits for the client to leave,
// "reset" sends one event and drops the connection.
type fakeEngine struct {
	words        int
	promptTokens int64
	hung         chan struct{} // a "hang" request's client left
}

func (e *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, e.promptTokens, e.words, e.promptTokens+int64(e.words))
	mode := r.Header.Get("x-test-mode")
	if mode == "500" {
		http.Error(w, `{"error":{"message":"engine fell over"}}`, 500)
		return
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":%s}`, strings.Repeat("word ", e.words), usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	flush := func() { _ = http.NewResponseController(w).Flush() }
	for i := range e.words {
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"w%d \"}}]}\n\n", i)
		flush()
		if i == 0 {
			switch mode {
			case "hang":
				<-r.Context().Done()
				if e.hung != nil {
					e.hung <- struct{}{}
				}
				return
			case "reset":
				panic(http.ErrAbortHandler)
			}
		}
	}
	if req.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":%s}\n\n", usage)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// recorder is the admission engine with its Releases recorded.
type recorder struct {
	*admission.Engine
	mu       sync.Mutex
	released []admission.Release
	results  []admission.ReleaseResult
	signal   chan struct{} // one send per Release
}

func (r *recorder) Release(ctx context.Context, rel admission.Release) (admission.ReleaseResult, error) {
	res, err := r.Engine.Release(ctx, rel)
	r.mu.Lock()
	r.released = append(r.released, rel)
	r.results = append(r.results, res)
	r.mu.Unlock()
	r.signal <- struct{}{}
	return res, err
}

// await waits for n more Releases: the front releases as the answer's
// last bytes pass, which may be after the client has read them.
func (r *recorder) await(n int) {
	for range n {
		<-r.signal
	}
}

func (r *recorder) releases() ([]admission.Release, []admission.ReleaseResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]admission.Release(nil), r.released...), append([]admission.ReleaseResult(nil), r.results...)
}

// rig is a front over a real admission engine with two tenants (acme with
// room to spare; tiny with one request per 100 s) and one domain whose
// engine is the fake engine.
type rig struct {
	eng    *recorder
	gw     *gateway.Gateway
	engine *fakeEngine
	front  *httptest.Server
	url    string
	// engineAddr is the fake engine's host:port.
	engineAddr string
}

func newRig(t testing.TB, o Options) *rig {
	t.Helper()
	setup := openaitest.TwoTenants(t)
	fe := &fakeEngine{words: 5, promptTokens: 11}
	engSrv := httptest.NewServer(fe)
	t.Cleanup(engSrv.Close)
	cluster := clusterAt(t, strings.TrimPrefix(engSrv.URL, "http://"))
	eng, err := admission.New(setup.Config, cluster)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go eng.Run(ctx)
	t.Cleanup(func() { cancel(); eng.Close() })
	rec := &recorder{Engine: eng, signal: make(chan struct{}, 1<<14)} // more than any test releases
	gw := gateway.New(rec, gateway.Options{})
	gw.SetModels(setup.Models)
	gw.SetTopology(cluster)
	front := httptest.NewServer(New(gw, o))
	t.Cleanup(front.Close)
	return &rig{eng: rec, gw: gw, engine: fe, front: front, url: front.URL, engineAddr: strings.TrimPrefix(engSrv.URL, "http://")}
}

// post sends a chat completion for tenant; extra headers as name, value.
func (r *rig) post(t testing.TB, ctx context.Context, tenant, body string, kv ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "POST", r.url+PathChat, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if tenant != "" {
		req.Header.Set(gateway.DefaultTenantHeader, tenant)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	resp, err := r.front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

const (
	chatStream = `{"model":"llama-405b","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"tell me a story"}]}`
	chatWhole  = `{"model":"llama-405b","max_tokens":64,"messages":[{"role":"user","content":"tell me a story"}]}`
)

// clusterAt is one HGX domain whose one engine serves at addr.
func clusterAt(t testing.TB, addr string) topology.Cluster {
	t.Helper()
	cluster, err := topology.Parse([]byte(`
domains:
  - id: d1
    kind: hgx
    gpu: H200
    gpus_per_node: 8
    nodes: 1
    engines:
      - {metrics: "http://` + addr + `/metrics", kind: vllm, address: "` + addr + `"}
`))
	if err != nil {
		t.Fatal(err)
	}
	return cluster
}
