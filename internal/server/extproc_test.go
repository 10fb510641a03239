package server

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/extproc"
	"github.com/sluice-sched/sluice/internal/grpctest"
	"github.com/sluice-sched/sluice/pd"
)

// gatewayTopology is one HGX domain whose engines serve at addresses: the
// first serves the large model under its served name, the second every
// model; a third is read for metrics only.
const gatewayTopology = `
domains:
  - id: d1
    kind: hgx
    gpu: H200
    gpus_per_node: 8
    nodes: 1
    engines:
      - {metrics: "http://127.0.0.1:9/metrics", kind: vllm, address: "10.0.0.1:8000", models: [llama-405b]}
      - {metrics: "http://127.0.0.1:9/metrics2", kind: vllm, address: "10.0.0.2:8000"}
      - {metrics: "http://127.0.0.1:9/metrics3", kind: vllm}
`

// startGateway runs sluiced on gatewayTopology with two tenants: acme with
// room to spare, tiny with a token bucket of 3000.
func startGateway(t *testing.T, mutate func(*Options)) (*Server, extprocv3.ExternalProcessorClient) {
	t.Helper()
	dir := t.TempDir()
	models := pd.DefaultModels()
	for i := range models {
		if models[i].Name == "large" {
			models[i].ServedNames = []string{"llama-405b"}
		}
		if models[i].Name == "medium" {
			models[i].ServedNames = []string{"llama-70b"}
		}
	}
	tier := func(tokens int64) map[string]any {
		return map[string]any{"rps": map[string]any{"rate": 10000, "burst": 10000}, "tokens": map[string]any{"rate": 1, "burst": tokens},
			"max_concurrency": 10000, "weight": 1}
	}
	cfg := map[string]any{
		"tiers":   map[string]any{"big": tier(100_000_000), "tiny": tier(3000)},
		"tenants": map[string]any{"acme": map[string]any{"tier": "big"}, "tiny": map[string]any{"tier": "tiny"}},
		"models":  models,
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath, topoPath := filepath.Join(dir, "config.json"), filepath.Join(dir, "topology.yaml")
	if err := os.WriteFile(cfgPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(topoPath, []byte(gatewayTopology), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := Options{ConfigPath: cfgPath, Topology: topoPath}
	if mutate != nil {
		mutate(&opts)
	}
	srv, _, _, _ := start(t, opts)
	return srv, extprocv3.NewExternalProcessorClient(grpctest.Dial(t, srv.GRPCAddr().String()))
}

// envoy plays Envoy's part on one Process stream.
type envoy struct {
	t      *testing.T
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
}

func newEnvoy(t *testing.T, c extprocv3.ExternalProcessorClient) *envoy {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	s, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	return &envoy{t: t, stream: s, cancel: cancel}
}

func headerMap(kv ...string) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	for i := 0; i < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return hm
}

func (e *envoy) send(r *extprocv3.ProcessingRequest) {
	e.t.Helper()
	if err := e.stream.Send(r); err != nil {
		e.t.Fatalf("send: %v", err)
	}
}

func (e *envoy) recv() *extprocv3.ProcessingResponse {
	e.t.Helper()
	r, err := e.stream.Recv()
	if err != nil {
		e.t.Fatalf("recv: %v", err)
	}
	return r
}

// requestHeaders sends the request's headers, in mode, with a subset hint
// when subset is not nil.
func (e *envoy) requestHeaders(mode filterv3.ProcessingMode_BodySendMode, end bool, subset []string, kv ...string) {
	r := &extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(kv...), EndOfStream: end}},
	}
	if subset != nil {
		vals := make([]*structpb.Value, len(subset))
		for i, s := range subset {
			vals[i] = structpb.NewStringValue(s)
		}
		r.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			extproc.SubsetNamespace: {Fields: map[string]*structpb.Value{extproc.SubsetKey: structpb.NewListValue(&structpb.ListValue{Values: vals})}},
		}}
	}
	e.send(r)
}

func (e *envoy) requestBody(chunk string, end bool) {
	e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chunk), EndOfStream: end}}})
}

// routed reads a headers answer that routes the request, and the streamed
// body after it; it returns the destination and the body forwarded.
func (e *envoy) routed() (dest string, set map[string]string, body string) {
	e.t.Helper()
	r := e.recv()
	h := r.GetRequestHeaders()
	if h == nil {
		e.t.Fatalf("want a request headers answer, got %v", r)
	}
	if !h.GetResponse().GetClearRouteCache() {
		e.t.Error("the route cache is not cleared")
	}
	set = map[string]string{}
	for _, o := range h.GetResponse().GetHeaderMutation().GetSetHeaders() {
		set[o.GetHeader().GetKey()] = string(o.GetHeader().GetRawValue())
	}
	dest = set[extproc.DestinationHeader]
	md := r.GetDynamicMetadata().GetFields()[extproc.MetadataNamespace].GetStructValue().GetFields()[extproc.DestinationHeader].GetStringValue()
	if dest == "" || md != dest && !strings.HasPrefix(md, dest+",") {
		e.t.Errorf("destination header %q, metadata %q", dest, md)
	}
	if cl, ok := set["content-length"]; ok {
		defer func() {
			if cl != fmt.Sprint(len(body)) {
				e.t.Errorf("content-length %s for a body of %d bytes", cl, len(body))
			}
		}()
	}
	for {
		r := e.recv()
		sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			e.t.Fatalf("want a streamed body chunk, got %v", r)
		}
		if len(sr.GetBody()) > extproc.MaxChunk {
			e.t.Errorf("a body chunk of %d bytes, past %d", len(sr.GetBody()), extproc.MaxChunk)
		}
		body += string(sr.GetBody())
		if sr.GetEndOfStream() {
			return dest, set, body
		}
	}
}

// respond plays the upstream's answer: headers, then chunks; it returns
// what the client receives.
func (e *envoy) respond(status, contentType string, chunks ...string) string {
	e.t.Helper()
	e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: headerMap(":status", status, "content-type", contentType)}}})
	if e.recv().GetResponseHeaders() == nil {
		e.t.Fatal("want a response headers answer")
	}
	var got strings.Builder
	for i, c := range chunks {
		e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(c), EndOfStream: i == len(chunks)-1}}})
		sr := e.recv().GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		got.Write(sr.GetBody())
	}
	return got.String()
}

// immediate reads an ImmediateResponse.
func (e *envoy) immediate() *extprocv3.ImmediateResponse {
	e.t.Helper()
	r := e.recv()
	ir := r.GetImmediateResponse()
	if ir == nil {
		e.t.Fatalf("want an immediate response, got %v", r)
	}
	return ir
}

func immediateHeader(ir *extprocv3.ImmediateResponse, name string) string {
	for _, o := range ir.GetHeaders().GetSetHeaders() {
		if o.GetHeader().GetKey() == name {
			return string(o.GetHeader().GetRawValue())
		}
	}
	return ""
}

// tokenLevel is tenant's token bucket level.
func tokenLevel(t *testing.T, srv *Server, tenant string) int64 {
	t.Helper()
	ti, ok := srv.Engine().Tenant(tenant)
	if !ok {
		t.Fatalf("no tenant %s", tenant)
	}
	return ti.TokenLevel
}

func checkNoLeases(t *testing.T, srv *Server) {
	t.Helper()
	if n := srv.Engine().LeaseCount(); n != 0 {
		t.Errorf("%d leases held after the exchange", n)
	}
	for _, d := range srv.Engine().Domains() {
		if d.InFlight != 0 || d.KVInUse != 0 {
			t.Errorf("domain %s: %d in flight, %d KV bytes held after the exchange", d.ID, d.InFlight, d.KVInUse)
		}
	}
}

const sseUsage = `data: {"id":"c","choices":[],"usage":{"prompt_tokens":900,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":100}}}` + "\n\n"

// A streamed chat request split over chunks is routed to the least loaded
// engine serving its model, with include_usage added; the usage event
// Sluice asked for is kept from the client, and the tenant is charged the
// usage reported: 900 prompt + 4 × 3 output weighted tokens.
func TestExtProcStreamedChatChargesTheReportedUsage(t *testing.T) {
	srv, c := startGateway(t, nil)
	before := tokenLevel(t, srv, "acme")
	e := newEnvoy(t, c)
	e.requestHeaders(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, nil, ":path", "/v1/chat/completions", ":method", "POST", "x-llm-d-inference-fairness-id", "acme")
	body := `{"model":"llama-405b","stream":true,"max_tokens":50,"messages":[{"role":"user","content":"` + strings.Repeat("hello ", 500) + `"}]}`
	e.requestBody(body[:100], false)
	e.requestBody(body[100:2000], false)
	e.requestBody(body[2000:], true)
	dest, set, fwd := e.routed()
	if dest != "10.0.0.1:8000" && dest != "10.0.0.2:8000" {
		t.Errorf("destination %q", dest)
	}
	if set["x-sluice-domain"] != "d1" || set["x-sluice-model"] != "large" {
		t.Errorf("headers %v", set)
	}
	if !strings.Contains(fwd, `"stream_options":{"include_usage":true}`) || !strings.Contains(fwd, `"model":"llama-405b"`) {
		t.Errorf("forwarded body lacks include_usage or changed the model: %.200s", fwd)
	}
	client := e.respond("200", "text/event-stream",
		`data: {"id":"c","choices":[{"delta":{"content":"a"}}]}`+"\n\n"+`data: {"id":"c","choi`,
		`ces":[{"delta":{"content":"b"}}]}`+"\n\n",
		`data: {"id":"c","choices":[{"delta":{"content":"c"}}]}`+"\n\n"+sseUsage[:40],
		sseUsage[40:]+"data: [DONE]\n\n")
	want := `data: {"id":"c","choices":[{"delta":{"content":"a"}}]}` + "\n\n" + `data: {"id":"c","choices":[{"delta":{"content":"b"}}]}` + "\n\n" +
		`data: {"id":"c","choices":[{"delta":{"content":"c"}}]}` + "\n\n" + "data: [DONE]\n\n"
	if client != want {
		t.Errorf("the client receives\n%q\nwant\n%q", client, want)
	}
	checkNoLeases(t, srv)
	if got := before - tokenLevel(t, srv, "acme"); got != 900+4*3 {
		t.Errorf("acme charged %d weighted tokens, want %d", got, 900+4*3)
	}
}

// A client that asked for the usage event receives it, and the body goes
// on unchanged; a BUFFERED body gets its destination with the body's answer.
func TestExtProcBufferedChatWithClientUsage(t *testing.T) {
	srv, c := startGateway(t, nil)
	e := newEnvoy(t, c)
	e.requestHeaders(filterv3.ProcessingMode_BUFFERED, false, nil, ":path", "/v1/chat/completions", "x-llm-d-inference-fairness-id", "acme")
	if e.recv().GetRequestHeaders() == nil {
		t.Fatal("BUFFERED: the headers are answered at once")
	}
	body := `{"model":"large","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	e.requestBody(body, true)
	r := e.recv()
	cr := r.GetRequestBody().GetResponse()
	if cr == nil || string(cr.GetBodyMutation().GetBody()) != body || !cr.GetClearRouteCache() {
		t.Fatalf("BUFFERED body answer: %v", r)
	}
	client := e.respond("200", "text/event-stream", `data: {"choices":[{"delta":{"content":"x"}}]}`+"\n\n", sseUsage)
	if !strings.Contains(client, `"usage"`) {
		t.Errorf("the client asked for the usage event and did not get it: %q", client)
	}
	checkNoLeases(t, srv)
}

// A GET without a body is sent to an endpoint without admission; a JSON
// response's usage is charged.
func TestExtProcGetAndJSONUsage(t *testing.T) {
	srv, c := startGateway(t, nil)
	e := newEnvoy(t, c)
	e.requestHeaders(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, true, nil, ":path", "/v1/models", ":method", "GET")
	r := e.recv()
	if d := string(r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()[0].GetHeader().GetRawValue()); d != "10.0.0.1:8000" && d != "10.0.0.2:8000" {
		t.Errorf("GET routed to %q", d)
	}
	e.respond("200", "application/json", `{"data":[]}`)

	before := tokenLevel(t, srv, "acme")
	e = newEnvoy(t, c)
	e.requestHeaders(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, nil, ":path", "/v1/completions", "x-llm-d-inference-fairness-id", "acme")
	e.requestBody(`{"model":"llama-70b","prompt":"say hi","max_tokens":20}`, true)
	e.routed()
	e.respond("200", "application/json", `{"choices":[{"text":"hi"}],"usa`, `ge":{"prompt_tokens":7,"completion_tokens":2}}`)
	checkNoLeases(t, srv)
	if got := before - tokenLevel(t, srv, "acme"); got != 7+4*2 {
		t.Errorf("acme charged %d, want %d", got, 7+4*2)
	}
}

// A subset hint limits the endpoints: one in the domain is chosen; one
// naming no endpoint of Sluice's is 503 and charges nothing.
func TestExtProcSubsetHint(t *testing.T) {
	srv, c := startGateway(t, nil)
	body := `{"model":"llama-405b","messages":[{"role":"user","content":"hi"}]}`
	e := newEnvoy(t, c)
	e.requestHeaders(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, []string{"10.0.0.2:8000"}, ":path", "/v1/chat/completions", "x-llm-d-inference-fairness-id", "acme")
	e.requestBody(body, true)
	if dest, _, _ := e.routed(); dest != "10.0.0.2:8000" {
		t.Errorf("with the subset hint 10.0.0.2:8000: destination %q", dest)
	}
	e.respond("200", "application/json", `{"usage":{"prompt_tokens":5,"completion_tokens":1}}`)

	before := tokenLevel(t, srv, "acme")
	e = newEnvoy(t, c)
	e.requestHeaders(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, []string{"192.0.2.1:80"}, ":path", "/v1/chat/completions", "x-llm-d-inference-fairness-id", "acme")
	e.requestBody(body, true)
	ir := e.immediate()
	if ir.GetStatus().GetCode() != 503 || !strings.Contains(string(ir.GetBody()), `"code":"no_endpoint"`) {
		t.Errorf("no endpoint fits the subset: %v", ir)
	}
	if got := before - tokenLevel(t, srv, "acme"); got != 0 {
		t.Errorf("a request no endpoint could serve charged %d", got)
	}
	checkNoLeases(t, srv)
}

// Refusals: over quota 429 with retry-after in OpenAI's error shape;
// malformed JSON 400 naming the body; a body past the bound 413.
func TestExtProcRefusals(t *testing.T) {
	srv, c := startGateway(t, func(o *Options) { o.Gateway.Gateway.MaxBody = 64 << 10 })
	e := newEnvoy(t, c)
	e.requestHeaders(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, nil, ":path", "/v1/chat/completions", "x-llm-d-inference-fairness-id", "tiny")
	e.requestBody(`{"model":"large","max_tokens":2000,"messages":[{"role":"user","content":"hi"}]}`, true)
	ir := e.immediate()
	var eb struct {
		Error struct{ Message, Type, Code string } `json:"error"`
	}
	if err := json.Unmarshal(ir.GetBody(), &eb); err != nil {
		t.Fatalf("refusal body %s: %v", ir.GetBody(), err)
	}
	// 2000 output tokens weigh 8000, past tiny's burst of 3000: a
	// request too large ever to pass is 400; a smaller one over what is
	// left is 429 with retry-after.
	if ir.GetStatus().GetCode() != 400 || eb.Error.Code != "request_too_large" {
		t.Errorf("a request past the quota's burst: %d %s", ir.GetStatus().GetCode(), ir.GetBody())
	}
	for range 2 {
		e = newEnvoy(t, c)
		e.requestHeaders(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, nil, ":path", "/v1/chat/completions", "x-llm-d-inference-fairness-id", "tiny")
		e.requestBody(`{"model":"large","max_tokens":500,"messages":[{"role":"user","content":"hi"}]}`, true)
		r := e.recv()
		if ir = r.GetImmediateResponse(); ir != nil {
			break
		}
		e.recv() // the body
		e.respond("200", "application/json", `{"usage":{"prompt_tokens":10,"completion_tokens":500}}`)
	}
	if ir == nil || ir.GetStatus().GetCode() != 429 || immediateHeader(ir, "retry-after") == "" || immediateHeader(ir, "x-sluice-reason") != "QUOTA_EXCEEDED" {
		t.Fatalf("over quota: %v", ir)
	}
	if err := json.Unmarshal(ir.GetBody(), &eb); err != nil || eb.Error.Type != "rate_limit_exceeded" || eb.Error.Code != "quota_exceeded" {
		t.Errorf("429 body %s: %v", ir.GetBody(), err)
	}

	e = newEnvoy(t, c)
	e.requestHeaders(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, nil, ":path", "/v1/chat/completions", "x-llm-d-inference-fairness-id", "acme")
	e.requestBody(`{"model":"large","messages":[`, true)
	if ir := e.immediate(); ir.GetStatus().GetCode() != 400 || !strings.Contains(string(ir.GetBody()), `"param":"body"`) {
		t.Errorf("malformed JSON: %d %s", ir.GetStatus().GetCode(), ir.GetBody())
	}
	e = newEnvoy(t, c)
	e.requestHeaders(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, nil, ":path", "/v1/chat/completions", "x-llm-d-inference-fairness-id", "acme")
	e.requestBody(`{"model":"large","max_tokens":-1,"messages":[{"content":"x"}]}`, true)
	if ir := e.immediate(); ir.GetStatus().GetCode() != 400 || !strings.Contains(string(ir.GetBody()), `"param":"max_tokens"`) {
		t.Errorf("a bad field: %d %s", ir.GetStatus().GetCode(), ir.GetBody())
	}
	e = newEnvoy(t, c)
	e.requestHeaders(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, nil, ":path", "/v1/chat/completions", "x-llm-d-inference-fairness-id", "acme")
	e.requestBody(strings.Repeat("x", 40<<10), false)
	e.requestBody(strings.Repeat("x", 40<<10), false)
	if ir := e.immediate(); ir.GetStatus().GetCode() != 413 {
		t.Errorf("a body past the bound: %d %s", ir.GetStatus().GetCode(), ir.GetBody())
	}
	checkNoLeases(t, srv)
}

// A client that goes mid-stream, and an upstream 500, release their leases:
// the cancelled one charged the output seen, the failed one as an error.
func TestExtProcCancelAndUpstreamError(t *testing.T) {
	srv, c := startGateway(t, nil)
	body := `{"model":"large","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
	e := newEnvoy(t, c)
	e.requestHeaders(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, nil, ":path", "/v1/chat/completions", "x-llm-d-inference-fairness-id", "acme")
	e.requestBody(body, true)
	e.routed()
	e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(":status", "200", "content-type", "text/event-stream")}}})
	e.recv()
	e.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(`data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n")}}})
	e.recv()
	e.cancel()
	eventually(t, func() bool { return srv.Engine().LeaseCount() == 0 })

	e = newEnvoy(t, c)
	e.requestHeaders(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, nil, ":path", "/v1/chat/completions", "x-llm-d-inference-fairness-id", "acme")
	e.requestBody(body, true)
	e.routed()
	if got := e.respond("500", "application/json", `{"error":"boom"}`); got != `{"error":"boom"}` {
		t.Errorf("the upstream's error reaches the client as %q", got)
	}
	checkNoLeases(t, srv)
	m := get(t, srv, "/metrics")
	for _, want := range []string{`sluice_gateway_requests_total{outcome="client_cancel"} 1`, `sluice_gateway_requests_total{outcome="upstream_error"} 1`, `sluice_releases_total{outcome="error"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// A request waits in the fair queue while its stream is held, and is
// routed once capacity frees.
func TestExtProcQueueThenAdmit(t *testing.T) {
	clk := clock.NewManual(time.Now())
	srv, c := startGateway(t, func(o *Options) { o.Clock = clk })
	eng := srv.Engine()
	// Take the domain's capacity with leases from the router API, on a
	// clock that does not move, until one more would have to wait.
	var leases []uint64
	for {
		dec, err := eng.Admit(context.Background(), admission.Request{Tenant: "acme", Model: "large", PromptTokens: 1000, MaxOutputTokens: 1000, Deadline: clk.Now().Add(time.Nanosecond)})
		if err != nil {
			t.Fatal(err)
		}
		if dec.Outcome != admission.Admitted {
			break
		}
		leases = append(leases, dec.LeaseID)
	}
	e := newEnvoy(t, c)
	e.requestHeaders(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, nil, ":path", "/v1/chat/completions", "x-llm-d-inference-fairness-id", "acme", "x-sluice-deadline-ms", "60000")
	e.requestBody(`{"model":"large","max_tokens":1000,"messages":[{"role":"user","content":"`+strings.Repeat("word ", 1000)+`"}]}`, true)
	eventually(t, func() bool { return eng.QueueLen() == 1 })
	for _, id := range leases {
		if _, err := eng.Release(context.Background(), admission.Release{LeaseID: id, Outcome: admission.ReleaseOK}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(10 * time.Second) // the buckets refill; the next dispatch admits the request
	e.routed()
	e.respond("200", "application/json", `{"usage":{"prompt_tokens":5,"completion_tokens":1}}`)
	checkNoLeases(t, srv)
}

// fillLarge takes d1's capacity for the large model with leases from the
// router API, on a clock that does not move, until one more request of
// 1000 prompt and 1000 output tokens is refused; it returns the leases.
func fillLarge(t *testing.T, srv *Server, clk *clock.Manual) []uint64 {
	t.Helper()
	var leases []uint64
	for {
		dec, err := srv.Engine().Admit(context.Background(), admission.Request{Tenant: "acme", Model: "large", PromptTokens: 1000, MaxOutputTokens: 1000, Deadline: clk.Now().Add(time.Nanosecond)})
		if err != nil {
			t.Fatal(err)
		}
		if dec.Outcome != admission.Admitted {
			return leases
		}
		leases = append(leases, dec.LeaseID)
	}
}

// A request for large that accepts medium, arriving when large has no room
// left and with no time to wait for it, is DEGRADED: Envoy forwards the body
// with its model rewritten to medium's served name, to the engine serving
// medium, and the tenant is charged the usage the engine reports.
func TestExtProcDegradeRewritesTheBody(t *testing.T) {
	clk := clock.NewManual(time.Now())
	srv, c := startGateway(t, func(o *Options) { o.Clock = clk })
	leases := fillLarge(t, srv, clk)
	before := tokenLevel(t, srv, "acme")
	e := newEnvoy(t, c)
	e.requestHeaders(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, nil, ":path", "/v1/chat/completions", "x-llm-d-inference-fairness-id", "acme",
		"x-sluice-accept-downgrade", "llama-70b", "x-sluice-deadline-ms", "50")
	body := `{"model":"llama-405b","max_tokens":100,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 1000) + `"}]}`
	e.requestBody(body[:3000], false)
	e.requestBody(body[3000:], true)
	dest, set, fwd := e.routed()
	if dest != "10.0.0.2:8000" || set["x-sluice-model"] != "medium" {
		t.Errorf("degraded: destination %q, headers %v; want 10.0.0.2:8000, the engine serving medium", dest, set)
	}
	if want := strings.Replace(body, `"model":"llama-405b"`, `"model":"llama-70b"`, 1); fwd != want {
		t.Errorf("the body forwarded:\n%.120s\nwant:\n%.120s", fwd, want)
	}
	if got := e.respond("200", "application/json", `{"model":"llama-70b","choices":[{"message":{"content":"ok"}}],`, `"usage":{"prompt_tokens":1300,"completion_tokens":40}}`); !strings.HasSuffix(got, `"completion_tokens":40}}`) {
		t.Errorf("the client receives %q", got)
	}
	// The clock stands still: acme's tokens moved by the usage reported,
	// 1300 + 4 × 40 weighted tokens, charged at medium's rate against
	// large (70B over 405B active parameters), rounded up: 253.
	if got, want := before-tokenLevel(t, srv, "acme"), int64(math.Ceil((1300+4*40)*70.0/405)); got != want {
		t.Errorf("acme charged %d weighted tokens for the degraded request, want %d", got, want)
	}
	if n := srv.Engine().LeaseCount(); n != len(leases) {
		t.Errorf("%d leases held after the exchange, want the fill's %d", n, len(leases))
	}
	for _, id := range leases {
		if _, err := srv.Engine().Release(context.Background(), admission.Release{LeaseID: id, Outcome: admission.ReleaseOK}); err != nil {
			t.Fatal(err)
		}
	}
	checkNoLeases(t, srv)
	if m := get(t, srv, "/metrics"); !strings.Contains(m, `sluice_decisions_total{decision="DEGRADED",reason="REASON_UNSPECIFIED"} 1`) {
		t.Error("/metrics counts no DEGRADED decision")
	}
}

// sluiced serves ext_proc's health.
func TestExtProcHealth(t *testing.T) {
	srv, _ := startGateway(t, nil)
	conn := grpctest.Dial(t, srv.GRPCAddr().String())
	h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: extproc.ServiceName})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health of %s: %v, %v", extproc.ServiceName, h, err)
	}
}
