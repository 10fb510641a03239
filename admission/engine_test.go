package admission

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"reflect"
	"testing"
	"time"
)

func TestAdmitReleaseRefundsUnusedOutputAndFreesKV(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 2))
	before := h.tenant("a").TokenLevel
	d := h.admit(req("a", "medium", 1000, 500))
	if d.Outcome != Admitted || d.LeaseID == 0 || d.Model != "medium" || d.Domain == "" {
		t.Fatalf("want an admission with a lease, got %+v", d)
	}
	if d.Trace.WeightedTokens != 1000+4*500 || d.Trace.QuotaBefore-d.Trace.QuotaAfter != 3000 {
		t.Fatalf("trace: weighted %d, quota %d → %d", d.Trace.WeightedTokens, d.Trace.QuotaBefore, d.Trace.QuotaAfter)
	}
	dom := h.domain(d.Domain)
	if dom.KVInUse == 0 || dom.InFlight != 1 {
		t.Fatalf("domain after admit: KV %d, in flight %d", dom.KVInUse, dom.InFlight)
	}
	decodeAfterAdmit := dom.DecodeLevel

	res := h.release(d.LeaseID, 1000, 100) // 400 output tokens never generated
	if res.RefundedTokens != 4*400 {
		t.Fatalf("refunded %d weighted tokens, want %d", res.RefundedTokens, 4*400)
	}
	dom = h.domain(d.Domain)
	if dom.KVInUse != 0 || dom.InFlight != 0 {
		t.Fatalf("domain after release: KV %d, in flight %d; want 0, 0", dom.KVInUse, dom.InFlight)
	}
	if dom.DecodeLevel <= decodeAfterAdmit {
		t.Fatalf("decode bucket not refunded: %d after admit, %d after release", decodeAfterAdmit, dom.DecodeLevel)
	}
	if got := h.tenant("a").TokenLevel; got != before-(1000+4*100) {
		t.Fatalf("tenant tokens: %d, want %d (charged for what was used only)", got, before-1400)
	}
	if _, err := h.e.Release(context.Background(), Release{LeaseID: d.LeaseID, OutputTokens: 1}); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("second release: %v, want ErrLeaseNotFound", err)
	}
	if got := h.tenant("a").TokenLevel; got != before-1400 {
		t.Fatalf("second release changed the tenant: %d", got)
	}
}

func TestExpiredLeaseFreesKV(t *testing.T) {
	cfg := testConfig()
	cfg.Leases.TTL = Duration{time.Minute}
	h := newHarness(t, cfg, hgxCluster(t, 1))
	d := h.admit(req("a", "small", 2000, 200))
	if h.domain("d1").KVInUse == 0 {
		t.Fatal("no KV held")
	}
	h.advance(59 * time.Second)
	if h.domain("d1").KVInUse == 0 {
		t.Fatal("KV freed before the lease expired")
	}
	h.advance(time.Second)
	if got := h.domain("d1"); got.KVInUse != 0 || got.InFlight != 0 {
		t.Fatalf("after expiry: KV %d, in flight %d", got.KVInUse, got.InFlight)
	}
	if _, err := h.e.Release(context.Background(), Release{LeaseID: d.LeaseID}); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("release after expiry: %v, want ErrLeaseNotFound", err)
	}
}

func TestRepeatedRequestIDIsChargedOnce(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 2))
	r := req("a", "medium", 500, 100)
	r.RequestID = "req-1"
	first := h.admit(r)
	level := h.tenant("a").TokenLevel
	kv := h.domain(first.Domain).KVInUse
	second := h.admit(r)
	// The same admission: lease, domain, model, path (the trace's levels
	// are read at the repeat).
	if second.Outcome != first.Outcome || second.LeaseID != first.LeaseID || second.Domain != first.Domain ||
		second.Model != first.Model || !reflect.DeepEqual(second.DowngradePath, first.DowngradePath) || second.Trace.Tenant != "a" {
		t.Fatalf("same request id, different answers:\n%+v\n%+v", first, second)
	}
	if got := h.tenant("a").TokenLevel; got != level {
		t.Fatalf("charged twice: tokens %d → %d", level, got)
	}
	if got := h.domain(first.Domain).KVInUse; got != kv {
		t.Fatalf("KV charged twice: %d → %d", kv, got)
	}
	// Ids are scoped per tenant: another tenant's same id is its own request.
	other := r
	other.Tenant = "b"
	if d := h.admit(other); d.Outcome != Admitted || d.LeaseID == first.LeaseID {
		t.Fatalf("another tenant with the same id: %+v, want an admission of its own", d)
	}
	// The same id with another body is refused, and changes nothing.
	changed := r
	changed.MaxOutputTokens++
	if _, err := h.e.Admit(context.Background(), changed); !isInvalid(err, "request_id") {
		t.Fatalf("the id with a different body: %v, want invalid request_id", err)
	}
	if got := h.tenant("a").TokenLevel; got != level {
		t.Fatalf("a refused repeat charged: tokens %d → %d", level, got)
	}
	// Once its lease has ended, a repeat gets no dead lease for free.
	h.release(first.LeaseID, 500, 100)
	after := h.tenant("a").TokenLevel
	if _, err := h.e.Admit(context.Background(), r); !errors.Is(err, ErrLeaseEnded) {
		t.Fatalf("repeat after release: %v, want ErrLeaseEnded", err)
	}
	if got := h.tenant("a").TokenLevel; got != after {
		t.Fatalf("a repeat after release charged: tokens %d → %d", after, got)
	}
	// Past its TTL the id is forgotten and decides afresh.
	h.advance(h.e.Config().Leases.IdempotencyTTL.Duration + time.Minute)
	if d := h.admit(r); d.Outcome != Admitted || d.LeaseID == first.LeaseID {
		t.Fatalf("the id after its TTL: %+v, want a new admission", d)
	}
}

func isInvalid(err error, field string) bool {
	var ia *InvalidArgumentError
	return errors.As(err, &ia) && ia.Field == field
}

func TestInvalidRequestsNameTheFieldAndChangeNothing(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 2))
	good := req("a", "medium", 100, 100)
	cases := []struct {
		field string
		edit  func(*Request)
	}{
		{"tenant", func(r *Request) { r.Tenant = "" }},
		{"tenant", func(r *Request) { r.Tenant = string([]byte{0xff, 0xfe}) }},
		{"model", func(r *Request) { r.Model = "" }},
		{"model", func(r *Request) { r.Model = "gigantic" }},
		{"prompt_tokens", func(r *Request) { r.PromptTokens = 0 }},
		{"prompt_tokens", func(r *Request) { r.PromptTokens = -5 }},
		{"prompt_tokens", func(r *Request) { r.PromptTokens = 1 << 40 }},
		{"max_output_tokens", func(r *Request) { r.MaxOutputTokens = 0 }},
		{"max_output_tokens", func(r *Request) { r.MaxOutputTokens = 1 << 40 }},
		{"priority", func(r *Request) { r.Priority = 7 }},
		{"accept_downgrade[0]", func(r *Request) { r.AcceptDowngrade = []string{"nope"} }},
		{"accept_downgrade[0]", func(r *Request) { r.Model = "small"; r.AcceptDowngrade = []string{"large"} }},
		{"request_id", func(r *Request) { r.RequestID = string(make([]byte, 200)) }},
	}
	tenants, domains := h.e.Tenants(), h.e.Domains()
	for _, c := range cases {
		r := good
		c.edit(&r)
		_, err := h.e.Admit(context.Background(), r)
		if !isInvalid(err, c.field) {
			t.Errorf("%+v: got %v, want InvalidArgumentError on %s", r, err, c.field)
		}
	}
	if !reflect.DeepEqual(tenants, h.e.Tenants()) || !reflect.DeepEqual(domains, h.e.Domains()) {
		t.Fatal("invalid requests changed state")
	}
	d := h.admit(req("nobody", "medium", 1, 1))
	if d.Outcome != Rejected || d.Reason != ReasonUnknownTenant {
		t.Fatalf("unknown tenant: %+v", d)
	}
}

func TestTokenBucketQuotaAndExactRetryAfter(t *testing.T) {
	cfg := testConfig()
	cfg.Tiers["bronze"] = TierPolicy{RPS: Limit{Rate: 1000, Burst: 1000}, Tokens: Limit{Rate: 500, Burst: 1000}, Weight: 1}
	h := newHarness(t, cfg, hgxCluster(t, 1))
	// 100 prompt + 4×25 output = 200 weighted tokens: five fit the burst.
	for i := 0; i < 5; i++ {
		if d := h.admit(req("b", "small", 100, 25)); d.Outcome != Admitted {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	d := h.admit(req("b", "small", 100, 25))
	if d.Outcome != Rejected || d.Reason != ReasonQuotaExceeded {
		t.Fatalf("sixth: %+v, want QUOTA_EXCEEDED", d)
	}
	if d.RetryAfter != 400*time.Millisecond { // 200 tokens at 500/s
		t.Fatalf("retry after %v, want 400ms", d.RetryAfter)
	}
	h.advance(d.RetryAfter - time.Nanosecond)
	if d := h.admit(req("b", "small", 100, 25)); d.Reason != ReasonQuotaExceeded {
		t.Fatalf("1ns early: %+v", d)
	}
	h.advance(time.Nanosecond)
	if d := h.admit(req("b", "small", 100, 25)); d.Outcome != Admitted {
		t.Fatalf("at retry_after: %+v", d)
	}
}

func TestBurstCreditBreaker(t *testing.T) {
	cfg := testConfig()
	cfg.Tiers["bronze"] = TierPolicy{
		RPS: Limit{Rate: 1000, Burst: 1000}, Tokens: Limit{Rate: 5, Burst: 1000}, Weight: 1,
		BurstCredit: BurstCredit{Multiple: 100, Window: Duration{10 * time.Second}, BreakerOpen: Duration{60 * time.Second}},
	}
	h := newHarness(t, cfg, hgxCluster(t, 1))
	// Spend the burst (1000) and borrow 400 of the 500 credit: 7 × 200 weighted tokens.
	for i := 0; i < 7; i++ {
		if d := h.admit(req("b", "small", 100, 25)); d.Outcome != Admitted {
			t.Fatalf("request %d within burst+credit: %+v", i, d)
		}
	}
	if lvl := h.tenant("b").TokenLevel; lvl != -400 {
		t.Fatalf("level %d, want -400 (in debt)", lvl)
	}
	if d := h.admit(req("b", "small", 100, 25)); d.Reason != ReasonQuotaExceeded || d.Trace.BurstCreditBefore != 100 {
		t.Fatalf("beyond credit: %+v", d)
	}
	// Debt repays at 5/s: still -350 when the 10 s window ends, so the breaker opens.
	h.advance(10*time.Second + time.Millisecond)
	d := h.admit(req("b", "small", 1, 1))
	if d.Reason != ReasonBurstCreditExhausted || d.RetryAfter != 60*time.Second {
		t.Fatalf("after the window: %+v, want BURST_CREDIT_EXHAUSTED for 60s", d)
	}
	if !h.tenant("b").BreakerOpen {
		t.Fatal("breaker not reported open")
	}
	h.advance(59 * time.Second)
	if d := h.admit(req("b", "small", 1, 1)); d.Reason != ReasonBurstCreditExhausted || d.RetryAfter != time.Second {
		t.Fatalf("while open: %+v", d)
	}
	// Half-open at t=70: level -50, and nothing is lent: a 200-token request
	// waits for the debt to be repaid and 200 more, (200+50)/5 = 50 s.
	h.advance(time.Second)
	d = h.admit(req("b", "small", 100, 25))
	if d.Reason != ReasonQuotaExceeded || d.RetryAfter < 49*time.Second || d.RetryAfter > 50*time.Second {
		t.Fatalf("half-open in debt: %+v, want QUOTA_EXCEEDED for ~50s", d)
	}
	if got := h.tenant("b"); got.Credit != 0 || got.BreakerOpen {
		t.Fatalf("half-open: %+v, want no credit and not open", got)
	}
	h.advance(d.RetryAfter)
	if d := h.admit(req("b", "small", 100, 25)); d.Outcome != Admitted {
		t.Fatalf("after repayment: %+v", d)
	}
	if got := h.tenant("b").Credit; got != 500 {
		t.Fatalf("credit after recovery %d, want 500 (breaker closed)", got)
	}
}

func TestBudgetExhaustedUntilNextDay(t *testing.T) {
	cfg := testConfig()
	p := cfg.Tiers["bronze"]
	p.Budget = Budget{DailyUSD: 0.001} // 1000 micro-USD
	cfg.Tiers["bronze"] = p
	h := newHarness(t, cfg, hgxCluster(t, 1))
	// small: $0.0001/1k in, $0.0002/1k out → 1000+1000 tokens = 300 micro-USD.
	for i := 0; i < 3; i++ {
		if d := h.admit(req("b", "small", 1000, 1000)); d.Outcome != Admitted {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	d := h.admit(req("b", "small", 1000, 1000))
	if d.Reason != ReasonBudgetExhausted || d.RetryAfter != 12*time.Hour {
		t.Fatalf("over budget: %+v, want BUDGET_EXHAUSTED until midnight (12h)", d)
	}
	h.advance(12 * time.Hour)
	if d := h.admit(req("b", "small", 1000, 1000)); d.Outcome != Admitted {
		t.Fatalf("next day: %+v", d)
	}
}

func TestConcurrencyLimit(t *testing.T) {
	cfg := testConfig()
	p := cfg.Tiers["bronze"]
	p.MaxConcurrency = 2
	cfg.Tiers["bronze"] = p
	h := newHarness(t, cfg, hgxCluster(t, 1))
	a := h.admit(req("b", "small", 10, 10))
	h.admit(req("b", "small", 10, 10))
	if d := h.admit(req("b", "small", 10, 10)); d.Reason != ReasonConcurrencyExceeded {
		t.Fatalf("third: %+v", d)
	}
	h.release(a.LeaseID, 10, 10)
	if d := h.admit(req("b", "small", 10, 10)); d.Outcome != Admitted {
		t.Fatalf("after a release: %+v", d)
	}
}

func TestDegradationGrantsAcceptedLowerTier(t *testing.T) {
	cfg := testConfig()
	cfg.DegradeHeadroom = ptr(0.0001)
	cfg.Queue.DegradeAfter = &Duration{0} // at once, not after waiting for large
	h := newHarness(t, cfg, hgxCluster(t, 1))
	if got := h.saturate("a", "large", 4000, 10); len(got) == 0 {
		t.Fatal("nothing admitted while saturating")
	}
	r := req("a", "large", 4000, 10)
	r.AcceptDowngrade = []string{"small", "medium"} // any order; chain order is used
	d := h.admit(r)
	if d.Outcome != Degraded || d.Model != "medium" || !reflect.DeepEqual(d.DowngradePath, []string{"large", "medium"}) {
		t.Fatalf("want DEGRADED to medium via [large medium], got %+v", d)
	}
	// Not accepting: waits, and is rejected when its deadline passes.
	d2, w := h.submit(req("a", "large", 4000, 10))
	if w == nil {
		t.Fatalf("want the request queued, got %+v", d2)
	}
	h.e.Close()
	if !answered(w) || w.decision.Outcome != Rejected || w.decision.Reason != ReasonShuttingDown {
		t.Fatalf("queued request at shutdown: %+v", w.decision)
	}
}

func TestLowWeightTenantsDegradeFirst(t *testing.T) {
	cfg := testConfig()
	cfg.DegradeHeadroom = ptr(0.5)
	cfg.Queue.DegradeAfter = &Duration{0} // at once: the headroom alone decides
	h := newHarness(t, cfg, hgxCluster(t, 1))
	// Take the large tier to about 30% free.
	dom := h.domain("d1")
	for h.domain("d1").PrefillLevel > dom.PrefillBurst*3/10 {
		if d := h.admit(req("a", "large", 1000, 1)); d.Outcome != Admitted {
			t.Fatalf("filling: %+v", d)
		}
	}
	low := req("b", "large", 1000, 1) // weight 1 of max 4: headroom 0.375 → degrade
	low.AcceptDowngrade = []string{"medium"}
	high := req("a", "large", 1000, 1) // weight 4 of 4: headroom 0 → large
	high.AcceptDowngrade = []string{"medium"}
	if d := h.admit(low); d.Outcome != Degraded {
		t.Fatalf("low weight: %+v, want DEGRADED", d)
	}
	if d := h.admit(high); d.Outcome != Admitted || d.Model != "large" {
		t.Fatalf("high weight: %+v, want ADMITTED on large", d)
	}
}

func TestDrainedDomainGetsNoPlacement(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 3))
	held := h.admit(req("a", "medium", 100, 100))
	if err := h.e.Drain(held.Domain, "chaos drill"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		d := h.admit(req([]string{"a", "b", "c"}[i%3], "medium", 100, 100))
		if d.Domain == held.Domain {
			t.Fatalf("placed on drained domain %s", d.Domain)
		}
	}
	if got := h.domain(held.Domain); !got.Draining || got.DrainReason != "chaos drill" || got.InFlight != 1 {
		t.Fatalf("drained domain: %+v", got)
	}
	h.release(held.LeaseID, 100, 100) // its lease runs to completion
	if err := h.e.Drain("nope", ""); !errors.Is(err, ErrUnknownDomain) {
		t.Fatalf("drain unknown: %v", err)
	}
	// All drained: requests are refused with DOMAIN_DRAINING.
	for _, d := range h.e.Domains() {
		_ = h.e.Drain(d.ID, "all")
	}
	if d := h.admit(req("a", "medium", 100, 100)); d.Reason != ReasonDomainDraining {
		t.Fatalf("all drained: %+v", d)
	}
}

// Releases nobody saw the outcome of (the RLS adapter's) give domain
// health no sample: counted as OK, 100 of them would have hidden 20 errors
// (17%, under the 20% error rate).
func TestUnobservedReleasesLeaveHealthAlone(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 2))
	dom := h.admit(req("a", "small", 10, 10)).Domain // tenant a's small requests all go to one domain, until it is cut
	for i := range 120 {
		d := h.admit(req("a", "small", 10, 10))
		if d.Domain != dom {
			t.Fatalf("request %d placed on %s before %s was cut", i, d.Domain, dom)
		}
		outcome := ReleaseUnobserved
		if i%6 == 5 {
			outcome = ReleaseError
		}
		if _, err := h.e.Release(context.Background(), Release{LeaseID: d.LeaseID, OutputTokens: 10, Outcome: outcome}); err != nil {
			t.Fatal(err)
		}
	}
	if w := h.domain(dom).HealthWeight; w != 0.05 {
		t.Fatalf("weight after 20 errors and 100 unobserved releases: %v, want the cut 0.05", w)
	}
}

func TestDomainHealthCutAndRecovery(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 2))
	var bad string
	for i := 0; i < 20; i++ {
		d := h.admit(req("a", "small", 10, 10))
		bad = d.Domain // tenant a's small requests all go to one domain
		if _, err := h.e.Release(context.Background(), Release{LeaseID: d.LeaseID, OutputTokens: 10, Outcome: ReleaseError}); err != nil {
			t.Fatal(err)
		}
	}
	if w := h.domain(bad).HealthWeight; w != 0.05 {
		t.Fatalf("weight after 100%% errors: %v, want 0.05", w)
	}
	h.advance(29 * time.Second)
	if w := h.domain(bad).HealthWeight; w != 0.05 {
		t.Fatalf("recovered during cool-down: %v", w)
	}
	h.advance(time.Second)
	if w := h.domain(bad).HealthWeight; w < 0.149 || w > 0.151 {
		t.Fatalf("first step: %v, want 0.15", w)
	}
	for i := 0; i < 9; i++ {
		h.advance(5 * time.Second)
	}
	if w := h.domain(bad).HealthWeight; w != 1 {
		t.Fatalf("after recovery: %v, want 1", w)
	}
}

func TestQueuedRequestIsAdmittedWhenCapacityRefills(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	h.saturate("a", "large", 4000, 10)
	_, w := h.submit(req("b", "large", 4000, 10))
	if w == nil {
		t.Fatal("not queued")
	}
	if h.tenant("b").Queued != 1 {
		t.Fatal("queued count")
	}
	for i := 0; i < 100 && !answered(w); i++ {
		h.advance(10 * time.Millisecond)
	}
	if !answered(w) || w.decision.Outcome != Admitted || w.decision.Queued <= 0 {
		t.Fatalf("queued request: %+v", w.decision)
	}
	if h.tenant("b").Queued != 0 || h.tenant("b").InFlight != 1 {
		t.Fatalf("after dispatch: %+v", h.tenant("b"))
	}
}

func TestDeadlineUnmeetableAndQueueFull(t *testing.T) {
	cfg := testConfig()
	cfg.Queue.MaxPerFlow = 2
	cfg.Queue.MaxTotal = 2
	h := newHarness(t, cfg, hgxCluster(t, 1))
	h.saturate("a", "large", 4000, 10)
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	r := req("b", "large", 4000, 10)
	d, err := h.e.Admit(ctx, r)
	if err != nil || d.Reason != ReasonDeadlineUnmeetable || d.RetryAfter <= 0 {
		t.Fatalf("tight deadline: %+v %v", d, err)
	}
	level := h.tenant("b").TokenLevel
	h.submit(r)
	h.submit(r)
	d, _ = h.submit(r)
	if d.Reason != ReasonQueueFull || d.RetryAfter <= 0 {
		t.Fatalf("third queued: %+v, want QUEUE_FULL", d)
	}
	if got := h.tenant("b"); got.Queued != 2 || got.TokenLevel != level-2*(4000+40) {
		t.Fatalf("queue full charged something: %+v", got)
	}
	// A request no domain could ever hold is refused at once.
	if d := h.admit(req("b", "large", 1<<19, 1)); d.Reason != ReasonCapacityExceeded {
		t.Fatalf("too large: %+v", d)
	}
}

func TestQueuedRequestRejectedAtDeadlineIsRefunded(t *testing.T) {
	cfg := testConfig()
	cfg.Queue.DefaultWait = Duration{3 * time.Second}
	h := newHarness(t, cfg, hgxCluster(t, 1))
	h.saturate("a", "large", 4000, 10)
	level := h.tenant("b").TokenLevel
	_, w := h.submit(req("b", "large", 4000, 10))
	if w == nil {
		t.Fatal("not queued")
	}
	if got := h.tenant("b"); got.TokenLevel != level-4040 || got.Queued != 1 {
		t.Fatalf("queued request not charged: %+v", got)
	}
	h.advance(3 * time.Second) // deadlines are expired before dispatch
	if !answered(w) || w.decision.Reason != ReasonDeadlineUnmeetable {
		t.Fatalf("at the deadline: %+v", w.decision)
	}
	if got := h.tenant("b"); got.TokenLevel != level || got.Queued != 0 {
		t.Fatalf("not refunded: %+v (level was %d)", got, level)
	}
}

func TestApplyKeepsStateAndRefusesBadConfig(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 2))
	d := h.admit(req("a", "medium", 1000, 100))
	level := h.tenant("a").TokenLevel
	bad := testConfig()
	bad.Tenants["x"] = TenantConfig{Tier: "platinum"}
	err := h.e.Apply(bad)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Key != "tenants.x.tier" {
		t.Fatalf("bad config: %v, want ConfigError on tenants.x.tier", err)
	}
	if _, ok := h.e.Tenant("x"); ok {
		t.Fatal("refused config took effect")
	}
	good := testConfig()
	good.Tenants["x"] = TenantConfig{Tier: "gold"}
	if err := h.e.Apply(good); err != nil {
		t.Fatal(err)
	}
	if got := h.tenant("a").TokenLevel; got != level {
		t.Fatalf("reload reset a live bucket: %d → %d", level, got)
	}
	if got := h.domain(d.Domain); got.InFlight != 1 || got.KVInUse == 0 {
		t.Fatalf("reload dropped the lease: %+v", got)
	}
	h.release(d.LeaseID, 1000, 100)
	if d := h.admit(req("x", "small", 1, 1)); d.Outcome != Admitted {
		t.Fatalf("new tenant: %+v", d)
	}
}

func TestFloorsExceedingCapacityAreRefused(t *testing.T) {
	cfg := testConfig()
	p := cfg.Tiers["gold"]
	p.Floor = 1e8
	cfg.Tiers["gold"] = p
	_, err := New(cfg, hgxCluster(t, 1))
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Key != "tenants" {
		t.Fatalf("got %v, want ConfigError on tenants (floors exceed capacity)", err)
	}
}

func TestCloseAnswersEveryQueuedRequest(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	h.saturate("a", "large", 4000, 10)
	var ws []*waiter
	for i := 0; i < 10; i++ {
		if _, w := h.submit(req("b", "large", 4000, 10)); w != nil {
			ws = append(ws, w)
		}
	}
	h.e.Close()
	for _, w := range ws {
		if !answered(w) || w.decision.Reason != ReasonShuttingDown {
			t.Fatalf("queued request at shutdown: %+v", w.decision)
		}
	}
	if d := h.admit(req("a", "small", 1, 1)); d.Reason != ReasonShuttingDown {
		t.Fatalf("after close: %+v", d)
	}
	if got := h.tenant("b"); got.Queued != 0 {
		t.Fatalf("queued after close: %d", got.Queued)
	}
}

// A Release whose Authorize refuses the lease's tenant changes nothing and
// says why; an id nobody was given is not found.
func TestReleaseOfAnotherTenantsLeaseChangesNothing(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	d := h.admit(req("a", "medium", 1000, 500))
	tokens, dom := h.tenant("a").TokenLevel, h.domain(d.Domain)
	onlyB := func(tenant string) error {
		if tenant != "b" {
			return fmt.Errorf("not bound to %s", tenant)
		}
		return nil
	}
	_, err := h.e.Release(context.Background(), Release{LeaseID: d.LeaseID, OutputTokens: 1 << 30, Outcome: ReleaseError, Authorize: onlyB})
	if !errors.Is(err, ErrNotYourLease) {
		t.Fatalf("release of a's lease for a caller serving b: %v, want ErrNotYourLease", err)
	}
	if got := h.tenant("a").TokenLevel; got != tokens {
		t.Errorf("tokens %d → %d after a refused release", tokens, got)
	}
	if got := h.domain(d.Domain); got.KVInUse != dom.KVInUse || got.InFlight != dom.InFlight || got.HealthWeight != dom.HealthWeight {
		t.Errorf("domain %+v → %+v after a refused release", dom, got)
	}
	if _, err := h.e.Release(context.Background(), Release{LeaseID: d.LeaseID ^ 1}); !errors.Is(err, ErrLeaseNotFound) {
		t.Errorf("a forged id: %v, want ErrLeaseNotFound", err)
	}
	if _, err := h.e.Release(context.Background(), Release{LeaseID: d.LeaseID, Authorize: func(string) error { return nil }}); err != nil {
		t.Errorf("release by an allowed caller: %v", err)
	}
}

// Lease ids carry 64 random bits: neither sequential nor guessable from
// one another.
func TestLeaseIDsAreRandom(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	seen := map[uint64]bool{}
	var prev uint64
	ones := 0
	const n = 1000
	for i := 0; i < n; i++ {
		d := h.admit(req("a", "small", 10, 10))
		if seen[d.LeaseID] || d.LeaseID == 0 {
			t.Fatalf("lease id %d repeated or zero", d.LeaseID)
		}
		seen[d.LeaseID] = true
		if diff := d.LeaseID - prev; diff < 1<<20 || -diff < 1<<20 {
			t.Fatalf("ids %d then %d: close enough to guess", prev, d.LeaseID)
		}
		prev = d.LeaseID
		ones += bits.OnesCount64(d.LeaseID)
		h.release(d.LeaseID, 10, 10)
	}
	if avg := float64(ones) / n; avg < 30 || avg > 34 {
		t.Errorf("%.1f bits set per id on average, want about 32 of 64", avg)
	}
}

// The count of remembered request ids is bounded: past the bound the
// oldest are forgotten first (and counted), the newest still answer.
func TestIdempotencyRecordsAreBounded(t *testing.T) {
	cfg := testConfig()
	cfg.Leases.MaxIdempotencyRecords = 100
	h := newHarness(t, cfg, hgxCluster(t, 1))
	ids := make([]Decision, 0, 300)
	for i := 0; i < 300; i++ {
		r := req("a", "small", 10, 10)
		r.RequestID = fmt.Sprintf("id-%d", i)
		ids = append(ids, h.admit(r))
		if records, _ := h.e.IdempotencyRecords(); records > 100 {
			t.Fatalf("%d records after %d ids, bound 100", records, i+1)
		}
	}
	records, evicted := h.e.IdempotencyRecords()
	if records+int(evicted) != 300 || evicted < 200 {
		t.Fatalf("%d records, %d evicted of 300 ids", records, evicted)
	}
	// The newest is still a repeat (charged once); the oldest is decided afresh.
	r := req("a", "small", 10, 10)
	r.RequestID = "id-299"
	if d := h.admit(r); d.LeaseID != ids[299].LeaseID {
		t.Errorf("the newest id: lease %d, want %d", d.LeaseID, ids[299].LeaseID)
	}
	r.RequestID = "id-0"
	if d := h.admit(r); d.LeaseID == ids[0].LeaseID {
		t.Error("the oldest id still answered after the bound evicted it")
	}
}

// A request above its tenant's burst plus burst credit can never pass the
// token gate: it is REQUEST_TOO_LARGE at once, with no Retry-After and
// nothing charged, and Explain says the same at the tokens gate. A request
// the credit, the critical band, or the end of a credit freeze could carry
// is not.
func TestRequestAboveBurstPlusCreditIsTooLarge(t *testing.T) {
	cfg := testConfig()
	cfg.Tiers["bronze"] = TierPolicy{
		RPS: Limit{Rate: 1000, Burst: 1000}, Tokens: Limit{Rate: 5, Burst: 1000}, Weight: 1,
		Critical:    Limit{Rate: 10, Burst: 2000},
		BurstCredit: BurstCredit{Multiple: 100, Window: Duration{10 * time.Second}, BreakerOpen: Duration{60 * time.Second}},
	}
	h := newHarness(t, cfg, hgxCluster(t, 1))
	// Weighted tokens: prompt + 4 × 1 output. Burst 1000 + credit 500 = 1500.
	tooLarge := func(what string, r Request) {
		t.Helper()
		before := h.tenant("b")
		if d := h.admit(r); d.Outcome != Rejected || d.Reason != ReasonRequestTooLarge || d.RetryAfter != 0 {
			t.Fatalf("%s: %+v, want REQUEST_TOO_LARGE without a Retry-After", what, d)
		}
		if after := h.tenant("b"); after.TokenLevel != before.TokenLevel || after.RPSLevel != before.RPSLevel ||
			after.InFlight != before.InFlight || after.Queued != 0 || after.SpentTodayMicros != before.SpentTodayMicros {
			t.Fatalf("%s: the refusal charged something: %+v → %+v", what, before, after)
		}
	}
	tooLarge("1501 weighted tokens", req("b", "small", 1497, 1))
	x, err := h.e.Explain(context.Background(), req("b", "small", 1497, 1))
	if err != nil || x.Outcome != "REJECTED" || x.Reason != ReasonRequestTooLarge || x.RetryAfter != 0 {
		t.Fatalf("explain: %+v %v, want REQUEST_TOO_LARGE", x, err)
	}
	reached := true // every gate up to the token gate, which refuses
	for _, g := range x.Gates {
		if g.Reached != reached || g.Passed != (reached && g.Gate != "tokens") {
			t.Errorf("explain gate %s: passed %v reached %v", g.Gate, g.Passed, g.Reached)
		}
		if g.Gate == "tokens" {
			reached = false
		}
	}
	critical := req("b", "small", 1497, 1)
	critical.Priority = PriorityCritical
	if d := h.admit(critical); d.Outcome != Admitted {
		t.Fatalf("critical within the critical burst: %+v, want admitted from the critical band", d)
	}
	critical.PromptTokens = 1997 // 2001: above the critical burst too
	tooLarge("critical 2001", critical)

	h.e.FreezeCreditFor(time.Minute, "drill")
	if d := h.admit(req("b", "small", 1196, 1)); d.Reason != ReasonBurstCreditFrozen {
		t.Fatalf("1200 during a credit freeze: %+v, want BURST_CREDIT_FROZEN (the freeze ends)", d)
	}
	tooLarge("1501 during a credit freeze", req("b", "small", 1497, 1))
	h.e.ThawCredit()
	if d := h.admit(req("b", "small", 1496, 1)); d.Outcome != Admitted {
		t.Fatalf("exactly burst + credit: %+v, want admitted", d)
	}
	// In debt now, and a request the full bucket could carry waits for it.
	if d := h.admit(req("b", "small", 1496, 1)); d.Reason != ReasonQuotaExceeded || d.RetryAfter <= 0 {
		t.Fatalf("burst + credit while in debt: %+v, want QUOTA_EXCEEDED with a Retry-After", d)
	}
}
