package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluice-sched/sluice/admission/client"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/testwait"
)

// start runs a sluiced in-process on loopback and returns a client for it.
func start(t *testing.T, opts Options) (*Server, *client.Client, context.CancelFunc, <-chan error) {
	t.Helper()
	opts.GRPCAddr, opts.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() { done <- srv.Serve(ctx); close(finished) }()
	conn, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); cancel(); <-finished })
	return srv, client.New(conn, client.WithMaxAttempts(1)), cancel, done
}

func TestEndToEndAdmitRelease(t *testing.T) {
	srv, c, _, _ := start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Admit(ctx, &admissionv1.AdmitRequest{
		RequestId: "e2e-1", Tenant: "acme", Model: "large", PromptTokens: 1500, MaxOutputTokens: 200,
		Priority: admissionv1.Priority_PRIORITY_NORMAL,
	})
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	if resp.GetDecision() != admissionv1.Decision_ADMITTED || resp.GetLeaseId() == "" || resp.GetDomain() == "" || resp.GetModel() != "large" {
		t.Fatalf("Admit answer: %v", resp)
	}
	if resp.GetTrace().GetTenant() != "acme" || resp.GetTrace().GetWeightedTokens() != 1500+4*200 {
		t.Fatalf("trace: %v", resp.GetTrace())
	}
	if got := srv.Engine().LeaseCount(); got != 1 {
		t.Fatalf("leases held: %d", got)
	}
	rel, err := c.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: resp.GetLeaseId(), PromptTokens: 1500, OutputTokens: 50, Outcome: admissionv1.Outcome_OUTCOME_OK})
	if err != nil {
		t.Fatalf("Release: %v", err)
	}
	if rel.GetRefundedTokens() != 4*150 || rel.GetDomain() != resp.GetDomain() {
		t.Fatalf("Release answer: %v", rel)
	}
	if got := srv.Engine().LeaseCount(); got != 0 {
		t.Fatalf("leases after release: %d", got)
	}
	// A bad request is INVALID_ARGUMENT naming the field.
	_, err = c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "acme", Model: "large", PromptTokens: 0, MaxOutputTokens: 1})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "prompt_tokens") {
		t.Fatalf("bad request: %v", err)
	}
	// /healthz and /metrics answer.
	for _, path := range []string{"/healthz", "/metrics"} {
		r, err := http.Get("http://" + srv.HTTPAddr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != 200 {
			t.Fatalf("%s: %d", path, r.StatusCode)
		}
		if path == "/metrics" && !strings.Contains(string(body), `sluice_decisions_total{decision="ADMITTED",reason="REASON_UNSPECIFIED"} 1`) {
			t.Fatalf("/metrics lacks the admission:\n%s", body)
		}
	}
}

func TestQueuedRequestAnsweredAtShutdown(t *testing.T) {
	// A clock that stands still: capacity never refills, so what queues stays
	// queued. No floors, so the one domain left undrained has no reserve.
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, []byte(benchConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, c, cancelServe, done := start(t, Options{ConfigPath: path, Clock: clock.NewManual(time.Now())})
	// Drain every domain but one HGX node and fill it, so the next request queues.
	eng := srv.Engine()
	for _, d := range eng.Domains() {
		if d.ID != "hgx-h200-1" {
			if err := eng.Drain(d.ID, "test"); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Fill it: with a 1 ms deadline a request that would have to wait is
	// refused at once (DEADLINE_UNMEETABLE), which tells us it is full.
	for i := 0; ; i++ {
		short, cancelShort := context.WithTimeout(ctx, time.Millisecond)
		resp, err := c.Admit(short, &admissionv1.AdmitRequest{Tenant: "router", Model: "large", PromptTokens: 6000, MaxOutputTokens: 10})
		cancelShort()
		if err == nil && resp.GetDecision() == admissionv1.Decision_REJECTED {
			break
		}
		if i > 10000 {
			t.Fatal("never filled")
		}
	}
	answer := make(chan *admissionv1.AdmitResponse, 1)
	go func() {
		resp, err := c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "router", Model: "large", PromptTokens: 6000, MaxOutputTokens: 10})
		if err != nil {
			t.Errorf("queued Admit: %v", err)
		}
		answer <- resp
	}()
	eventually(t, func() bool {
		select {
		case r := <-answer:
			t.Fatalf("answered early: %v", r)
		default:
		}
		return eng.QueueLen() == 1
	})
	cancelServe()
	resp := <-answer
	if resp.GetDecision() != admissionv1.Decision_REJECTED || resp.GetReason() != admissionv1.Reason_REASON_SHUTTING_DOWN || resp.GetRetryAfter().AsDuration() <= 0 {
		t.Fatalf("queued request at shutdown: %v", resp)
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

func TestReloadRefusesBadConfigAndKeepsServing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(path, config.DefaultYAML(), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, c, _, _ := start(t, Options{ConfigPath: path})
	bad := strings.Replace(string(config.DefaultYAML()), "weight: 8", "weight: -3", 1)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	err := srv.Reload()
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "tiers.enterprise.weight") {
		t.Fatalf("bad reload: %v, want file and key named", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "acme", Model: "small", PromptTokens: 10, MaxOutputTokens: 10})
	if err != nil || resp.GetDecision() != admissionv1.Decision_ADMITTED {
		t.Fatalf("after a refused reload: %v %v", resp, err)
	}
	if ti, _ := srv.Engine().Tenant("acme"); ti.Weight != 8 {
		t.Fatalf("refused config took effect: weight %d", ti.Weight)
	}
}

// eventually waits for cond, polling; it is a wait for another goroutine,
// not a timing assertion.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	testwait.Until(t, 10*time.Second, "the condition", cond)
}

func TestTopologyErrorNamesTheTopologyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	// Valid on its own, but 1000 bytes of HBM hold no model weights.
	topo := "domains:\n  - id: d1\n    kind: hgx\n    nodes:\n      - {name: n1, gpu: H200, count: 8, peaks: {hbm_bytes: 1000}}\n"
	if err := os.WriteFile(path, []byte(topo), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := New(Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Topology: path,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil || !strings.Contains(err.Error(), path) || strings.Contains(err.Error(), "sluice.yaml") {
		t.Fatalf("got %v, want an error naming %s and not the config", err, path)
	}
}
