package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/sluice-sched/sluice/internal/extproc"
	"github.com/sluice-sched/sluice/internal/grpctest"
	"github.com/sluice-sched/sluice/internal/load"
	"github.com/sluice-sched/sluice/pd"
)

// noopProcessor is the do-nothing ext_proc server the exchange is measured
// against: every message is answered at once with an empty CONTINUE of the
// matching kind.
type noopProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
}

// Process implements extprocv3.ExternalProcessorServer.
func (noopProcessor) Process(ps extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := ps.Recv()
		if err != nil {
			return nil
		}
		var resp extprocv3.ProcessingResponse
		switch req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			resp.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}
		case *extprocv3.ProcessingRequest_RequestBody:
			resp.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			resp.Response = &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			resp.Response = &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}
		case *extprocv3.ProcessingRequest_ResponseBody:
			resp.Response = &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			resp.Response = &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}
		}
		if err := ps.Send(&resp); err != nil {
			return nil
		}
	}
}

// echoProcessor answers as FULL_DUPLEX_STREAMED requires of any processor
// that routes on the body, with no decision behind it: the request's
// headers answered once its body is whole, with a destination, and every
// body chunk echoed. It bounds what Sluice can reach on the same machine.
type echoProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
}

// Process implements extprocv3.ExternalProcessorServer.
func (echoProcessor) Process(ps extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := ps.Recv()
		if err != nil {
			return nil
		}
		var out []*extprocv3.ProcessingResponse
		switch r := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			if r.RequestHeaders.GetEndOfStream() {
				out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}})
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			if r.RequestBody.GetEndOfStream() {
				out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
					HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: extproc.DestinationHeader, RawValue: []byte("10.0.0.2:8000")}}}},
					ClearRouteCache: true}}}})
			}
			out = append(out, echoedBody(r.RequestBody, true))
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
		case *extprocv3.ProcessingRequest_ResponseBody:
			out = append(out, echoedBody(r.ResponseBody, false))
		}
		for _, resp := range out {
			if err := ps.Send(resp); err != nil {
				return nil
			}
		}
	}
}

func echoedBody(b *extprocv3.HttpBody, request bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b.GetBody(), EndOfStream: b.GetEndOfStream()}},
	}}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

// startProcessor serves p on loopback with gRPC's defaults and dials it;
// both stop when the benchmark ends.
func startProcessor(b *testing.B, p extprocv3.ExternalProcessorServer) extprocv3.ExternalProcessorClient {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(s, p)
	go func() { _ = s.Serve(lis) }()
	b.Cleanup(s.Stop)
	return extprocv3.NewExternalProcessorClient(grpctest.Dial(b, lis.Addr().String()))
}

// benchGatewayConfig has one tenant whose quotas never bind and the
// default models under served names, so that every exchange is admitted
// at once and released at its end.
func benchGatewayConfig(b *testing.B) string {
	models := pd.DefaultModels()
	for i := range models {
		models[i].ServedNames = []string{"llama-" + models[i].Name}
	}
	quota := map[string]any{"rps": map[string]any{"rate": 1e9, "burst": 1e9}, "tokens": map[string]any{"rate": 1e12, "burst": 1e12},
		"max_concurrency": 1_000_000, "weight": 1}
	raw, err := json.Marshal(map[string]any{
		"tiers": map[string]any{"bench": quota}, "tenants": map[string]any{"router": map[string]any{"tier": "bench"}}, "models": models,
	})
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "config.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		b.Fatal(err)
	}
	return path
}

// benchGatewayTopology is one domain of 100 HGX nodes whose engines serve
// every model: at the exchanges' rate a smaller domain's prefill rate
// binds, and requests would wait in the queue for the modelled hardware,
// not for Sluice.
const benchGatewayTopology = `
domains:
  - id: d1
    kind: hgx
    gpu: H200
    gpus_per_node: 8
    nodes: 100
    engines:
      - {metrics: "http://127.0.0.1:9/metrics", kind: vllm, address: "10.0.0.1:8000"}
      - {metrics: "http://127.0.0.1:9/metrics2", kind: vllm, address: "10.0.0.2:8000"}
`

// startGatewayBench serves sluiced on benchGatewayTopology and dials its
// ext_proc service; both stop when the benchmark ends.
func startGatewayBench(b *testing.B) (*Server, extprocv3.ExternalProcessorClient) {
	topo := filepath.Join(b.TempDir(), "topology.yaml")
	if err := os.WriteFile(topo, []byte(benchGatewayTopology), 0o600); err != nil {
		b.Fatal(err)
	}
	srv, err := New(Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ConfigPath: benchGatewayConfig(b), Topology: topo,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	return srv, extprocv3.NewExternalProcessorClient(grpctest.Dial(b, srv.GRPCAddr().String()))
}

// benchExchange is the messages of one exchange as Envoy streams them: the
// request's headers, a 4 KB streamed chat body in one chunk, the
// response's headers and 20 SSE chunks, the last with the usage event.
type benchExchange struct {
	reqHeaders, reqBody, respHeaders *extprocv3.ProcessingRequest
	respBody                         []*extprocv3.ProcessingRequest
}

func newBenchExchange() *benchExchange {
	content := strings.Repeat("word ", 800)
	body := `{"model":"llama-small","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"` + content + `"}]}`
	for len(body) < 4096 {
		body = strings.Replace(body, `"content":"`, `"content":"x`, 1)
	}
	x := &benchExchange{
		reqHeaders: &extprocv3.ProcessingRequest{
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(
				":path", "/v1/chat/completions", ":method", "POST", ":authority", "gateway", "content-type", "application/json",
				"content-length", fmt.Sprint(len(body)), "x-llm-d-inference-fairness-id", "router")}},
		},
		reqBody: &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}},
		respHeaders: &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(":status", "200", "content-type", "text/event-stream")}}},
	}
	for i := range 20 {
		chunk := fmt.Sprintf(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok%d"}}]}`+"\n\n", i)
		if i == 19 {
			chunk += `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":19}}` + "\n\n" + "data: [DONE]\n\n"
		}
		x.respBody = append(x.respBody, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(chunk), EndOfStream: i == 19}}})
	}
	return x
}

// run plays one exchange on a new stream of c, as Envoy does: the request
// is sent whole and its answers read up to the body's; then each response
// message is sent and its answer read before the next.
func (x *benchExchange) run(ctx context.Context, c extprocv3.ExternalProcessorClient) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.Process(ctx)
	if err != nil {
		return err
	}
	if err := s.Send(x.reqHeaders); err != nil {
		return err
	}
	if err := s.Send(x.reqBody); err != nil {
		return err
	}
	for {
		r, err := s.Recv()
		if err != nil {
			return err
		}
		if r.GetImmediateResponse() != nil {
			return fmt.Errorf("refused: %v", r.GetImmediateResponse())
		}
		if r.GetRequestBody() != nil {
			break
		}
	}
	for _, m := range append([]*extprocv3.ProcessingRequest{x.respHeaders}, x.respBody...) {
		if err := s.Send(m); err != nil {
			return err
		}
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	if _, err := s.Recv(); err != io.EOF {
		return fmt.Errorf("after the exchange: %v, want the end of the stream", err)
	}
	return nil
}

// BenchmarkExtProcExchange compares one ext_proc exchange through sluiced
// (admitted, routed, the body rewritten to ask for the usage, the SSE
// stream read and the usage event kept from the client, released) with the
// same exchange through a do-nothing ext_proc server, from the same client
// code at the same concurrency over loopback. Report
// ns/op(noop) / ns/op(sluice) (target ≥ 0.8), and the same of cpu-ns/op.
// The echo case is the protocol's floor (echoProcessor), no target of its
// own: noop / echo bounds what any processor that routes on the body
// reaches here.
// Sub-benchmarks run their -count in a row, so alternate whole runs:
//
//	go test -c -o /tmp/server.test ./internal/server/ && cd internal/server &&
//	  for i in 1 2 3 4 5 6; do /tmp/server.test -test.run '^$' -test.bench BenchmarkExtProcExchange -test.benchtime 3000x; done
func BenchmarkExtProcExchange(b *testing.B) {
	x := newBenchExchange()
	srv, sluice := startGatewayBench(b)
	noop, echo := startProcessor(b, noopProcessor{}), startProcessor(b, echoProcessor{})
	ctx := context.Background()
	run := func(c extprocv3.ExternalProcessorClient) func(*testing.B) {
		return func(b *testing.B) {
			b.SetParallelism(benchParallelism)
			b.ReportAllocs()
			startCPU := load.ProcessCPU()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := x.run(ctx, c); err != nil {
						b.Error(err)
						return
					}
				}
			})
			// This process's CPU (client and server together) moves less
			// than the wall time when other work shares the machine.
			b.ReportMetric(float64((load.ProcessCPU()-startCPU).Nanoseconds())/float64(b.N), "cpu-ns/op")
		}
	}
	b.Run("noop", run(noop))
	b.Run("sluice", run(sluice))
	b.Run("echo", run(echo))
	if n := srv.Engine().LeaseCount(); n != 0 {
		b.Errorf("%d leases held after the exchanges", n)
	}
}
