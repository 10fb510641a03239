package server

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
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

// BenchmarkGRPC compares Admit on the real engine with the same server's
// gRPC health Check, over one loopback connection at the same concurrency:
// the health handler is near-empty, so its throughput is the limit of the
// machine's gRPC stack. Report ns/op(Check) / ns/op(Admit) (target ≥ 0.9).
func BenchmarkGRPC(b *testing.B) {
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
	defer func() { cancel(); <-done }()
	conn, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	const parallelism = 8

	b.Run("HealthCheck", func(b *testing.B) {
		cl := healthpb.NewHealthClient(conn)
		b.SetParallelism(parallelism)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := cl.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("Admit", func(b *testing.B) {
		cl := admissionv1.NewAdmissionClient(conn)
		r := &admissionv1.AdmitRequest{Tenant: "router", Model: "small", PromptTokens: 10, MaxOutputTokens: 1,
			Priority: admissionv1.Priority_PRIORITY_NORMAL}
		b.SetParallelism(parallelism)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := cl.Admit(context.Background(), r)
				if err != nil {
					b.Error(err)
					return
				}
				if resp.GetDecision() != admissionv1.Decision_ADMITTED {
					b.Errorf("not admitted: %v", resp)
					return
				}
			}
		})
	})
}
