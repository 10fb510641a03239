package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/grpctest"
)

// benchConfig has one tenant whose quotas never bind, so every Admit in the
// benchmark is a full decision that admits at once.
const benchConfig = `
tiers:
  bench:
    rps: {rate: 1e9, burst: 1e9}
    tokens: {rate: 1e12, burst: 1e12}
    weight: 1
tenants:
  router: {tier: bench}
leases: {ttl: 1s}  # routers release; here leases expire, keeping the lease table at steady state
`

// benchParallelism is the callers per CPU of the gRPC benchmarks.
const benchParallelism = 8

// startBenchServer serves benchConfig on loopback and dials it over one
// connection; both stop when the benchmark ends.
func startBenchServer(b *testing.B) (*Server, *grpc.ClientConn) {
	path := filepath.Join(b.TempDir(), "bench.yaml")
	if err := os.WriteFile(path, []byte(benchConfig), 0o600); err != nil {
		b.Fatal(err)
	}
	srv, err := New(Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ConfigPath: path,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	return srv, grpctest.Dial(b, srv.GRPCAddr().String())
}

// benchParallel runs call b.N times from benchParallelism callers per CPU.
func benchParallel(b *testing.B, name string, call func() error) {
	b.Run(name, func(b *testing.B) {
		b.SetParallelism(benchParallelism)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := call(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// healthCall is one health Check on conn: the near-empty reference.
func healthCall(conn *grpc.ClientConn) func() error {
	cl := healthpb.NewHealthClient(conn)
	return func() error {
		_, err := cl.Check(context.Background(), &healthpb.HealthCheckRequest{})
		return err
	}
}

// admitCall is one Admit on conn that must be admitted.
func admitCall(conn *grpc.ClientConn, promptTokens int64) func() error {
	cl := admissionv1.NewAdmissionClient(conn)
	r := &admissionv1.AdmitRequest{Tenant: "router", Model: "small", PromptTokens: promptTokens, MaxOutputTokens: 1,
		Priority: admissionv1.Priority_PRIORITY_NORMAL}
	return func() error {
		resp, err := cl.Admit(context.Background(), r)
		if err == nil && resp.GetDecision() != admissionv1.Decision_ADMITTED {
			err = fmt.Errorf("not admitted: %v", resp)
		}
		return err
	}
}

// BenchmarkGRPC compares Admit on the real engine with the same server's
// gRPC health Check, over one loopback connection at the same concurrency:
// the health handler is near-empty, so its throughput is the limit of the
// machine's gRPC stack. Report ns/op(Check) / ns/op(Admit) (target ≥ 0.9).
func BenchmarkGRPC(b *testing.B) {
	_, conn := startBenchServer(b)
	benchParallel(b, "HealthCheck", healthCall(conn))
	benchParallel(b, "Admit", admitCall(conn, 10))
}
