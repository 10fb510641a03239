package grpcserver

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// FreezeBurstCredit applies to the engine without a freezer, shows in
// ListDomains and GetConfigStatus, and ThawBurstCredit ends it; bad input is
// INVALID_ARGUMENT naming the field.
func TestFreezeBurstCredit(t *testing.T) {
	eng := &testEngine{}
	cl := admissionv1.NewOperatorClient(startServer(t, eng, nil, WithConfigStatus(&fixedStatus{})).conn)
	ctx := context.Background()

	fr, err := cl.FreezeBurstCredit(ctx, &admissionv1.FreezeBurstCreditRequest{Duration: durationpb.New(5 * time.Minute), Reason: "incident 42"})
	if err != nil {
		t.Fatal(err)
	}
	want := time.Unix(1_700_000_000, 0).Add(5 * time.Minute)
	if !fr.GetFreeze().GetUntil().AsTime().Equal(want) || fr.GetFreeze().GetReason() != "incident 42" {
		t.Fatalf("FreezeBurstCredit = %v, want until %v", fr, want)
	}
	ld, err := cl.ListDomains(ctx, &admissionv1.ListDomainsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !ld.GetCreditFreeze().GetUntil().AsTime().Equal(want) || ld.GetCreditFreeze().GetReason() != "incident 42" {
		t.Errorf("ListDomains credit_freeze = %v", ld.GetCreditFreeze())
	}
	cs, err := cl.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !cs.GetCreditFreeze().GetUntil().AsTime().Equal(want) {
		t.Errorf("GetConfigStatus credit_freeze = %v", cs.GetCreditFreeze())
	}

	th, err := cl.ThawBurstCredit(ctx, &admissionv1.ThawBurstCreditRequest{})
	if err != nil || !th.GetWasFrozen() {
		t.Fatalf("ThawBurstCredit = %v, %v; want was_frozen", th, err)
	}
	if th, err := cl.ThawBurstCredit(ctx, &admissionv1.ThawBurstCreditRequest{}); err != nil || th.GetWasFrozen() {
		t.Fatalf("a second ThawBurstCredit = %v, %v; want not was_frozen", th, err)
	}
	if ld, _ := cl.ListDomains(ctx, &admissionv1.ListDomainsRequest{}); ld.GetCreditFreeze() != nil {
		t.Errorf("after thaw, ListDomains credit_freeze = %v, want absent", ld.GetCreditFreeze())
	}

	for _, tc := range []struct {
		name  string
		req   *admissionv1.FreezeBurstCreditRequest
		field string
	}{
		{"no duration", &admissionv1.FreezeBurstCreditRequest{}, "duration"},
		{"zero", &admissionv1.FreezeBurstCreditRequest{Duration: durationpb.New(0)}, "duration"},
		{"negative", &admissionv1.FreezeBurstCreditRequest{Duration: durationpb.New(-time.Second)}, "duration"},
		{"over a week", &admissionv1.FreezeBurstCreditRequest{Duration: durationpb.New(8 * 24 * time.Hour)}, "duration"},
		{"malformed", &admissionv1.FreezeBurstCreditRequest{Duration: &durationpb.Duration{Seconds: 1, Nanos: -1}}, "duration"},
		{"long reason", &admissionv1.FreezeBurstCreditRequest{Duration: durationpb.New(time.Minute), Reason: strings.Repeat("x", maxReasonLen+1)}, "reason"},
	} {
		_, err := cl.FreezeBurstCredit(ctx, tc.req)
		wantInvalidArgument(t, err, tc.field)
		if _, frozen := eng.CreditFrozen(); frozen {
			t.Fatalf("%s: refused, but the engine froze", tc.name)
		}
	}
}

// A freezer's own status (the control plane unreachable) reaches the caller.
func TestFreezeBurstCreditFreezerStatus(t *testing.T) {
	cl := admissionv1.NewOperatorClient(startServer(t, &testEngine{}, nil, WithCreditFreezer(downFreezer{})).conn)
	_, err := cl.FreezeBurstCredit(context.Background(), &admissionv1.FreezeBurstCreditRequest{Duration: durationpb.New(time.Minute)})
	wantCode(t, err, codes.Unavailable)
	_, err = cl.ThawBurstCredit(context.Background(), &admissionv1.ThawBurstCreditRequest{})
	wantCode(t, err, codes.Unavailable)
}

type downFreezer struct{}

func (downFreezer) FreezeCredit(context.Context, time.Duration, string) (admission.CreditFreeze, error) {
	return admission.CreditFreeze{}, status.Error(codes.Unavailable, "etcd unreachable")
}

func (downFreezer) ThawCredit(context.Context) (bool, error) {
	return false, status.Error(codes.Unavailable, "etcd unreachable")
}

// An engine that cannot freeze serves no freeze: the RPCs are UNIMPLEMENTED.
func TestFreezeBurstCreditWithoutACreditEngine(t *testing.T) {
	type plainEngine struct{ Engine } // hides testEngine's CreditEngine methods
	cl := admissionv1.NewOperatorClient(startServer(t, plainEngine{&testEngine{}}, nil).conn)
	_, err := cl.FreezeBurstCredit(context.Background(), &admissionv1.FreezeBurstCreditRequest{Duration: durationpb.New(time.Minute)})
	wantCode(t, err, codes.Unimplemented)
	_, err = cl.ThawBurstCredit(context.Background(), &admissionv1.ThawBurstCreditRequest{})
	wantCode(t, err, codes.Unimplemented)
	if ld, err := cl.ListDomains(context.Background(), &admissionv1.ListDomainsRequest{}); err != nil || ld.GetCreditFreeze() != nil {
		t.Fatalf("ListDomains = %v, %v", ld, err)
	}
}
