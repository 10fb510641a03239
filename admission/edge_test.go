package admission

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/topology"
)

// A request that only the floor reserve could ever hold is refused at once
// as CAPACITY_EXCEEDED with no Retry-After, even with others queued (a
// "never" wait once overflowed into a negative retry_after).
func TestRequestOnlyTheReserveCouldHoldIsRefused(t *testing.T) {
	cfg := testConfig()
	cfg.Tiers["floored"] = TierPolicy{RPS: Limit{Rate: 1e6, Burst: 1e6}, Tokens: Limit{Rate: 1e9, Burst: 1e9}, Floor: 1709, Weight: 1}
	cfg.Tenants["f"] = TenantConfig{Tier: "floored"}
	h := newHarness(t, cfg, hgxCluster(t, 1))
	if got := h.domain("d1").ReservedFrac; got < 0.4 || got > 0.6 {
		t.Fatalf("reserved fraction %v, want about half", got)
	}
	if d := h.admit(req("a", "large", 3000, 1)); d.Outcome != Admitted {
		t.Fatalf("first: %+v", d)
	}
	if _, w := h.submit(req("a", "large", 3000, 1)); w == nil {
		t.Fatal("second not queued")
	}
	d := h.admit(req("a", "large", 5000, 1)) // above the shared part, below the burst
	if d.Outcome != Rejected || d.Reason != ReasonCapacityExceeded || d.RetryAfter != 0 {
		t.Fatalf("got %+v, want CAPACITY_EXCEEDED with retry_after 0", d)
	}
}

func TestRetryAfterIsNeverNegativeOrHuge(t *testing.T) {
	for _, d := range []Decision{rejected(ReasonQuotaExceeded, -5), rejected(ReasonQuotaExceeded, 1<<62)} {
		if d.RetryAfter < 0 || d.RetryAfter.Hours() > 24 {
			t.Fatalf("retry_after %v outside [0, 24h]", d.RetryAfter)
		}
	}
}

func TestFloorsOnAClusterWithoutCapacityAreRefused(t *testing.T) {
	c, err := topology.Parse([]byte("domains:\n  - id: d1\n    kind: hgx\n    nodes:\n      - name: n1\n        gpus:\n          - {name: NVIDIA H200, healthy: false}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	p := cfg.Tiers["gold"]
	p.Floor = 100
	cfg.Tiers["gold"] = p
	_, err = New(cfg, c)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Key != "tenants" {
		t.Fatalf("got %v, want floors refused", err)
	}
}

func TestReleaseBeyondTheLimitsSettlesTheLease(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	d := h.admit(req("a", "small", 10, 10))
	res, err := h.e.Release(context.Background(), Release{LeaseID: d.LeaseID, PromptTokens: 1 << 62, OutputTokens: 1 << 62})
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	if res.RefundedTokens >= 0 {
		t.Fatalf("overrun not charged: %+v", res)
	}
	if got := h.domain("d1"); got.InFlight != 0 || got.KVInUse != 0 {
		t.Fatalf("lease still held: %+v", got)
	}
}

func TestRepeatedRequestIDIsAnsweredDuringShutdown(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	r := req("a", "small", 10, 10)
	r.RequestID = "lost-answer"
	first := h.admit(r)
	h.e.Close()
	if again := h.admit(r); again.LeaseID != first.LeaseID || again.Outcome != Admitted {
		t.Fatalf("retry after close: %+v, want the original admission %+v", again, first)
	}
}

func TestLongNamesAreRefusedWithoutEcho(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	long := strings.Repeat("m", 3<<20)
	for _, r := range []Request{req("a", long, 1, 1), {Tenant: "a", Model: "large", PromptTokens: 1, MaxOutputTokens: 1, AcceptDowngrade: []string{long}}} {
		_, err := h.e.Admit(context.Background(), r)
		var ia *InvalidArgumentError
		if !errors.As(err, &ia) || len(err.Error()) > 200 {
			t.Fatalf("got %.200v (%d bytes)", err, len(err.Error()))
		}
	}
}
