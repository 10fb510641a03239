package server

import (
	"fmt"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/rlsserver"
	"github.com/sluice-sched/sluice/internal/auth"
)

// registerRLS serves Envoy's rate-limit protocol on the gRPC server beside
// Sluice's own API, over the same engine (so its decisions are observed and
// counted as Admits), with the same tenant binding as Release: the tenants
// are inside the descriptors, where the auth interceptor cannot see them.
func (s *Server) registerRLS(cfg admission.Config) error {
	o := s.opts.RLS
	o.Clock = s.opts.Clock
	o.Logger = s.log
	o.OutputTokenWeight = cfg.OutputTokenWeight
	if !s.sec.auth.Open() {
		o.Guard = auth.CheckTenant
	}
	if _, err := rlsserver.Register(s.grpc, s.eng, o); err != nil {
		return fmt.Errorf("envoy rate-limit service: %w", err)
	}
	s.health.SetServingStatus(rlsserver.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return nil
}
