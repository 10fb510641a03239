package server

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluice-sched/sluice/admission/rlsserver"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/grpctest"
	"github.com/sluice-sched/sluice/internal/load"
)

// rlsRequest is what Envoy's ratelimit filter sends for deploy/envoy's
// descriptor actions: the tenant and model from request headers.
func rlsRequest(tenant, model string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{
		Domain: "sluice",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
			{Key: "tenant", Value: tenant}, {Key: "model", Value: model},
		}}},
		HitsAddend: 1000,
	}
}

// sluiced serves Envoy's rate-limit protocol on its gRPC port beside its own
// API: health reports the service, a decision is counted in the metrics as
// an Admit (and its immediate release as a release), and nothing stays
// leased.
func TestRLSServedBesideTheAdmissionAPI(t *testing.T) {
	srv, _, _, _ := start(t, Options{RLS: rlsserver.Options{Domain: "sluice"}})
	conn := grpctest.Dial(t, srv.GRPCAddr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: rlsserver.ServiceName})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health of %s: %v, %v", rlsserver.ServiceName, h, err)
	}
	rls := rlsv3.NewRateLimitServiceClient(conn)
	resp, err := rls.ShouldRateLimit(ctx, rlsRequest("acme", "large"))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit: %v, %v", resp, err)
	}
	if _, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "other", Descriptors: rlsRequest("acme", "large").Descriptors}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("another domain than --rls-domain: %v", err)
	}
	if n := srv.Engine().LeaseCount(); n != 0 {
		t.Errorf("%d leases held after an RLS admission", n)
	}
	m := get(t, srv, "/metrics")
	for _, want := range []string{
		`sluice_decisions_total{decision="ADMITTED",reason="REASON_UNSPECIFIED"} 1`,
		`sluice_releases_total{outcome="unobserved"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// With --auth, the RLS method is the router role's, for its bound tenants
// only: the descriptors' tenants are checked by the handler before
// anything is charged.
func TestRLSRoles(t *testing.T) {
	f := startSecure(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct {
		caller, tenant string
		want           codes.Code
	}{
		{"router-acme", "acme", codes.OK},
		{"router-acme", "globex", codes.PermissionDenied},
		{"router-all", "globex", codes.OK},
		{"viewer", "acme", codes.PermissionDenied},
		{"sre", "acme", codes.PermissionDenied},
		{"stranger", "acme", codes.Unauthenticated},
		{"anonymous", "acme", codes.Unauthenticated},
	} {
		t.Run(c.caller+"/"+c.tenant, func(t *testing.T) {
			before, _ := f.srv.Engine().Tenant(c.tenant)
			rls := rlsv3.NewRateLimitServiceClient(f.dial(t, f.caller(c.caller)))
			resp, err := rls.ShouldRateLimit(ctx, rlsRequest(c.tenant, "large"))
			if got := status.Code(err); got != c.want {
				t.Fatalf("code = %v (%v), want %v", got, err, c.want)
			}
			after, _ := f.srv.Engine().Tenant(c.tenant)
			switch {
			case c.want == codes.OK && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK:
				t.Errorf("answer: %v", resp)
			// The real clock refills the bucket between the two reads.
			case c.want == codes.OK && (before.TokenLevel-after.TokenLevel <= 0 || before.TokenLevel-after.TokenLevel > 1000):
				t.Errorf("charged %d, want 1000 less the refill", before.TokenLevel-after.TokenLevel)
			case c.want != codes.OK && after.TokenLevel < before.TokenLevel:
				t.Errorf("a refused call charged %d", before.TokenLevel-after.TokenLevel)
			}
		})
	}
	// A descriptor without a tenant needs no binding, but the role still.
	rls := rlsv3.NewRateLimitServiceClient(f.dial(t, f.caller("router-acme")))
	noTenant := &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "path", Value: "/"}}}}}
	if resp, err := rls.ShouldRateLimit(ctx, noTenant); err != nil || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_UNKNOWN {
		t.Errorf("no tenant: %v, %v", resp, err)
	}
}

// BenchmarkRLS compares ShouldRateLimit on the real engine (a decision and
// its release, every answer's headers) with the same server's gRPC health
// Check, over one loopback connection at the same concurrency, in one run,
// as BenchmarkGRPC does for Admit: ns/op(Check) / ns/op(RLS), target ≥ 0.9.
// Interleaved reports the ratio itself (rls/check), from the calls
// alternated round by round, which a machine shared with other work needs,
// beside Admit's (admit/check) on the same server in the same rounds.
func BenchmarkRLS(b *testing.B) {
	srv, conn := startBenchServer(b)
	rls := rlsv3.NewRateLimitServiceClient(conn)
	r := rlsRequest("router", "small")
	r.HitsAddend = 20
	decide := func() error {
		resp, err := rls.ShouldRateLimit(context.Background(), r)
		if err == nil && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			err = fmt.Errorf("not OK: %v", resp)
		}
		return err
	}
	benchParallel(b, "HealthCheck", healthCall(conn))
	benchParallel(b, "ShouldRateLimit", decide)
	if n := srv.Engine().LeaseCount(); n != 0 {
		b.Errorf("%d leases held after the RLS calls", n)
	}
	// The same calls alternated in rounds of a few thousand, so that what
	// else runs on the machine weighs on all alike: the ratios of their
	// throughputs over all rounds (the figure the target is about).
	b.Run("Interleaved", func(b *testing.B) {
		// Admit on the same server (leases expire after 1 s, as routers
		// would release them): the reference for what a decision costs.
		interleave(b, healthCall(conn), decide, admitCall(conn, 16))
	})
	// The protocol's own cost: a server with the same gRPC options whose
	// handlers answer a response of the same shape, prepared once, with no
	// engine behind them. Its ratios bound what any decision can reach on
	// this machine with this client.
	b.Run("Canned", func(b *testing.B) {
		admitResp, err := admissionv1.NewAdmissionClient(conn).Admit(context.Background(), &admissionv1.AdmitRequest{
			Tenant: "router", Model: "small", PromptTokens: 16, MaxOutputTokens: 1, Priority: admissionv1.Priority_PRIORITY_NORMAL})
		if err != nil {
			b.Fatal(err)
		}
		rlsResp, err := rls.ShouldRateLimit(context.Background(), r)
		if err != nil {
			b.Fatal(err)
		}
		canned := startCannedServer(b, srv, admitResp, rlsResp)
		cannedRLS := rlsv3.NewRateLimitServiceClient(canned)
		interleave(b, healthCall(canned), func() error {
			_, err := cannedRLS.ShouldRateLimit(context.Background(), r)
			return err
		}, admitCall(canned, 16))
	})
}

// interleave runs check, rls and admit in rounds of a few thousand calls
// from benchParallelism callers per CPU, alternated so that what else runs
// on the machine weighs on all alike, and reports their ratios: of calls
// per second (the figure the target is about) and of CPU per call (this
// process's, client and server together), which moves less when other
// work shares the machine.
func interleave(b *testing.B, check, rls, admit func() error) {
	callers := benchParallelism * runtime.GOMAXPROCS(0)
	const perCaller = 250
	round := func(call func() error) (wall, cpu time.Duration) {
		start, startCPU := time.Now(), load.ProcessCPU()
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				for range perCaller {
					if err := call(); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start), load.ProcessCPU() - startCPU
	}
	calls := []func() error{check, rls, admit}
	var took, cpu [3]time.Duration
	i := 0
	for b.Loop() {
		for k := range calls { // each round starts with the next one
			j := (i + k) % len(calls)
			w, c := round(calls[j])
			took[j] += w
			cpu[j] += c
		}
		i++
	}
	n := float64(i * callers * perCaller)
	b.ReportMetric(float64(took[0].Nanoseconds())/n, "ns/check")
	b.ReportMetric(float64(took[1].Nanoseconds())/n, "ns/rls")
	b.ReportMetric(float64(took[2].Nanoseconds())/n, "ns/admit")
	b.ReportMetric(float64(took[0])/float64(took[1]), "rls/check")
	b.ReportMetric(float64(took[0])/float64(took[2]), "admit/check")
	b.ReportMetric(float64(cpu[0])/float64(cpu[1]), "rls/check-cpu")
	b.ReportMetric(float64(cpu[0])/float64(cpu[2]), "admit/check-cpu")
}

// cannedServer answers Admit and ShouldRateLimit with fixed responses.
type cannedServer struct {
	admissionv1.UnimplementedAdmissionServer
	rlsv3.UnimplementedRateLimitServiceServer
	admit *admissionv1.AdmitResponse
	rls   *rlsv3.RateLimitResponse
}

func (c *cannedServer) Admit(context.Context, *admissionv1.AdmitRequest) (*admissionv1.AdmitResponse, error) {
	return c.admit, nil
}

func (c *cannedServer) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return c.rls, nil
}

// startCannedServer serves the canned responses and health on loopback,
// with srv's gRPC options, and dials it; both stop when the benchmark ends.
func startCannedServer(b *testing.B, srv *Server, admit *admissionv1.AdmitResponse, rls *rlsv3.RateLimitResponse) *grpc.ClientConn {
	gs := grpc.NewServer(srv.grpcServerOptions()...)
	c := &cannedServer{admit: admit, rls: rls}
	admissionv1.RegisterAdmissionServer(gs, c)
	rlsv3.RegisterRateLimitServiceServer(gs, c)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	return grpctest.Serve(b, gs)
}
