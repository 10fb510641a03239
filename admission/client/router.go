package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/rendezvous"
)

// Member is one live sluiced replica as routers see it: the control plane
// registers one per replica (see package etcdmembers for the etcd layout).
type Member struct {
	// ID names the replica; unique among the live members.
	ID string `json:"id"`
	// Addr is the replica's gRPC address as routers dial it ("host:port").
	Addr string `json:"grpc_addr"`
}

// MemberSource tells a Router which replicas are live.
type MemberSource interface {
	// Watch sends the complete member list at once when it is known and again
	// after every change, until ctx ends; then it closes the channel. It
	// does not send an empty list because it lost sight of the members (a
	// control-plane outage): the last list it sent stays in force.
	Watch(ctx context.Context) <-chan []Member
}

// Conn is a connection to one replica; *grpc.ClientConn is one.
type Conn interface {
	grpc.ClientConnInterface
	Close() error
}

// Dialer opens a connection to a replica's address. grpc.NewClient does not
// connect at once, so a Dialer rarely fails.
type Dialer func(addr string) (Conn, error)

// leaseSep separates an engine lease id from the id of the replica that
// holds it in the lease ids a Router hands out: "l-4294967297@sluiced-2".
// Engine lease ids never contain it.
const leaseSep = "@"

// Router sends each tenant's requests to one replica, the first of the live
// members in rendezvous order for the tenant's name (package rendezvous), so
// that a tenant's flow lives in one replica's fair queue. When the members
// change, only the tenants whose replica came or went move.
//
// Admit tries the tenant's replica and, when it is unavailable (UNAVAILABLE
// after the Client's own retries) or shutting down, the next replicas in the
// tenant's order, with the same request id. Leases stay where they were
// granted: the lease ids a Router returns name their replica
// ("l-4294967297@sluiced-2"), and Release sends each to that replica, so a
// membership change never strands one: a replica that leaves the
// membership keeps its connection for Release for a grace period
// (WithReleaseGrace, DefaultReleaseGrace), while new Admits stop going
// there at once. Pass Router lease ids only to Router.Release.
//
// A Router is safe for concurrent use.
type Router struct {
	dial  Dialer
	opts  []Option
	grace time.Duration // how long a departed member serves Release
	stop  context.CancelFunc
	done  chan struct{}

	mu struct {
		sync.RWMutex
		members []*routedMember // sorted by ID
		nodes   []rendezvous.Node
		hashes  []uint64
		// departed are members that left within the grace period, by ID:
		// Release still reaches them, Admit does not.
		departed map[string]*departedMember
		known    bool          // a member list has arrived
		ready    chan struct{} // closed when known becomes true
		closed   bool
	}
}

// departedMember is a member that left, kept for Release until its timer
// closes its connection.
type departedMember struct {
	*routedMember
	timer *time.Timer
}

// routedMember is a member with its connection and Client.
type routedMember struct {
	Member
	conn   Conn
	client *Client
}

// NewRouter returns a Router that follows src until Close. Each replica is
// reached through a Client built with opts over the connection dial opens.
func NewRouter(src MemberSource, dial Dialer, opts ...Option) *Router {
	ctx, cancel := context.WithCancel(context.Background())
	settings := Client{releaseGrace: DefaultReleaseGrace}
	for _, o := range opts {
		o(&settings)
	}
	r := &Router{dial: dial, opts: opts, grace: settings.releaseGrace, stop: cancel, done: make(chan struct{})}
	r.mu.ready = make(chan struct{})
	r.mu.departed = make(map[string]*departedMember)
	ch := src.Watch(ctx)
	go func() {
		defer close(r.done)
		for list := range ch {
			r.setMembers(list)
		}
	}()
	return r
}

// setMembers replaces the member list, keeping the connections of replicas
// that stay (same ID and address). A replica that left keeps its connection
// for Release during the grace period; one that returns within it (same
// address) gets it back.
func (r *Router) setMembers(list []Member) {
	byID := make(map[string]Member, len(list))
	for _, m := range list {
		if m.ID == "" || m.Addr == "" {
			continue
		}
		byID[m.ID] = m
	}
	r.mu.Lock()
	if r.mu.closed {
		r.mu.Unlock()
		return
	}
	old := make(map[string]*routedMember, len(r.mu.members))
	for _, rm := range r.mu.members {
		old[rm.ID] = rm
	}
	next := make([]*routedMember, 0, len(byID))
	var gone []Conn
	for id, m := range byID {
		if rm, ok := old[id]; ok && rm.Addr == m.Addr {
			next = append(next, rm)
			delete(old, id)
			continue
		}
		if dm, ok := r.mu.departed[id]; ok {
			delete(r.mu.departed, id)
			dm.timer.Stop()
			if dm.Addr == m.Addr { // back within the grace period
				next = append(next, dm.routedMember)
				continue
			}
			gone = append(gone, dm.conn)
		}
		conn, err := r.dial(m.Addr)
		if err != nil {
			continue // unreachable by construction: leave it out until it changes
		}
		next = append(next, &routedMember{Member: m, conn: conn, client: New(conn, r.opts...)})
	}
	for id, rm := range old {
		if _, back := byID[id]; back || r.grace <= 0 {
			gone = append(gone, rm.conn) // replaced (new address), or no grace
			continue
		}
		dm := &departedMember{routedMember: rm}
		dm.timer = time.AfterFunc(r.grace, func() { r.expire(id, dm) })
		r.mu.departed[id] = dm
	}
	slices.SortFunc(next, func(a, b *routedMember) int { return strings.Compare(a.ID, b.ID) })
	r.mu.members = next
	r.mu.nodes = make([]rendezvous.Node, len(next))
	r.mu.hashes = make([]uint64, len(next))
	for i, rm := range next {
		r.mu.nodes[i] = rendezvous.Node{ID: rm.ID, Weight: 1}
		r.mu.hashes[i] = rendezvous.NodeHash(rm.ID)
	}
	if !r.mu.known {
		r.mu.known = true
		close(r.mu.ready)
	}
	r.mu.Unlock()
	for _, c := range gone {
		_ = c.Close() // RPCs in flight on it fail UNAVAILABLE; Admit moves on
	}
}

// expire ends dm's grace period: its connection closes, and Release of its
// leases is NOT_FOUND from then on.
func (r *Router) expire(id string, dm *departedMember) {
	r.mu.Lock()
	if r.mu.departed[id] != dm {
		r.mu.Unlock()
		return // it came back, or the Router closed
	}
	delete(r.mu.departed, id)
	r.mu.Unlock()
	_ = dm.conn.Close()
}

// Ready returns a channel closed once the first member list has arrived.
func (r *Router) Ready() <-chan struct{} { return r.mu.ready }

// Members returns the live members, sorted by ID.
func (r *Router) Members() []Member {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Member, len(r.mu.members))
	for i, rm := range r.mu.members {
		out[i] = rm.Member
	}
	return out
}

// Route returns the replica tenant's requests go to; false when no member is
// live.
func (r *Router) Route(tenant string) (Member, bool) {
	order := r.order(tenant)
	if len(order) == 0 {
		return Member{}, false
	}
	return order[0].Member, true
}

// order returns the members in rendezvous order for tenant.
func (r *Router) order(tenant string) []*routedMember {
	r.mu.RLock()
	defer r.mu.RUnlock()
	idx := rendezvous.OrderHashed(rendezvous.Hash(tenant), r.mu.nodes, r.mu.hashes, make([]int, 0, len(r.mu.nodes)))
	out := make([]*routedMember, len(idx))
	for i, j := range idx {
		out[i] = r.mu.members[j]
	}
	return out
}

// waitReady waits for the first member list or ctx.
func (r *Router) waitReady(ctx context.Context) error {
	select {
	case <-r.mu.ready:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// Admit sends req to the tenant's replica as the type documentation
// describes and returns its answer; an admission's lease id names the
// replica. With no live member it is UNAVAILABLE.
func (r *Router) Admit(ctx context.Context, req *admissionv1.AdmitRequest) (*admissionv1.AdmitResponse, error) {
	if err := r.waitReady(ctx); err != nil {
		return nil, err
	}
	if req.GetRequestId() == "" { // one id for every replica tried
		req = proto.CloneOf(req)
		req.RequestId = NewRequestID()
	}
	order := r.order(req.GetTenant())
	if len(order) == 0 {
		return nil, status.Error(codes.Unavailable, "no sluiced replica is registered")
	}
	var resp *admissionv1.AdmitResponse
	var err error
	var owner *routedMember
	for _, rm := range order {
		owner = rm
		resp, err = rm.client.Admit(ctx, req)
		if !moveOn(resp, err) || ctx.Err() != nil {
			break
		}
	}
	if err == nil && resp.GetLeaseId() != "" {
		resp = proto.CloneOf(resp)
		resp.LeaseId += leaseSep + owner.ID
	}
	return resp, err
}

// moveOn reports whether Admit should try the next replica: this one is
// unreachable or shutting down.
func moveOn(resp *admissionv1.AdmitResponse, err error) bool {
	if err != nil {
		return status.Code(err) == codes.Unavailable
	}
	return resp.GetDecision() == admissionv1.Decision_REJECTED && resp.GetReason() == admissionv1.Reason_REASON_SHUTTING_DOWN
}

// Release ends a lease that Router.Admit granted, on the replica that holds
// it, also when that replica left the membership less than the grace period
// ago. A lease id without a replica is INVALID_ARGUMENT; one of a replica
// that left longer ago is NOT_FOUND (a replica that left has ended its
// leases or will let them expire).
func (r *Router) Release(ctx context.Context, req *admissionv1.ReleaseRequest) (*admissionv1.ReleaseResponse, error) {
	lease, owner, ok := strings.Cut(req.GetLeaseId(), leaseSep)
	if !ok || owner == "" {
		return nil, status.Errorf(codes.InvalidArgument, "lease_id %q: not a Router lease id (want LEASE@REPLICA)", req.GetLeaseId())
	}
	r.mu.RLock()
	var rm *routedMember
	for _, m := range r.mu.members {
		if m.ID == owner {
			rm = m
			break
		}
	}
	if dm, ok := r.mu.departed[owner]; ok && rm == nil {
		rm = dm.routedMember
	}
	r.mu.RUnlock()
	if rm == nil {
		return nil, status.Errorf(codes.NotFound, "lease %s: replica %q is not a member, nor left less than %v ago", lease, owner, r.grace)
	}
	out := proto.CloneOf(req)
	out.LeaseId = lease
	return rm.client.Release(ctx, out)
}

// Close stops following the members and closes every connection.
func (r *Router) Close() error {
	r.stop()
	<-r.done
	r.mu.Lock()
	r.mu.closed = true
	members := r.mu.members
	for _, dm := range r.mu.departed {
		dm.timer.Stop()
		members = append(members, dm.routedMember)
	}
	r.mu.members, r.mu.nodes, r.mu.hashes, r.mu.departed = nil, nil, nil, nil
	r.mu.Unlock()
	var errs []error
	for _, rm := range members {
		if err := rm.conn.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", rm.Addr, err))
		}
	}
	return errors.Join(errs...)
}
