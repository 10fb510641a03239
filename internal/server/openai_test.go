package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/internal/gateway"
)

// The front streams a chat completion over HTTP/1.1 and over h2c (HTTP/2
// with prior knowledge), the [DONE] event last, and names the domain.
func TestOpenAIFrontStreamsOverHTTP1AndH2C(t *testing.T) {
	srv, _ := startOpenAISim(t, false)
	url := "http://" + srv.OpenAIAddr().String() + "/v1/chat/completions"
	h2c := &http.Transport{Protocols: new(http.Protocols)}
	h2c.Protocols.SetUnencryptedHTTP2(true)
	for _, tc := range []struct {
		name  string
		rt    http.RoundTripper
		major int
	}{{"http/1.1", &http.Transport{}, 1}, {"h2c", h2c, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(context.Background(), "POST", url,
				strings.NewReader(`{"model":"llama-405b","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"hello"}]}`))
			req.Header.Set(gateway.DefaultTenantHeader, "acme")
			resp, err := (&http.Client{Transport: tc.rt}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 200 || resp.ProtoMajor != tc.major || resp.Header.Get("X-Sluice-Domain") != "d1" ||
				!strings.HasSuffix(string(body), "data: [DONE]\n\n") || strings.Contains(string(body), `"usage":{`) {
				t.Fatalf("%s %d domain %q:\n%s", resp.Proto, resp.StatusCode, resp.Header.Get("X-Sluice-Domain"), body)
			}
		})
	}
	if n := srv.Engine().LeaseCount(); n != 0 {
		t.Fatalf("%d leases left", n)
	}
}

// Without an auth file the front serves loopback only, as the other ports
// do: a wider address is refused at start unless --insecure.
func TestOpenAIFrontBeyondLoopbackNeedsAuth(t *testing.T) {
	_, err := New(Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Gateway: GatewayOptions{OpenAIAddr: "0.0.0.0:0"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil || !strings.Contains(err.Error(), "--openai-addr") || !strings.Contains(err.Error(), "--auth") {
		t.Fatalf("New: %v, want a refusal naming --openai-addr and --auth", err)
	}
}
