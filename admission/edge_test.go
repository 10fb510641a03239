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

// A Release reporting more than limits.release_overrun_multiple times what
// its lease admitted is charged exactly as one reporting the bound: the
// tenant and the domain alike, and the answer says it was clamped. Within
// the bound nothing is clamped.
func TestReleaseOverrunIsBoundedByAMultipleOfTheAdmission(t *testing.T) {
	const prompt, output = 10, 5 // 30 weighted tokens admitted
	for _, c := range []struct {
		name           string
		multiple       int64 // 0: the default, 4
		prompt, output int64 // reported
		charged        Release
		clamped        bool
	}{
		{"output at the global limit", 0, 0, 1<<63 - 1, Release{OutputTokens: 4 * output}, true},
		{"output just past the bound", 0, 0, 4*output + 1, Release{OutputTokens: 4 * output}, true},
		{"prompt past the bound", 0, 1 << 40, output, Release{PromptTokens: 4 * prompt, OutputTokens: output}, true},
		{"both at the bound", 0, 4 * prompt, 4 * output, Release{PromptTokens: 4 * prompt, OutputTokens: 4 * output}, false},
		{"less than admitted", 0, 0, 1, Release{OutputTokens: 1}, false},
		{"multiple 1: no overrun", 1, 0, output + 1, Release{OutputTokens: output}, true},
		{"multiple 1, as admitted", 1, prompt, output, Release{PromptTokens: prompt, OutputTokens: output}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Limits.ReleaseOverrunMultiple = c.multiple
			h, twin := newHarness(t, cfg, hgxCluster(t, 1)), newHarness(t, cfg, hgxCluster(t, 1))
			var res [2]ReleaseResult
			for i, e := range []*harness{h, twin} {
				d := e.admit(req("a", "small", prompt, output))
				rel := c.charged
				if i == 0 {
					rel = Release{PromptTokens: c.prompt, OutputTokens: c.output}
				}
				rel.LeaseID = d.LeaseID
				var err error
				if res[i], err = e.e.Release(context.Background(), rel); err != nil {
					t.Fatalf("release %+v: %v", rel, err)
				}
			}
			if res[0].OverrunClamped != c.clamped || res[0].Tenant != "a" {
				t.Errorf("clamped %v for tenant %q, want %v for a", res[0].OverrunClamped, res[0].Tenant, c.clamped)
			}
			if res[0].RefundedTokens != res[1].RefundedTokens || res[0].ActualCostMicros != res[1].ActualCostMicros {
				t.Errorf("charged %+v, want %+v (the bound's charge)", res[0], res[1])
			}
			if a, b := h.tenant("a"), twin.tenant("a"); a.TokenLevel != b.TokenLevel || a.SpentTodayMicros != b.SpentTodayMicros {
				t.Errorf("tenant: tokens %d, spent %d; at the bound %d, %d", a.TokenLevel, a.SpentTodayMicros, b.TokenLevel, b.SpentTodayMicros)
			}
			if a, b := h.domain("d1"), twin.domain("d1"); a.PrefillLevel != b.PrefillLevel || a.DecodeLevel != b.DecodeLevel || a.InFlight != 0 || a.KVInUse != 0 {
				t.Errorf("domain: prefill %d, decode %d (in flight %d, KV %d); at the bound %d, %d", a.PrefillLevel, a.DecodeLevel, a.InFlight, a.KVInUse, b.PrefillLevel, b.DecodeLevel)
			}
		})
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
