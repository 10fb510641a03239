package server

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// TestDeferredTicketLifecycle drives a ticket through sluiced's gRPC API:
// deferred while every domain drains (GetTicket says why, ListBacklog,
// /metrics and the dashboard count it), cancelled; another claimed by a worker once the
// domains return, released, and DONE.
func TestDeferredTicketLifecycle(t *testing.T) {
	srv, _, _, _ := start(t, Options{Deferral: DeferralOptions{DataDir: t.TempDir()}})
	adm, op, ctx := deferralClients(t, srv)
	domains := drainEveryDomain(ctx, t, op)
	submit := func(id string) string {
		t.Helper()
		resp, err := adm.Admit(ctx, &admissionv1.AdmitRequest{RequestId: id, Tenant: "acme", Model: "large", PromptTokens: 1000, MaxOutputTokens: 100, Deferrable: true})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetDecision() != admissionv1.Decision_DEFERRED || resp.GetReason() != admissionv1.Reason_REASON_DOMAIN_DRAINING || resp.GetTicketId() == "" {
			t.Fatalf("Admit while drained: %v %v ticket %q, want DEFERRED DOMAIN_DRAINING with a ticket", resp.GetDecision(), resp.GetReason(), resp.GetTicketId())
		}
		return resp.GetTicketId()
	}
	first, second := submit("batch-1"), submit("batch-2")
	tk, err := adm.GetTicket(ctx, &admissionv1.GetTicketRequest{TicketId: first})
	if err != nil || tk.GetState() != admissionv1.TicketState_TICKET_PENDING || tk.GetWaitingOn() != admissionv1.Reason_REASON_DOMAIN_DRAINING || tk.GetRequest().GetTenant() != "acme" {
		t.Fatalf("GetTicket: %v (%v)", tk, err)
	}
	bl, err := op.ListBacklog(ctx, &admissionv1.ListBacklogRequest{})
	if err != nil || bl.GetPending() != 2 || len(bl.GetTenants()) != 1 || bl.GetTenants()[0].GetTenant() != "acme" || bl.GetTenants()[0].GetTier() == "" {
		t.Fatalf("ListBacklog: %v (%v), want acme with 2 pending", bl, err)
	}
	body := get(t, srv, "/metrics")
	for _, want := range []string{`sluice_deferred_backlog{state="pending",tenant="acme",tier="enterprise"} 2`, `sluice_deferred_tickets{state="pending"} 2`, `sluice_deferred_events_total{event="deferred"} 2`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// The dashboard's fleet strip reads the same backlog.
	var snap struct {
		Backlog *struct {
			Pending int64 `json:"pending"`
			Tenants []struct {
				Tenant  string `json:"tenant"`
				Pending int64  `json:"pending"`
			} `json:"tenants"`
		} `json:"backlog"`
	}
	if err := json.Unmarshal([]byte(get(t, srv, "/api/v1/dashboard")), &snap); err != nil {
		t.Fatal(err)
	}
	if b := snap.Backlog; b == nil || b.Pending != 2 || len(b.Tenants) != 1 || b.Tenants[0].Tenant != "acme" || b.Tenants[0].Pending != 2 {
		t.Fatalf("dashboard backlog %+v, want acme's 2 pending", snap.Backlog)
	}
	if tk, err := adm.CancelTicket(ctx, &admissionv1.CancelTicketRequest{TicketId: first}); err != nil || tk.GetState() != admissionv1.TicketState_TICKET_CANCELLED {
		t.Fatalf("CancelTicket: %v (%v)", tk, err)
	}
	if _, err := adm.GetTicket(ctx, &admissionv1.GetTicketRequest{TicketId: "0123456789abcdef0123456789abcdef"}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetTicket of an unknown id: %v, want NOT_FOUND", err)
	}
	if _, err := adm.GetTicket(ctx, &admissionv1.GetTicketRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("GetTicket without an id: %v, want INVALID_ARGUMENT", err)
	}

	stream, err := adm.Claim(ctx, &admissionv1.ClaimRequest{Tenants: []string{"acme"}, MaxInFlight: 4})
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
	if w.GetTicket().GetTicketId() != second || w.GetTicket().GetState() != admissionv1.TicketState_TICKET_CLAIMED || w.GetAdmission().GetLeaseId() == "" || w.GetAdmission().GetDomain() == "" {
		t.Fatalf("claimed %v, want ticket %s with a lease and a domain", w, second)
	}
	if _, err := adm.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: w.GetAdmission().GetLeaseId(), OutputTokens: 50}); err != nil {
		t.Fatal(err)
	}
	if tk, err := adm.GetTicket(ctx, &admissionv1.GetTicketRequest{TicketId: second}); err != nil || tk.GetState() != admissionv1.TicketState_TICKET_DONE {
		t.Fatalf("GetTicket after Release: %v (%v), want DONE", tk, err)
	}
}

// A worker is a router bound to its tenants: it claims only their tickets,
// may not ask for another tenant's work, and another tenant's ticket is
// NOT_FOUND to it, as an unknown one.
func TestDeferredWorkIsBoundToTheRoutersTenants(t *testing.T) {
	f := startSecure(t, nil)
	eng := f.srv.Engine()
	for _, d := range eng.Domains() {
		if err := eng.Drain(d.ID, "test"); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	all := admissionv1.NewAdmissionClient(f.dial(t, f.caller("router-all")))
	acme := admissionv1.NewAdmissionClient(f.dial(t, f.caller("router-acme")))
	tickets := map[string]string{}
	for _, tenant := range []string{"globex", "acme"} {
		resp, err := all.Admit(ctx, &admissionv1.AdmitRequest{Tenant: tenant, Model: "small", PromptTokens: 100, MaxOutputTokens: 10, Deferrable: true})
		if err != nil || resp.GetTicketId() == "" {
			t.Fatalf("Admit for %s: %v %v", tenant, resp, err)
		}
		tickets[tenant] = resp.GetTicketId()
	}
	if _, err := acme.GetTicket(ctx, &admissionv1.GetTicketRequest{TicketId: tickets["globex"]}); status.Code(err) != codes.NotFound {
		t.Fatalf("router-acme's GetTicket of globex's ticket: %v, want NOT_FOUND", err)
	}
	if _, err := acme.CancelTicket(ctx, &admissionv1.CancelTicketRequest{TicketId: tickets["globex"]}); status.Code(err) != codes.NotFound {
		t.Fatalf("router-acme's CancelTicket of globex's ticket: %v, want NOT_FOUND", err)
	}
	if tk, err := acme.GetTicket(ctx, &admissionv1.GetTicketRequest{TicketId: tickets["acme"]}); err != nil || tk.GetState() != admissionv1.TicketState_TICKET_PENDING {
		t.Fatalf("router-acme's GetTicket of its own: %v %v", tk, err)
	}
	denied, err := acme.Claim(ctx, &admissionv1.ClaimRequest{Tenants: []string{"globex"}})
	if err == nil {
		_, err = denied.Recv()
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("router-acme claiming globex's work: %v, want PERMISSION_DENIED", err)
	}
	stream, err := acme.Claim(ctx, &admissionv1.ClaimRequest{MaxInFlight: 4})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range eng.Domains() {
		if err := eng.Undrain(d.ID); err != nil {
			t.Fatal(err)
		}
	}
	w, err := stream.Recv()
	if err != nil || w.GetTicket().GetTicketId() != tickets["acme"] {
		t.Fatalf("router-acme claimed %v (%v), want acme's ticket", w.GetTicket(), err)
	}
	// globex's ticket stays pending: no worker of globex claims.
	if tk, err := all.GetTicket(ctx, &admissionv1.GetTicketRequest{TicketId: tickets["globex"]}); err != nil || tk.GetState() != admissionv1.TicketState_TICKET_PENDING {
		t.Fatalf("globex's ticket: %v %v, want still PENDING", tk.GetState(), err)
	}
}

// deferralClients dials srv's gRPC port for a test of deferred work: the
// Admission and Operator clients and a context that ends with the test
// (30 s at most).
func deferralClients(t *testing.T, srv *Server) (admissionv1.AdmissionClient, admissionv1.OperatorClient, context.Context) {
	t.Helper()
	conn, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return admissionv1.NewAdmissionClient(conn), admissionv1.NewOperatorClient(conn), ctx
}

// drainEveryDomain drains every domain, so that deferrable work waits, and
// returns them.
func drainEveryDomain(ctx context.Context, t *testing.T, op admissionv1.OperatorClient) *admissionv1.ListDomainsResponse {
	t.Helper()
	domains, err := op.ListDomains(ctx, &admissionv1.ListDomainsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range domains.GetDomains() {
		if _, err := op.DrainDomain(ctx, &admissionv1.DrainDomainRequest{Domain: d.GetId(), Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	return domains
}
