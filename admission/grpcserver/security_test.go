package grpcserver

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// ownedEngine is a testEngine whose leases have tenants, releasing as the
// engine does: an unknown lease is NOT_FOUND, and Authorize is asked about
// the lease's tenant before anything is released.
func ownedEngine(owners map[uint64]string, released *atomic.Int64) *testEngine {
	return &testEngine{release: func(_ context.Context, rel admission.Release) (admission.ReleaseResult, error) {
		owner, ok := owners[rel.LeaseID]
		if !ok {
			return admission.ReleaseResult{}, admission.ErrLeaseNotFound
		}
		if rel.Authorize != nil {
			if err := rel.Authorize(owner); err != nil {
				return admission.ReleaseResult{}, fmt.Errorf("%w: %w", admission.ErrNotYourLease, err)
			}
		}
		released.Add(1)
		return admission.ReleaseResult{}, nil
	}}
}

// metadataGuard plays the auth interceptor's part: the caller may serve the
// tenant named in its "x-may-serve" metadata.
func metadataGuard(ctx context.Context, tenant string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, t := range md.Get("x-may-serve") {
		if t == tenant {
			return nil
		}
	}
	return status.Errorf(codes.PermissionDenied, "not bound to tenant %q", tenant)
}

// Release has the engine ask the guard about the lease's tenant before it
// releases anything: another tenant's live lease gets the very answer of a
// forged id, NOT_FOUND in the same words, so that a caller cannot tell a
// live foreign lease from a dead one; neither releases anything.
func TestReleaseChecksTheLeaseOwner(t *testing.T) {
	var released atomic.Int64
	eng := ownedEngine(map[uint64]string{7: "acme", 8: "globex"}, &released)
	cl := admissionv1.NewAdmissionClient(startServer(t, eng, nil, WithTenantGuard(metadataGuard)).conn)
	asAcme := metadata.AppendToOutgoingContext(context.Background(), "x-may-serve", "acme")

	if _, err := cl.Release(asAcme, &admissionv1.ReleaseRequest{LeaseId: "l-7"}); err != nil {
		t.Fatalf("own lease: %v", err)
	}
	_, foreign := cl.Release(asAcme, &admissionv1.ReleaseRequest{LeaseId: "l-8", OutputTokens: 1 << 40, Outcome: admissionv1.Outcome_OUTCOME_ERROR})
	wantCode(t, foreign, codes.NotFound)
	_, forged := cl.Release(asAcme, &admissionv1.ReleaseRequest{LeaseId: "l-4294967297"})
	wantCode(t, forged, codes.NotFound)
	if a, b := status.Convert(foreign), status.Convert(forged); a.Message() != b.Message() || len(a.Details()) != len(b.Details()) {
		t.Errorf("a foreign lease is told apart from a dead one: %q vs %q", a.Message(), b.Message())
	}
	if strings.Contains(foreign.Error(), "globex") {
		t.Errorf("the answer names the lease's tenant: %v", foreign)
	}
	if n := released.Load(); n != 1 {
		t.Errorf("released %d leases, want only the caller's own", n)
	}
}

// Without a guard (no auth) Release asks nothing: every caller may release
// any lease it knows the id of.
func TestReleaseWithoutAGuard(t *testing.T) {
	var released atomic.Int64
	cl := admissionv1.NewAdmissionClient(startServer(t, ownedEngine(map[uint64]string{8: "globex"}, &released), nil).conn)
	if _, err := cl.Release(context.Background(), &admissionv1.ReleaseRequest{LeaseId: "l-8"}); err != nil {
		t.Fatalf("no guard: %v", err)
	}
	if released.Load() != 1 {
		t.Error("the release did not happen")
	}
}

// A drain reason over 1 KiB and names over 128 bytes are INVALID_ARGUMENT
// naming the field; the engine never sees them and no error echoes them.
func TestOperatorBoundsWhatItStoresAndEchoes(t *testing.T) {
	var drains atomic.Int64
	eng := &testEngine{drain: func(string, string) error { drains.Add(1); return nil }}
	op := admissionv1.NewOperatorClient(startServer(t, eng, nil).conn)
	ctx := context.Background()

	_, err := op.DrainDomain(ctx, &admissionv1.DrainDomainRequest{Domain: "nvl72-a", Reason: strings.Repeat("r", 1025)})
	wantInvalidArgument(t, err, "reason")
	if _, err := op.DrainDomain(ctx, &admissionv1.DrainDomainRequest{Domain: "nvl72-a", Reason: strings.Repeat("r", 1024)}); err != nil {
		t.Fatalf("a 1 KiB reason: %v", err)
	}
	long := strings.Repeat("x", 1<<20)
	for name, call := range map[string]func() error{
		"domain": func() error {
			_, err := op.DrainDomain(ctx, &admissionv1.DrainDomainRequest{Domain: long})
			return err
		},
		"domain (undrain)": func() error {
			_, err := op.UndrainDomain(ctx, &admissionv1.UndrainDomainRequest{Domain: long})
			return err
		},
		"name": func() error {
			_, err := op.GetTenant(ctx, &admissionv1.GetTenantRequest{Name: long})
			return err
		},
	} {
		err := call()
		wantInvalidArgument(t, err, strings.Fields(name)[0])
		if len(err.Error()) > 256 {
			t.Errorf("%s: a %d-byte error echoes the name", name, len(err.Error()))
		}
	}
	if n := drains.Load(); n != 1 {
		t.Errorf("engine drains: %d, want 1", n)
	}
	_, err = op.GetTenant(ctx, &admissionv1.GetTenantRequest{Name: strings.Repeat("y", 128)})
	wantCode(t, err, codes.NotFound)
}

// Claim names the bad field before it asks the guard anything: an empty
// tenant or model is INVALID_ARGUMENT even for a caller bound to no
// tenant, and max_in_flight out of range too; a tenant the caller is not
// bound to is PERMISSION_DENIED.
func TestClaimChecksItsArgumentsFirst(t *testing.T) {
	eng := &testEngine{}
	bl := &testBacklog{eng: eng}
	cl := admissionv1.NewAdmissionClient(startServer(t, eng, nil, WithBacklog(bl), WithTenantGuard(metadataGuard)).conn)
	asAcme := metadata.AppendToOutgoingContext(context.Background(), "x-may-serve", "acme")
	claim := func(in *admissionv1.ClaimRequest) error {
		stream, err := cl.Claim(asAcme, in)
		if err != nil {
			return err
		}
		_, err = stream.Recv()
		return err
	}
	for field, in := range map[string]*admissionv1.ClaimRequest{
		"tenants[1]":    {Tenants: []string{"globex", ""}},
		"models[0]":     {Tenants: []string{"globex"}, Models: []string{""}},
		"max_in_flight": {MaxInFlight: -1},
	} {
		wantInvalidArgument(t, claim(in), field)
	}
	if err := claim(&admissionv1.ClaimRequest{Tenants: []string{"globex"}}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Claim of another tenant's work: %v, want PERMISSION_DENIED", err)
	}
}
