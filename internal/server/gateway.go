package server

import (
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-sched/sluice/internal/extproc"
	"github.com/sluice-sched/sluice/internal/gateway"
)

// GatewayOptions configure the request lifecycle that gateways drive:
// Envoy's external processing (ext_proc) on the gRPC port.
type GatewayOptions struct {
	// Gateway: the trusted headers, the bounds and the default tenant;
	// its Clock, Registerer and Loads are the server's.
	Gateway gateway.Options
	// ExtProc: the body mode assumed when Envoy does not say.
	ExtProc extproc.Options
	// OpenAIAddr is where the OpenAI-compatible front listens
	// (--openai-addr, openai.go); "": no front.
	OpenAIAddr string
}

// newGateway builds the lifecycle over the engine's instrumented Admit
// (the gRPC API's own path: its decisions are observed and timed alike)
// and the engine readings of the feed.
func (s *Server) newGateway(feed *engineFeed) *gateway.Gateway {
	o := s.opts.Gateway.Gateway
	o.Clock = s.opts.Clock
	o.Registerer = s.metrics.Registry
	if feed != nil {
		o.Loads = engineLoads{feed}
	}
	return gateway.New(s.metrics.Instrument(s.eng), o)
}

// registerExtProc serves the ext_proc ExternalProcessor beside the
// Admission service; under --auth only the gateway role may call it.
func (s *Server) registerExtProc() {
	extproc.Register(s.grpc, s.state.gw, s.opts.Gateway.ExtProc)
	s.health.SetServingStatus(extproc.ServiceName, healthpb.HealthCheckResponse_SERVING)
}

// engineLoads reads the engines' waiting queues for the gateway's
// endpoint choice; a reading older than loadsFresh is none.
type engineLoads struct{ f *engineFeed }

// loadsFresh: twice the Inference Extension's staleness bound, so that
// one failed pass of the reader still counts.
const loadsFresh = 400 * time.Millisecond

// Waiting implements gateway.Loads.
func (l engineLoads) Waiting(metricsURL string) (float64, bool) {
	s, at, ok := l.f.reader.EndpointSample(metricsURL)
	if !ok || l.f.now().Sub(at) > loadsFresh {
		return 0, false
	}
	return s.Queue, true
}
