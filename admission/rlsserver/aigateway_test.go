package rlsserver

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"
)

// aiGatewayNamespace is the dynamic metadata namespace AI Gateway writes
// its llmRequestCosts to.
const aiGatewayNamespace = "io.envoy.ai_gateway"

// loadAIGatewayConfig parses deploy/envoy/envoy-ai-gateway.yaml: every
// xDS fragment its EnvoyPatchPolicy adds as Envoy would read it (strictly,
// every typed config resolved) and held to Envoy's validation rules. It
// returns the rate-limit filter's config and AI Gateway's cost metadata
// keys by type (InputToken, OutputToken).
func loadAIGatewayConfig(t *testing.T) (*ratelimitfilterv3.RateLimit, map[string]string) {
	t.Helper()
	data, err := os.ReadFile("../../deploy/envoy/envoy-ai-gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	costs := map[string]string{}
	var filter *ratelimitfilterv3.RateLimit
	var cluster *clusterv3.Cluster
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		var obj map[string]any
		if err := yaml.UnmarshalStrict([]byte(doc), &obj); err != nil {
			t.Fatalf("envoy-ai-gateway.yaml: %v", err)
		}
		spec, _ := obj["spec"].(map[string]any)
		switch obj["kind"] {
		case "AIGatewayRoute":
			for _, c := range spec["llmRequestCosts"].([]any) {
				c := c.(map[string]any)
				costs[c["type"].(string)] = c["metadataKey"].(string)
			}
		case "EnvoyPatchPolicy":
			for _, p := range spec["jsonPatches"].([]any) {
				p := p.(map[string]any)
				value := p["operation"].(map[string]any)["value"]
				switch p["type"] {
				case "type.googleapis.com/envoy.config.cluster.v3.Cluster":
					cluster = new(clusterv3.Cluster)
					unmarshalXDS(t, value, cluster)
				case "type.googleapis.com/envoy.config.listener.v3.Listener":
					var hf hcmv3.HttpFilter
					unmarshalXDS(t, value, &hf)
					filter = new(ratelimitfilterv3.RateLimit)
					if err := hf.GetTypedConfig().UnmarshalTo(filter); err != nil {
						t.Fatal(err)
					}
					if err := filter.ValidateAll(); err != nil {
						t.Fatal(err)
					}
				default:
					t.Fatalf("a patch this test does not model: %v", p["type"])
				}
			}
		}
	}
	if filter == nil || cluster == nil || filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName() != cluster.GetName() {
		t.Fatalf("the patch adds no rate-limit filter (%v) pointed at the cluster it adds (%v)", filter, cluster)
	}
	return filter, costs
}

// unmarshalXDS reads a YAML fragment as the xDS message m and runs Envoy's
// validation rules on it.
func unmarshalXDS(t *testing.T, v any, m interface {
	proto.Message
	ValidateAll() error
}) {
	t.Helper()
	js, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(js, m); err != nil {
		t.Fatalf("%T: %v", m, err)
	}
	if err := m.ValidateAll(); err != nil {
		t.Fatalf("%T breaks Envoy's validation rules: %v", m, err)
	}
}

// dynamicMetadataFormat is the one substitution a hits_addend format may
// hold that the config uses: %DYNAMIC_METADATA(namespace:key)%.
var dynamicMetadataFormat = regexp.MustCompile(`^%DYNAMIC_METADATA\(([^:]+):([^)]+)\)%$`)

// envoyDescriptors composes the descriptors Envoy's rate-limit filter sends
// for the rate limits of one phase (streamDone: those applied when the
// stream completes) from the request's headers and AI Gateway's dynamic
// metadata (namespace io.envoy.ai_gateway): an absent header drops the
// descriptor unless skip_if_absent, and a hits_addend format that does not
// resolve to a number drops it too.
func envoyDescriptors(t *testing.T, filter *ratelimitfilterv3.RateLimit, streamDone bool, hdrs map[string]string, meta map[string]uint64) []*ratelimitv3.RateLimitDescriptor {
	t.Helper()
	var out []*ratelimitv3.RateLimitDescriptor
next:
	for _, rl := range filter.GetRateLimits() {
		if rl.GetApplyOnStreamDone() != streamDone {
			continue
		}
		d := &ratelimitv3.RateLimitDescriptor{}
		for _, a := range rl.GetActions() {
			switch spec := a.GetActionSpecifier().(type) {
			case *routev3.RateLimit_Action_RequestHeaders_:
				rh := spec.RequestHeaders
				v, ok := hdrs[rh.GetHeaderName()]
				switch {
				case ok:
					d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: rh.GetDescriptorKey(), Value: v})
				case !rh.GetSkipIfAbsent():
					continue next
				}
			case *routev3.RateLimit_Action_GenericKey_:
				d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: spec.GenericKey.GetDescriptorKey(), Value: spec.GenericKey.GetDescriptorValue()})
			default:
				t.Fatalf("an action this test does not model: %v", a)
			}
		}
		switch h := rl.GetHitsAddend(); {
		case h.GetNumber() != nil:
			d.HitsAddend = wrapperspb.UInt64(h.GetNumber().GetValue())
		case h.GetFormat() != "":
			m := dynamicMetadataFormat.FindStringSubmatch(h.GetFormat())
			if m == nil || m[1] != aiGatewayNamespace {
				t.Fatalf("a hits_addend format this test does not model: %q", h.GetFormat())
			}
			n, ok := meta[m[2]]
			if !ok {
				continue next
			}
			d.HitsAddend = wrapperspb.UInt64(n)
		}
		out = append(out, d)
	}
	return out
}

// deploy/envoy/envoy-ai-gateway.yaml drives Sluice in Envoy AI Gateway's
// own pattern: a check with hits_addend 0 on the request path charges
// nothing; the call at stream done settles the usage AI Gateway read from
// the response, prompt and output, and is never refused, even once the
// tenant is over its limit; the debt then makes the check OVER_LIMIT with
// the exact wait until it is repaid, and OK again after it.
func TestEnvoyAIGatewayPattern(t *testing.T) {
	filter, costs := loadAIGatewayConfig(t)
	if filter.GetDomain() != "sluice" || !filter.GetFailureModeDeny() {
		t.Errorf("rate-limit filter: domain %q, failure_mode_deny %v", filter.GetDomain(), filter.GetFailureModeDeny())
	}
	f := newFixture(t, meteredConfig(), hgxCluster(t, 1), Options{Domain: filter.GetDomain(), DefaultModel: "large"})
	send := func(streamDone bool, hdrs map[string]string, meta map[string]uint64) *rlsv3.RateLimitResponse {
		t.Helper()
		descs := envoyDescriptors(t, filter, streamDone, hdrs, meta)
		if len(descs) == 0 {
			t.Fatalf("no descriptors (stream done %v) for %v, %v", streamDone, hdrs, meta)
		}
		resp, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: filter.GetDomain(), Descriptors: descs})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return resp
	}
	// At the check AI Gateway has not read the model yet; at stream done it has.
	request := map[string]string{"x-user-id": "acme"}
	served := map[string]string{"x-user-id": "acme", "x-ai-eg-model": "large"}
	usage := func(prompt, output uint64) map[string]uint64 {
		return map[string]uint64{costs["InputToken"]: prompt, costs["OutputToken"]: output}
	}
	level := func() int64 { t.Helper(); return f.tenant(t, "acme").TokenLevel }

	resp := send(false, request, nil)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 10000 {
		t.Fatalf("check within the limit: %v", resp)
	}
	if h := headers(t, resp); h[HeaderDomain] != "" || h[HeaderRateLimit] != `"tokens";r=10000;t=0` {
		t.Errorf("a check places nothing and shows the quota as it stands: %v", h)
	}
	if got := level(); got != 10000 {
		t.Fatalf("acme's tokens after a check = %d, want 10000 (nothing charged)", got)
	}

	// 3000 prompt + 4 × 500 output = 5000 weighted tokens.
	if resp := send(true, served, usage(3000, 500)); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("settling: %v", resp)
	}
	if got := level(); got != 5000 {
		t.Fatalf("acme's tokens after 3000 + 4 × 500 used = %d, want 5000", got)
	}
	// A response far past what is left is settled all the same: 10000 more.
	resp = send(true, served, usage(6000, 1000))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("settling past the limit: %v", resp)
	}
	for _, st := range resp.GetStatuses() {
		if st.GetCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("a settling status is %v", st)
		}
	}
	if got := level(); got != -5000 {
		t.Fatalf("acme's tokens after going over = %d, want -5000 (a debt)", got)
	}

	// Over its limit: the check refuses until the debt is repaid and the
	// cheapest request (5 weighted tokens) fits: 5005 tokens at 1000/s.
	resp = send(false, request, nil)
	st := resp.GetStatuses()[0]
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetDurationUntilReset().AsDuration() != 5005*time.Millisecond {
		t.Fatalf("check over the limit: %v, want OVER_LIMIT for 5.005s", resp)
	}
	if h := headers(t, resp); h[HeaderReason] != "QUOTA_EXCEEDED" || h[HeaderRetryAfter] != "6" {
		t.Errorf("over the limit: headers %v", h)
	}
	if got := level(); got != -5000 {
		t.Fatalf("acme's tokens after a refused check = %d, want -5000", got)
	}
	f.clk.Advance(5005*time.Millisecond - time.Nanosecond)
	if resp := send(false, request, nil); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("1ns before the reset: %v", resp)
	}
	f.clk.Advance(time.Nanosecond)
	if resp := send(false, request, nil); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("at the reset: %v", resp)
	}
	// A stream that ended before AI Gateway read any usage resolves no
	// hits_addend: Envoy drops those descriptors and charges nothing.
	if d := envoyDescriptors(t, filter, true, served, nil); len(d) != 0 {
		t.Errorf("stream done without usage: %v", d)
	}
	// Without x-user-id there is no descriptor, and the route does not
	// match either (AIGatewayRoute requires the header).
	if d := envoyDescriptors(t, filter, false, map[string]string{"x-ai-eg-model": "large"}, nil); len(d) != 0 {
		t.Errorf("descriptors without x-user-id: %v", d)
	}
	f.idle(t)
	if !strings.HasPrefix(costs["InputToken"], "llm_") || !strings.HasPrefix(costs["OutputToken"], "llm_") {
		t.Errorf("AIGatewayRoute's llmRequestCosts: %v", costs)
	}
}
