package server

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/grpcserver"
	"github.com/sluice-sched/sluice/internal/auth"
	"github.com/sluice-sched/sluice/internal/controlplane"
)

// creditFreezer is where the Operator's credit freezes go: with --etcd, the
// fleet's freeze key (etcdFreezer); without, the engine alone (Register's
// default).
func (s *Server) creditFreezer() []grpcserver.RegisterOption {
	if s.opts.Etcd.Endpoints == "" {
		return nil
	}
	return []grpcserver.RegisterOption{grpcserver.WithCreditFreezer(etcdFreezer{s})}
}

// etcdFreezer writes a freeze to etcd, with its end as an absolute time, so
// that every replica's watch applies the same one; this replica applies it
// at once too, so that the answer it gives is already true here. A write
// etcd does not take is UNAVAILABLE and changes nothing.
type etcdFreezer struct{ s *Server }

// FreezeCredit implements grpcserver.CreditFreezer.
func (f etcdFreezer) FreezeCredit(ctx context.Context, d time.Duration, reason string) (admission.CreditFreeze, error) {
	cp := &f.s.cp
	if cp.cli == nil {
		return admission.CreditFreeze{}, status.Error(codes.Unavailable, "the control plane is not started")
	}
	now := f.s.opts.Clock.Now()
	m := controlplane.CreditFreezeMark{Until: now.Add(d), Reason: reason, At: now}
	if p, ok := auth.FromContext(ctx); ok {
		m.By = p.Name
	}
	if _, err := controlplane.PutCreditFreeze(ctx, cp.cli, cp.ctl.Prefix(), m); err != nil {
		return admission.CreditFreeze{}, status.Errorf(codes.Unavailable, "%v", err)
	}
	f.s.eng.FreezeCredit(m.Until, m.Describe())
	return admission.CreditFreeze{Until: m.Until, Reason: m.Describe()}, nil
}

// ThawCredit implements grpcserver.CreditFreezer.
func (f etcdFreezer) ThawCredit(ctx context.Context) (bool, error) {
	cp := &f.s.cp
	if cp.cli == nil {
		return false, status.Error(codes.Unavailable, "the control plane is not started")
	}
	deleted, err := controlplane.DeleteCreditFreeze(ctx, cp.cli, cp.ctl.Prefix())
	if err != nil {
		return false, status.Errorf(codes.Unavailable, "%v", err)
	}
	local := f.s.eng.ThawCredit()
	return deleted || local, nil
}
