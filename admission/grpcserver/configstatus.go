package grpcserver

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/sharing"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// ConfigStatus is what GetConfigStatus reports: where the serving config
// came from and the last one refused.
type ConfigStatus struct {
	Source      string // "embedded", a file path, or "etcd"
	Revision    int64  // etcd revision of the serving config; 0 when not from etcd
	AppliedAt   time.Time
	LastRefusal *admission.ConfigRefusal // the latest refusal since AppliedAt; nil when none
	// ControlPlane is ControlPlaneEtcd when the server uses etcd and
	// ControlPlaneNone when it runs on its local config alone.
	ControlPlane string
	// ControlPlaneConnected is whether etcd is reachable; false when there
	// is no control plane (nothing is connected).
	ControlPlaneConnected bool
	// SharedShards are the shared state's shards and which are down
	// (empty where the store is not sharded).
	SharedShards []sharing.ShardStatus
}

// The control planes GetConfigStatus names.
const (
	ControlPlaneNone = "none"
	ControlPlaneEtcd = "etcd"
)

// ConfigStatusSource is the port GetConfigStatus reads. It must be safe for
// concurrent use.
type ConfigStatusSource interface {
	ConfigStatus() ConfigStatus
}

// RegisterOption configures Register.
type RegisterOption func(*registerOptions)

type registerOptions struct {
	configStatus ConfigStatusSource
	tenantGuard  TenantGuard
	freezer      CreditFreezer
	backlog      Backlog
}

// WithConfigStatus makes the Operator's GetConfigStatus answer from src.
// Without it GetConfigStatus is UNIMPLEMENTED.
func WithConfigStatus(src ConfigStatusSource) RegisterOption {
	return func(o *registerOptions) { o.configStatus = src }
}

// TenantGuard decides whether the caller in ctx may act for tenant: nil to
// go on, or a status error (PERMISSION_DENIED) to refuse. The auth
// interceptors check Admit's tenant before the handler runs; a Release names
// only a lease, whose tenant the handler must learn first, so the handler
// asks the guard itself (see admissionServer.Release).
type TenantGuard func(ctx context.Context, tenant string) error

// WithTenantGuard makes Release check its lease's tenant with guard (in
// sluiced, auth.CheckTenant). Without it every caller may release any lease.
func WithTenantGuard(guard TenantGuard) RegisterOption {
	return func(o *registerOptions) { o.tenantGuard = guard }
}

// GetConfigStatus implements admissionv1.OperatorServer.
func (s *operatorServer) GetConfigStatus(context.Context, *admissionv1.GetConfigStatusRequest) (*admissionv1.GetConfigStatusResponse, error) {
	if s.configStatus == nil {
		return nil, status.Error(codes.Unimplemented, "this server does not report its config status")
	}
	st := s.configStatus.ConfigStatus()
	out := &admissionv1.GetConfigStatusResponse{
		Source:                st.Source,
		Revision:              st.Revision,
		ControlPlaneConnected: st.ControlPlaneConnected,
		ControlPlane:          st.ControlPlane,
		CreditFreeze:          s.creditFreeze(),
	}
	for _, sh := range st.SharedShards {
		out.SharedShards = append(out.SharedShards, &admissionv1.SharedShard{Name: sh.Name, Down: sh.Down})
	}
	if !st.AppliedAt.IsZero() {
		out.AppliedAt = timestamppb.New(st.AppliedAt)
	}
	if r := st.LastRefusal; r != nil {
		out.LastRefusal = &admissionv1.ConfigRefusal{Source: r.Source, Key: r.Key, Reason: r.Reason, Revision: r.Revision}
		if !r.At.IsZero() {
			out.LastRefusal.At = timestamppb.New(r.At)
		}
	}
	return out, nil
}
