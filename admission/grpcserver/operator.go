package grpcserver

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// operatorServer implements admissionv1.OperatorServer over an Engine.
type operatorServer struct {
	admissionv1.UnimplementedOperatorServer
	eng          Engine
	configStatus ConfigStatusSource // nil: GetConfigStatus is UNIMPLEMENTED
}

// ListDomains implements admissionv1.OperatorServer.
func (s *operatorServer) ListDomains(context.Context, *admissionv1.ListDomainsRequest) (*admissionv1.ListDomainsResponse, error) {
	ds := s.eng.Domains()
	out := &admissionv1.ListDomainsResponse{Domains: make([]*admissionv1.DomainInfo, len(ds))}
	for i := range ds {
		out.Domains[i] = domainToProto(&ds[i])
	}
	return out, nil
}

// DrainDomain implements admissionv1.OperatorServer.
func (s *operatorServer) DrainDomain(_ context.Context, in *admissionv1.DrainDomainRequest) (*admissionv1.DrainDomainResponse, error) {
	if in.GetDomain() == "" {
		return nil, invalidArgument("domain", "required")
	}
	if err := s.eng.Drain(in.GetDomain(), in.GetReason()); err != nil {
		return nil, statusFromError(err)
	}
	return &admissionv1.DrainDomainResponse{Domain: s.findDomain(in.GetDomain())}, nil
}

// UndrainDomain implements admissionv1.OperatorServer.
func (s *operatorServer) UndrainDomain(_ context.Context, in *admissionv1.UndrainDomainRequest) (*admissionv1.UndrainDomainResponse, error) {
	if in.GetDomain() == "" {
		return nil, invalidArgument("domain", "required")
	}
	if err := s.eng.Undrain(in.GetDomain()); err != nil {
		return nil, statusFromError(err)
	}
	return &admissionv1.UndrainDomainResponse{Domain: s.findDomain(in.GetDomain())}, nil
}

// ListTenants implements admissionv1.OperatorServer.
func (s *operatorServer) ListTenants(context.Context, *admissionv1.ListTenantsRequest) (*admissionv1.ListTenantsResponse, error) {
	ts := s.eng.Tenants()
	out := &admissionv1.ListTenantsResponse{Tenants: make([]*admissionv1.TenantInfo, len(ts))}
	for i := range ts {
		out.Tenants[i] = tenantToProto(&ts[i])
	}
	return out, nil
}

// GetTenant implements admissionv1.OperatorServer.
func (s *operatorServer) GetTenant(_ context.Context, in *admissionv1.GetTenantRequest) (*admissionv1.GetTenantResponse, error) {
	if in.GetName() == "" {
		return nil, invalidArgument("name", "required")
	}
	t, ok := s.eng.Tenant(in.GetName())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "unknown tenant %q", in.GetName())
	}
	return &admissionv1.GetTenantResponse{Tenant: tenantToProto(&t)}, nil
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
	}
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
