package grpcserver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/deferral"
)

// testEngine is a fake of the Engine port. Each func field, when set,
// replaces the default behaviour; admitCalls and releaseCalls count calls.
type testEngine struct {
	admit    func(ctx context.Context, req admission.Request) (admission.Decision, error)
	release  func(ctx context.Context, rel admission.Release) (admission.ReleaseResult, error)
	drain    func(domain, reason string) error
	undrain  func(domain string) error
	explain  func(ctx context.Context, req admission.Request) (admission.Explanation, error)
	freezeMu sync.Mutex
	freeze   *admission.CreditFreeze // the credit freeze in force; nil when none
	domains  []admission.DomainInfo
	tenants  []admission.TenantInfo

	admitCalls   atomic.Int64
	releaseCalls atomic.Int64
}

var (
	_ Engine       = (*testEngine)(nil)
	_ CreditEngine = (*testEngine)(nil)
)

func (e *testEngine) Admit(ctx context.Context, req admission.Request) (admission.Decision, error) {
	e.admitCalls.Add(1)
	if e.admit != nil {
		return e.admit(ctx, req)
	}
	return benchDecision, nil
}

func (e *testEngine) Release(ctx context.Context, rel admission.Release) (admission.ReleaseResult, error) {
	e.releaseCalls.Add(1)
	if e.release != nil {
		return e.release(ctx, rel)
	}
	return admission.ReleaseResult{}, nil
}

func (e *testEngine) Domains() []admission.DomainInfo { return e.domains }

func (e *testEngine) Drain(domain, reason string) error {
	if e.drain != nil {
		return e.drain(domain, reason)
	}
	return nil
}

func (e *testEngine) Undrain(domain string) error {
	if e.undrain != nil {
		return e.undrain(domain)
	}
	return nil
}

func (e *testEngine) Tenants() []admission.TenantInfo { return e.tenants }

func (e *testEngine) FreezeCreditFor(d time.Duration, reason string) admission.CreditFreeze {
	e.freezeMu.Lock()
	defer e.freezeMu.Unlock()
	e.freeze = &admission.CreditFreeze{Until: time.Unix(1_700_000_000, 0).Add(d), Reason: reason}
	return *e.freeze
}

func (e *testEngine) ThawCredit() bool {
	e.freezeMu.Lock()
	defer e.freezeMu.Unlock()
	was := e.freeze != nil
	e.freeze = nil
	return was
}

func (e *testEngine) CreditFrozen() (admission.CreditFreeze, bool) {
	e.freezeMu.Lock()
	defer e.freezeMu.Unlock()
	if e.freeze == nil {
		return admission.CreditFreeze{}, false
	}
	return *e.freeze, true
}

func (e *testEngine) Explain(ctx context.Context, req admission.Request) (admission.Explanation, error) {
	if e.explain != nil {
		return e.explain(ctx, req)
	}
	return admission.Explanation{}, nil
}

func (e *testEngine) Tenant(name string) (admission.TenantInfo, bool) {
	for _, t := range e.tenants {
		if t.Name == name {
			return t, true
		}
	}
	return admission.TenantInfo{}, false
}

// benchDecision is a typical admitted answer, every label filled in.
var benchDecision = admission.Decision{
	Outcome: admission.Admitted,
	LeaseID: 1234567,
	Domain:  "0f3c9a2e-5b1d-4e7a-9c3b-2d8e6f1a4b7c.3",
	Model:   "llama-3.1-70b",
	Trace: admission.Trace{
		Tenant: "acme", Model: "llama-3.1-70b", Tier: "enterprise",
		QuotaBefore: 1_000_000, QuotaAfter: 995_904,
		BurstCreditBefore: 500_000, BurstCreditAfter: 500_000,
		PrefillLevel: 1 << 50, DecodeLevel: 1 << 42, KVInUse: 3 << 30, KVLimit: 90 << 30,
		WeightedTokens: 4096, EstimatedCostMicros: 2150,
	},
}

// testServer is a real gRPC server on a loopback TCP port.
type testServer struct {
	conn   *grpc.ClientConn
	health *health.Server
}

// startServer serves eng on 127.0.0.1:0 with the recovery interceptor
// logging to logw (discarded when nil) and returns a client connection; the
// server stops when the test ends.
func startServer(tb testing.TB, eng Engine, logw io.Writer, opts ...RegisterOption) *testServer {
	tb.Helper()
	ts, stop, err := serveLoopback(eng, logw, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Error(err)
		}
	})
	return ts
}

// serveLoopback serves eng on 127.0.0.1:0 as startServer does; stop closes
// the connection, stops the server and returns Serve's error, if any.
func serveLoopback(eng Engine, logw io.Writer, opts ...RegisterOption) (ts *testServer, stop func() error, err error) {
	if logw == nil {
		logw = io.Discard
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		RecoveryUnaryInterceptor(slog.New(slog.NewTextHandler(logw, nil)))))
	hs := Register(srv, eng, opts...)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		srv.Stop()
		<-served
		return nil, nil, err
	}
	stop = func() error {
		conn.Close()
		srv.Stop()
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	}
	return &testServer{conn: conn, health: hs}, stop, nil
}

// lockedBuffer is an io.Writer safe for the server's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// wantInvalidArgument fails unless err is INVALID_ARGUMENT with message
// "invalid <field>: ..." and a BadRequest detail naming field.
func wantInvalidArgument(t *testing.T, err error, field string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.InvalidArgument {
		t.Fatalf("error = %v, want INVALID_ARGUMENT", err)
	}
	if want := "invalid " + field + ": "; len(st.Message()) < len(want) || st.Message()[:len(want)] != want {
		t.Errorf("message = %q, want prefix %q", st.Message(), want)
	}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			if len(br.GetFieldViolations()) != 1 || br.GetFieldViolations()[0].GetField() != field {
				t.Errorf("BadRequest = %v, want one violation of field %q", br, field)
			}
			return
		}
	}
	t.Errorf("no BadRequest detail in %v", st.Details())
}

// wantCode fails unless err has gRPC code c.
func wantCode(t *testing.T, err error, c codes.Code) {
	t.Helper()
	if got := status.Code(err); got != c {
		t.Fatalf("code = %v (%v), want %v", got, err, c)
	}
}

// wantAllFieldsSet fails if any field of m (recursively, for message fields)
// is unset, so a field added to the proto cannot be forgotten by a test.
func wantAllFieldsSet(t *testing.T, m proto.Message) {
	t.Helper()
	r := m.ProtoReflect()
	fields := r.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		f := fields.Get(i)
		if !r.Has(f) {
			t.Errorf("%s: field %s is not set", r.Descriptor().FullName(), f.Name())
			continue
		}
		if f.Kind() == protoreflect.MessageKind && !f.IsList() && !f.IsMap() {
			if sub := r.Get(f).Message().Interface(); sub.ProtoReflect().Descriptor().FullName().Parent() == r.Descriptor().FullName().Parent() {
				wantAllFieldsSet(t, sub)
			}
		}
	}
}

// wantNoZeroFields fails if any field of the struct v is its zero value, so
// a field added to an engine type cannot be forgotten by a test.
func wantNoZeroFields(t *testing.T, v any) {
	t.Helper()
	rv := reflect.ValueOf(v)
	for i := 0; i < rv.NumField(); i++ {
		f := rv.Field(i)
		if f.IsZero() {
			t.Errorf("%s.%s is zero in the test fixture", rv.Type().Name(), rv.Type().Field(i).Name)
			continue
		}
		if f.Kind() == reflect.Struct && f.Type() != reflect.TypeFor[time.Time]() {
			wantNoZeroFields(t, f.Interface())
		}
	}
}

// testBacklog is the Backlog port over a testEngine: its Admit answers the
// engine's decision with a fixed ticket and message, and it records the
// leases it is told were released.
type testBacklog struct {
	eng             *testEngine
	ticket, message string
	mu              sync.Mutex
	released        []uint64
}

func (b *testBacklog) Admit(ctx context.Context, req admission.Request) (deferral.Answer, error) {
	d, err := b.eng.Admit(ctx, req)
	return deferral.Answer{Decision: d, Ticket: b.ticket, Message: b.message}, err
}

func (b *testBacklog) Released(_ context.Context, leaseID uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.released = append(b.released, leaseID)
}

func (b *testBacklog) Claim(context.Context, deferral.ClaimOptions, func(deferral.Delivery) error) error {
	return deferral.ErrClosed
}

func (b *testBacklog) Get(context.Context, string, func(string) bool) (deferral.Record, error) {
	return deferral.Record{}, deferral.ErrNotFound
}

func (b *testBacklog) Cancel(context.Context, string, func(string) bool) (deferral.Record, error) {
	return deferral.Record{}, deferral.ErrNotFound
}

func (b *testBacklog) Waiting(string) admission.Reason { return admission.ReasonNone }

func (b *testBacklog) Tenants() []deferral.TenantBacklog { return nil }
