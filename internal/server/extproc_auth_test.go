package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-sched/sluice/admission/client"
	"github.com/sluice-sched/sluice/internal/auth/authtest"
	"github.com/sluice-sched/sluice/internal/extproc"
)

// The principals of the ext_proc auth test: a gateway, routers bound to
// one tenant and to every tenant, and a viewer.
const extProcAuthFile = `
principals:
  - name: envoy
    token_sha256: "%s"
    roles: [gateway]
  - name: router-acme
    token_sha256: "%s"
    roles: [router]
    tenants: [acme]
  - name: router-all
    mtls_san: "spiffe://test/router-all"
    roles: [router]
    tenants: ["*"]
  - name: viewer
    token_sha256: "%s"
    roles: [viewer]
`

// Under --auth only the gateway role may call ext_proc's Process: the
// gateway's stream is routed and charged to the tenant its header names
// (the gateway is trusted with every tenant); a router, even one bound to
// every tenant, and a viewer are refused PERMISSION_DENIED, a caller
// without credentials UNAUTHENTICATED, and none of them is charged.
func TestExtProcUnderAuth(t *testing.T) {
	f := startSecure(t, func(o *Options) {
		dir := t.TempDir()
		o.Security.AuthFile = filepath.Join(dir, "auth.yaml")
		authtest.WriteFile(t, o.Security.AuthFile, fmt.Appendf(nil, extProcAuthFile,
			authtest.TokenSHA256("envoy-token"), authtest.TokenSHA256("router-acme-token"), authtest.TokenSHA256("viewer-token")))
		o.Topology = filepath.Join(dir, "topology.yaml")
		// One large domain: the default config's floors need more than
		// gatewayTopology's one node.
		if err := os.WriteFile(o.Topology, []byte(benchGatewayTopology), 0o600); err != nil {
			t.Fatal(err)
		}
	})
	eng := f.srv.Engine()
	const body = `{"model":"large","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	// exchange sends a chat request for globex's tenant on a stream of
	// caller's, and returns the first answer or the stream's error.
	exchange := func(sec client.Security) (*extprocv3.ProcessingResponse, *envoy, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t.Cleanup(cancel)
		s, err := extprocv3.NewExternalProcessorClient(f.dial(t, sec)).Process(ctx)
		if err != nil {
			return nil, nil, err
		}
		// A refused stream may end before the messages go: Send then
		// fails with io.EOF, and Recv reads the refusal.
		_ = s.Send(&extprocv3.ProcessingRequest{
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: headerMap(":path", "/v1/chat/completions", "x-llm-d-inference-fairness-id", "globex")}},
		})
		_ = s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}})
		r, err := s.Recv()
		return r, &envoy{t: t, stream: s, cancel: cancel}, err
	}

	for _, c := range []struct {
		caller string
		sec    client.Security
		want   codes.Code
	}{
		{"router-acme", client.Security{CAFile: f.ca.File, Token: "router-acme-token"}, codes.PermissionDenied},
		{"router-all", f.caller("router-all"), codes.PermissionDenied},
		{"viewer", client.Security{CAFile: f.ca.File, Token: "viewer-token"}, codes.PermissionDenied},
		{"anonymous", f.caller("anonymous"), codes.Unauthenticated},
		{"bad-token", f.caller("bad-token"), codes.Unauthenticated},
	} {
		before, _ := eng.Tenant("globex")
		r, _, err := exchange(c.sec)
		if status.Code(err) != c.want {
			t.Errorf("%s → ext_proc Process: %v (answer %v), want %v", c.caller, err, r, c.want)
		}
		if after, _ := eng.Tenant("globex"); after.InFlight != before.InFlight || after.TokenLevel < before.TokenLevel {
			t.Errorf("%s's refused stream charged globex: in flight %d → %d, tokens %d → %d", c.caller, before.InFlight, after.InFlight, before.TokenLevel, after.TokenLevel)
		}
	}
	if n := eng.LeaseCount(); n != 0 {
		t.Fatalf("%d leases after the refused streams", n)
	}

	r, e, err := exchange(client.Security{CAFile: f.ca.File, Token: "envoy-token"})
	if err != nil {
		t.Fatalf("the gateway's stream: %v", err)
	}
	set := map[string]string{}
	for _, o := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		set[o.GetHeader().GetKey()] = string(o.GetHeader().GetRawValue())
	}
	if d := set[extproc.DestinationHeader]; d != "10.0.0.1:8000" && d != "10.0.0.2:8000" {
		t.Fatalf("the gateway's request is not routed: %v", r)
	}
	if g, _ := eng.Tenant("globex"); g.InFlight != 1 {
		t.Errorf("the gateway's request for globex: globex has %d in flight, want 1", g.InFlight)
	}
	e.recv() // the body
	e.respond("200", "application/json", `{"usage":{"prompt_tokens":20,"completion_tokens":5}}`)
	if g, _ := eng.Tenant("globex"); g.InFlight != 0 || eng.LeaseCount() != 0 {
		t.Errorf("after the response: globex has %d in flight, %d leases held", g.InFlight, eng.LeaseCount())
	}
}
