package grpcserver

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// operatorServer implements admissionv1.OperatorServer over an Engine.
type operatorServer struct {
	admissionv1.UnimplementedOperatorServer
	eng          Engine
	configStatus ConfigStatusSource // nil: GetConfigStatus is UNIMPLEMENTED
	credit       CreditEngine       // nil: eng freezes no credit
	freezer      CreditFreezer      // where a credit freeze goes: the fleet's control plane, or credit; nil: none
	backlog      Backlog            // nil: ListBacklog is UNIMPLEMENTED
}

func newOperatorServer(eng Engine, o *registerOptions) *operatorServer {
	s := &operatorServer{eng: eng, configStatus: o.configStatus, freezer: o.freezer, backlog: o.backlog}
	s.credit, _ = eng.(CreditEngine)
	if s.freezer == nil && s.credit != nil {
		s.freezer = localFreezer{s.credit}
	}
	return s
}

// Bounds on what the Operator API accepts and echoes.
const (
	// maxReasonLen bounds a drain reason: it is stored with the drain and
	// served on every ListDomains and /v1/domains read.
	maxReasonLen = 1024
	// maxNameLen bounds the names the Operator API is sent (a domain, a
	// tenant), as the engine bounds Admit's, so that no error echoes more.
	maxNameLen = 128
)

// checkName refuses an empty or overlong name in field, so that neither the
// engine's errors nor ours echo more than maxNameLen bytes of it.
func checkName(field, name string) error {
	switch {
	case name == "":
		return invalidArgument(field, "required")
	case len(name) > maxNameLen:
		return invalidArgument(field, "must be at most "+strconv.Itoa(maxNameLen)+" bytes")
	}
	return nil
}

// ListDomains implements admissionv1.OperatorServer.
func (s *operatorServer) ListDomains(context.Context, *admissionv1.ListDomainsRequest) (*admissionv1.ListDomainsResponse, error) {
	ds := s.eng.Domains()
	out := &admissionv1.ListDomainsResponse{Domains: make([]*admissionv1.DomainInfo, len(ds))}
	for i := range ds {
		out.Domains[i] = domainToProto(&ds[i])
	}
	out.CreditFreeze = s.creditFreeze()
	return out, nil
}

// DrainDomain implements admissionv1.OperatorServer.
func (s *operatorServer) DrainDomain(_ context.Context, in *admissionv1.DrainDomainRequest) (*admissionv1.DrainDomainResponse, error) {
	if err := checkName("domain", in.GetDomain()); err != nil {
		return nil, err
	}
	if len(in.GetReason()) > maxReasonLen {
		return nil, invalidArgument("reason", "must be at most "+strconv.Itoa(maxReasonLen)+" bytes")
	}
	if err := s.eng.Drain(in.GetDomain(), in.GetReason()); err != nil {
		return nil, statusFromError(err)
	}
	return &admissionv1.DrainDomainResponse{Domain: s.findDomain(in.GetDomain())}, nil
}

// UndrainDomain implements admissionv1.OperatorServer.
func (s *operatorServer) UndrainDomain(_ context.Context, in *admissionv1.UndrainDomainRequest) (*admissionv1.UndrainDomainResponse, error) {
	if err := checkName("domain", in.GetDomain()); err != nil {
		return nil, err
	}
	if err := s.eng.Undrain(in.GetDomain()); err != nil {
		return nil, statusFromError(err)
	}
	return &admissionv1.UndrainDomainResponse{Domain: s.findDomain(in.GetDomain())}, nil
}

// GetTenant implements admissionv1.OperatorServer.
func (s *operatorServer) GetTenant(_ context.Context, in *admissionv1.GetTenantRequest) (*admissionv1.GetTenantResponse, error) {
	if err := checkName("name", in.GetName()); err != nil {
		return nil, err
	}
	t, ok := s.eng.Tenant(in.GetName())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "unknown tenant %q", in.GetName())
	}
	return &admissionv1.GetTenantResponse{Tenant: tenantToProto(&t)}, nil
}

// ExplainAdmit implements admissionv1.OperatorServer.
func (s *operatorServer) ExplainAdmit(ctx context.Context, in *admissionv1.AdmitRequest) (*admissionv1.ExplainAdmitResponse, error) {
	req, err := requestFromProto(ctx, in)
	if err != nil {
		return nil, err
	}
	x, err := s.eng.Explain(ctx, req)
	if err != nil {
		return nil, statusFromError(err)
	}
	out := &admissionv1.ExplainAdmitResponse{
		Outcome: x.Outcome, Reason: admissionv1.Reason(x.Reason),
		Domain: x.Domain, Model: x.Model, Floor: x.Floor,
	}
	if x.RetryAfter > 0 {
		out.RetryAfter = durationpb.New(x.RetryAfter)
	}
	if x.EstimatedWait > 0 {
		out.EstimatedWait = durationpb.New(x.EstimatedWait)
	}
	for _, g := range x.Gates {
		out.Gates = append(out.Gates, &admissionv1.GateCheck{Gate: g.Gate, Passed: g.Passed, Reached: g.Reached, Before: g.Before, After: g.After, Detail: g.Detail})
	}
	for _, p := range x.Placement {
		out.Placement = append(out.Placement, &admissionv1.PlacementCheck{Model: p.Model, Domain: p.Domain, Floor: p.Floor, Fits: p.Fits, Detail: p.Detail})
	}
	return out, nil
}

// findDomain returns the domain with the given id, or nil.
func (s *operatorServer) findDomain(id string) *admissionv1.DomainInfo {
	ds := s.eng.Domains()
	for i := range ds {
		if ds[i].ID == id {
			return domainToProto(&ds[i])
		}
	}
	return nil
}

// domainToProto renders d.
func domainToProto(d *admission.DomainInfo) *admissionv1.DomainInfo {
	return &admissionv1.DomainInfo{
		Id:           d.ID,
		Kind:         d.Kind,
		Gpus:         int64(d.GPUs),
		Draining:     d.Draining,
		DrainReason:  d.DrainReason,
		HealthWeight: d.HealthWeight,
		InFlight:     int64(d.InFlight),
		PrefillRate:  d.PrefillRate,
		PrefillLevel: d.PrefillLevel,
		PrefillBurst: d.PrefillBurst,
		DecodeRate:   d.DecodeRate,
		DecodeLevel:  d.DecodeLevel,
		DecodeBurst:  d.DecodeBurst,
		KvInUse:      d.KVInUse,
		KvLimit:      d.KVLimit,
		ReservedFrac: d.ReservedFrac,

		WarmupFraction: d.WarmupFraction,
		WarmupLeft:     durationOrNil(d.WarmupLeft),

		EffectivePrefillRate: d.EffectivePrefillRate,
		EffectiveDecodeRate:  d.EffectiveDecodeRate,
		PriorPrefillRate:     d.PriorPrefillRate,
		PriorDecodeRate:      d.PriorDecodeRate,
		CapacityFactor:       d.CapacityFactor,
		EngineQueue:          d.EngineQueue,
		EngineKvUsage:        d.EngineKVUsage,
		EngineMetricsAge:     durationOrNil(d.EngineMetricsAge),
		EngineMetricsStale:   d.EngineMetricsStale,
		EngineSaturated:      d.EngineSaturated,
		FloorsShort:          d.FloorsShort,
		PrefillUse:           d.PrefillUse,
		DecodeUse:            d.DecodeUse,
		Load:                 d.Load,
	}
}

// durationOrNil renders d, or nil (absent) when it is not positive.
func durationOrNil(d time.Duration) *durationpb.Duration {
	if d <= 0 {
		return nil
	}
	return durationpb.New(d)
}

// tenantToProto renders t; a zero BreakerUntil is left absent.
func tenantToProto(t *admission.TenantInfo) *admissionv1.TenantInfo {
	out := &admissionv1.TenantInfo{
		Name:             t.Name,
		Tier:             t.Tier,
		Weight:           t.Weight,
		FloorTokens:      t.FloorTokens,
		TokenRate:        t.TokenRate,
		TokenBurst:       t.TokenBurst,
		TokenLevel:       t.TokenLevel,
		Credit:           t.Credit,
		RpsLevel:         t.RPSLevel,
		InFlight:         int64(t.InFlight),
		Queued:           int64(t.Queued),
		BreakerOpen:      t.BreakerOpen,
		SpentTodayMicros: t.SpentTodayMicros,
		SpentMonthMicros: t.SpentMonthMicros,
	}
	if !t.BreakerUntil.IsZero() {
		out.BreakerUntil = timestamppb.New(t.BreakerUntil)
	}
	return out
}
