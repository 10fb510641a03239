package rlsserver

import (
	"context"
	"reflect"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/grpcserver"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/grpctest"
	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/topology/topologytest"
)

// epoch is the manual clock's start.
var epoch = time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)

// hgxCluster returns n HGX H200 domains of one node each: d1, d2, ...
func hgxCluster(t testing.TB, n int) topology.Cluster { return topologytest.HGX(t, n) }

// ratelimitDescriptor shortens Envoy's descriptor type in test tables.
type ratelimitDescriptor = ratelimitv3.RateLimitDescriptor

// big is a limit that never binds.
var big = admission.Limit{Rate: 1e9, Burst: 1e9}

// fixture is a real engine on a manual clock behind the RLS service on a
// loopback gRPC server, and Envoy's generated client for it.
type fixture struct {
	clk *clock.Manual
	eng *admission.Engine
	rls rlsv3.RateLimitServiceClient
}

// newFixture serves cfg on cluster; opts' clock is the fixture's.
func newFixture(t *testing.T, cfg admission.Config, cluster topology.Cluster, opts Options) *fixture {
	t.Helper()
	f := &fixture{clk: clock.NewManual(epoch)}
	var err error
	if f.eng, err = admission.New(cfg, cluster, admission.WithClock(f.clk)); err != nil {
		t.Fatalf("engine: %v", err)
	}
	t.Cleanup(f.eng.Close)
	opts.Clock = f.clk
	f.rls = serve(t, f.eng, opts)
	return f
}

// serve registers the RLS service over eng on a loopback server (with the
// recovery interceptor sluiced uses) and returns a client of it.
func serve(t testing.TB, eng Engine, opts Options) rlsv3.RateLimitServiceClient {
	t.Helper()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(grpcserver.RecoveryUnaryInterceptor(nil)))
	if _, err := Register(srv, eng, opts); err != nil {
		t.Fatal(err)
	}
	conn := grpctest.Serve(t, srv)
	return rlsv3.NewRateLimitServiceClient(conn)
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// withHits sets a descriptor's own hits_addend.
func withHits(d *ratelimitv3.RateLimitDescriptor, hits uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(hits)
	return d
}

// call sends one request and fails the test on an error.
func (f *fixture) call(t *testing.T, hits uint32, descs ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "sluice", Descriptors: descs, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// tenant returns a tenant's state, failing the test if it is unknown.
func (f *fixture) tenant(t *testing.T, name string) admission.TenantInfo {
	t.Helper()
	ti, ok := f.eng.Tenant(name)
	if !ok {
		t.Fatalf("no tenant %s", name)
	}
	return ti
}

// headers returns an answer's response headers as a map, failing the test
// on a header given twice.
func headers(t *testing.T, resp *rlsv3.RateLimitResponse) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, h := range resp.GetResponseHeadersToAdd() {
		if _, dup := m[h.GetKey()]; dup {
			t.Errorf("header %s given twice", h.GetKey())
		}
		m[h.GetKey()] = h.GetValue()
	}
	return m
}

// wantHeaders fails unless the answer's response headers are exactly want.
func wantHeaders(t *testing.T, resp *rlsv3.RateLimitResponse, want map[string]string) {
	t.Helper()
	if got := headers(t, resp); !reflect.DeepEqual(got, want) {
		t.Errorf("headers:\n got %v\nwant %v", got, want)
	}
}

// wantInvalidArgument fails unless err is INVALID_ARGUMENT whose
// BadRequest detail names field.
func wantInvalidArgument(t *testing.T, err error, field string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.InvalidArgument {
		t.Fatalf("error = %v, want INVALID_ARGUMENT", err)
	}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			if v := br.GetFieldViolations(); len(v) != 1 || v[0].GetField() != field {
				t.Errorf("BadRequest = %v, want field %q", br, field)
			}
			return
		}
	}
	t.Errorf("no BadRequest detail in %v", st.Details())
}

// idle fails unless no lease is held and no domain holds KV or in-flight
// requests: RLS admissions leave nothing behind.
func (f *fixture) idle(t *testing.T) {
	t.Helper()
	if n := f.eng.LeaseCount(); n != 0 {
		t.Errorf("%d leases held", n)
	}
	for _, d := range f.eng.Domains() {
		if d.KVInUse != 0 || d.InFlight != 0 {
			t.Errorf("domain %s: KV %d bytes, %d in flight", d.ID, d.KVInUse, d.InFlight)
		}
	}
}
