package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// backlog lists the tenants with deferred tickets, largest first, with
// totals; -o json is the ListBacklog message.
func TestBacklog(t *testing.T) {
	srv := startPlain(t)
	eng := srv.Engine()
	for _, d := range eng.Domains() {
		if err := eng.Drain(d.ID, "test"); err != nil {
			t.Fatal(err)
		}
	}
	addr := srv.GRPCAddr().String()
	code, out, errs := sluicectl("backlog", "--server", addr)
	if code != 0 || !strings.Contains(out, "total  ") {
		t.Fatalf("empty backlog: %d %s %s", code, out, errs)
	}
	// Tickets are issued through the backlog: the gRPC Admit of a
	// deferrable request.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	adm := admissionv1.NewAdmissionClient(conn)
	for _, tenant := range []string{"acme", "acme", "hooli"} {
		resp, err := adm.Admit(context.Background(), &admissionv1.AdmitRequest{Tenant: tenant, Model: "small", PromptTokens: 100, MaxOutputTokens: 10, Deferrable: true})
		if err != nil || resp.GetTicketId() == "" {
			t.Fatalf("Admit: %v %v", resp, err)
		}
	}
	code, out, errs = sluicectl("backlog", "--server", addr)
	if code != 0 {
		t.Fatalf("backlog: %d %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[1], "acme ") || !strings.Contains(lines[1], " 2 ") ||
		!strings.HasPrefix(lines[2], "hooli ") || !strings.HasPrefix(lines[3], "total") || !strings.Contains(lines[3], "3") {
		t.Fatalf("backlog:\n%s", out)
	}
	code, out, errs = sluicectl("backlog", "--server", addr, "-o", "json")
	if code != 0 {
		t.Fatalf("backlog -o json: %d %s", code, errs)
	}
	var doc struct {
		Pending string `json:"pending"`
		Tenants []struct {
			Tenant, Pending string
		} `json:"tenants"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || doc.Pending != "3" || len(doc.Tenants) != 2 {
		t.Fatalf("backlog -o json: %v\n%s", err, out)
	}
}

// explain --deferrable says a deferrable request would be DEFERRED while
// every domain drains, and why.
func TestExplainDeferrable(t *testing.T) {
	srv := startPlain(t)
	eng := srv.Engine()
	for _, d := range eng.Domains() {
		if err := eng.Drain(d.ID, "test"); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errs := sluicectl("explain", "--server", srv.GRPCAddr().String(), "--tenant", "acme", "--model", "small", "--deferrable")
	if code != 0 || !strings.Contains(out, "DEFERRED") || !strings.Contains(out, "DOMAIN_DRAINING") {
		t.Fatalf("explain --deferrable: %d\n%s%s", code, out, errs)
	}
}
