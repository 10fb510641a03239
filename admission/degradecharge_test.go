package admission

import (
	"math"
	"testing"
)

// A degraded admission takes its granted tier's share of the quota: the
// weighted tokens times the granted model's prefill FLOPs per token over
// the requested model's. Its release settles at the same share, so what
// comes back is what it did not use of that share, and the bucket ends
// where the actual tokens on the lower tier leave it.
func TestDegradedAdmissionPaysItsTiersShareOfTheQuota(t *testing.T) {
	cfg := testConfig()
	cfg.DegradeHeadroom = ptr(0.0001)
	cfg.Queue.DegradeAfter = &Duration{0}
	h := newHarness(t, cfg, hgxCluster(t, 1))
	if got := h.saturate("b", "large", 4000, 10); len(got) == 0 {
		t.Fatal("nothing admitted while saturating")
	}
	large, medium := h.e.mu.place.models["large"].model, h.e.mu.place.models["medium"].model
	rate := float64(medium.ActiveParams) / float64(large.ActiveParams)
	r := req("a", "large", 4000, 100)
	r.AcceptDowngrade = []string{"medium"}
	d := h.admit(r)
	if d.Outcome != Degraded || d.Model != "medium" {
		t.Fatalf("want DEGRADED to medium, got %+v", d)
	}
	weighted := int64(4000 + 4*100)
	want := int64(math.Ceil(float64(weighted) * rate))
	if got := d.Trace.QuotaBefore - d.Trace.QuotaAfter; got != want {
		t.Fatalf("quota charged %d weighted tokens, want %d (%d at %.3f, medium's FLOPs per token over large's)", got, want, weighted, rate)
	}
	res := h.release(d.LeaseID, 4000, 40)
	used := int64(math.Ceil(float64(4000+4*40) * rate))
	if res.RefundedTokens != want-used {
		t.Fatalf("release refunded %d weighted tokens, want %d (%d charged, %d used at medium's share)", res.RefundedTokens, want-used, want, used)
	}
	// A request on its own tier pays its weighted tokens in full.
	h2 := newHarness(t, cfg, hgxCluster(t, 1))
	full := h2.admit(r)
	if full.Outcome != Admitted || full.Trace.QuotaBefore-full.Trace.QuotaAfter != weighted {
		t.Fatalf("on its own tier: %+v, want ADMITTED charged %d", full, weighted)
	}
}
