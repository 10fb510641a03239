package deferral_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/deferral"
	"github.com/sluice-sched/sluice/internal/testwait"
)

// A request id reused with a different request is INVALID_ARGUMENT on
// request_id, the interactive path's error, whether its ticket is pending
// or done; the same request again still gets its ticket.
func TestRequestIDReusedWithAnotherBodyIsRefused(t *testing.T) {
	r := newRig(t, quotaConfig(1000), deferral.NewMemStore())
	r.admit(deferrable("b", 1000, 10)) // takes the burst
	req := deferrable("b", 1000, 10)
	req.RequestID = "job-1"
	first := r.admit(req)
	if first.Decision.Outcome != admission.Deferred || first.Ticket == "" {
		t.Fatalf("first: %v ticket %q, want DEFERRED with a ticket", first.Decision.Outcome, first.Ticket)
	}
	// What the interactive path answers for the same reuse.
	interactive := admission.Request{Tenant: "b", Model: "small", PromptTokens: 10, MaxOutputTokens: 10, RequestID: "chat-1"}
	if _, err := r.e.Admit(context.Background(), interactive); err != nil {
		t.Fatal(err)
	}
	interactive.PromptTokens = 11
	_, want := r.e.Admit(context.Background(), interactive)
	var wantIA *admission.InvalidArgumentError
	if !errors.As(want, &wantIA) || wantIA.Field != "request_id" {
		t.Fatalf("interactive reuse: %v, want INVALID_ARGUMENT on request_id", want)
	}
	others := map[string]func(*admission.Request){
		"prompt_tokens":     func(q *admission.Request) { q.PromptTokens++ },
		"max_output_tokens": func(q *admission.Request) { q.MaxOutputTokens++ },
		"model":             func(q *admission.Request) { q.Model = "large" },
		"priority":          func(q *admission.Request) { q.Priority = admission.PriorityCritical },
		"accept_downgrade":  func(q *admission.Request) { q.AcceptDowngrade = []string{"bronze"} },
	}
	refusedAll := func(state string) {
		t.Helper()
		for name, change := range others {
			other := req
			change(&other)
			a, err := r.b.Admit(context.Background(), other)
			var ia *admission.InvalidArgumentError
			if !errors.As(err, &ia) || *ia != *wantIA {
				t.Errorf("%s ticket, request id reused with another %s: %+v %v, want %v", state, name, a, err, want)
			}
		}
		if got := r.admit(req); got.Ticket != first.Ticket {
			t.Errorf("%s ticket, the same request again: ticket %q, want %q", state, got.Ticket, first.Ticket)
		}
	}
	refusedAll("pending")

	w := r.worker(deferral.ClaimOptions{})
	testwait.Until(t, 10*time.Second, "the worker to register", func() bool { return r.b.Claiming() == 1 })
	r.clk.Advance(3 * time.Second)
	r.release(w.take(t, r, 1)[0])
	if rec, err := r.b.Get(context.Background(), first.Ticket, nil); err != nil || rec.State != deferral.StateDone {
		t.Fatalf("Get after Release: %v %v, want DONE", rec.State, err)
	}
	refusedAll("done")
	if got := r.b.Tenants(); len(got) != 0 {
		t.Errorf("backlog %+v, want empty: a refused reuse holds no ticket", got)
	}
}
