package client_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/client"
	"github.com/sluice-sched/sluice/admission/client/etcdmembers"
	"github.com/sluice-sched/sluice/admission/grpcserver"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/controlplane"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/internal/testwait"
	"github.com/sluice-sched/sluice/topology"
)

// eventually polls cond until it holds, for up to 30 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, 30*time.Second, what, cond)
}

// replica is a sluiced in miniature: an engine served over gRPC on
// loopback, following etcd and registered as a member.
type replica struct {
	id       string
	eng      *admission.Engine
	srv      *grpc.Server
	stopCtl  context.CancelFunc
	ctlDone  chan struct{}
	stopped  bool
	stopGRPC func()
}

func startReplica(t *testing.T, etcd *etcdtest.Server, id string) *replica {
	t.Helper()
	cfg, err := config.Default()
	if err != nil {
		t.Fatal(err)
	}
	eng, err := admission.New(cfg, topology.Simulated())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{id: id, eng: eng, srv: grpc.NewServer(), ctlDone: make(chan struct{})}
	grpcserver.Register(r.srv, eng)
	served := make(chan struct{})
	go func() { _ = r.srv.Serve(lis); close(served) }()
	r.stopGRPC = func() { r.srv.Stop(); <-served }
	ctl, err := controlplane.New(controlplane.Options{
		Client: etcd.Client(t), Engine: eng, Self: client.Member{ID: id, Addr: lis.Addr().String()},
		LeaseTTL: time.Second, ProbeEvery: 50 * time.Millisecond, RetryEvery: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.stopCtl = cancel
	go func() { ctl.Run(ctx); close(r.ctlDone) }()
	runCtx, stopRun := context.WithCancel(context.Background())
	go eng.Run(runCtx)
	t.Cleanup(func() { r.leave(); r.stopGRPC(); stopRun() })
	return r
}

// leave stops the replica's controller, which revokes its membership lease.
func (r *replica) leave() {
	if !r.stopped {
		r.stopped = true
		r.stopCtl()
		<-r.ctlDone
	}
}

func dialer(addr string) (client.Conn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// The Router follows the members in etcd, sends each tenant to one replica
// by rendezvous hashing, and when a replica leaves moves exactly that
// replica's tenants; leases stay with the replica that granted them.
func TestRouterFollowsMembership(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := controlplane.ApplyConfig(ctx, cli, controlplane.DefaultPrefix, "sluice.yaml", config.DefaultYAML()); err != nil {
		t.Fatal(err)
	}
	var tenants []string
	for i := range 30 {
		name := fmt.Sprintf("t%02d", i)
		tenants = append(tenants, name)
		if _, err := cli.Put(ctx, controlplane.TenantKey(controlplane.DefaultPrefix, name), "tier: free\n"); err != nil {
			t.Fatal(err)
		}
	}
	reps := map[string]*replica{}
	for _, id := range []string{"r1", "r2", "r3"} {
		reps[id] = startReplica(t, etcd, id)
	}
	router := client.NewRouter(etcdmembers.NewSource(cli, controlplane.DefaultPrefix, nil), dialer, client.WithMaxAttempts(1))
	defer router.Close()
	eventually(t, "three members", func() bool { return len(router.Members()) == 3 })
	for _, r := range reps {
		eventually(t, "every replica has the tenants", func() bool { _, ok := r.eng.Tenant("t29"); return ok })
	}

	// admitAll admits every tenant once through the router and returns the
	// replica that granted each.
	admitAll := func() map[string]string {
		owner := map[string]string{}
		for _, tn := range tenants {
			resp, err := router.Admit(ctx, &admissionv1.AdmitRequest{Tenant: tn, Model: "small", PromptTokens: 10, MaxOutputTokens: 10})
			if err != nil || resp.GetDecision() != admissionv1.Decision_ADMITTED {
				t.Fatalf("%s: %v, %v", tn, resp, err)
			}
			_, id, ok := strings.Cut(resp.GetLeaseId(), "@")
			if !ok {
				t.Fatalf("lease id %q names no replica", resp.GetLeaseId())
			}
			if info, _ := reps[id].eng.Tenant(tn); info.InFlight == 0 {
				t.Fatalf("%s: lease says %s, but %s holds nothing for it", tn, id, id)
			}
			if m, _ := router.Route(tn); m.ID != id {
				t.Fatalf("%s: granted by %s, routed to %s", tn, id, m.ID)
			}
			owner[tn] = resp.GetLeaseId()
		}
		return owner
	}
	before := admitAll()
	spread := map[string]int{}
	for _, l := range before {
		_, id, _ := strings.Cut(l, "@")
		spread[id]++
	}
	if len(spread) != 3 {
		t.Fatalf("30 tenants over 3 replicas went to %v", spread)
	}

	reps["r3"].leave()
	eventually(t, "r3 gone from the router", func() bool { return len(router.Members()) == 2 })
	after := admitAll()
	for _, tn := range tenants {
		_, was, _ := strings.Cut(before[tn], "@")
		_, now, _ := strings.Cut(after[tn], "@")
		switch {
		case now == "r3":
			t.Fatalf("%s still routed to r3", tn)
		case was != "r3" && now != was:
			t.Fatalf("%s moved from %s to %s though %s stayed", tn, was, now, was)
		}
	}
	// Leases go back to the replica that granted them, r3 included: it left
	// the membership but still serves, within the Router's grace period.
	for _, tn := range tenants {
		_, id, _ := strings.Cut(before[tn], "@")
		held, _ := reps[id].eng.Tenant(tn)
		if _, err := router.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: before[tn], OutputTokens: 5}); err != nil {
			t.Fatalf("release %s: %v", before[tn], err)
		}
		if now, _ := reps[id].eng.Tenant(tn); now.InFlight != held.InFlight-1 {
			t.Fatalf("release %s: %s holds %d leases for %s, was %d", before[tn], id, now.InFlight, tn, held.InFlight)
		}
	}
	if _, err := router.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: "l-4294967297"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a lease id without a replica: %v", err)
	}
}

// A registered replica that does not answer is passed over: Admit tries the
// tenant's next replica with the same request id.
func TestRouterMovesOnWhenAReplicaIsUnavailable(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	a := startReplica(t, etcd, "a")
	b := startReplica(t, etcd, "b")
	router := client.NewRouter(etcdmembers.NewSource(cli, controlplane.DefaultPrefix, nil), dialer, client.WithMaxAttempts(1))
	defer router.Close()
	eventually(t, "two members", func() bool { return len(router.Members()) == 2 })
	// Find a tenant routed to b, then make b unreachable while registered.
	var tenant string
	for _, tn := range []string{"acme", "globex", "initech", "hooli"} {
		if m, _ := router.Route(tn); m.ID == "b" {
			tenant = tn
		}
	}
	if tenant == "" {
		t.Fatal("no default tenant routes to b")
	}
	b.stopGRPC()
	b.stopGRPC = func() {}
	resp, err := router.Admit(context.Background(), &admissionv1.AdmitRequest{Tenant: tenant, Model: "small", PromptTokens: 10, MaxOutputTokens: 10})
	if err != nil || !strings.HasSuffix(resp.GetLeaseId(), "@a") {
		t.Fatalf("Admit with b down: %v, %v", resp, err)
	}
	if info, _ := a.eng.Tenant(tenant); info.InFlight != 1 {
		t.Fatalf("a holds %d leases for %s", info.InFlight, tenant)
	}
}

// staticMembers is a MemberSource with a fixed list.
type staticMembers []client.Member

func (s staticMembers) Watch(ctx context.Context) <-chan []client.Member {
	ch := make(chan []client.Member, 1)
	ch <- s
	go func() { <-ctx.Done(); close(ch) }()
	return ch
}

// With no member the Router answers UNAVAILABLE; before the first list it
// waits for it, up to the caller's deadline.
func TestRouterWithoutMembers(t *testing.T) {
	r := client.NewRouter(staticMembers{}, dialer)
	defer r.Close()
	<-r.Ready()
	_, err := r.Admit(context.Background(), &admissionv1.AdmitRequest{Tenant: "acme", Model: "small", PromptTokens: 1, MaxOutputTokens: 1})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("no members: %v", err)
	}
	if _, ok := r.Route("acme"); ok {
		t.Fatal("a route without members")
	}

	never := client.NewRouter(neverMembers{}, dialer)
	defer never.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := never.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "acme"}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("before the first list: %v", err)
	}
}

// neverMembers never sends a list.
type neverMembers struct{}

func (neverMembers) Watch(ctx context.Context) <-chan []client.Member {
	ch := make(chan []client.Member)
	go func() { <-ctx.Done(); close(ch) }()
	return ch
}

// fakeConn is a connection whose Release calls succeed and are counted.
type fakeConn struct {
	mu       sync.Mutex
	releases int
	closed   bool
}

func (c *fakeConn) Invoke(_ context.Context, method string, _, reply any, _ ...grpc.CallOption) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return status.Error(codes.Unavailable, "closed")
	}
	if !strings.HasSuffix(method, "/Release") {
		return status.Errorf(codes.Unimplemented, "%s", method)
	}
	c.releases++
	proto.Merge(reply.(proto.Message), &admissionv1.ReleaseResponse{})
	return nil
}

func (c *fakeConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unimplemented, "no streams")
}

func (c *fakeConn) Close() error { c.mu.Lock(); c.closed = true; c.mu.Unlock(); return nil }

func (c *fakeConn) state() (int, bool) { c.mu.Lock(); defer c.mu.Unlock(); return c.releases, c.closed }

// chanMembers is a MemberSource fed by the test.
type chanMembers chan []client.Member

func (s chanMembers) Watch(ctx context.Context) <-chan []client.Member {
	out := make(chan []client.Member)
	go func() {
		defer close(out)
		for {
			select {
			case l := <-s:
				select {
				case out <- l:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// A member that leaves gets no new Admit at once, but its leases' Releases
// still reach it for the grace period; then its connection closes and
// Release is NOT_FOUND. One that returns within the grace period gets its
// connection back.
func TestRouterReleaseGrace(t *testing.T) {
	conns := map[string]*fakeConn{}
	var mu sync.Mutex
	dial := func(addr string) (client.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		c := &fakeConn{}
		conns[addr] = c
		return c, nil
	}
	conn := func(addr string) *fakeConn { mu.Lock(); defer mu.Unlock(); return conns[addr] }
	src := make(chanMembers)
	a, b := client.Member{ID: "a", Addr: "a:1"}, client.Member{ID: "b", Addr: "b:1"}
	r := client.NewRouter(src, dial, client.WithReleaseGrace(200*time.Millisecond))
	defer r.Close()
	src <- []client.Member{a, b}
	<-r.Ready()
	eventually(t, "two members", func() bool { return len(r.Members()) == 2 })

	src <- []client.Member{a}
	eventually(t, "b gone from the members", func() bool { return len(r.Members()) == 1 })
	for i := range 50 {
		if m, _ := r.Route(fmt.Sprintf("t%d", i)); m.ID != "a" {
			t.Fatalf("t%d routed to %s after b left", i, m.ID)
		}
	}
	if _, err := r.Release(context.Background(), &admissionv1.ReleaseRequest{LeaseId: "l-1@b"}); err != nil {
		t.Fatalf("release on b within the grace period: %v", err)
	}
	if n, closed := conn("b:1").state(); n != 1 || closed {
		t.Fatalf("b's connection: %d releases, closed %v; want 1, open", n, closed)
	}
	eventually(t, "b's connection closed after the grace period", func() bool { _, closed := conn("b:1").state(); return closed })
	if _, err := r.Release(context.Background(), &admissionv1.ReleaseRequest{LeaseId: "l-2@b"}); status.Code(err) != codes.NotFound {
		t.Fatalf("release on b after the grace period: %v", err)
	}

	// a leaves and returns within the grace period: same connection.
	src2 := make(chanMembers)
	long := client.NewRouter(src2, dial, client.WithReleaseGrace(time.Hour))
	defer long.Close()
	first := conn("a:1")
	src2 <- []client.Member{a}
	eventually(t, "a in the second router", func() bool { return len(long.Members()) == 1 && conn("a:1") != first })
	second := conn("a:1")
	src2 <- []client.Member{b}
	eventually(t, "a gone", func() bool { m := long.Members(); return len(m) == 1 && m[0].ID == "b" })
	src2 <- []client.Member{a, b}
	eventually(t, "a back", func() bool { return len(long.Members()) == 2 })
	if conn("a:1") != second {
		t.Fatal("a was dialed again though it came back within the grace period")
	}
	if _, closed := second.state(); closed {
		t.Fatal("a's connection closed though it came back")
	}
}
