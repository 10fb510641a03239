package admission

import (
	"testing"
	"time"
)

// CheckRepeat refuses exactly the changes bodyHash sees: the deferral
// backlog and the engine agree on what a retry must repeat.
func TestCheckRepeatAgreesWithBodyHash(t *testing.T) {
	m := newIdempotency()
	base := Request{RequestID: "r", Tenant: "t", Model: "small", PromptTokens: 100, MaxOutputTokens: 10, AcceptDowngrade: []string{"a"}}
	for name, c := range map[string]struct {
		change func(*Request)
		same   bool
	}{
		"model":                  {func(r *Request) { r.Model = "large" }, false},
		"prompt_tokens":          {func(r *Request) { r.PromptTokens++ }, false},
		"max_output_tokens":      {func(r *Request) { r.MaxOutputTokens++ }, false},
		"priority":               {func(r *Request) { r.Priority = PriorityCritical }, false},
		"accept_downgrade":       {func(r *Request) { r.AcceptDowngrade = []string{"b"} }, false},
		"accept_downgrade added": {func(r *Request) { r.AcceptDowngrade = append(r.AcceptDowngrade, "b") }, false},
		"deadline":               {func(r *Request) { r.Deadline = time.Unix(1, 0) }, true},
		"defer_within":           {func(r *Request) { r.DeferWithin = time.Hour }, true},
		"deferrable":             {func(r *Request) { r.Deferrable = true }, true},
		"expected_cached_tokens": {func(r *Request) { r.ExpectedCachedTokens = 50 }, true},
		"ticketed":               {func(r *Request) { r.Ticketed = true }, true},
		"nothing":                {func(*Request) {}, true},
	} {
		again := base
		again.AcceptDowngrade = append([]string(nil), base.AcceptDowngrade...)
		c.change(&again)
		hashSame := m.bodyHash(&base) == m.bodyHash(&again)
		err := CheckRepeat(&base, &again)
		if hashSame != c.same || (err == nil) != c.same {
			t.Errorf("%s changed: bodyHash same %v, CheckRepeat %v; want same %v", name, hashSame, err, c.same)
		}
	}
}
