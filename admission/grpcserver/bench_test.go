package grpcserver

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// benchParallelism × GOMAXPROCS goroutines call concurrently in both
// benchmarks, so that the server, not the round trip, is the limit.
const benchParallelism = 8

// The benchmarks share one server and one client connection, so that Admit
// and the health Check are measured with the same client, server options
// (the recovery interceptor included) and concurrency. The target is Admit
// at ≥ 90% of Check's throughput: ns/op(Check) / ns/op(Admit) ≥ 0.9.
var (
	benchOnce sync.Once
	benchConn *grpc.ClientConn
	benchErr  error
)

// sharedBenchConn starts, once per process, a server over the test engine
// on a loopback TCP port. It is left running until the process exits.
func sharedBenchConn(b *testing.B) *grpc.ClientConn {
	benchOnce.Do(func() {
		var ts *testServer
		ts, _, benchErr = serveLoopback(&testEngine{}, nil)
		if benchErr == nil {
			benchConn = ts.conn
		}
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return benchConn
}

// benchAdmitRequest is a typical router request.
var benchAdmitRequest = &admissionv1.AdmitRequest{
	RequestId:       "7f9c2ba4e88f827d616045507605853e",
	Tenant:          "acme",
	Model:           "llama-3.1-70b",
	PromptTokens:    2048,
	MaxOutputTokens: 512,
	Priority:        admissionv1.Priority_PRIORITY_NORMAL,
	AcceptDowngrade: []string{"llama-3.1-8b"},
}

func BenchmarkGRPCAdmit(b *testing.B) {
	cl := admissionv1.NewAdmissionClient(sharedBenchConn(b))
	ctx := context.Background()
	if _, err := cl.Admit(ctx, benchAdmitRequest); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := cl.Admit(ctx, benchAdmitRequest)
			if err != nil {
				b.Error(err)
				return
			}
			if resp.GetDecision() != admissionv1.Decision_ADMITTED {
				b.Errorf("decision %v", resp.GetDecision())
				return
			}
		}
	})
}

func BenchmarkGRPCHealthCheck(b *testing.B) {
	cl := healthpb.NewHealthClient(sharedBenchConn(b))
	ctx := context.Background()
	req := &healthpb.HealthCheckRequest{}
	if _, err := cl.Check(ctx, req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := cl.Check(ctx, req)
			if err != nil {
				b.Error(err)
				return
			}
			if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				b.Errorf("status %v", resp.GetStatus())
				return
			}
		}
	})
}
