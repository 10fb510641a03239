package rlsserver

import (
	"context"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/clock"
)

// FuzzShouldRateLimit sends arbitrary descriptors to the handler over the
// real engine: no input panics, an error is only INVALID_ARGUMENT, an
// answer has one status per descriptor and an overall OK or OVER_LIMIT, and
// no lease is ever left behind.
//
//	go test -run '^$' -fuzz FuzzShouldRateLimit ./admission/rlsserver/
func FuzzShouldRateLimit(f *testing.F) {
	f.Add("", "tenant", "acme", "model", "small", "prompt_tokens", "10", uint32(0), uint64(0), false, false)
	f.Add("sluice", "tenant", "acme", "max_output_tokens", "3", "accept_downgrade", "medium,,small", uint32(40), uint64(7), true, false)
	f.Add("sluice", "tenant", "nobody", "model", "large", "prompt_tokens", "99999999999999", uint32(1), uint64(1<<63), true, true)
	f.Add("x", "path", "/", "tenant", "", "model", "\xff", uint32(4_000_000_000), uint64(0), false, false)
	f.Add("sluice", "tenant", "acme", "usage", "output", "model", "small", uint32(0), uint64(1<<40), true, false)
	f.Add("sluice", "tenant", "acme", "usage", "prompt", "model", "huge", uint32(7), uint64(0), false, false)
	f.Add("sluice", "tenant", "acme", "prompt_tokens", "99999", "model", "large", uint32(0), uint64(0), true, false)
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2, k3, v3 string, hits uint32, dhits uint64, setDHits, negative bool) {
		cfg := admission.Config{
			Tiers:   map[string]admission.TierPolicy{"t": {RPS: big, Tokens: admission.Limit{Rate: 1000, Burst: 10000}, Weight: 1}},
			Tenants: map[string]admission.TenantConfig{"acme": {Tier: "t"}},
		}
		clk := clock.NewManual(epoch)
		eng, err := admission.New(cfg, hgxCluster(t, 1), admission.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		defer eng.Close()
		s, err := New(eng, Options{Clock: clk, DefaultModel: "medium"})
		if err != nil {
			t.Fatal(err)
		}
		d := desc(k1, v1, k2, v2, k3, v3)
		if setDHits {
			d.HitsAddend = wrapperspb.UInt64(dhits)
		}
		d.IsNegativeHits = negative
		req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: []*ratelimitDescriptor{d, desc(k3, v3)}}
		resp, err := s.ShouldRateLimit(context.Background(), req)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument {
				t.Fatalf("error %v (%v), want INVALID_ARGUMENT or an answer", c, err)
			}
		} else {
			if len(resp.GetStatuses()) != 2 {
				t.Fatalf("%d statuses for 2 descriptors", len(resp.GetStatuses()))
			}
			if c := resp.GetOverallCode(); c != rlsv3.RateLimitResponse_OK && c != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("overall code %v", c)
			}
		}
		if n := eng.LeaseCount(); n != 0 {
			t.Fatalf("%d leases left", n)
		}
	})
}
