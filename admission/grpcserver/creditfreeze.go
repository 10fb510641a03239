package grpcserver

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// maxFreeze bounds a credit freeze: an emergency switch, not a policy (a
// longer one belongs in the tiers' burst_credit).
const maxFreeze = 7 * 24 * time.Hour

// errNoFreeze answers the credit RPCs of a server whose engine cannot freeze.
var errNoFreeze = status.Error(codes.Unimplemented, "this server does not freeze burst credit")

// CreditFreezer is where FreezeBurstCredit and ThawBurstCredit go: with a
// control plane, a key every replica applies (sluiced's etcd adapter);
// without one, this replica's engine. It must be safe for concurrent use.
type CreditFreezer interface {
	// FreezeCredit freezes every tenant's burst credit for d from now and
	// returns the freeze in force.
	FreezeCredit(ctx context.Context, d time.Duration, reason string) (admission.CreditFreeze, error)
	// ThawCredit ends the freeze; it reports whether one was in force.
	ThawCredit(ctx context.Context) (bool, error)
}

// WithCreditFreezer sends the Operator's credit freezes to f. Without it
// they apply to the engine Register serves, on this replica only.
func WithCreditFreezer(f CreditFreezer) RegisterOption {
	return func(o *registerOptions) { o.freezer = f }
}

// localFreezer freezes one engine: a server without a control plane.
type localFreezer struct{ eng CreditEngine }

func (l localFreezer) FreezeCredit(_ context.Context, d time.Duration, reason string) (admission.CreditFreeze, error) {
	return l.eng.FreezeCreditFor(d, reason), nil
}

func (l localFreezer) ThawCredit(context.Context) (bool, error) { return l.eng.ThawCredit(), nil }

// FreezeBurstCredit implements admissionv1.OperatorServer.
func (s *operatorServer) FreezeBurstCredit(ctx context.Context, in *admissionv1.FreezeBurstCreditRequest) (*admissionv1.FreezeBurstCreditResponse, error) {
	if s.freezer == nil {
		return nil, errNoFreeze
	}
	if in.GetDuration() == nil {
		return nil, invalidArgument("duration", "required (how long to freeze burst credit)")
	}
	if err := in.GetDuration().CheckValid(); err != nil {
		return nil, invalidArgument("duration", err.Error())
	}
	d := in.GetDuration().AsDuration()
	if d <= 0 || d > maxFreeze {
		return nil, invalidArgument("duration", "must be positive and at most "+maxFreeze.String()+", got "+d.String())
	}
	if len(in.GetReason()) > maxReasonLen {
		return nil, invalidArgument("reason", "must be at most "+strconv.Itoa(maxReasonLen)+" bytes")
	}
	f, err := s.freezer.FreezeCredit(ctx, d, in.GetReason())
	if err != nil {
		return nil, freezerStatus(err)
	}
	return &admissionv1.FreezeBurstCreditResponse{Freeze: freezeToProto(f)}, nil
}

// ThawBurstCredit implements admissionv1.OperatorServer.
func (s *operatorServer) ThawBurstCredit(ctx context.Context, _ *admissionv1.ThawBurstCreditRequest) (*admissionv1.ThawBurstCreditResponse, error) {
	if s.freezer == nil {
		return nil, errNoFreeze
	}
	was, err := s.freezer.ThawCredit(ctx)
	if err != nil {
		return nil, freezerStatus(err)
	}
	return &admissionv1.ThawBurstCreditResponse{WasFrozen: was}, nil
}

// freezerStatus keeps a freezer's own status (UNAVAILABLE when the control
// plane cannot be written) and maps any other error as the engine's.
func freezerStatus(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return statusFromError(err)
}

// creditFreeze renders the engine's freeze in force; nil when none.
func (s *operatorServer) creditFreeze() *admissionv1.CreditFreeze {
	if s.credit == nil {
		return nil
	}
	f, ok := s.credit.CreditFrozen()
	if !ok {
		return nil
	}
	return freezeToProto(f)
}

func freezeToProto(f admission.CreditFreeze) *admissionv1.CreditFreeze {
	return &admissionv1.CreditFreeze{Until: timestamppb.New(f.Until), Reason: f.Reason}
}
