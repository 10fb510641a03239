package server

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// A deferrable request id reused with another body is INVALID_ARGUMENT,
// word for word the interactive path's answer, while its ticket is
// pending and once it is done; the same body again gets its ticket.
func TestDeferrableRequestIDReusedWithAnotherBody(t *testing.T) {
	srv, _, _, _ := start(t, Options{Deferral: DeferralOptions{DataDir: t.TempDir()}})
	adm, op, ctx := deferralClients(t, srv)

	interactive := &admissionv1.AdmitRequest{RequestId: "chat-1", Tenant: "acme", Model: "large", PromptTokens: 100, MaxOutputTokens: 10}
	if _, err := adm.Admit(ctx, interactive); err != nil {
		t.Fatal(err)
	}
	interactive.PromptTokens++
	_, want := adm.Admit(ctx, interactive)
	if status.Code(want) != codes.InvalidArgument {
		t.Fatalf("interactive request id reused with another body: %v, want INVALID_ARGUMENT", want)
	}

	domains := drainEveryDomain(ctx, t, op)
	batch := &admissionv1.AdmitRequest{RequestId: "batch-1", Tenant: "acme", Model: "large", PromptTokens: 1000, MaxOutputTokens: 100, Deferrable: true}
	first, err := adm.Admit(ctx, batch)
	if err != nil || first.GetDecision() != admissionv1.Decision_DEFERRED {
		t.Fatalf("Admit while drained: %v %v, want DEFERRED", first, err)
	}
	reuse := func(when string) {
		t.Helper()
		other := proto.Clone(batch).(*admissionv1.AdmitRequest)
		other.PromptTokens++
		_, err := adm.Admit(ctx, other)
		if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != status.Convert(want).Message() {
			t.Errorf("%s: request id reused with another body: %v; want %v", when, err, want)
		}
		again, err := adm.Admit(ctx, batch)
		if err != nil || again.GetTicketId() != first.GetTicketId() {
			t.Errorf("%s: the same request again: ticket %q %v; want %q", when, again.GetTicketId(), err, first.GetTicketId())
		}
	}
	reuse("pending ticket")

	stream, err := adm.Claim(ctx, &admissionv1.ClaimRequest{Tenants: []string{"acme"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range domains.GetDomains() {
		if _, err := op.UndrainDomain(ctx, &admissionv1.UndrainDomainRequest{Domain: d.GetId()}); err != nil {
			t.Fatal(err)
		}
	}
	w, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := adm.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: w.GetAdmission().GetLeaseId(), OutputTokens: 50}); err != nil {
		t.Fatal(err)
	}
	if tk, err := adm.GetTicket(ctx, &admissionv1.GetTicketRequest{TicketId: first.GetTicketId()}); err != nil || tk.GetState() != admissionv1.TicketState_TICKET_DONE {
		t.Fatalf("GetTicket after Release: %v (%v), want DONE", tk, err)
	}
	reuse("done ticket")
}
