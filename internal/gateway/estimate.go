package gateway

import (
	"math"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Estimator estimates a prompt's tokens from its bytes with a ratio of
// tokens to bytes per model, calibrated from the prompt tokens the engines
// report: after each response it takes in the pair (bytes, tokens) with
// weight Alpha, as decayed sums Σtokens / Σbytes, so a long prompt counts
// for more than a short one and the ratio follows a change of tokenizer
// within a few dozen requests. Until a model has a report its ratio is
// Prior. Safe for concurrent use.
type Estimator struct {
	prior, alpha float64
	errs         *prometheus.HistogramVec // |estimate − reported| / reported, by model

	mu     sync.Mutex
	models map[string]*ratio
}

// ratio is one model's decayed sums.
type ratio struct{ tokens, bytes float64 }

// The estimator's defaults.
const (
	// DefaultPrior is about 4 bytes a token: English text under the BPE
	// tokenizers of today's open models, before any report.
	DefaultPrior = 0.25
	// DefaultAlpha weighs each report: about the last 20 requests decide.
	DefaultAlpha = 0.05
)

// NewEstimator returns an Estimator with prior and alpha (0: the
// defaults) whose error histogram, sluice_gateway_prompt_estimate_error_ratio,
// is registered with reg (nil: not registered).
func NewEstimator(prior, alpha float64, reg prometheus.Registerer) *Estimator {
	if prior <= 0 {
		prior = DefaultPrior
	}
	if alpha <= 0 || alpha > 1 {
		alpha = DefaultAlpha
	}
	e := &Estimator{prior: prior, alpha: alpha, models: make(map[string]*ratio),
		errs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_gateway_prompt_estimate_error_ratio",
			Help:    "How far the gateway's prompt-token estimate was from the prompt tokens the engine reported, as a share of the reported count, by model.",
			Buckets: []float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1},
		}, []string{"model"})}
	if reg != nil {
		reg.MustRegister(e.errs)
	}
	return e
}

// Estimate returns the tokens of a prompt of n bytes for model: at least 1.
func (e *Estimator) Estimate(model string, n int) int64 {
	e.mu.Lock()
	r := e.ratioLocked(model)
	e.mu.Unlock()
	return max(1, int64(math.Ceil(float64(n)*r)))
}

// Ratio returns model's tokens per byte.
func (e *Estimator) Ratio(model string) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ratioLocked(model)
}

func (e *Estimator) ratioLocked(model string) float64 {
	if r := e.models[model]; r != nil && r.bytes > 0 {
		return r.tokens / r.bytes
	}
	return e.prior
}

// Observe takes in what an engine reported for a prompt of n bytes whose
// estimate was estimated: its error goes to the histogram, and the pair to
// model's ratio. A report of no tokens or no bytes says nothing.
func (e *Estimator) Observe(model string, n int, estimated, reported int64) {
	if n <= 0 || reported <= 0 {
		return
	}
	e.errs.WithLabelValues(model).Observe(math.Abs(float64(estimated-reported)) / float64(reported))
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.models[model]
	if r == nil {
		// The first report replaces the prior at once.
		e.models[model] = &ratio{tokens: float64(reported), bytes: float64(n)}
		return
	}
	r.tokens = (1-e.alpha)*r.tokens + e.alpha*float64(reported)
	r.bytes = (1-e.alpha)*r.bytes + e.alpha*float64(n)
}

// Forget drops the ratios of models not in keep, so a model gone from the
// catalog leaves no state behind.
func (e *Estimator) Forget(keep func(model string) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for m := range e.models {
		if !keep(m) {
			delete(e.models, m)
			e.errs.DeleteLabelValues(m)
		}
	}
}
