package admission

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-sched/sluice/pd"
)

// Release ends a lease: the domain gets back what was charged for output
// never generated (and is charged for any overrun), the KV is freed, the
// tenant's token bucket and budget are settled to the actual tokens, and the
// outcome feeds the domain's health. Counts past
// limits.release_overrun_multiple times what the lease admitted are charged
// at that bound (ReleaseResult.OverrunClamped). What the router measured
// feeds the capacity loop's calibration, so it is refused, not clamped,
// when it cannot be true (InvalidArgumentError, nothing changes): cached
// prompt tokens above the prompt tokens or above limits.max_prompt_tokens,
// and a time to first token or duration above maxMeasuredDuration.
// Releasing twice returns ErrLeaseNotFound and changes nothing.
func (e *Engine) Release(ctx context.Context, rel Release) (ReleaseResult, error) {
	if err := validateRelease(&rel); err != nil {
		return ReleaseResult{}, err
	}
	e.mu.Lock()
	slot, ok := e.mu.leases.find(rel.LeaseID)
	if !ok {
		e.mu.Unlock()
		return ReleaseResult{}, ErrLeaseNotFound
	}
	if rel.Authorize != nil {
		if err := rel.Authorize(e.mu.leases.slot(slot).tenant.name); err != nil {
			e.mu.Unlock()
			return ReleaseResult{}, fmt.Errorf("%w: %w", ErrNotYourLease, err)
		}
	}
	if err := validateCached(&rel, &e.mu.leases.slot(slot).lease, &e.mu.cfg.Limits); err != nil {
		e.mu.Unlock()
		return ReleaseResult{}, err
	}
	l := e.mu.leases.take(slot)
	clamped := l.boundOverrun(&rel, &e.mu.cfg.Limits)
	now := e.nowLocked()
	res, weighted, actual := l.settle(now, e.base.Add(time.Duration(now)), rel, &e.mu.place)
	res.OverrunClamped = clamped
	res.Deferred = l.ticketed
	storeWork := e.shared.ReleasedLocked(rel.LeaseID, l.sharedCharge(), weighted, actual)
	answered := e.dispatchLocked(now, nil)
	e.mu.Unlock()
	finish(answered)
	if storeWork != nil {
		storeWork(ctx)
	}
	if e.observer != nil {
		e.observer.ObserveRelease(rel, res)
	}
	return res, nil
}

// boundOverrun charges counts past a bound at the bound: at most
// limits.release_overrun_multiple times what the lease admitted, and never
// past the request limits. The lease must still be settled, and the bound
// keeps one report, mistaken or hostile, from charging the tenant and the
// domain far beyond the admission (5 tokens admitted, 2^63−1 reported).
// It reports whether a count was lowered.
func (l *lease) boundOverrun(rel *Release, lim *RequestLimits) (clamped bool) {
	bound := func(n *int64, admitted, limit int64) {
		if b := min(limit, admitted*lim.ReleaseOverrunMultiple); *n > b {
			*n, clamped = b, true
		}
	}
	bound(&rel.PromptTokens, l.prompt, lim.MaxPromptTokens)
	bound(&rel.OutputTokens, l.output, lim.MaxOutputTokens)
	if rel.PromptTokens > 0 {
		// Within the prompt it was checked against, and so within the
		// prompt as bounded.
		rel.CachedPromptTokens = min(rel.CachedPromptTokens, rel.PromptTokens)
	}
	return clamped
}

// maxMeasuredDuration bounds a Release's time to first token and duration:
// no lease lives that long at any sane leases.ttl, and a larger value (a
// protobuf Duration reaches 10,000 years) would only skew the capacity
// loop's calibration.
const maxMeasuredDuration = 24 * time.Hour

// validateCached checks the cached prompt tokens against the prompt they
// are part of (the lease's admitted prompt when the Release reports none)
// and against the largest prompt Admit accepts.
func validateCached(rel *Release, l *lease, lim *RequestLimits) error {
	prompt := rel.PromptTokens
	if prompt == 0 {
		prompt = l.prompt
	}
	switch {
	case rel.CachedPromptTokens > prompt:
		return &InvalidArgumentError{Field: "cached_prompt_tokens", Reason: fmt.Sprintf("must not exceed the prompt tokens %d, got %d", prompt, rel.CachedPromptTokens)}
	case rel.CachedPromptTokens > lim.MaxPromptTokens:
		return &InvalidArgumentError{Field: "cached_prompt_tokens", Reason: fmt.Sprintf("%d exceeds the limit of %d", rel.CachedPromptTokens, lim.MaxPromptTokens), Limit: lim.MaxPromptTokens}
	}
	return nil
}

func validateRelease(rel *Release) error {
	switch {
	case rel.LeaseID == 0:
		return &InvalidArgumentError{Field: "lease_id", Reason: "must not be empty"}
	case rel.PromptTokens < 0:
		return &InvalidArgumentError{Field: "prompt_tokens", Reason: fmt.Sprintf("must be ≥ 0, got %d", rel.PromptTokens)}
	case rel.OutputTokens < 0:
		return &InvalidArgumentError{Field: "output_tokens", Reason: fmt.Sprintf("must be ≥ 0, got %d", rel.OutputTokens)}
	case rel.CachedPromptTokens < 0:
		return &InvalidArgumentError{Field: "cached_prompt_tokens", Reason: fmt.Sprintf("must be ≥ 0, got %d", rel.CachedPromptTokens)}
	case rel.PromptTokens > 0 && rel.CachedPromptTokens > rel.PromptTokens:
		return &InvalidArgumentError{Field: "cached_prompt_tokens", Reason: fmt.Sprintf("must not exceed prompt_tokens %d, got %d", rel.PromptTokens, rel.CachedPromptTokens)}
	case rel.TTFT < 0 || rel.TTFT > maxMeasuredDuration:
		return &InvalidArgumentError{Field: "time_to_first_token", Reason: fmt.Sprintf("must be in [0, %v], got %v", maxMeasuredDuration, rel.TTFT)}
	case rel.Duration < 0 || rel.Duration > maxMeasuredDuration || (rel.Duration > 0 && rel.Duration < rel.TTFT):
		return &InvalidArgumentError{Field: "duration", Reason: fmt.Sprintf("must be in [0, %v] and not shorter than time_to_first_token, got %v", maxMeasuredDuration, rel.Duration)}
	case rel.Outcome != 0 && rel.Outcome != ReleaseOK && rel.Outcome != ReleaseError && rel.Outcome != ReleaseUnobserved:
		return &InvalidArgumentError{Field: "outcome", Reason: fmt.Sprintf("unknown outcome %d", rel.Outcome)}
	}
	return nil
}

// settle settles a released lease's charge at its actual tokens, costed
// and priced with the placer's catalog (a model no longer in it keeps its
// admitted cost and price), and feeds the outcome, if observed, to the
// domain's health.
// It returns the answer, and the actual weighted tokens and cost.
func (l *lease) settle(now int64, wall time.Time, rel Release, p *placer) (res ReleaseResult, weighted int64, actual pd.Cost) {
	prompt, cached := rel.PromptTokens, rel.CachedPromptTokens
	if prompt == 0 {
		prompt = l.prompt
	}
	if cached == 0 {
		cached = l.cached // as expected, when the router measured none
	}
	actual, price := l.cost, l.gates.price
	if m, known := p.models[l.modelName]; known {
		if c, err := l.dom.cap.CostCached(m.model, prompt, cached, rel.OutputTokens); err == nil {
			actual = c
		}
		price = p.cat.PriceMicros(m.model, prompt, rel.OutputTokens)
	}
	weighted = scaleWeighted(prompt+l.outWeight*rel.OutputTokens, l.tierShare)
	l.tenant.budget.roll(wall)
	refunded := l.Settle(now, actual, weighted, price)
	if rel.Outcome != ReleaseUnobserved {
		p.recordOutcome(l.dom, now, rel.Outcome == ReleaseError)
	}
	if rel.Outcome != ReleaseError {
		l.dom.loop.released(actual, rel.TTFT)
	}
	return ReleaseResult{
		Tenant:           l.tenant.name,
		Domain:           l.dom.ID(),
		Model:            l.modelName,
		RefundedTokens:   refunded,
		ActualCostMicros: price,
		HeldFor:          time.Duration(now - l.granted),
	}, weighted, actual
}
