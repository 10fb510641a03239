package rlsserver

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/testwait"
)

// meteredConfig has acme on a token bucket of 1000/s, 10000 deep (no
// credit), and globex on limits that never bind.
func meteredConfig() admission.Config {
	return admission.Config{
		Tiers: map[string]admission.TierPolicy{
			"metered": {RPS: big, Tokens: admission.Limit{Rate: 1000, Burst: 10000}, Weight: 1},
			"open":    {RPS: big, Tokens: big, Weight: 1},
		},
		Tenants: map[string]admission.TenantConfig{"acme": {Tier: "metered"}, "globex": {Tier: "open"}},
	}
}

// An admitted descriptor is OK with its tenant's limit and what remains,
// the domain and model in the headers (also for the upstream), and the
// admission is settled before the answer: no lease, no KV, nothing in
// flight, and the tenant and domain charged exactly what Admit and an
// immediate Release at the admitted counts charge on a twin engine.
func TestAdmittedIsSettledAtOnceAndChargedOnce(t *testing.T) {
	cfg, cluster := meteredConfig(), hgxCluster(t, 2)
	f := newFixture(t, cfg, cluster, Options{})
	twin, err := admission.New(cfg, cluster, admission.WithClock(f.clk))
	if err != nil {
		t.Fatal(err)
	}
	defer twin.Close()
	admitRelease := func(prompt, output int64) {
		t.Helper()
		d, err := twin.Admit(context.Background(), admission.Request{Tenant: "acme", Model: "small", PromptTokens: prompt, MaxOutputTokens: output})
		if err != nil || d.Outcome != admission.Admitted {
			t.Fatalf("twin: %+v, %v", d, err)
		}
		if _, err := twin.Release(context.Background(), admission.Release{LeaseID: d.LeaseID, PromptTokens: prompt, OutputTokens: output, Outcome: admission.ReleaseOK}); err != nil {
			t.Fatal(err)
		}
	}
	same := func() {
		t.Helper()
		if got, want := f.eng.Domains(), twin.Domains(); !reflect.DeepEqual(got, want) {
			t.Errorf("domains after RLS:\n%+v\nafter Admit+Release:\n%+v", got, want)
		}
		got, _ := f.eng.Tenant("acme")
		want, _ := twin.Tenant("acme")
		if got != want {
			t.Errorf("tenant after RLS:\n%+v\nafter Admit+Release:\n%+v", got, want)
		}
	}

	// Hits alone: 600 weighted tokens = 596 prompt + 4 × 1 output.
	resp := f.call(t, 600, desc("tenant", "acme", "model", "small"))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 1 {
		t.Fatalf("answer: %v", resp)
	}
	st := resp.GetStatuses()[0]
	if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 9400 || st.GetDurationUntilReset() != nil {
		t.Errorf("status: %v", st)
	}
	if l := st.GetCurrentLimit(); l.GetName() != "tokens" || l.GetRequestsPerUnit() != 1000 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND {
		t.Errorf("current limit: %v", l)
	}
	h := headers(t, resp)
	if h[HeaderDomain] != "d1" && h[HeaderDomain] != "d2" {
		t.Errorf("domain header %q", h[HeaderDomain])
	}
	wantHeaders(t, resp, map[string]string{
		HeaderDomain:    h[HeaderDomain],
		HeaderModel:     "small",
		HeaderPolicy:    `"tokens";q=10000;w=10;qu="weighted-tokens"`,
		HeaderRateLimit: `"tokens";r=9400;t=1`,
	})
	if up := resp.GetRequestHeadersToAdd(); len(up) != 2 || up[0].GetKey() != HeaderDomain || up[1].GetKey() != HeaderModel || up[1].GetValue() != "small" {
		t.Errorf("upstream headers: %v", up)
	}
	f.idle(t)
	if lvl := f.tenant(t, "acme").TokenLevel; lvl != 9400 {
		t.Errorf("acme's tokens = %d, want 9400 (charged once, exactly the hits)", lvl)
	}
	admitRelease(596, 1)
	same()

	// Token entries instead of hits: 100 + 4 × 50 = 300 weighted tokens.
	resp = f.call(t, 0, desc("tenant", "acme", "model", "small", "prompt_tokens", "100", "max_output_tokens", "50"))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 9100 {
		t.Fatalf("answer: %v", resp)
	}
	f.idle(t)
	admitRelease(100, 50)
	same()

	// A descriptor's own hits_addend overrides the request's.
	resp = f.call(t, 5000, withHits(desc("tenant", "acme", "model", "small"), 100))
	if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 9000 {
		t.Errorf("remaining %d after a descriptor's 100 hits, want 9000", got)
	}
	f.idle(t)
}

// Over the limit: OVER_LIMIT with duration_until_reset = the engine's
// exact Retry-After, nothing charged, and OK again once that has passed.
func TestOverLimitCarriesTheExactReset(t *testing.T) {
	f := newFixture(t, meteredConfig(), hgxCluster(t, 1), Options{DefaultModel: "small"})
	if resp := f.call(t, 9700, desc("tenant", "acme")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first call: %v", resp)
	}
	// 300 left; 800 more need 500 tokens of refill at 1000/s: 500 ms.
	resp := f.call(t, 800, desc("tenant", "acme"))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("answer: %v", resp)
	}
	st := resp.GetStatuses()[0]
	if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetLimitRemaining() != 0 {
		t.Errorf("status: %v", st)
	}
	if got := st.GetDurationUntilReset().AsDuration(); got != 500*time.Millisecond {
		t.Errorf("duration_until_reset = %v, want 500ms", got)
	}
	wantHeaders(t, resp, map[string]string{
		HeaderReason:     "QUOTA_EXCEEDED",
		HeaderRetryAfter: "1",
		HeaderPolicy:     `"tokens";q=10000;w=10;qu="weighted-tokens"`,
		HeaderRateLimit:  `"tokens";r=0;t=1`,
	})
	if resp.GetRequestHeadersToAdd() != nil {
		t.Errorf("a refusal adds upstream headers: %v", resp.GetRequestHeadersToAdd())
	}
	if lvl := f.tenant(t, "acme").TokenLevel; lvl != 300 {
		t.Errorf("tokens = %d after a refusal, want 300 (nothing charged)", lvl)
	}
	f.clk.Advance(499 * time.Millisecond)
	if resp := f.call(t, 800, desc("tenant", "acme")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("1 ms early: %v", resp)
	}
	f.clk.Advance(time.Millisecond)
	if resp := f.call(t, 800, desc("tenant", "acme")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("at the reset: %v", resp)
	}
	f.idle(t)
}

// A descriptor asking more than its tenant's bucket can ever hold (10000,
// no credit) is OVER_LIMIT with reason REQUEST_TOO_LARGE and neither a
// Retry-After nor a duration until reset: no wait lets it pass. The
// RateLimit field shows the bucket as it stands, and nothing is charged.
func TestRequestTooLargeHasNoRetry(t *testing.T) {
	f := newFixture(t, meteredConfig(), hgxCluster(t, 1), Options{})
	resp := f.call(t, 0, desc("tenant", "acme", "model", "small", "prompt_tokens", "9997", "max_output_tokens", "1")) // 10001
	st := resp.GetStatuses()[0]
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetDurationUntilReset() != nil {
		t.Fatalf("answer: %v", resp)
	}
	wantHeaders(t, resp, map[string]string{
		HeaderReason:    "REQUEST_TOO_LARGE",
		HeaderPolicy:    `"tokens";q=10000;w=10;qu="weighted-tokens"`,
		HeaderRateLimit: `"tokens";r=10000;t=0`,
	})
	if lvl := f.tenant(t, "acme").TokenLevel; lvl != 10000 {
		t.Errorf("tokens = %d after a refusal, want 10000 (nothing charged)", lvl)
	}
	// The bucket's whole burst still passes.
	if resp := f.call(t, 0, desc("tenant", "acme", "model", "small", "prompt_tokens", "9996", "max_output_tokens", "1")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("10000 tokens: %v", resp)
	}
	f.idle(t)
}

// A descriptor without a tenant is UNKNOWN and charges nothing; an
// unconfigured (or empty) tenant is OVER_LIMIT, UNKNOWN_TENANT, as Admit
// rejects it; and the overall code is never UNKNOWN.
func TestUnknownTenants(t *testing.T) {
	f := newFixture(t, meteredConfig(), hgxCluster(t, 1), Options{DefaultModel: "small"})

	resp := f.call(t, 100, desc("path", "/v1/chat"))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_UNKNOWN {
		t.Errorf("no tenant: %v", resp)
	}
	wantHeaders(t, resp, map[string]string{})

	for _, name := range []string{"nobody", ""} {
		resp = f.call(t, 100, desc("tenant", name))
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT ||
			st.GetCurrentLimit() != nil || st.GetDurationUntilReset() != nil {
			t.Errorf("tenant %q: %v", name, resp)
		}
		wantHeaders(t, resp, map[string]string{HeaderReason: "UNKNOWN_TENANT"})
	}

	// Mixed: statuses follow the descriptors; the known tenant is charged.
	resp = f.call(t, 100, desc("path", "/v1/chat"), desc("tenant", "acme"), desc("tenant", "nobody"))
	var codes []rlsv3.RateLimitResponse_Code
	for _, st := range resp.GetStatuses() {
		codes = append(codes, st.GetCode())
	}
	if want := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_UNKNOWN, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}; !reflect.DeepEqual(codes, want) ||
		resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("mixed: overall %v, statuses %v", resp.GetOverallCode(), codes)
	}
	// The headers are the refusal's (the deciding descriptor).
	if h := headers(t, resp); h[HeaderReason] != "UNKNOWN_TENANT" || h[HeaderModel] != "" {
		t.Errorf("mixed headers: %v", h)
	}
	if lvl := f.tenant(t, "acme").TokenLevel; lvl != 9900 {
		t.Errorf("acme's tokens = %d, want 9900", lvl)
	}
	f.idle(t)
}

// A saturated large tier degrades a low-weight tenant that accepts medium:
// the headers name the model granted and the path, for the client and the
// model server.
func TestDowngradeHeader(t *testing.T) {
	headroom := 0.5
	cfg := admission.Config{
		DegradeHeadroom: &headroom,
		Tiers: map[string]admission.TierPolicy{
			"gold":   {RPS: big, Tokens: big, Weight: 4},
			"bronze": {RPS: big, Tokens: big, Weight: 1},
		},
		Tenants: map[string]admission.TenantConfig{"a": {Tier: "gold"}, "b": {Tier: "bronze"}},
	}
	f := newFixture(t, cfg, hgxCluster(t, 1), Options{})
	// a (the top weight) takes large's prefill down to about a quarter.
	for i := range 5 {
		resp := f.call(t, 0, desc("tenant", "a", "model", "large", "prompt_tokens", "1000"))
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || headers(t, resp)[HeaderModel] != "large" {
			t.Fatalf("a's request %d: %v", i, resp)
		}
	}
	// b must leave 37.5% free on large: it is degraded.
	resp := f.call(t, 0, desc("tenant", "b", "model", "large", "prompt_tokens", "1000", "accept_downgrade", "medium, small"))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("b: %v", resp)
	}
	h := headers(t, resp)
	if h[HeaderModel] != "medium" || h[HeaderDowngrade] != "large>medium" || h[HeaderDomain] != "d1" {
		t.Errorf("downgrade headers: %v", h)
	}
	if up := resp.GetRequestHeadersToAdd(); len(up) != 2 || up[1].GetValue() != "medium" {
		t.Errorf("the upstream is not told the granted model: %v", up)
	}
	// Not accepting a lower tier, b still gets large: the headroom only
	// decides who is degraded, not who is refused.
	resp = f.call(t, 0, desc("tenant", "b", "model", "large", "prompt_tokens", "1000"))
	if h := headers(t, resp); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || h[HeaderModel] != "large" || h[HeaderDowngrade] != "" {
		t.Errorf("b without a downgrade: %v", resp)
	}
	f.idle(t)
}

// Floors hold under an RLS-driven burst: a floor tenant's requests stay OK
// every round while another tenant's burst, far past the domain's shared
// capacity, is refused (and releases hold no KV that could block anyone).
func TestFloorHoldsUnderRLSBurst(t *testing.T) {
	cfg := admission.Config{
		Tiers: map[string]admission.TierPolicy{
			"standard": {RPS: admission.Limit{Rate: 100, Burst: 100}, Tokens: admission.Limit{Rate: 4000, Burst: 8000}, Floor: 2000, Weight: 1},
			"bursty":   {RPS: big, Tokens: admission.Limit{Rate: 60000, Burst: 120000}, Weight: 8},
		},
		Tenants: map[string]admission.TenantConfig{"initech": {Tier: "standard"}, "burst": {Tier: "bursty"}},
	}
	f := newFixture(t, cfg, hgxCluster(t, 1), Options{})
	floorReq := desc("tenant", "initech", "model", "medium", "prompt_tokens", "960", "max_output_tokens", "10")
	burstReq := desc("tenant", "burst", "model", "medium", "prompt_tokens", "960", "max_output_tokens", "10")
	for round := range 20 {
		var ok, over int
		for range 60 {
			switch f.call(t, 0, burstReq).GetOverallCode() {
			case rlsv3.RateLimitResponse_OK:
				ok++
			case rlsv3.RateLimitResponse_OVER_LIMIT:
				over++
			}
		}
		if round > 0 && over == 0 {
			t.Errorf("round %d: the burst was never refused (%d OK): it is not past capacity", round, ok)
		}
		// 1000 weighted tokens, within the 2000/s floor every 500 ms.
		resp := f.call(t, 0, floorReq)
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("round %d: the floor tenant was refused while the burst got %d OK, %d OVER_LIMIT: %v", round, ok, over, resp)
		}
		f.clk.Advance(500 * time.Millisecond)
		f.eng.Tick()
	}
	f.idle(t)
}

// MaxWait lets a request that does not fit now wait in the fair queue for
// capacity, and be answered OK when the dispatcher admits it.
func TestMaxWaitQueues(t *testing.T) {
	cfg := admission.Config{
		Tiers:   map[string]admission.TierPolicy{"gold": {RPS: big, Tokens: big, Weight: 1}},
		Tenants: map[string]admission.TenantConfig{"a": {Tier: "gold"}},
	}
	f := newFixture(t, cfg, hgxCluster(t, 1), Options{MaxWait: 10 * time.Second})
	req := &rlsv3.RateLimitRequest{Descriptors: []*ratelimitDescriptor{desc("tenant", "a", "model", "large", "prompt_tokens", "1000")}}
	// Fill large's buckets until a request has to wait.
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatal("a thousand large requests fit: the domain never fills")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done := make(chan *rlsv3.RateLimitResponse, 1)
		go func() {
			resp, err := f.rls.ShouldRateLimit(ctx, req)
			if err != nil {
				t.Error(err)
			}
			done <- resp
		}()
		var resp *rlsv3.RateLimitResponse
		testwait.Until(t, 10*time.Second, "an answer or a queued request", func() bool {
			select {
			case resp = <-done:
				return true
			default:
				return f.eng.QueueLen() > 0
			}
		})
		if resp != nil {
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("request %d refused before any waited: %v", i, resp)
			}
			continue
		}
		// Queued: capacity refills on the manual clock and it is admitted.
		for f.eng.QueueLen() > 0 {
			f.clk.Advance(100 * time.Millisecond)
			f.eng.Tick()
		}
		if resp = <-done; resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("queued request: %v", resp)
		}
		break
	}
	f.idle(t)
}

// Requests that are not decisions are gRPC errors naming the field, and
// charge nothing.
func TestInvalidRequests(t *testing.T) {
	f := newFixture(t, meteredConfig(), hgxCluster(t, 1), Options{Domain: "sluice"})
	for _, c := range []struct {
		name  string
		req   *rlsv3.RateLimitRequest
		field string
	}{
		{"another domain", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitDescriptor{desc("tenant", "acme", "model", "small")}}, "domain"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "sluice"}, "descriptors"},
		{"no model", &rlsv3.RateLimitRequest{Domain: "sluice", Descriptors: []*ratelimitDescriptor{desc("tenant", "acme")}}, "descriptors[0].model"},
		{"bad prompt", &rlsv3.RateLimitRequest{Domain: "sluice", Descriptors: []*ratelimitDescriptor{desc("tenant", "acme", "model", "small", "prompt_tokens", "lots")}}, "descriptors[0].prompt_tokens"},
		{"zero output", &rlsv3.RateLimitRequest{Domain: "sluice", Descriptors: []*ratelimitDescriptor{desc("tenant", "acme", "model", "small", "max_output_tokens", "0")}}, "descriptors[0].max_output_tokens"},
		{"unknown model", &rlsv3.RateLimitRequest{Domain: "sluice", Descriptors: []*ratelimitDescriptor{desc("tenant", "acme", "model", "huge")}}, "descriptors[0].model"},
		{"hits past the prompt limit", &rlsv3.RateLimitRequest{Domain: "sluice", HitsAddend: 4_000_000_000, Descriptors: []*ratelimitDescriptor{desc("tenant", "acme", "model", "small")}}, "descriptors[0].hits_addend"},
		{"negative hits", &rlsv3.RateLimitRequest{Domain: "sluice", Descriptors: []*ratelimitDescriptor{{Entries: desc("tenant", "acme", "model", "small").Entries, IsNegativeHits: true}}}, "descriptors[0].is_negative_hits"},
		// The second descriptor is invalid: the first is not charged either.
		{"second invalid", &rlsv3.RateLimitRequest{Domain: "sluice", Descriptors: []*ratelimitDescriptor{desc("tenant", "acme", "model", "small"), desc("tenant", "acme", "model", "small", "prompt_tokens", "-1")}}, "descriptors[1].prompt_tokens"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := f.rls.ShouldRateLimit(context.Background(), c.req)
			wantInvalidArgument(t, err, c.field)
		})
	}
	if lvl := f.tenant(t, "acme").TokenLevel; lvl != 10000 {
		t.Errorf("tokens = %d after invalid requests, want 10000", lvl)
	}
	if _, err := New(f.eng, Options{TenantKey: "x", ModelKey: "x"}); err == nil {
		t.Error("two entries on one key accepted")
	}
}

// A hits_addend past the prompt limit is refused naming the number sent
// and the most hits_addend may be (limits.max_prompt_tokens plus the
// output tokens at their weight), not the prompt count derived from it.
func TestHitsPastTheLimitNameWhatWasSent(t *testing.T) {
	f := newFixture(t, meteredConfig(), hgxCluster(t, 1), Options{})
	const promptLimit = 1 << 20 // the default limits.max_prompt_tokens
	for _, c := range []struct {
		name       string
		req        *rlsv3.RateLimitRequest
		sent, most string
	}{
		{"request hits", &rlsv3.RateLimitRequest{HitsAddend: 4_000_000_000, Descriptors: []*ratelimitDescriptor{desc("tenant", "acme", "model", "small")}},
			"4000000000", fmt.Sprint(promptLimit + 4*1)},
		{"descriptor hits and output", &rlsv3.RateLimitRequest{Descriptors: []*ratelimitDescriptor{withHits(desc("tenant", "acme", "model", "small", "max_output_tokens", "10"), 2_000_000)}},
			"2000000", fmt.Sprint(promptLimit + 4*10)},
		{"hits past every bound", &rlsv3.RateLimitRequest{Descriptors: []*ratelimitDescriptor{withHits(desc("tenant", "acme", "model", "small"), 1<<62)}},
			fmt.Sprint(uint64(1) << 62), fmt.Sprint(promptLimit + 4*1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := f.rls.ShouldRateLimit(context.Background(), c.req)
			wantInvalidArgument(t, err, "descriptors[0].hits_addend")
			want := c.sent + " exceeds the limit of " + c.most
			if msg := status.Convert(err).Message(); !strings.Contains(msg, want) {
				t.Errorf("error %q, want it to say %q", msg, want)
			}
		})
	}
	if lvl := f.tenant(t, "acme").TokenLevel; lvl != 10000 {
		t.Errorf("tokens = %d after refused requests, want 10000", lvl)
	}
}

// The guard sees every descriptor's tenant before anything is decided: a
// call naming a tenant the caller does not serve charges nothing.
func TestGuardRefusesBeforeAnyCharge(t *testing.T) {
	var seen []string
	guard := func(_ context.Context, tenant string) error {
		seen = append(seen, tenant)
		if tenant == "globex" {
			return status.Error(codes.PermissionDenied, "not yours")
		}
		return nil
	}
	f := newFixture(t, meteredConfig(), hgxCluster(t, 1), Options{DefaultModel: "small", Guard: guard})
	_, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Descriptors: []*ratelimitDescriptor{desc("tenant", "acme"), desc("path", "/"), desc("tenant", "globex")}, HitsAddend: 100})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("error = %v, want PERMISSION_DENIED", err)
	}
	if !reflect.DeepEqual(seen, []string{"acme", "globex"}) {
		t.Errorf("guard asked about %v", seen)
	}
	if lvl := f.tenant(t, "acme").TokenLevel; lvl != 10000 {
		t.Errorf("acme charged %d by a refused call", 10000-lvl)
	}
}

// A reload that changes output_token_weight is followed: the first decision
// after it teaches the handler the engine's weight, and hits map exactly
// again from the next one.
func TestFollowsTheEnginesOutputTokenWeight(t *testing.T) {
	f := newFixture(t, meteredConfig(), hgxCluster(t, 1), Options{DefaultModel: "small", OutputTokenWeight: 2})
	f.call(t, 100, desc("tenant", "acme")) // prompt 98 + 4 × 1: 102 charged
	if lvl := f.tenant(t, "acme").TokenLevel; lvl != 9898 {
		t.Fatalf("tokens = %d, want 9898", lvl)
	}
	f.call(t, 100, desc("tenant", "acme")) // prompt 96 + 4 × 1: exact
	if lvl := f.tenant(t, "acme").TokenLevel; lvl != 9798 {
		t.Errorf("tokens = %d, want 9798", lvl)
	}
}
