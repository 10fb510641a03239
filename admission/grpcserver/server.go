// Package grpcserver serves the admission engine over gRPC: the Admission
// service for routers, the Operator service for sluicectl, the standard
// health service and server reflection (so grpcurl works without the proto).
//
// The handlers translate between admission/v1 messages and the engine's
// in-process types and do nothing else: they validate only what the engine's
// types cannot express (enum values, lease id syntax) and leave every other
// check to the engine, which names the offending field in an
// *admission.InvalidArgumentError. Engine errors map to gRPC codes as follows:
//
//	*admission.InvalidArgumentError   INVALID_ARGUMENT, with a google.rpc.BadRequest detail naming the field
//	admission.ErrLeaseNotFound        NOT_FOUND
//	admission.ErrUnknownDomain        NOT_FOUND
//	admission.ErrNotYourLease         NOT_FOUND, worded as ErrLeaseNotFound (Release of a lease of a tenant the caller does not serve)
//	admission.ErrLeaseEnded           FAILED_PRECONDITION (a request_id repeated after its lease ended)
//	context.DeadlineExceeded          DEADLINE_EXCEEDED
//	context.Canceled                  CANCELED
//	anything else                     INTERNAL
//
// A rejection is not an error: it is an AdmitResponse with decision REJECTED.
//
// The Admit handler is on the hot path. It allocates the response, its trace
// and its durations as one object and builds no maps.
package grpcserver

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// Engine is the port the gRPC services drive; the admission engine
// satisfies it. Its methods must be safe for concurrent use.
type Engine interface {
	// Admit decides one request. req.Deadline carries the gRPC deadline.
	// The answer's slices are sent after Admit returns: the engine must not
	// modify them afterwards.
	Admit(ctx context.Context, req admission.Request) (admission.Decision, error)
	// Release ends a lease.
	Release(ctx context.Context, rel admission.Release) (admission.ReleaseResult, error)
	// Domains describes every domain.
	Domains() []admission.DomainInfo
	// Drain stops new placements on a domain; an unknown domain is an error
	// wrapping admission.ErrUnknownDomain.
	Drain(domain, reason string) error
	// Undrain lets a domain take placements again; an unknown domain is an
	// error wrapping admission.ErrUnknownDomain.
	Undrain(domain string) error
	// Tenants describes every tenant.
	Tenants() []admission.TenantInfo
	// Tenant describes one tenant; false if it is not configured.
	Tenant(name string) (admission.TenantInfo, bool)
	// Explain answers what Admit would do with req now, charging nothing.
	Explain(ctx context.Context, req admission.Request) (admission.Explanation, error)
}

// CreditEngine is the part of an Engine that freezes burst credit
// (*admission.Engine has it). An Engine without it serves no credit freeze:
// FreezeBurstCredit and ThawBurstCredit are UNIMPLEMENTED unless a
// CreditFreezer is given, and no freeze is ever reported.
type CreditEngine interface {
	// FreezeCreditFor freezes every tenant's burst credit for d from now,
	// on this replica.
	FreezeCreditFor(d time.Duration, reason string) admission.CreditFreeze
	// ThawCredit ends a credit freeze on this replica; it reports whether
	// one was in force.
	ThawCredit() bool
	// CreditFrozen returns the credit freeze in force, if any.
	CreditFrozen() (admission.CreditFreeze, bool)
}

// Register registers the Admission and Operator services backed by eng, the
// standard health service and server reflection on s. It returns the health
// server, which reports SERVING for the whole server ("") and for both
// services; call its Shutdown when the server begins to stop, so that load
// balancers see NOT_SERVING.
//
// gRPC does not recover panics in handlers: build s with
// grpc.ChainUnaryInterceptor(RecoveryUnaryInterceptor(logger)) so that no
// input can take the process down. Options add optional ports, such as
// WithConfigStatus.
func Register(s *grpc.Server, eng Engine, opts ...RegisterOption) *health.Server {
	var o registerOptions
	for _, opt := range opts {
		opt(&o)
	}
	admissionv1.RegisterAdmissionServer(s, &admissionServer{eng: eng, guard: o.tenantGuard, backlog: o.backlog})
	admissionv1.RegisterOperatorServer(s, newOperatorServer(eng, &o))
	hs := health.NewServer()
	hs.SetServingStatus(admissionv1.Admission_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(admissionv1.Operator_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, hs)
	reflection.Register(s)
	return hs
}

// NewOperator returns the Operator service over eng without a gRPC server:
// the handlers Register serves, for an adapter that offers the same actions
// elsewhere (the dashboard's HTTP API), with the same validation, the same
// answers and the same errors (gRPC status errors). Authorization and audit
// are the caller's, as the interceptors are on gRPC.
func NewOperator(eng Engine, opts ...RegisterOption) admissionv1.OperatorServer {
	var o registerOptions
	for _, opt := range opts {
		opt(&o)
	}
	return newOperatorServer(eng, &o)
}

// admissionServer implements admissionv1.AdmissionServer over an Engine.
type admissionServer struct {
	admissionv1.UnimplementedAdmissionServer
	eng     Engine
	guard   TenantGuard // nil: no ownership check (no auth)
	backlog Backlog     // nil: no deferrable work
}

// admitAnswer holds an AdmitResponse and the messages it points to, so that
// building an answer costs one allocation instead of four.
type admitAnswer struct {
	resp       admissionv1.AdmitResponse
	trace      admissionv1.Trace
	retryAfter durationpb.Duration
	queued     durationpb.Duration
	wait       durationpb.Duration
}

// Admit implements admissionv1.AdmissionServer.
func (s *admissionServer) Admit(ctx context.Context, in *admissionv1.AdmitRequest) (*admissionv1.AdmitResponse, error) {
	req, err := requestFromProto(ctx, in)
	if err != nil {
		return nil, err
	}
	if req.Deferrable {
		return s.admitDeferrable(ctx, req)
	}
	d, err := s.eng.Admit(ctx, req)
	if err != nil {
		return nil, statusFromError(err)
	}
	return decisionToProto(&d), nil
}

// requestFromProto checks in and builds the engine's request; the gRPC
// deadline is the request's.
func requestFromProto(ctx context.Context, in *admissionv1.AdmitRequest) (admission.Request, error) {
	prio, err := priorityFromProto(in.GetPriority())
	if err != nil {
		return admission.Request{}, err
	}
	req := admission.Request{
		RequestID:       in.GetRequestId(),
		Tenant:          in.GetTenant(),
		Model:           in.GetModel(),
		PromptTokens:    in.GetPromptTokens(),
		MaxOutputTokens: in.GetMaxOutputTokens(),
		Priority:        prio,
		AcceptDowngrade: in.GetAcceptDowngrade(),

		ExpectedCachedTokens: in.GetExpectedCachedTokens(),
		Deferrable:           in.GetDeferrable(),
	}
	if req.DeferWithin, err = deferWithin(in); err != nil {
		return admission.Request{}, err
	}
	if dl, ok := ctx.Deadline(); ok && !req.Deferrable {
		// A deferrable request's wait is defer_within; the call's
		// deadline bounds only this answer.
		req.Deadline = dl
	}
	return req, nil
}

// Release implements admissionv1.AdmissionServer.
func (s *admissionServer) Release(ctx context.Context, in *admissionv1.ReleaseRequest) (*admissionv1.ReleaseResponse, error) {
	id, err := parseLeaseID(in.GetLeaseId())
	if err != nil {
		return nil, err
	}
	outcome, err := outcomeFromProto(in.GetOutcome())
	if err != nil {
		return nil, err
	}
	rel := admission.Release{
		LeaseID:      id,
		PromptTokens: in.GetPromptTokens(),
		OutputTokens: in.GetOutputTokens(),
		Outcome:      outcome,

		CachedPromptTokens: in.GetCachedPromptTokens(),
	}
	for _, d := range []struct {
		field string
		in    *durationpb.Duration
		out   *time.Duration
	}{{"time_to_first_token", in.GetTimeToFirstToken(), &rel.TTFT}, {"duration", in.GetDuration(), &rel.Duration}} {
		if d.in == nil {
			continue
		}
		if err := d.in.CheckValid(); err != nil {
			return nil, invalidArgument(d.field, err.Error())
		}
		*d.out = d.in.AsDuration()
	}
	if s.guard != nil {
		// A router releases only its own tenants' leases: the engine asks
		// the guard about the lease's tenant before anything changes.
		rel.Authorize = func(tenant string) error { return s.guard(ctx, tenant) }
	}
	res, err := s.eng.Release(ctx, rel)
	if err != nil {
		return nil, statusFromError(err)
	}
	if res.Deferred && s.backlog != nil {
		s.backlog.Released(ctx, id)
	}
	a := new(struct {
		resp    admissionv1.ReleaseResponse
		heldFor durationpb.Duration
	})
	a.resp.Domain = res.Domain
	a.resp.Model = res.Model
	a.resp.RefundedTokens = res.RefundedTokens
	a.resp.ActualCostMicros = res.ActualCostMicros
	a.resp.OverrunClamped = res.OverrunClamped
	if res.HeldFor != 0 {
		setDuration(&a.heldFor, res.HeldFor)
		a.resp.HeldFor = &a.heldFor
	}
	return &a.resp, nil
}

// priorityFromProto checks p and maps PRIORITY_UNSPECIFIED to normal.
func priorityFromProto(p admissionv1.Priority) (admission.Priority, error) {
	switch p {
	case admissionv1.Priority_PRIORITY_UNSPECIFIED, admissionv1.Priority_PRIORITY_NORMAL:
		return admission.PriorityNormal, nil
	case admissionv1.Priority_PRIORITY_CRITICAL:
		return admission.PriorityCritical, nil
	}
	return 0, invalidArgument("priority", "unknown value "+strconv.FormatInt(int64(p), 10))
}

// outcomeFromProto checks o and maps OUTCOME_UNSPECIFIED to OK.
func outcomeFromProto(o admissionv1.Outcome) (admission.ReleaseOutcome, error) {
	switch o {
	case admissionv1.Outcome_OUTCOME_UNSPECIFIED, admissionv1.Outcome_OUTCOME_OK:
		return admission.ReleaseOK, nil
	case admissionv1.Outcome_OUTCOME_ERROR:
		return admission.ReleaseError, nil
	}
	return 0, invalidArgument("outcome", "unknown value "+strconv.FormatInt(int64(o), 10))
}

// decisionToProto renders d. Zero durations are left absent.
func decisionToProto(d *admission.Decision) *admissionv1.AdmitResponse {
	a := new(admitAnswer)
	r := &a.resp
	r.Decision = admissionv1.Decision(d.Outcome)
	r.Reason = admissionv1.Reason(d.Reason)
	if d.RetryAfter > 0 { // the engine never answers a negative wait; never send one
		setDuration(&a.retryAfter, d.RetryAfter)
		r.RetryAfter = &a.retryAfter
	}
	if d.LeaseID != 0 {
		r.LeaseId = formatLeaseID(d.LeaseID)
	}
	r.Domain = d.Domain
	r.Model = d.Model
	r.DowngradePath = d.DowngradePath
	if d.Queued != 0 {
		setDuration(&a.queued, d.Queued)
		r.Queued = &a.queued
	}
	t, tr := &a.trace, &d.Trace
	t.Tenant = tr.Tenant
	t.Model = tr.Model
	t.Tier = tr.Tier
	t.QuotaBefore = tr.QuotaBefore
	t.QuotaAfter = tr.QuotaAfter
	t.BurstCreditBefore = tr.BurstCreditBefore
	t.BurstCreditAfter = tr.BurstCreditAfter
	t.Floor = tr.Floor
	t.Critical = tr.Critical
	t.PrefillLevel = tr.PrefillLevel
	t.DecodeLevel = tr.DecodeLevel
	t.KvInUse = tr.KVInUse
	t.KvLimit = tr.KVLimit
	t.WeightedTokens = tr.WeightedTokens
	t.EstimatedCostMicros = tr.EstimatedCostMicros
	if tr.EstimatedWait > 0 {
		setDuration(&a.wait, tr.EstimatedWait)
		t.EstimatedWait = &a.wait
	}
	r.Trace = t
	return r
}

// setDuration stores d in p as durationpb.New would, without allocating.
func setDuration(p *durationpb.Duration, d time.Duration) {
	p.Seconds = int64(d / time.Second)
	p.Nanos = int32(d % time.Second)
}
