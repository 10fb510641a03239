package drill

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/client"
	"github.com/sluice-sched/sluice/admission/client/etcdmembers"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/controlplane"
)

// Part names a piece of a fleet a drill stops and starts.
type Part struct {
	// Kind is "redis", "etcd", "agent" or "replica".
	Kind string `json:"kind"`
	// Name is the agent's node or the replica's id ("" for redis and etcd).
	Name string `json:"name,omitempty"`
}

// String is the part as the timeline names it: "redis", "agent hgx-1".
func (p Part) String() string {
	if p.Name == "" {
		return p.Kind
	}
	return p.Kind + " " + p.Name
}

// Faults stops and starts parts of a fleet: the self-contained fleet kills
// and restarts its own children; a fleet the drill did not start runs the
// operator's --stop and --start commands.
type Faults interface {
	Stop(ctx context.Context, p Part) error
	Start(ctx context.Context, p Part) error
}

// Fleet is what a drill loads, watches and breaks: a Router over its
// replicas (the load goes through it, as a router's would), the control
// plane when it has one, and its Faults.
type Fleet struct {
	// Router sends each tenant to its replica and fails over as the Go
	// client does.
	Router *client.Router
	// Etcd is the control plane; nil when the fleet has none (drains then go
	// through the Operator API of every replica).
	Etcd   *clientv3.Client
	Prefix string
	// Sec dials the replicas' Operator API.
	Sec client.Security
	// Replicas is N, for the quota bound (N−1)·R·W; Interval is W, the
	// batched reconcile interval.
	Replicas int
	Interval time.Duration
	// Mode is the replicas' shared-state mode (ModeBatched, ModeStrict,
	// ModeEmbedded; "": batched), which sets the quota promise's bound.
	Mode string
	// MemberTTL is the replicas' member lease TTL (sluiced's --member-ttl),
	// with etcd: kill-replica's promise is that a dead replica's capacity
	// is back within it.
	MemberTTL time.Duration
	// Faults stops and starts parts; nil: only drills that need none run.
	Faults Faults
	// SelfContained says the drill started the fleet (Local is set).
	Local *Local

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	close []func()
}

// operator returns an Operator client of the replica at addr, dialled once.
func (f *Fleet) operator(addr string) (admissionv1.OperatorClient, error) {
	cc, err := f.conn(addr)
	if err != nil {
		return nil, err
	}
	return admissionv1.NewOperatorClient(cc), nil
}

// admission returns an Admission client of the replica at addr itself (not
// through the Router): deferred-burst's workers claim and release there.
func (f *Fleet) admission(addr string) (admissionv1.AdmissionClient, error) {
	cc, err := f.conn(addr)
	if err != nil {
		return nil, err
	}
	return admissionv1.NewAdmissionClient(cc), nil
}

// conn is the connection to the replica at addr, dialled once.
func (f *Fleet) conn(addr string) (*grpc.ClientConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		f.conns = map[string]*grpc.ClientConn{}
	}
	cc, ok := f.conns[addr]
	if !ok {
		var err error
		if cc, err = client.Dial(addr, f.Sec); err != nil {
			return nil, fmt.Errorf("replica %s: %w", addr, err)
		}
		f.conns[addr] = cc
	}
	return cc, nil
}

// members are the replicas the Router knows now.
func (f *Fleet) members() []client.Member { return f.Router.Members() }

// Close closes the connections and stops what the fleet started (the
// self-contained fleet's children).
func (f *Fleet) Close() {
	f.mu.Lock()
	for _, cc := range f.conns {
		_ = cc.Close()
	}
	f.conns = nil
	closers := f.close
	f.close = nil
	f.mu.Unlock()
	for i := len(closers) - 1; i >= 0; i-- {
		closers[i]()
	}
}

// onClose adds a step to Close (run in reverse order of adding).
func (f *Fleet) onClose(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.close = append(f.close, fn)
}

// staticSource is a MemberSource of a fixed list: the replicas given with
// --server when the fleet has no etcd.
type staticSource []client.Member

// Watch sends the list once and closes when ctx ends.
func (s staticSource) Watch(ctx context.Context) <-chan []client.Member {
	ch := make(chan []client.Member, 1)
	ch <- s
	go func() {
		<-ctx.Done()
		close(ch)
	}()
	return ch
}

// ShellFaults are the operator's hooks for a fleet the drill did not start:
// StopCmd and StartCmd are shell commands (sh -c), run with DRILL_PART (redis,
// etcd, agent, replica) and DRILL_NAME (the node or replica id) in their
// environment.
type ShellFaults struct {
	StopCmd, StartCmd string
	// Log receives the commands' output.
	Log io.Writer
}

// Stop runs the stop command for p.
func (s ShellFaults) Stop(ctx context.Context, p Part) error {
	return s.run(ctx, "--stop", s.StopCmd, p)
}

// Start runs the start command for p.
func (s ShellFaults) Start(ctx context.Context, p Part) error {
	return s.run(ctx, "--start", s.StartCmd, p)
}

func (s ShellFaults) run(ctx context.Context, flag, command string, p Part) error {
	if command == "" {
		return fmt.Errorf("%s: no command given for %s (a fleet the drill did not start needs --stop and --start)", flag, p)
	}
	cmd := exec.CommandContext(ctx, "sh", "-c", command)
	cmd.Env = append(os.Environ(), "DRILL_PART="+p.Kind, "DRILL_NAME="+p.Name)
	if s.Log != nil {
		cmd.Stdout, cmd.Stderr = s.Log, s.Log
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %q for %s: %w", flag, command, p, err)
	}
	return nil
}

// ConnectOptions describe a fleet the drill did not start.
type ConnectOptions struct {
	// Etcd is the fleet's control plane (members, drains, agents); nil:
	// Servers are the replicas, drained through the Operator API.
	Etcd    *clientv3.Client
	Prefix  string
	Servers []string
	Sec     client.Security
	// Replicas is N for the quota bound; 0: the replicas found.
	Replicas int
	// Interval is the batched reconcile interval (sluiced's --redis-interval).
	Interval time.Duration
	// Mode is the replicas' shared-state mode ("": batched).
	Mode string
	// MemberTTL is the replicas' --member-ttl (default 10 s).
	MemberTTL time.Duration
	Faults    Faults
	// Timeout bounds the wait for the first member list.
	Timeout time.Duration
}

// EtcdConfig reads the fleet's config from etcd: nil when etcd holds no
// policy document (the replicas then serve their local files).
func EtcdConfig(ctx context.Context, cli *clientv3.Client, prefix string) (*admission.Config, error) {
	base, tenants, _, err := controlplane.ReadDocuments(ctx, cli, prefix)
	if err != nil {
		return nil, err
	}
	if len(base) == 0 {
		return nil, nil
	}
	c, err := controlplane.ParseDocuments(prefix, base, tenants)
	if err != nil {
		return nil, fmt.Errorf("the config in etcd: %w", err)
	}
	return &c, nil
}

// Connect returns a Fleet over replicas the drill did not start: the members
// registered in etcd, or the --server addresses.
func Connect(ctx context.Context, o ConnectOptions) (*Fleet, error) {
	f := &Fleet{Etcd: o.Etcd, Prefix: o.Prefix, Sec: o.Sec, Replicas: o.Replicas, Interval: o.Interval, Mode: o.Mode, MemberTTL: o.MemberTTL, Faults: o.Faults}
	var src client.MemberSource
	if o.Etcd != nil {
		src = etcdmembers.NewSource(o.Etcd, o.Prefix, slog.New(slog.DiscardHandler))
	} else {
		if len(o.Servers) == 0 {
			return nil, fmt.Errorf("no fleet: give --etcd, --server or --self-contained")
		}
		var list staticSource
		for _, s := range o.Servers {
			list = append(list, client.Member{ID: s, Addr: s})
		}
		src = list
	}
	f.Router = client.NewRouter(src, o.Sec.Dialer())
	f.onClose(func() { _ = f.Router.Close() })
	wctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	select {
	case <-f.Router.Ready():
	case <-wctx.Done():
		f.Close()
		return nil, fmt.Errorf("no member list within %v", o.Timeout)
	}
	if len(f.Router.Members()) == 0 {
		f.Close()
		return nil, fmt.Errorf("no sluiced replica is registered under %s", o.Prefix)
	}
	if f.Replicas == 0 {
		f.Replicas = len(f.Router.Members())
	}
	if f.Interval == 0 {
		f.Interval = 100 * time.Millisecond
	}
	if f.MemberTTL == 0 {
		f.MemberTTL = 10 * time.Second
	}
	return f, nil
}
