package rlsserver

import (
	"context"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// A descriptor whose own hits_addend is 0 is a check: the answer Admit
// would give, with nothing charged, for the size its entries give (the
// cheapest request without them). The request-level hits_addend, 0 when
// Envoy leaves it unset, still counts as 1.
func TestZeroHitsIsACheckThatChargesNothing(t *testing.T) {
	f := newFixture(t, meteredConfig(), hgxCluster(t, 1), Options{DefaultModel: "small"})
	for range 3 {
		resp := f.call(t, 0, withHits(desc("tenant", "acme"), 0))
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 10000 {
			t.Fatalf("check: %v", resp)
		}
	}
	if lvl := f.tenant(t, "acme").TokenLevel; lvl != 10000 {
		t.Fatalf("acme's tokens after three checks = %d, want 10000", lvl)
	}
	// A check of a request larger than what is left refuses it, still
	// charging nothing.
	f.call(t, 6000, desc("tenant", "acme"))
	resp := f.call(t, 0, withHits(desc("tenant", "acme", "prompt_tokens", "5000"), 0))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || headers(t, resp)[HeaderReason] != "QUOTA_EXCEEDED" {
		t.Fatalf("check past the quota: %v", resp)
	}
	if lvl := f.tenant(t, "acme").TokenLevel; lvl != 4000 {
		t.Fatalf("acme's tokens after a refused check = %d, want 4000", lvl)
	}
	// The request's hits_addend left at 0: one hit, the cheapest request (5).
	f.call(t, 0, desc("tenant", "acme"))
	if lvl := f.tenant(t, "acme").TokenLevel; lvl != 4000-5 {
		t.Fatalf("acme's tokens after an unset hits_addend = %d, want %d", lvl, 4000-5)
	}
	f.idle(t)
}

// A usage descriptor settles what its hits_addend counts (prompt or output
// tokens, weighted) against its tenant, and is OK even past the limit; a
// usage value other than prompt or output is INVALID_ARGUMENT naming the
// entry, and the call charges nothing. The key is configurable.
func TestUsageDescriptorSettles(t *testing.T) {
	f := newFixture(t, meteredConfig(), hgxCluster(t, 1), Options{DefaultModel: "small", UsageKey: "sluice_usage"})
	resp := f.call(t, 0, withHits(desc("tenant", "acme", "sluice_usage", "prompt"), 4000), withHits(desc("tenant", "acme", "sluice_usage", "output"), 2000))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("settling 4000 + 4 × 2000: %v", resp)
	}
	if lvl := f.tenant(t, "acme").TokenLevel; lvl != 10000-12000 {
		t.Fatalf("acme's tokens = %d, want %d", lvl, 10000-12000)
	}
	_, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Descriptors: []*ratelimitDescriptor{
		withHits(desc("tenant", "acme", "sluice_usage", "prompt"), 100), withHits(desc("tenant", "acme", "sluice_usage", "total"), 100)}})
	wantInvalidArgument(t, err, "descriptors[1].sluice_usage")
	if lvl := f.tenant(t, "acme").TokenLevel; lvl != 10000-12000 {
		t.Fatalf("acme's tokens after a refused call = %d, want %d", lvl, 10000-12000)
	}
	// An unconfigured tenant has no quota to settle against.
	resp = f.call(t, 0, withHits(desc("tenant", "nobody", "sluice_usage", "prompt"), 100))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || headers(t, resp)[HeaderReason] != "UNKNOWN_TENANT" {
		t.Fatalf("usage of an unknown tenant: %v", resp)
	}
	if _, err := New(f.eng, Options{UsageKey: "tenant"}); err == nil {
		t.Error("a usage key equal to the tenant key is accepted")
	}
	f.idle(t)
}
