package grpcserver

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/deferral"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// Backlog is the port of deferrable work (*deferral.Backlog has it):
// deferrable Admits, the workers' Claim streams and the tickets.
type Backlog interface {
	Admit(ctx context.Context, req admission.Request) (deferral.Answer, error)
	Released(ctx context.Context, leaseID uint64)
	Claim(ctx context.Context, opts deferral.ClaimOptions, send func(deferral.Delivery) error) error
	Get(ctx context.Context, id string, allow func(tenant string) bool) (deferral.Record, error)
	Cancel(ctx context.Context, id string, allow func(tenant string) bool) (deferral.Record, error)
	Waiting(id string) admission.Reason
	Tenants() []deferral.TenantBacklog
}

// WithBacklog serves deferrable work from b: deferrable Admits, Claim,
// GetTicket and CancelTicket. Without it a deferrable Admit is
// FAILED_PRECONDITION and the ticket calls UNIMPLEMENTED.
func WithBacklog(b Backlog) RegisterOption {
	return func(o *registerOptions) { o.backlog = b }
}

// maxTicketIDLen bounds a ticket id (32 hex digits) before any lookup.
const maxTicketIDLen = 64

// admitDeferrable answers a deferrable Admit through the backlog.
func (s *admissionServer) admitDeferrable(ctx context.Context, req admission.Request) (*admissionv1.AdmitResponse, error) {
	if s.backlog == nil {
		return nil, status.Error(codes.FailedPrecondition, "this server keeps no backlog for deferrable work")
	}
	a, err := s.backlog.Admit(ctx, req)
	if err != nil {
		return nil, backlogStatus(err)
	}
	resp := decisionToProto(&a.Decision)
	resp.TicketId = a.Ticket
	resp.Message = a.Message
	return resp, nil
}

// allow is the caller's tenant check for the ticket calls, nil without auth.
func (s *admissionServer) allow(ctx context.Context) func(string) bool {
	if s.guard == nil {
		return nil
	}
	return func(tenant string) bool { return s.guard(ctx, tenant) == nil }
}

// Claim implements admissionv1.AdmissionServer.
func (s *admissionServer) Claim(in *admissionv1.ClaimRequest, stream admissionv1.Admission_ClaimServer) error {
	if s.backlog == nil {
		return status.Error(codes.Unimplemented, "this server keeps no backlog for deferrable work")
	}
	if in.GetMaxInFlight() < 0 || in.GetMaxInFlight() > 10000 {
		return invalidArgument("max_in_flight", "must be in [0, 10000]")
	}
	ctx := stream.Context()
	for i, t := range in.GetTenants() {
		if t == "" {
			return invalidArgument("tenants["+strconv.Itoa(i)+"]", "must not be empty")
		}
	}
	for i, m := range in.GetModels() {
		if m == "" {
			return invalidArgument("models["+strconv.Itoa(i)+"]", "must not be empty")
		}
	}
	if s.guard != nil {
		for _, t := range in.GetTenants() {
			if err := s.guard(ctx, t); err != nil {
				return err
			}
		}
	}
	opts := deferral.ClaimOptions{
		Tenants: in.GetTenants(), Models: in.GetModels(), MaxInFlight: int(in.GetMaxInFlight()), Allow: s.allow(ctx),
	}
	err := s.backlog.Claim(ctx, opts, func(d deferral.Delivery) error {
		return stream.Send(&admissionv1.ClaimedWork{Ticket: ticketToProto(d.Record, admission.ReasonNone), Admission: decisionToProto(&d.Decision)})
	})
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	return backlogStatus(err)
}

// GetTicket implements admissionv1.AdmissionServer.
func (s *admissionServer) GetTicket(ctx context.Context, in *admissionv1.GetTicketRequest) (*admissionv1.Ticket, error) {
	if s.backlog == nil {
		return nil, status.Error(codes.Unimplemented, "this server keeps no backlog for deferrable work")
	}
	if err := checkTicketID(in.GetTicketId()); err != nil {
		return nil, err
	}
	rec, err := s.backlog.Get(ctx, in.GetTicketId(), s.allow(ctx))
	if err != nil {
		return nil, backlogStatus(err)
	}
	return ticketToProto(rec, s.backlog.Waiting(rec.ID)), nil
}

// CancelTicket implements admissionv1.AdmissionServer.
func (s *admissionServer) CancelTicket(ctx context.Context, in *admissionv1.CancelTicketRequest) (*admissionv1.Ticket, error) {
	if s.backlog == nil {
		return nil, status.Error(codes.Unimplemented, "this server keeps no backlog for deferrable work")
	}
	if err := checkTicketID(in.GetTicketId()); err != nil {
		return nil, err
	}
	rec, err := s.backlog.Cancel(ctx, in.GetTicketId(), s.allow(ctx))
	if err != nil {
		return nil, backlogStatus(err)
	}
	return ticketToProto(rec, admission.ReasonNone), nil
}

func checkTicketID(id string) error {
	if id == "" || len(id) > maxTicketIDLen {
		return invalidArgument("ticket_id", "must be 1 to 64 characters")
	}
	return nil
}

// backlogStatus maps the backlog's errors to gRPC codes: a ticket of
// another tenant is answered as an unknown one (as a lease is).
func backlogStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, deferral.ErrNotFound), errors.Is(err, deferral.ErrNotYours):
		return status.Error(codes.NotFound, deferral.ErrNotFound.Error())
	case errors.Is(err, deferral.ErrClaimed):
		return status.Error(codes.FailedPrecondition, errorText(err))
	case errors.Is(err, deferral.ErrClosed):
		return status.Error(codes.Unavailable, errorText(err))
	}
	if _, ok := status.FromError(err); ok && status.Code(err) != codes.Unknown {
		return err
	}
	var ia *admission.InvalidArgumentError
	if errors.As(err, &ia) {
		return statusFromError(err)
	}
	return status.Error(codes.Unavailable, "deferred backlog: "+errorText(err))
}

// ticketToProto renders a ticket; waiting is what holds a pending one.
func ticketToProto(rec deferral.Record, waiting admission.Reason) *admissionv1.Ticket {
	w := &rec.Work
	out := &admissionv1.Ticket{
		TicketId: rec.ID,
		State:    admissionv1.TicketState(rec.State),
		Request: &admissionv1.AdmitRequest{
			RequestId: w.RequestID, Tenant: w.Tenant, Model: w.Model, PromptTokens: w.PromptTokens,
			MaxOutputTokens: w.MaxOutputTokens, Priority: admissionv1.Priority(w.Priority),
			AcceptDowngrade: w.AcceptDowngrade, ExpectedCachedTokens: w.ExpectedCachedTokens,
			Deferrable: true, DeferWithin: durationpb.New(rec.Deadline.Sub(rec.Created)),
		},
		Created:  timestamppb.New(rec.Created),
		Deadline: timestamppb.New(rec.Deadline),
		Reason:   rec.Reason,
	}
	if rec.State == deferral.StatePending {
		out.WaitingOn = admissionv1.Reason(waiting)
	}
	if rec.State == deferral.StateClaimed {
		out.LeaseId = formatLeaseID(rec.Claim.LeaseID)
		out.Domain, out.Model = rec.Claim.Domain, rec.Claim.Model
	}
	if !rec.Finished.IsZero() {
		out.Finished = timestamppb.New(rec.Finished)
	}
	return out
}

// deferWithin reads an AdmitRequest's defer_within.
func deferWithin(in *admissionv1.AdmitRequest) (time.Duration, error) {
	d := in.GetDeferWithin()
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, invalidArgument("defer_within", err.Error())
	}
	return d.AsDuration(), nil
}

// ListBacklog implements admissionv1.OperatorServer.
func (s *operatorServer) ListBacklog(context.Context, *admissionv1.ListBacklogRequest) (*admissionv1.ListBacklogResponse, error) {
	if s.backlog == nil {
		return nil, status.Error(codes.Unimplemented, "this server keeps no backlog for deferrable work")
	}
	tenants := s.backlog.Tenants()
	slices.SortFunc(tenants, func(a, b deferral.TenantBacklog) int {
		return cmp.Or(cmp.Compare(b.Pending+b.Claimed, a.Pending+a.Claimed), cmp.Compare(a.Tenant, b.Tenant))
	})
	out := &admissionv1.ListBacklogResponse{Tenants: make([]*admissionv1.TenantBacklog, len(tenants))}
	for i, tb := range tenants {
		t := &admissionv1.TenantBacklog{Tenant: tb.Tenant, Pending: int64(tb.Pending), Claimed: int64(tb.Claimed)}
		if info, ok := s.eng.Tenant(tb.Tenant); ok {
			t.Tier = info.Tier
		}
		if tb.Pending > 0 {
			t.OldestAge = durationpb.New(tb.OldestAge)
		}
		out.Pending += t.Pending
		out.Claimed += t.Claimed
		out.Tenants[i] = t
	}
	return out, nil
}
