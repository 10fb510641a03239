package server

import (
	"context"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// grpcMetrics are the gRPC calls by method and status code
// (grpc_server_started_total, grpc_server_handled_total,
// grpc_server_msg_received_total, grpc_server_msg_sent_total: the names and
// labels of go-grpc-middleware's Prometheus provider) and the invalid
// requests by method and the field they named, which no other surface
// counts: an Admit with a bad field is refused before it is a decision.
type grpcMetrics struct {
	calls   *grpcCalls
	invalid *prometheus.CounterVec
}

func newGRPCMetrics(reg prometheus.Registerer) *grpcMetrics {
	m := &grpcMetrics{
		calls: newGRPCCalls(),
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
	return []grpc.UnaryServerInterceptor{m.calls.unary, m.countInvalid}
}

// stream counts every streaming call and its messages.
func (m *grpcMetrics) stream() grpc.StreamServerInterceptor { return m.calls.stream }

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

// The gRPC types of go-grpc-middleware's grpc_type label.
const (
	grpcUnary        = "unary"
	grpcClientStream = "client_stream"
	grpcServerStream = "server_stream"
	grpcBidiStream   = "bidi_stream"
)

// grpcCalls counts calls and stream messages by method. A method's
// counters are looked up once, at its first call, and kept: a stream
// message costs one atomic add, not a lookup by label values (an ext_proc
// exchange sends and receives some forty).
type grpcCalls struct {
	started, handled, received, sent *prometheus.CounterVec
	methods                          sync.Map // full method name → *methodCalls
}

// methodCalls are one method's counters; handled is indexed by code.
type methodCalls struct {
	started, received, sent prometheus.Counter
	handled                 [codes.Unauthenticated + 1]prometheus.Counter
	labels                  [3]string // grpc_type, grpc_service, grpc_method
}

func newGRPCCalls() *grpcCalls {
	labels := []string{"grpc_type", "grpc_service", "grpc_method"}
	return &grpcCalls{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_started_total", Help: "Total number of RPCs started on the server.",
		}, labels),
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_handled_total", Help: "Total number of RPCs completed on the server, regardless of success or failure.",
		}, append(labels, "grpc_code")),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_received_total", Help: "Total number of RPC stream messages received on the server.",
		}, labels),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_sent_total", Help: "Total number of gRPC stream messages sent by the server.",
		}, labels),
	}
}

// Describe implements prometheus.Collector.
func (g *grpcCalls) Describe(ch chan<- *prometheus.Desc) {
	g.started.Describe(ch)
	g.handled.Describe(ch)
	g.received.Describe(ch)
	g.sent.Describe(ch)
}

// Collect implements prometheus.Collector.
func (g *grpcCalls) Collect(ch chan<- prometheus.Metric) {
	g.started.Collect(ch)
	g.handled.Collect(ch)
	g.received.Collect(ch)
	g.sent.Collect(ch)
}

// InitializeMetrics creates the series of every method s serves, at 0.
func (g *grpcCalls) InitializeMetrics(s *grpc.Server) {
	for service, info := range s.GetServiceInfo() {
		for _, m := range info.Methods {
			g.method("/"+service+"/"+m.Name, grpcType(m.IsClientStream, m.IsServerStream))
		}
	}
}

// grpcType is the grpc_type label of a method.
func grpcType(clientStream, serverStream bool) string {
	switch {
	case clientStream && serverStream:
		return grpcBidiStream
	case clientStream:
		return grpcClientStream
	case serverStream:
		return grpcServerStream
	}
	return grpcUnary
}

// method returns the counters of fullMethod, created at its first call.
func (g *grpcCalls) method(fullMethod, typ string) *methodCalls {
	if mc, ok := g.methods.Load(fullMethod); ok {
		return mc.(*methodCalls)
	}
	service, name := "unknown", "unknown"
	if s, n, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/"); ok {
		service, name = s, n
	}
	mc := &methodCalls{labels: [3]string{typ, service, name}}
	mc.started = g.started.WithLabelValues(typ, service, name)
	mc.received = g.received.WithLabelValues(typ, service, name)
	mc.sent = g.sent.WithLabelValues(typ, service, name)
	for c := range mc.handled {
		mc.handled[c] = g.handled.WithLabelValues(typ, service, name, codes.Code(c).String())
	}
	actual, _ := g.methods.LoadOrStore(fullMethod, mc)
	return actual.(*methodCalls)
}

// done counts a call's end with err's code.
func (g *grpcCalls) done(mc *methodCalls, err error) {
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	if c := st.Code(); int(c) < len(mc.handled) {
		mc.handled[c].Inc()
		return
	}
	g.handled.WithLabelValues(mc.labels[0], mc.labels[1], mc.labels[2], st.Code().String()).Inc()
}

// unary counts one unary call: a message received, a response sent.
func (g *grpcCalls) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	mc := g.method(info.FullMethod, grpcUnary)
	mc.started.Inc()
	mc.received.Inc()
	resp, err := handler(ctx, req)
	if err == nil {
		mc.sent.Inc()
	}
	g.done(mc, err)
	return resp, err
}

// stream counts one streaming call and each message it receives or sends.
func (g *grpcCalls) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	mc := g.method(info.FullMethod, grpcType(info.IsClientStream, info.IsServerStream))
	mc.started.Inc()
	err := handler(srv, &countedStream{ServerStream: ss, mc: mc})
	g.done(mc, err)
	return err
}

// countedStream counts the messages a stream receives and sends.
type countedStream struct {
	grpc.ServerStream
	mc *methodCalls
}

// RecvMsg implements grpc.ServerStream: a message received is counted,
// the end of the stream is not.
func (s *countedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		s.mc.received.Inc()
	}
	return err
}

// SendMsg implements grpc.ServerStream.
func (s *countedStream) SendMsg(m any) error {
	err := s.ServerStream.SendMsg(m)
	if err == nil {
		s.mc.sent.Inc()
	}
	return err
}
