package admission

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Usage is what a request used that no lease holds, reported after its
// response: a gateway that only checks the quota on the request path
// (Envoy AI Gateway's rate-limit pattern, whose call at stream end carries
// the real usage) settles the tokens here.
type Usage struct {
	Tenant       string
	Model        string // prices the budget charge
	PromptTokens int64
	OutputTokens int64
}

// UsageResult is what ChargeUsage charged.
type UsageResult struct {
	WeightedTokens int64 // prompt + output_token_weight × output, taken from the token bucket
	QuotaAfter     int64 // the tenant's token bucket after the charge; negative: in debt
	CostMicros     int64 // charged to the tenant's budget
	Clamped        bool  // a count above the request limits was charged at the limit
}

// ErrUnknownTenant is ChargeUsage's answer for a tenant the config does not
// name: there is no quota to charge.
var ErrUnknownTenant = errors.New("unknown tenant")

// ChargeUsage charges tokens already used to u's tenant: its token bucket
// (which may go into debt, past the burst credit, as a Release overrun
// does: the work is done, so it is never refused) and its budget, at u's
// model's price. Counts above limits.max_prompt_tokens or
// limits.max_output_tokens are charged at the limit (Clamped), so that one
// mistaken or hostile report cannot sink a tenant for good. Nothing is
// placed on a domain: the request ran wherever the gateway sent it. An
// empty tenant or model, negative counts or an unknown model are an
// InvalidArgumentError, an unconfigured tenant ErrUnknownTenant; either
// changes nothing.
//
// The charge is this replica's: batched shared state reconciles it with
// the rest of the bucket's use; strict shared state does not take it from
// the store.
func (e *Engine) ChargeUsage(u Usage) (UsageResult, error) {
	switch {
	case u.Tenant == "" || len(u.Tenant) > maxNameLen || !utf8.ValidString(u.Tenant):
		return UsageResult{}, &InvalidArgumentError{Field: "tenant", Reason: fmt.Sprintf("must be valid UTF-8 of 1 to %d bytes", maxNameLen)}
	case u.Model == "" || len(u.Model) > maxNameLen:
		return UsageResult{}, &InvalidArgumentError{Field: "model", Reason: fmt.Sprintf("must be 1 to %d bytes", maxNameLen)}
	case u.PromptTokens < 0:
		return UsageResult{}, &InvalidArgumentError{Field: "prompt_tokens", Reason: fmt.Sprintf("must be ≥ 0, got %d", u.PromptTokens)}
	case u.OutputTokens < 0:
		return UsageResult{}, &InvalidArgumentError{Field: "output_tokens", Reason: fmt.Sprintf("must be ≥ 0, got %d", u.OutputTokens)}
	}
	now := int64(e.clk.Since(e.base))
	wall := e.base.Add(time.Duration(now))
	e.mu.Lock()
	defer e.mu.Unlock()
	m, ok := e.mu.place.models[u.Model]
	if !ok {
		return UsageResult{}, &InvalidArgumentError{Field: "model", Reason: fmt.Sprintf("unknown model %q (known: %v)", u.Model, e.mu.place.cat.Names())}
	}
	t, fresh := e.mu.gates.lookupLocked(u.Tenant, now, e.mu.place.modelList)
	if t == nil {
		return UsageResult{}, fmt.Errorf("charging usage to %q: %w", u.Tenant, ErrUnknownTenant)
	}
	if fresh {
		e.shared.TenantReadyLocked(t, now, false)
	}
	var res UsageResult
	lim := &e.mu.cfg.Limits
	prompt, output := u.PromptTokens, u.OutputTokens
	if prompt > lim.MaxPromptTokens {
		prompt, res.Clamped = lim.MaxPromptTokens, true
	}
	if output > lim.MaxOutputTokens {
		output, res.Clamped = lim.MaxOutputTokens, true
	}
	res.WeightedTokens = prompt + e.mu.cfg.OutputTokenWeight*output
	before := t.tokens.Level(now)
	t.tokens.Take(now, res.WeightedTokens)
	res.QuotaAfter = t.tokens.Level(now)
	t.credit.noteTake(before, res.QuotaAfter, now)
	res.CostMicros = e.mu.place.cat.PriceMicros(m.model, prompt, output)
	t.budget.roll(wall)
	t.budget.spend(res.CostMicros)
	return res, nil
}
