package grpcserver

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// validatingEngine answers like a simple engine: it validates what the real
// one validates (naming the field) and admits everything else.
func validatingEngine() *testEngine {
	return &testEngine{admit: func(_ context.Context, req admission.Request) (admission.Decision, error) {
		switch {
		case req.Tenant == "":
			return admission.Decision{}, &admission.InvalidArgumentError{Field: "tenant", Reason: "required"}
		case req.Model == "":
			return admission.Decision{}, &admission.InvalidArgumentError{Field: "model", Reason: "required"}
		case req.PromptTokens <= 0:
			return admission.Decision{}, &admission.InvalidArgumentError{Field: "prompt_tokens", Reason: "must be > 0"}
		case req.MaxOutputTokens <= 0:
			return admission.Decision{}, &admission.InvalidArgumentError{Field: "max_output_tokens", Reason: "must be > 0"}
		case req.Priority != admission.PriorityNormal && req.Priority != admission.PriorityCritical:
			panic("handler passed an unchecked priority")
		}
		d := benchDecision
		d.Model = req.Model
		d.DowngradePath = append([]string{req.Model}, req.AcceptDowngrade...)
		d.Trace.Tenant, d.Trace.Model = req.Tenant, req.Model
		return d, nil
	}}
}

func FuzzAdmitRequest(f *testing.F) {
	for _, m := range []*admissionv1.AdmitRequest{
		{},
		{RequestId: "r", Tenant: "acme", Model: "large", PromptTokens: 100, MaxOutputTokens: 10},
		{Tenant: "acme", Model: "large", PromptTokens: 1, MaxOutputTokens: 1, Priority: admissionv1.Priority_PRIORITY_CRITICAL, AcceptDowngrade: []string{"medium", "small"}},
		{Tenant: "acme", Model: "large", PromptTokens: -1, MaxOutputTokens: 1},
		{Tenant: "acme", Model: "large", PromptTokens: 1, MaxOutputTokens: 1, Priority: 7},
		{Tenant: "acme", Model: "large", PromptTokens: 1, MaxOutputTokens: 1, Priority: -3},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xff, 0xff, 0xff})
	srv := &admissionServer{eng: validatingEngine()}
	f.Fuzz(func(t *testing.T, b []byte) {
		var in admissionv1.AdmitRequest
		if proto.Unmarshal(b, &in) != nil {
			return // the gRPC codec rejects these before any handler runs
		}
		resp, err := srv.Admit(context.Background(), &in)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument {
				t.Fatalf("code %v (%v) for %v", c, err, &in)
			}
			return
		}
		if _, err := proto.Marshal(resp); err != nil {
			t.Fatalf("response does not marshal: %v", err)
		}
	})
}
