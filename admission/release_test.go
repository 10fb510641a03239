package admission

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"
)

// What a Release measured feeds the capacity loop, so a value that cannot
// be true is INVALID_ARGUMENT naming its field and changes nothing: the
// lease stays held, and settles afterwards as usual.
func TestReleaseRefusesMeasurementsThatCannotBeTrue(t *testing.T) {
	const prompt, output = 100, 10
	for _, c := range []struct {
		name  string
		rel   Release
		field string
	}{
		{"cached above the reported prompt", Release{PromptTokens: 50, CachedPromptTokens: 51}, "cached_prompt_tokens"},
		{"cached above the admitted prompt", Release{CachedPromptTokens: prompt + 1}, "cached_prompt_tokens"},
		{"cached at MaxInt64", Release{CachedPromptTokens: math.MaxInt64}, "cached_prompt_tokens"},
		{"cached and prompt at MaxInt64", Release{PromptTokens: math.MaxInt64, CachedPromptTokens: math.MaxInt64}, "cached_prompt_tokens"},
		{"time to first token of 292 years", Release{TTFT: math.MaxInt64}, "time_to_first_token"},
		{"time to first token past a day", Release{TTFT: maxMeasuredDuration + 1}, "time_to_first_token"},
		{"duration of 292 years", Release{TTFT: time.Second, Duration: math.MaxInt64}, "duration"},
		{"duration past a day", Release{Duration: maxMeasuredDuration + 1}, "duration"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, testConfig(), hgxCluster(t, 1))
			d := h.admit(req("a", "small", prompt, output))
			rel := c.rel
			rel.LeaseID = d.LeaseID
			_, err := h.e.Release(context.Background(), rel)
			var ia *InvalidArgumentError
			if !errors.As(err, &ia) || ia.Field != c.field {
				t.Fatalf("release %+v: %v, want an invalid %s", c.rel, err, c.field)
			}
			if got := h.domain("d1"); got.InFlight != 1 {
				t.Fatalf("after the refusal %d leases in flight, want the lease still held", got.InFlight)
			}
			if _, err := h.e.Release(context.Background(), Release{LeaseID: d.LeaseID, CachedPromptTokens: prompt, TTFT: maxMeasuredDuration, Duration: maxMeasuredDuration}); err != nil {
				t.Fatalf("release at the bounds: %v", err)
			}
		})
	}
}
