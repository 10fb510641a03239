package server

import (
	"context"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// grpcMetrics are the gRPC calls by method and status code
// (go-grpc-middleware's Prometheus provider: grpc_server_started_total,
// grpc_server_handled_total, …) and the invalid requests by method and
// the field they named, which no other surface counts: an Admit with a
// bad field is refused before it is a decision.
type grpcMetrics struct {
	calls   *grpcprom.ServerMetrics
	invalid *prometheus.CounterVec
}

func newGRPCMetrics(reg prometheus.Registerer) *grpcMetrics {
	m := &grpcMetrics{
		calls: grpcprom.NewServerMetrics(),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_invalid_requests_total",
			Help: "gRPC calls refused INVALID_ARGUMENT, by method and the field they named (google.rpc.BadRequest; \"unknown\" without one).",
		}, []string{"method", "field"}),
	}
	reg.MustRegister(m.calls, m.invalid)
	return m
}

// unary counts every unary call: outermost, so that the calls auth or
// the connection limits refuse are counted too.
func (m *grpcMetrics) unary() []grpc.UnaryServerInterceptor {
	return []grpc.UnaryServerInterceptor{m.calls.UnaryServerInterceptor(), m.countInvalid}
}

// stream counts every streaming call.
func (m *grpcMetrics) stream() grpc.StreamServerInterceptor { return m.calls.StreamServerInterceptor() }

// countInvalid counts a call refused INVALID_ARGUMENT by its method and
// the first field its BadRequest names.
func (m *grpcMetrics) countInvalid(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if err == nil {
		return resp, nil
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.InvalidArgument {
		return resp, err
	}
	field := "unknown"
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			field = br.GetFieldViolations()[0].GetField()
			break
		}
	}
	m.invalid.WithLabelValues(info.FullMethod, field).Inc()
	return resp, err
}
