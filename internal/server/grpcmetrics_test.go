package server

import (
	"io"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// An ext_proc stream is one call started and handled OK, and each message
// it receives or sends is counted once; the end of the client's stream is
// no message.
func TestGRPCMetricsCountStreamMessages(t *testing.T) {
	srv, c := startGateway(t, nil)
	e := newEnvoy(t, c)
	e.requestHeaders(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, nil, ":path", "/v1/chat/completions", ":method", "POST", "x-llm-d-inference-fairness-id", "acme")
	e.requestBody(`{"model":"llama-405b","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"`+strings.Repeat("hi ", 50)+`"}]}`, true)
	e.routed() // the headers' answer and the body's
	e.respond("200", "text/event-stream", `data: {"id":"c","choices":[{"delta":{"content":"a"}}]}`+"\n\n", sseUsage+"data: [DONE]\n\n")
	if err := e.stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.stream.Recv(); err != io.EOF {
		t.Fatalf("after the exchange: %v, want the end of the stream", err)
	}
	fams := scrape(t, srv)
	process := map[string]string{"grpc_service": "envoy.service.ext_proc.v3.ExternalProcessor", "grpc_method": "Process", "grpc_type": "bidi_stream"}
	for _, c := range []struct {
		name string
		code string
		want float64
	}{
		{"grpc_server_started_total", "", 1},
		{"grpc_server_handled_total", "OK", 1},
		{"grpc_server_msg_received_total", "", 5}, // request headers and body, response headers and two chunks
		{"grpc_server_msg_sent_total", "", 5},     // their answers
	} {
		labels := map[string]string{}
		for k, v := range process {
			labels[k] = v
		}
		if c.code != "" {
			labels["grpc_code"] = c.code
		}
		if got := value(t, fams, c.name, labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, labels, got, c.want)
		}
	}
}
