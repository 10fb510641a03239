package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/state/redistest"
	"github.com/sluice-sched/sluice/internal/testdep"
)

// batchConfig has ten tenants whose quotas never hold deferred work
// back, so that what the test measures is the backlog.
const batchConfig = `
tiers:
  batch:
    rps: {rate: 1000000, burst: 1000000}
    tokens: {rate: 1000000000, burst: 1000000000}
    weight: 1
tenants:
  t0: {tier: batch}
  t1: {tier: batch}
  t2: {tier: batch}
  t3: {tier: batch}
  t4: {tier: batch}
  t5: {tier: batch}
  t6: {tier: batch}
  t7: {tier: batch}
  t8: {tier: batch}
  t9: {tier: batch}
`

// TestKillNineKeepsEveryTicket defers 10,000 requests (every domain
// drained, so none can run), kills sluiced with SIGKILL, starts it again
// on the same store, and claims the backlog: every ticket is delivered
// exactly once and none is lost. The embedded store is a bbolt file under
// --data-dir; the shared one Redis Streams on a redis-server with the
// append-only file fsynced on every write.
func TestKillNineKeepsEveryTicket(t *testing.T) {
	if testing.Short() {
		testdep.Missing(t, "-short: this test starts sluiced twice and defers 10,000 requests")
	}
	bin := buildSluiced(t)
	cfgPath := filepath.Join(t.TempDir(), "batch.yaml")
	if err := os.WriteFile(cfgPath, []byte(batchConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--config", cfgPath, "--topology", "simulated", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json"}
	t.Run("embedded", func(t *testing.T) {
		killNineRestart(t, bin, append(base, "--data-dir", t.TempDir()))
	})
	t.Run("redis", func(t *testing.T) {
		rs := redistest.StartDurable(t)
		killNineRestart(t, bin, append(base, "--redis", rs.URL(), "--replica-id", "sluiced-a"))
	})
}

func killNineRestart(t *testing.T, bin string, args []string) {
	const tickets = 10000
	cmd, addr := startSluiced(t, bin, args)
	conn := dial(t, addr)
	op := admissionv1.NewOperatorClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	domains, err := op.ListDomains(ctx, &admissionv1.ListDomainsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range domains.GetDomains() {
		if _, err := op.DrainDomain(ctx, &admissionv1.DrainDomainRequest{Domain: d.GetId(), Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	adm := admissionv1.NewAdmissionClient(conn)
	var mu sync.Mutex
	issued := map[string]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := range 32 {
		wg.Go(func() {
			for i := g; i < tickets; i += 32 {
				resp, err := adm.Admit(ctx, &admissionv1.AdmitRequest{
					RequestId: fmt.Sprintf("job-%05d", i), Tenant: fmt.Sprintf("t%d", i%10), Model: "small",
					PromptTokens: 100, MaxOutputTokens: 10, Deferrable: true,
				})
				if err != nil {
					errs <- err
					return
				}
				if resp.GetDecision() != admissionv1.Decision_DEFERRED || resp.GetTicketId() == "" {
					errs <- fmt.Errorf("job %d: %v %v, want DEFERRED with a ticket", i, resp.GetDecision(), resp.GetReason())
					return
				}
				mu.Lock()
				issued[resp.GetTicketId()] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(issued) != tickets {
		t.Fatalf("%d distinct tickets for %d requests", len(issued), tickets)
	}
	conn.Close()
	if err := cmd.Process.Kill(); err != nil { // SIGKILL: nothing is flushed on the way out
		t.Fatal(err)
	}
	_ = cmd.Wait()

	_, addr = startSluiced(t, bin, args)
	conn = dial(t, addr)
	adm = admissionv1.NewAdmissionClient(conn)
	delivered := map[string]int{}
	done := make(chan struct{})
	var closeDone sync.Once
	for range 4 {
		wg.Go(func() {
			stream, err := adm.Claim(ctx, &admissionv1.ClaimRequest{MaxInFlight: 256})
			if err != nil {
				t.Error(err)
				return
			}
			for {
				w, err := stream.Recv()
				if err != nil {
					return // the test ends the streams
				}
				id := w.GetTicket().GetTicketId()
				mu.Lock()
				delivered[id]++
				n := len(delivered)
				mu.Unlock()
				if _, err := adm.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: w.GetAdmission().GetLeaseId(), OutputTokens: 10}); err != nil {
					t.Errorf("Release of ticket %s: %v", id, err)
				}
				if n == tickets {
					closeDone.Do(func() { close(done) })
				}
			}
		})
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		mu.Lock()
		t.Errorf("after the restart %d of %d tickets were delivered", len(delivered), tickets)
		mu.Unlock()
	}
	// Nothing is left to deliver twice: the backlog is empty.
	bl, err := admissionv1.NewOperatorClient(conn).ListBacklog(ctx, &admissionv1.ListBacklogRequest{})
	if err != nil || bl.GetPending() != 0 || bl.GetClaimed() != 0 {
		t.Errorf("backlog after every ticket: %v (%v), want empty", bl, err)
	}
	cancel()
	wg.Wait()
	for id, n := range delivered {
		if !issued[id] || n != 1 {
			t.Fatalf("ticket %s delivered %d times (issued before the kill: %v)", id, n, issued[id])
		}
	}
	probe := dialAdmission(t, addr)
	for id := range issued {
		got, err := probe.GetTicket(context.Background(), &admissionv1.GetTicketRequest{TicketId: id})
		if err != nil || got.GetState() != admissionv1.TicketState_TICKET_DONE {
			t.Fatalf("GetTicket(%s) after its Release: %v %v, want DONE", id, got.GetState(), err)
		}
		break
	}
}

// startSluiced starts the binary with args and returns it and its gRPC
// address; it is killed at the test's end.
func startSluiced(t *testing.T, bin string, args []string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	logs, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	grpcAddr, _ := readyAddrs(t, logs, -1)
	return cmd, grpcAddr
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func dialAdmission(t *testing.T, addr string) admissionv1.AdmissionClient {
	return admissionv1.NewAdmissionClient(dial(t, addr))
}
