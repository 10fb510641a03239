package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-sched/sluice/admission/client"
	"github.com/sluice-sched/sluice/admission/grpcserver"
	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/controlplane"
)

// EtcdOptions configure the etcd control plane (package controlplane); the
// zero value runs without one.
type EtcdOptions struct {
	Endpoints string // --etcd: comma-separated URLs; "" runs without etcd
	CAFile    string // --etcd-ca
	CertFile  string // --etcd-cert
	KeyFile   string // --etcd-key
	Prefix    string // --etcd-prefix; default controlplane.DefaultPrefix
	// AdvertiseAddr is the gRPC address routers dial (--advertise-addr);
	// default: the bound gRPC address, with this host's name when it is
	// bound to every interface.
	AdvertiseAddr string
	// ReplicaID names this replica among the members (--replica-id);
	// default: AdvertiseAddr.
	ReplicaID string
	// MemberTTL is the membership lease's TTL (--member-ttl); default 10 s.
	MemberTTL time.Duration
	// SyncTimeout bounds the first read of etcd in New; when it passes,
	// sluiced serves its local config and topology and keeps trying in the
	// background. Default 5 s.
	SyncTimeout time.Duration
	// ProbeEvery and RetryEvery tune the controller (tests shorten them).
	ProbeEvery, RetryEvery time.Duration
}

// controlPlaneHealthService is the gRPC health service name that reports
// etcd's reachability: SERVING while connected (or not used), NOT_SERVING
// during an outage. The server itself ("") stays SERVING: admission goes on.
const controlPlaneHealthService = "sluice.controlplane.Etcd"

// controlPlane is the server's part of the control plane: the config
// status (fed by file reloads and etcd) and, with --etcd, the controller.
type controlPlane struct {
	status  *controlplane.Status
	cli     *clientv3.Client         // nil without etcd
	ctl     *controlplane.Controller // nil without etcd
	metrics *controlplane.Metrics
	stop    context.CancelFunc
	done    chan struct{}
	once    sync.Once
}

// statusSource adapts controlplane.Status to the Operator's port.
type statusSource struct {
	st     *controlplane.Status
	etcd   bool // the server uses etcd (--etcd)
	shared func() (sharing.Status, bool)
}

// ConfigStatus implements grpcserver.ConfigStatusSource. Without etcd there
// is no control plane to be connected to: it says so (none, not connected)
// rather than passing on the Status's "not disconnected".
func (s statusSource) ConfigStatus() grpcserver.ConfigStatus {
	v := s.st.View()
	out := grpcserver.ConfigStatus{Source: v.Source, Revision: v.Revision, AppliedAt: v.AppliedAt,
		ControlPlane: grpcserver.ControlPlaneNone}
	if s.etcd {
		out.ControlPlane, out.ControlPlaneConnected = grpcserver.ControlPlaneEtcd, v.Connected
	}
	if r := v.LastRefusal; r != nil {
		out.LastRefusal = r
	}
	if s.shared != nil {
		if st, ok := s.shared(); ok {
			out.SharedShards = st.Shards
		}
	}
	return out
}

// newConfigStatus creates the config status for the config loaded from
// cfgName, registers the control plane's metrics, and returns the Operator's
// view of it.
func (s *Server) newConfigStatus(cfgName string) grpcserver.RegisterOption {
	m, err := controlplane.NewMetrics(s.metrics.Registry)
	if err != nil { // the names are fixed and registered once per registry
		s.log.Error("control-plane metrics not registered", "err", err)
		m = nil
	}
	source := cfgName
	if cfgName == config.DefaultName {
		source = controlplane.SourceEmbedded
	}
	etcd := s.opts.Etcd.Endpoints != ""
	if !etcd {
		// Nothing to be connected to: a sluice_control_plane_connected of 1
		// would read as a reachable etcd.
		m.DropConnected(s.metrics.Registry)
	}
	s.cp.status = controlplane.NewStatus(source, s.opts.Clock.Now(), m)
	s.cp.metrics = m
	return grpcserver.WithConfigStatus(statusSource{st: s.cp.status, etcd: etcd, shared: s.sharedStatus})
}

// startControlPlane connects to etcd when --etcd is set, registers the
// controller and reads etcd once (bounded by SyncTimeout) so that the first
// request is decided on etcd's config, topology and drains. etcd being
// unreachable is not an error: the local config serves and Serve keeps
// trying.
func (s *Server) startControlPlane() error {
	eo := s.opts.Etcd
	if eo.Endpoints == "" {
		return nil
	}
	if eo.SyncTimeout <= 0 {
		eo.SyncTimeout = 5 * time.Second
	}
	cli, err := controlplane.NewClient(controlplane.ClientOptions{
		Endpoints: eo.Endpoints, CAFile: eo.CAFile, CertFile: eo.CertFile, KeyFile: eo.KeyFile,
	})
	if err != nil {
		return err
	}
	self := client.Member{Addr: eo.AdvertiseAddr, ID: eo.ReplicaID}
	if self.Addr == "" {
		self.Addr = advertiseAddr(s.grpcLis.Addr())
	}
	if self.ID == "" {
		self.ID = self.Addr
	}
	s.replica = self.ID
	ctl, err := controlplane.New(controlplane.Options{
		Client:     cli,
		Prefix:     eo.Prefix,
		Engine:     &trackedEngine{Engine: s.eng, st: s.state},
		Status:     s.cp.status,
		Self:       self,
		LeaseTTL:   eo.MemberTTL,
		OnReplicas: s.setReplicaCount,
		OnMembers: func(ids []string) {
			if s.relaysEngines {
				s.state.feed.membersChanged(self.ID, ids)
			}
		},
		OnConnected: func(ok bool) {
			st := healthpb.HealthCheckResponse_SERVING
			if !ok {
				st = healthpb.HealthCheckResponse_NOT_SERVING
			}
			s.health.SetServingStatus(controlPlaneHealthService, st)
		},
		ProbeEvery: eo.ProbeEvery,
		RetryEvery: eo.RetryEvery,
		Logger:     s.log.With("component", "controlplane"),
		Metrics:    s.cp.metrics,
		Now:        s.opts.Clock.Now,
	})
	if err != nil {
		_ = cli.Close()
		return err
	}
	s.cp.cli, s.cp.ctl = cli, ctl
	ctx, cancel := context.WithTimeout(context.Background(), eo.SyncTimeout)
	defer cancel()
	if err := ctl.Sync(ctx); err != nil {
		s.cp.status.SetConnected(false, s.opts.Clock.Now())
		s.health.SetServingStatus(controlPlaneHealthService, healthpb.HealthCheckResponse_NOT_SERVING)
		s.log.Error("etcd unreachable at start; serving the local config and topology until it answers",
			"etcd", eo.Endpoints, "err", err)
	} else {
		s.health.SetServingStatus(controlPlaneHealthService, healthpb.HealthCheckResponse_SERVING)
	}
	s.log.Info("control plane", "etcd", eo.Endpoints, "prefix", ctl.Prefix(), "member", self.ID, "advertise", self.Addr)
	return nil
}

// advertiseAddr is the address routers should dial for a listener bound to
// addr: this host's name in place of an unspecified IP.
func advertiseAddr(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return addr.String()
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return net.JoinHostPort(host, fmt.Sprint(tcp.Port))
}

// runControlPlane follows etcd until stopControlPlane.
func (s *Server) runControlPlane() {
	if s.cp.ctl == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cp.stop, s.cp.done = cancel, make(chan struct{})
	go func() { defer close(s.cp.done); s.cp.ctl.Run(ctx) }()
}

// stopControlPlane leaves the membership (revoking the lease, so routers
// stop choosing this replica at once), stops following etcd and closes the
// client. Safe to call more than once.
func (s *Server) stopControlPlane() {
	s.cp.once.Do(func() {
		if s.cp.stop != nil {
			s.cp.stop()
			<-s.cp.done
		}
		if s.cp.cli != nil {
			_ = s.cp.cli.Close()
		}
	})
}

// errConfigFromEtcd refuses a file reload while etcd serves the config.
var errConfigFromEtcd = errors.New("reload: the config comes from etcd; write it with 'sluicectl config apply'")

// checkReloadSource refuses a file reload while the config in force came
// from etcd: the file would silently undo the fleet's config on one replica.
func (s *Server) checkReloadSource() error {
	if s.cp.status != nil && s.cp.status.View().Source == controlplane.SourceEtcd {
		return errConfigFromEtcd
	}
	return nil
}

// configReloaded records a file reload's outcome in the config status.
func (s *Server) configReloaded(err error) {
	now := s.opts.Clock.Now()
	if err != nil {
		s.cp.status.Refused(controlplane.RefusalOf(s.opts.ConfigPath, 0, now, err))
		return
	}
	s.cp.status.Applied(s.opts.ConfigPath, 0, now)
}

// controlPlaneHealth is the detail /healthz adds during an etcd outage.
func (s *Server) controlPlaneHealth() string {
	if s.cp.status == nil {
		return ""
	}
	v := s.cp.status.View()
	if v.Connected {
		return ""
	}
	return fmt.Sprintf(" (control plane: etcd unreachable since %s; serving the last good config, topology and drains)",
		v.DisconnectedSince.UTC().Format(time.RFC3339))
}

// ControlPlane returns the etcd controller, nil without --etcd.
func (s *Server) ControlPlane() *controlplane.Controller { return s.cp.ctl }
