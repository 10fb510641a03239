package rlsserver

import (
	"context"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/topology"
)

// BenchmarkShouldRateLimit runs the handler in-process on the real engine
// (a decision, its release and the answer with every header) beside the
// engine's own Admit and Release of the same request: the difference is
// what the RLS adapter costs before gRPC's share.
func BenchmarkShouldRateLimit(b *testing.B) {
	cfg := admission.Config{
		Tiers:   map[string]admission.TierPolicy{"bench": {RPS: big, Tokens: admission.Limit{Rate: 1e12, Burst: 1e12}, Weight: 1}},
		Tenants: map[string]admission.TenantConfig{"router": {Tier: "bench"}},
	}
	// The simulated cluster and the smallest request: its capacity (millions
	// of these per second) never binds, so every call admits at once.
	eng, err := admission.New(cfg, topology.Simulated())
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go eng.Run(ctx) // never needed if every request admits at once, but nothing may hang
	b.Run("EngineAdmitRelease", func(b *testing.B) {
		req := admission.Request{Tenant: "router", Model: "small", PromptTokens: 1, MaxOutputTokens: 1}
		b.ReportAllocs()
		for b.Loop() {
			d, err := eng.Admit(ctx, req)
			if err != nil || d.Outcome != admission.Admitted {
				b.Fatal(d, err)
			}
			if _, err := eng.Release(ctx, admission.Release{LeaseID: d.LeaseID, PromptTokens: 1, OutputTokens: 1, Outcome: admission.ReleaseOK}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ShouldRateLimit", func(b *testing.B) {
		s, err := New(eng, Options{})
		if err != nil {
			b.Fatal(err)
		}
		req := &rlsv3.RateLimitRequest{Domain: "sluice", HitsAddend: 5, Descriptors: []*ratelimitDescriptor{desc("tenant", "router", "model", "small")}}
		b.ReportAllocs()
		for b.Loop() {
			resp, err := s.ShouldRateLimit(ctx, req)
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				b.Fatal(resp, err)
			}
		}
	})
}
