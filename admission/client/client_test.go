package client

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/grpcserver"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/grpctest"
)

// step is one scripted answer: a decision, or an UNAVAILABLE error.
type step struct {
	dec         admission.Decision
	unavailable bool
}

func reject(r admission.Reason, retryAfter time.Duration) step {
	return step{dec: admission.Decision{Outcome: admission.Rejected, Reason: r, RetryAfter: retryAfter}}
}

var (
	admit       = step{dec: admission.Decision{Outcome: admission.Admitted, LeaseID: 7, Domain: "d", Model: "m"}}
	unavailable = step{unavailable: true}
)

// scriptedEngine answers Admit calls from a script, in order; an
// unavailable step is answered by a server interceptor before the handler.
// It records the request id of every call that reached the server.
type scriptedEngine struct {
	t     *testing.T
	mu    sync.Mutex
	steps []step
	ids   []string
}

func (e *scriptedEngine) next(id string) (step, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ids = append(e.ids, id)
	if len(e.steps) == 0 {
		e.t.Errorf("call %d with request id %q: script exhausted", len(e.ids), id)
		return step{}, false
	}
	s := e.steps[0]
	e.steps = e.steps[1:]
	return s, true
}

// intercept answers unavailable steps; the others reach the handler.
func (e *scriptedEngine) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if r, ok := req.(*admissionv1.AdmitRequest); ok {
		e.mu.Lock()
		down := len(e.steps) > 0 && e.steps[0].unavailable
		e.mu.Unlock()
		if down {
			e.next(r.GetRequestId())
			return nil, status.Error(codes.Unavailable, "scripted outage")
		}
	}
	return handler(ctx, req)
}

func (e *scriptedEngine) Admit(_ context.Context, req admission.Request) (admission.Decision, error) {
	s, ok := e.next(req.RequestID)
	if !ok {
		return admission.Decision{}, errors.New("script exhausted")
	}
	return s.dec, nil
}

func (e *scriptedEngine) Release(_ context.Context, rel admission.Release) (admission.ReleaseResult, error) {
	if rel.LeaseID != 7 {
		return admission.ReleaseResult{}, admission.ErrLeaseNotFound
	}
	return admission.ReleaseResult{Domain: "d", Model: "m", RefundedTokens: 5}, nil
}

func (e *scriptedEngine) Domains() []admission.DomainInfo { return nil }
func (e *scriptedEngine) Drain(string, string) error      { return nil }
func (e *scriptedEngine) Undrain(string) error            { return nil }
func (e *scriptedEngine) Tenants() []admission.TenantInfo { return nil }
func (e *scriptedEngine) Explain(context.Context, admission.Request) (admission.Explanation, error) {
	return admission.Explanation{}, nil
}

func (e *scriptedEngine) Tenant(string) (admission.TenantInfo, bool) {
	return admission.TenantInfo{}, false
}
func (e *scriptedEngine) requestIDs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.ids)
}
func (e *scriptedEngine) remaining() int { e.mu.Lock(); defer e.mu.Unlock(); return len(e.steps) }

// sleeps records the waits a Client asks for; err, when set, is returned.
type sleeps struct {
	mu  sync.Mutex
	got []time.Duration
	err error
}

func (s *sleeps) sleep(_ context.Context, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, d)
	return s.err
}

func (s *sleeps) durations() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

// setup serves a scripted engine through grpcserver on a loopback port and
// returns a Client over it with no jitter, recording sleeps, plus opts.
func setup(t *testing.T, script []step, opts ...Option) (*Client, *scriptedEngine, *sleeps) {
	t.Helper()
	eng := &scriptedEngine{t: t, steps: script}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		grpcserver.RecoveryUnaryInterceptor(slog.New(slog.NewTextHandler(io.Discard, nil))), eng.intercept))
	grpcserver.Register(srv, eng)
	t.Cleanup(func() {
		if n := eng.remaining(); n != 0 {
			t.Errorf("%d scripted answers were not asked for", n)
		}
	})
	conn := grpctest.Serve(t, srv)
	sl := &sleeps{}
	return New(conn, append([]Option{WithJitter(0), WithSleep(sl.sleep)}, opts...)...), eng, sl
}

var request = &admissionv1.AdmitRequest{RequestId: "req-1", Tenant: "acme", Model: "large", PromptTokens: 10, MaxOutputTokens: 10}

func wantIDs(t *testing.T, eng *scriptedEngine, id string, n int) {
	t.Helper()
	ids := eng.requestIDs()
	if len(ids) != n {
		t.Fatalf("%d calls reached the server, want %d", len(ids), n)
	}
	for i, got := range ids {
		if got != id {
			t.Errorf("call %d carried request id %q, want %q", i+1, got, id)
		}
	}
}

func wantSleeps(t *testing.T, sl *sleeps, want ...time.Duration) {
	t.Helper()
	if got := sl.durations(); !slices.Equal(got, want) {
		t.Errorf("slept %v, want %v", got, want)
	}
}

func TestHonoursRetryAfter(t *testing.T) {
	c, eng, sl := setup(t, []step{
		reject(admission.ReasonQuotaExceeded, 150*time.Millisecond),
		reject(admission.ReasonQueueFull, 2*time.Second),
		admit,
	})
	resp, err := c.Admit(context.Background(), request)
	if err != nil || resp.GetDecision() != admissionv1.Decision_ADMITTED || resp.GetLeaseId() != "l-7" {
		t.Fatalf("Admit = %v, %v; want the admission", resp, err)
	}
	wantSleeps(t, sl, 150*time.Millisecond, 2*time.Second)
	wantIDs(t, eng, "req-1", 3)
}

func TestRetriesEveryRetryableReason(t *testing.T) {
	for _, r := range []admission.Reason{
		admission.ReasonQuotaExceeded, admission.ReasonCapacityExceeded, admission.ReasonQueueFull,
		admission.ReasonConcurrencyExceeded, admission.ReasonShuttingDown,
	} {
		t.Run(r.String(), func(t *testing.T) {
			c, eng, sl := setup(t, []step{reject(r, time.Second), admit})
			resp, err := c.Admit(context.Background(), request)
			if err != nil || resp.GetDecision() != admissionv1.Decision_ADMITTED {
				t.Fatalf("Admit = %v, %v", resp, err)
			}
			wantSleeps(t, sl, time.Second)
			wantIDs(t, eng, "req-1", 2)
		})
	}
}

func TestDoesNotRetryOtherRejections(t *testing.T) {
	for _, s := range []step{
		reject(admission.ReasonBudgetExhausted, time.Second),
		reject(admission.ReasonUnknownTenant, time.Second),
		reject(admission.ReasonBurstCreditExhausted, time.Second),
		reject(admission.ReasonDeadlineUnmeetable, time.Second),
		reject(admission.ReasonDomainDraining, time.Second),
		reject(admission.ReasonQuotaExceeded, 0), // retryable reason, but no retry_after
	} {
		t.Run(s.dec.Reason.String(), func(t *testing.T) {
			c, eng, sl := setup(t, []step{s})
			resp, err := c.Admit(context.Background(), request)
			if err != nil || resp.GetDecision() != admissionv1.Decision_REJECTED ||
				resp.GetReason() != admissionv1.Reason(s.dec.Reason) {
				t.Fatalf("Admit = %v, %v; want the rejection", resp, err)
			}
			wantSleeps(t, sl)
			wantIDs(t, eng, "req-1", 1)
		})
	}
}

func TestStopsAtMaxAttempts(t *testing.T) {
	r := reject(admission.ReasonCapacityExceeded, time.Second)
	t.Run("default", func(t *testing.T) {
		c, eng, sl := setup(t, []step{r, r, r})
		resp, err := c.Admit(context.Background(), request)
		if err != nil || resp.GetReason() != admissionv1.Reason_REASON_CAPACITY_EXCEEDED {
			t.Fatalf("Admit = %v, %v; want the last rejection", resp, err)
		}
		wantSleeps(t, sl, time.Second, time.Second)
		wantIDs(t, eng, "req-1", DefaultMaxAttempts)
	})
	t.Run("five", func(t *testing.T) {
		c, eng, sl := setup(t, []step{r, r, r, r, r}, WithMaxAttempts(5))
		if _, err := c.Admit(context.Background(), request); err != nil {
			t.Fatal(err)
		}
		wantSleeps(t, sl, time.Second, time.Second, time.Second, time.Second)
		wantIDs(t, eng, "req-1", 5)
	})
	t.Run("one", func(t *testing.T) {
		c, eng, sl := setup(t, []step{r}, WithMaxAttempts(0))
		if _, err := c.Admit(context.Background(), request); err != nil {
			t.Fatal(err)
		}
		wantSleeps(t, sl)
		wantIDs(t, eng, "req-1", 1)
	})
}

func TestGivesUpWhenTheDeadlineWouldPass(t *testing.T) {
	// The client's clock is frozen at t0 and the deadline is an hour after
	// it, so whether a wait ends before the deadline does not depend on how
	// fast the test runs.
	t0 := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), t0.Add(time.Hour))
	defer cancel()
	frozen := func(c *Client) { c.now = func() time.Time { return t0 } }

	c, eng, sl := setup(t, []step{reject(admission.ReasonQueueFull, time.Hour)}, frozen)
	resp, err := c.Admit(ctx, request)
	if err != nil || resp.GetReason() != admissionv1.Reason_REASON_QUEUE_FULL {
		t.Fatalf("Admit = %v, %v; want the rejection at once", resp, err)
	}
	wantSleeps(t, sl)
	wantIDs(t, eng, "req-1", 1)

	c, eng, sl = setup(t, []step{reject(admission.ReasonQueueFull, time.Hour-time.Nanosecond), admit}, frozen)
	if resp, err := c.Admit(ctx, request); err != nil || resp.GetDecision() != admissionv1.Decision_ADMITTED {
		t.Fatalf("Admit = %v, %v; want the admission after one retry", resp, err)
	}
	wantSleeps(t, sl, time.Hour-time.Nanosecond)
	wantIDs(t, eng, "req-1", 2)

	c, eng, sl = setup(t, []step{unavailable}, frozen, WithBackoff(time.Hour, time.Hour))
	_, err = c.Admit(ctx, request)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Admit error = %v, want UNAVAILABLE at once", err)
	}
	wantSleeps(t, sl)
	wantIDs(t, eng, "req-1", 1)
}

func TestGeneratesOneRequestIDPerCall(t *testing.T) {
	r := reject(admission.ReasonConcurrencyExceeded, time.Millisecond)
	c, eng, _ := setup(t, []step{r, unavailable, admit, admit})
	in := &admissionv1.AdmitRequest{Tenant: "acme", Model: "large", PromptTokens: 10, MaxOutputTokens: 10}
	if _, err := c.Admit(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	if in.GetRequestId() != "" {
		t.Errorf("the caller's request was modified: request_id %q", in.GetRequestId())
	}
	if _, err := c.Admit(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	ids := eng.requestIDs()
	if len(ids) != 4 {
		t.Fatalf("%d calls, want 4", len(ids))
	}
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(ids[0]) {
		t.Errorf("generated request id %q is not 16 bytes of hex", ids[0])
	}
	if ids[1] != ids[0] || ids[2] != ids[0] {
		t.Errorf("retries carried %q, want %q on every attempt", ids[:3], ids[0])
	}
	if ids[3] == ids[0] {
		t.Errorf("two calls share request id %q", ids[0])
	}
}

func TestRetriesUnavailableWithCappedBackoff(t *testing.T) {
	c, eng, sl := setup(t, []step{unavailable, unavailable, unavailable, admit},
		WithMaxAttempts(4), WithBackoff(100*time.Millisecond, 300*time.Millisecond))
	resp, err := c.Admit(context.Background(), request)
	if err != nil || resp.GetDecision() != admissionv1.Decision_ADMITTED {
		t.Fatalf("Admit = %v, %v", resp, err)
	}
	wantSleeps(t, sl, 100*time.Millisecond, 200*time.Millisecond, 300*time.Millisecond)
	wantIDs(t, eng, "req-1", 4)

	c, eng, sl = setup(t, []step{unavailable, unavailable, unavailable})
	_, err = c.Admit(context.Background(), request)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Admit error = %v, want UNAVAILABLE after the last attempt", err)
	}
	wantSleeps(t, sl, DefaultBackoffBase, 2*DefaultBackoffBase)
	wantIDs(t, eng, "req-1", 3)
}

func TestDoesNotRetryOtherErrors(t *testing.T) {
	c, eng, sl := setup(t, []step{admit})
	_, err := c.Admit(context.Background(), &admissionv1.AdmitRequest{RequestId: "bad", Priority: 9})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Admit error = %v, want INVALID_ARGUMENT", err)
	}
	wantSleeps(t, sl)
	if n := len(eng.requestIDs()); n != 0 {
		t.Errorf("%d calls reached the engine", n)
	}
	if _, err := c.Admit(context.Background(), request); err != nil { // use up the script
		t.Fatal(err)
	}
}

func TestStopsWhenTheSleepIsInterrupted(t *testing.T) {
	c, eng, sl := setup(t, []step{reject(admission.ReasonQuotaExceeded, time.Second)})
	sl.err = context.Canceled
	resp, err := c.Admit(context.Background(), request)
	if err != nil || resp.GetReason() != admissionv1.Reason_REASON_QUOTA_EXCEEDED {
		t.Fatalf("Admit = %v, %v; want the rejection", resp, err)
	}
	wantSleeps(t, sl, time.Second)
	wantIDs(t, eng, "req-1", 1)
}

func TestJitterLengthensWaits(t *testing.T) {
	r := reject(admission.ReasonQuotaExceeded, time.Second)
	c, _, sl := setup(t, []step{r, r, r, r, r, r, r, r, r, r}, WithMaxAttempts(10), WithJitter(0.5))
	if _, err := c.Admit(context.Background(), request); err != nil {
		t.Fatal(err)
	}
	got := sl.durations()
	if len(got) != 9 {
		t.Fatalf("slept %d times, want 9", len(got))
	}
	for _, d := range got {
		if d < time.Second || d >= 1500*time.Millisecond {
			t.Errorf("slept %v, want within [1s, 1.5s)", d)
		}
	}
}

func TestRelease(t *testing.T) {
	c, _, sl := setup(t, nil)
	resp, err := c.Release(context.Background(), &admissionv1.ReleaseRequest{LeaseId: "l-7", OutputTokens: 3})
	if err != nil || resp.GetDomain() != "d" || resp.GetRefundedTokens() != 5 {
		t.Fatalf("Release = %v, %v", resp, err)
	}
	_, err = c.Release(context.Background(), &admissionv1.ReleaseRequest{LeaseId: "l-8"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("Release error = %v, want NOT_FOUND", err)
	}
	wantSleeps(t, sl)
}

func TestNewRequestID(t *testing.T) {
	a, b := NewRequestID(), NewRequestID()
	if len(a) != 32 || a == b {
		t.Errorf("NewRequestID() = %q, %q", a, b)
	}
}
