package gateway

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// After 200 requests of one model whose tokenizer gives 1 token per 3.6
// bytes, give or take 2% per prompt, the estimate is within 5% of the
// engine's count for 9 requests in 10 (the last 100 judged).
func TestEstimateConvergesOnTheEnginesCount(t *testing.T) {
	e := NewEstimator(0, 0, nil)
	rng := rand.New(rand.NewPCG(1, 2))
	var errs []float64
	for i := range 200 {
		n := 200 + rng.IntN(20000)
		real := int64(math.Round(float64(n) / 3.6 * (0.98 + 0.04*rng.Float64())))
		est := e.Estimate("llama", n)
		if i >= 100 {
			errs = append(errs, math.Abs(float64(est-real))/float64(real))
		}
		e.Observe("llama", n, est, real)
	}
	slices.Sort(errs)
	if p90 := errs[len(errs)*9/10-1]; p90 > 0.05 {
		t.Errorf("p90 error after 200 requests = %.3f, want ≤ 0.05 (ratio %.4f, true 0.2778)", p90, e.Ratio("llama"))
	}
	if r := e.Ratio("other"); r != DefaultPrior {
		t.Errorf("a model never reported has ratio %g, want the prior %g", r, DefaultPrior)
	}
}

// A model's ratio follows a new tokenizer (a model redeployed under the
// same name) within a few dozen requests.
func TestEstimateFollowsAChange(t *testing.T) {
	e := NewEstimator(0, 0, nil)
	for range 50 {
		e.Observe("m", 1000, 0, 250)
	}
	for range 60 {
		e.Observe("m", 1000, 0, 400)
	}
	if r := e.Ratio("m"); math.Abs(r-0.4) > 0.4*0.05 {
		t.Errorf("ratio %g after 60 reports at 0.4, want within 5%%", r)
	}
	if got := e.Estimate("m", 0); got != 1 {
		t.Errorf("an empty prompt is estimated %d tokens, want 1", got)
	}
}
