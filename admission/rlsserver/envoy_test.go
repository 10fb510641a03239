package rlsserver

import (
	"context"
	"os"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // resolves the Any in envoy.yaml
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3" // resolves the Any in envoy.yaml
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/sluice-sched/sluice/admission"
)

// loadEnvoyConfig parses deploy/envoy/envoy.yaml as Envoy would (strictly,
// every typed config resolved) and runs Envoy's own validation rules on it.
// It returns the rate-limit filter and the route that carries the
// descriptor actions.
func loadEnvoyConfig(t *testing.T) (*ratelimitfilterv3.RateLimit, *routev3.Route) {
	t.Helper()
	data, err := os.ReadFile("../../deploy/envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	var boot bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &boot); err != nil {
		t.Fatalf("envoy.yaml is not a valid bootstrap: %v", err)
	}
	if err := boot.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml breaks Envoy's validation rules: %v", err)
	}
	var filter *ratelimitfilterv3.RateLimit
	var route *routev3.Route
	for _, l := range boot.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, nf := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if err := nf.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					t.Fatal(err)
				}
				if err := hcm.ValidateAll(); err != nil {
					t.Fatal(err)
				}
				for _, hf := range hcm.GetHttpFilters() {
					if hf.GetName() == "envoy.filters.http.ratelimit" {
						filter = new(ratelimitfilterv3.RateLimit)
						if err := hf.GetTypedConfig().UnmarshalTo(filter); err != nil {
							t.Fatal(err)
						}
						if err := filter.ValidateAll(); err != nil {
							t.Fatal(err)
						}
					}
				}
				for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
					for _, r := range vh.GetRoutes() {
						if len(r.GetRoute().GetRateLimits()) > 0 {
							route = r
						}
					}
				}
			}
		}
	}
	if filter == nil || route == nil {
		t.Fatalf("no rate-limit filter (%v) or no route with rate limits (%v)", filter, route)
	}
	return filter, route
}

// descriptorsFor composes the descriptors Envoy's request_headers actions
// make from a request's headers: an absent header drops the descriptor,
// unless skip_if_absent, which drops only its entry.
func descriptorsFor(t *testing.T, route *routev3.Route, hdrs map[string]string) []*ratelimitv3.RateLimitDescriptor {
	t.Helper()
	var out []*ratelimitv3.RateLimitDescriptor
next:
	for _, rl := range route.GetRoute().GetRateLimits() {
		d := &ratelimitv3.RateLimitDescriptor{}
		for _, a := range rl.GetActions() {
			rh := a.GetRequestHeaders()
			if rh == nil {
				t.Fatalf("an action this test does not model: %v", a)
			}
			v, ok := hdrs[rh.GetHeaderName()]
			switch {
			case ok:
				d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: rh.GetDescriptorKey(), Value: v})
			case !rh.GetSkipIfAbsent():
				continue next
			}
		}
		out = append(out, d)
	}
	return out
}

// deploy/envoy/envoy.yaml is a configuration Envoy accepts, pointed at
// sluiced's gRPC port, failing closed, and its descriptors are what this
// service reads with its default keys: the tenant and model from headers
// decide, and a downgrade reaches the headers.
func TestEnvoyConfig(t *testing.T) {
	filter, route := loadEnvoyConfig(t)
	if filter.GetDomain() != "sluice" || !filter.GetFailureModeDeny() ||
		filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName() != "sluice" {
		t.Errorf("rate-limit filter: %v", filter)
	}
	headroom := 0.5
	cfg := admission.Config{
		DegradeHeadroom: &headroom,
		Tiers: map[string]admission.TierPolicy{
			"gold":   {RPS: big, Tokens: big, Weight: 4},
			"bronze": {RPS: big, Tokens: admission.Limit{Rate: 1000, Burst: 10000}, Weight: 1},
		},
		Tenants: map[string]admission.TenantConfig{"a": {Tier: "gold"}, "b": {Tier: "bronze"}},
	}
	f := newFixture(t, cfg, hgxCluster(t, 1), Options{Domain: filter.GetDomain(), DefaultModel: "large"})
	ask := func(hdrs map[string]string) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: filter.GetDomain(), Descriptors: descriptorsFor(t, route, hdrs)})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// Only x-tenant: the default model, one hit (the cheapest request).
	if resp := ask(map[string]string{"x-tenant": "b"}); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || headers(t, resp)[HeaderModel] != "large" {
		t.Errorf("x-tenant alone: %v", resp)
	}
	if lvl := f.tenant(t, "b").TokenLevel; lvl != 10000-5 {
		t.Errorf("b's tokens = %d, want %d", lvl, 10000-5)
	}
	for range 5 {
		ask(map[string]string{"x-tenant": "a", "x-model": "large", "x-prompt-tokens": "1000"})
	}
	resp := ask(map[string]string{"x-tenant": "b", "x-model": "large", "x-prompt-tokens": "1000", "x-max-output-tokens": "1", "x-accept-downgrade": "medium"})
	if h := headers(t, resp); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || h[HeaderModel] != "medium" || h[HeaderDowngrade] != "large>medium" {
		t.Errorf("downgrade through envoy.yaml's actions: %v", resp)
	}
	// No x-tenant: the route answers 401 itself; were the call made, its
	// descriptor would carry no tenant.
	if d := descriptorsFor(t, route, map[string]string{"x-model": "large"}); len(d) != 0 {
		t.Errorf("descriptors without x-tenant: %v", d)
	}
	f.idle(t)
}
