package admission

import (
	"errors"
	"testing"
	"time"
)

// Usage reported after the response is charged to the tenant's token
// bucket even past its burst credit (a debt, as a Release overrun is): the
// work is done, so it is never refused. The debt then refuses Admit with
// the exact wait for it to be repaid, and nothing is placed on a domain.
func TestChargeUsageRunsIntoDebtAndRefusesUntilRepaid(t *testing.T) {
	cfg := testConfig()
	cfg.Tiers["bronze"] = TierPolicy{RPS: Limit{Rate: 1000, Burst: 1000}, Tokens: Limit{Rate: 500, Burst: 1000}, Weight: 1,
		BurstCredit: BurstCredit{Multiple: 1, Window: Duration{time.Hour}, BreakerOpen: Duration{time.Minute}}}
	h := newHarness(t, cfg, hgxCluster(t, 1))
	before := h.domain("d1")
	// 1000 prompt + 4 × 250 output = 2000 weighted: past the burst (1000)
	// and the credit it lends (500).
	res, err := h.e.ChargeUsage(Usage{Tenant: "b", Model: "small", PromptTokens: 1000, OutputTokens: 250})
	if err != nil {
		t.Fatal(err)
	}
	if res.WeightedTokens != 2000 || res.QuotaAfter != -1000 || res.Clamped {
		t.Fatalf("charged %+v, want 2000 weighted leaving -1000", res)
	}
	if lvl := h.tenant("b").TokenLevel; lvl != -1000 {
		t.Fatalf("b's tokens = %d, want -1000", lvl)
	}
	if got := h.domain("d1"); got != before {
		t.Fatalf("domain after usage:\n%+v\nbefore:\n%+v", got, before)
	}
	// A second report while in debt is charged all the same.
	if res, err := h.e.ChargeUsage(Usage{Tenant: "b", Model: "small", PromptTokens: 500}); err != nil || res.QuotaAfter != -1500 {
		t.Fatalf("usage while in debt: %+v, %v", res, err)
	}
	// The cheapest request (5) passes once it leaves the level at the
	// credit's -500: from -1500 up to -495, 1005 tokens at 500/s.
	d := h.admit(req("b", "small", 1, 1))
	if d.Outcome != Rejected || d.Reason != ReasonQuotaExceeded || d.RetryAfter != 2010*time.Millisecond {
		t.Fatalf("in debt: %+v, want QUOTA_EXCEEDED for 2.01s", d)
	}
	h.advance(d.RetryAfter)
	if d := h.admit(req("b", "small", 1, 1)); d.Outcome != Admitted {
		t.Fatalf("after repaying: %+v", d)
	}
}

// Usage is priced at the model's rates into the tenant's budget, and counts
// above the request limits are charged at the limit.
func TestChargeUsageSpendsTheBudgetAndBoundsTheCounts(t *testing.T) {
	cfg := testConfig()
	p := cfg.Tiers["bronze"]
	p.Budget = Budget{DailyUSD: 0.001} // 1000 micro-USD
	cfg.Tiers["bronze"] = p
	h := newHarness(t, cfg, hgxCluster(t, 1))
	// small: $0.0001/1k in, $0.0002/1k out → 3000 + 2000 tokens = 700 micro-USD.
	res, err := h.e.ChargeUsage(Usage{Tenant: "b", Model: "small", PromptTokens: 3000, OutputTokens: 2000})
	if err != nil || res.CostMicros != 700 {
		t.Fatalf("usage: %+v, %v, want 700 µ$", res, err)
	}
	if spent := h.tenant("b").SpentTodayMicros; spent != 700 {
		t.Fatalf("spent today %d, want 700", spent)
	}
	if d := h.admit(req("b", "small", 1000, 1500)); d.Reason != ReasonBudgetExhausted {
		t.Fatalf("400 µ$ more on 700 of 1000: %+v, want BUDGET_EXHAUSTED", d)
	}
	lim := h.e.Config().Limits
	res, err = h.e.ChargeUsage(Usage{Tenant: "a", Model: "small", PromptTokens: 1 << 62, OutputTokens: 1 << 62})
	if err != nil || !res.Clamped || res.WeightedTokens != lim.MaxPromptTokens+4*lim.MaxOutputTokens {
		t.Fatalf("usage past the limits: %+v, %v, want clamped to %d + 4 × %d", res, err, lim.MaxPromptTokens, lim.MaxOutputTokens)
	}
}

// A report that cannot be charged is an error naming why, and changes
// nothing.
func TestChargeUsageRefusesBadReports(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	for _, c := range []struct {
		name  string
		u     Usage
		field string // empty: ErrUnknownTenant
	}{
		{"no tenant", Usage{Model: "small", PromptTokens: 1}, "tenant"},
		{"no model", Usage{Tenant: "a", PromptTokens: 1}, "model"},
		{"unknown model", Usage{Tenant: "a", Model: "huge", PromptTokens: 1}, "model"},
		{"negative prompt", Usage{Tenant: "a", Model: "small", PromptTokens: -1}, "prompt_tokens"},
		{"negative output", Usage{Tenant: "a", Model: "small", OutputTokens: -1}, "output_tokens"},
		{"unknown tenant", Usage{Tenant: "nobody", Model: "small", PromptTokens: 1}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := h.e.ChargeUsage(c.u)
			switch {
			case c.field == "" && !errors.Is(err, ErrUnknownTenant):
				t.Fatalf("%v, want ErrUnknownTenant", err)
			case c.field != "" && !isInvalid(err, c.field):
				t.Fatalf("%v, want an invalid %s", err, c.field)
			}
			if lvl := h.tenant("a").TokenLevel; lvl != 1e9 {
				t.Fatalf("a's tokens = %d after a refused report", lvl)
			}
		})
	}
}
