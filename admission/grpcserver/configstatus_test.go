package grpcserver

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/grpctest"
)

// fixedStatus is a ConfigStatusSource whose answer the test sets.
type fixedStatus struct {
	mu sync.Mutex
	st ConfigStatus
}

func (f *fixedStatus) ConfigStatus() ConfigStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}

func (f *fixedStatus) set(st ConfigStatus) { f.mu.Lock(); f.st = st; f.mu.Unlock() }

// serveWith serves a test engine with opts on loopback and returns an
// Operator client.
func serveWith(t *testing.T, opts ...RegisterOption) admissionv1.OperatorClient {
	t.Helper()
	srv := grpc.NewServer()
	Register(srv, &testEngine{}, opts...)
	return admissionv1.NewOperatorClient(grpctest.Serve(t, srv))
}

// GetConfigStatus renders the port's status, refusal included; without a
// port it is UNIMPLEMENTED.
func TestGetConfigStatus(t *testing.T) {
	src := &fixedStatus{}
	op := serveWith(t, WithConfigStatus(src))
	ctx := context.Background()
	applied := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

	src.set(ConfigStatus{Source: "/etc/sluice.yaml", AppliedAt: applied, ControlPlane: ControlPlaneNone})
	got, err := op.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := &admissionv1.GetConfigStatusResponse{Source: "/etc/sluice.yaml", AppliedAt: timestamppb.New(applied), ControlPlane: "none"}
	if !proto.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}

	src.set(ConfigStatus{Source: "etcd", Revision: 40, AppliedAt: applied, ControlPlane: ControlPlaneEtcd, ControlPlaneConnected: true})
	got, err = op.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want = &admissionv1.GetConfigStatusResponse{Source: "etcd", Revision: 40, AppliedAt: timestamppb.New(applied), ControlPlane: "etcd", ControlPlaneConnected: true}
	if !proto.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}

	refused := applied.Add(time.Minute)
	src.set(ConfigStatus{Source: "etcd", Revision: 41, AppliedAt: applied, LastRefusal: &admission.ConfigRefusal{
		Source: "/sluice/tenants/x", Key: "tenants.x.weight", Reason: "want a whole number", Revision: 42, At: refused,
	}})
	got, err = op.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want = &admissionv1.GetConfigStatusResponse{Source: "etcd", Revision: 41, AppliedAt: timestamppb.New(applied),
		LastRefusal: &admissionv1.ConfigRefusal{Source: "/sluice/tenants/x", Key: "tenants.x.weight",
			Reason: "want a whole number", Revision: 42, At: timestamppb.New(refused)}}
	if !proto.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}

	bare := serveWith(t)
	if _, err := bare.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("without a port: %v, want UNIMPLEMENTED", err)
	}
}
