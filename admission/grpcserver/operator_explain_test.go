package grpcserver

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// ExplainAdmit hands the request to the engine's Explain as Admit would
// and renders every field of the explanation.
func TestExplainAdmitRoundTrips(t *testing.T) {
	x := admission.Explanation{
		Outcome: "REJECTED", Reason: admission.ReasonDeadlineUnmeetable, RetryAfter: 3 * time.Second,
		Domain: "d1", Model: "medium", Floor: true, EstimatedWait: 2 * time.Second,
		Gates:     []admission.GateCheck{{Gate: "tokens", Passed: true, Reached: true, Before: 10, After: 5, Detail: "x"}},
		Placement: []admission.PlacementCheck{{Model: "large", Domain: "d1", Floor: true, Fits: true, Detail: "y"}},
	}
	var got admission.Request
	eng := &testEngine{explain: func(_ context.Context, req admission.Request) (admission.Explanation, error) {
		got = req
		return x, nil
	}}
	op := admissionv1.NewOperatorClient(startServer(t, eng, nil).conn)
	resp, err := op.ExplainAdmit(context.Background(), &admissionv1.AdmitRequest{Tenant: "acme", Model: "large", PromptTokens: 10, MaxOutputTokens: 5, AcceptDowngrade: []string{"medium"}})
	if err != nil {
		t.Fatal(err)
	}
	if got.Tenant != "acme" || got.Model != "large" || got.PromptTokens != 10 || got.MaxOutputTokens != 5 || len(got.AcceptDowngrade) != 1 || got.Priority != admission.PriorityNormal {
		t.Errorf("engine got %+v", got)
	}
	want := &admissionv1.ExplainAdmitResponse{
		Outcome: "REJECTED", Reason: admissionv1.Reason_REASON_DEADLINE_UNMEETABLE, RetryAfter: durationpb.New(3 * time.Second),
		Domain: "d1", Model: "medium", Floor: true, EstimatedWait: durationpb.New(2 * time.Second),
		Gates:     []*admissionv1.GateCheck{{Gate: "tokens", Passed: true, Reached: true, Before: 10, After: 5, Detail: "x"}},
		Placement: []*admissionv1.PlacementCheck{{Model: "large", Domain: "d1", Floor: true, Fits: true, Detail: "y"}},
	}
	if !proto.Equal(resp, want) {
		t.Errorf("got %v\nwant %v", resp, want)
	}
	_, err = op.ExplainAdmit(context.Background(), &admissionv1.AdmitRequest{Tenant: "acme", Model: "large", Priority: 9})
	wantInvalidArgument(t, err, "priority")
	eng.explain = func(context.Context, admission.Request) (admission.Explanation, error) {
		return admission.Explanation{}, &admission.InvalidArgumentError{Field: "model", Reason: "unknown"}
	}
	_, err = op.ExplainAdmit(context.Background(), &admissionv1.AdmitRequest{Tenant: "acme", Model: "nope"})
	wantInvalidArgument(t, err, "model")
}
