package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-sched/sluice/admission"
)

// Instrumented is the admission engine with Admit measured: its latency per
// tenant and requested model (sluice_admit_latency_seconds) and the requests
// waiting in the fair queue per tenant tier and model (sluice_queue_depth).
// Every other method is the engine's. The gRPC services are registered over
// it, so the latency is the engine call's, without the transport.
type Instrumented struct {
	*admission.Engine
	m *Metrics
}

// Instrument wraps eng. The engine must have been built WithObserver(m), so
// that a tenant's series exist by the time its latency is recorded.
func (m *Metrics) Instrument(eng *admission.Engine) *Instrumented {
	return &Instrumented{Engine: eng, m: m}
}

// Admit decides req as the engine's Admit does (Submit, then Await when the
// request was queued: the same steps) and records its latency. A decision
// made at once costs two clock reads, a map lookup and a histogram
// observation, and allocates nothing; only a queued request touches the
// queue-depth gauge. Invalid requests (an error) are not recorded: their
// model need not exist, and labels must stay bounded.
func (i *Instrumented) Admit(ctx context.Context, req admission.Request) (admission.Decision, error) {
	start := time.Now()
	d, tk, err := i.Engine.Submit(ctx, req)
	if err != nil {
		return d, err
	}
	if tk != nil {
		g := i.m.depthGauge(i.tierOf(req.Tenant), req.Model)
		g.Inc()
		d = i.Engine.Await(ctx, tk)
		g.Dec()
	}
	ts := i.m.tenants.find(req.Tenant)
	i.m.tenants.observeLatency(ts, req.Model, time.Since(start).Seconds())
	return d, nil
}

// tierOf returns the tenant's tier; a tenant the config no longer has is
// counted under OtherTenant.
func (i *Instrumented) tierOf(tenant string) string {
	if t, ok := i.Engine.Tenant(tenant); ok {
		return t.Tier
	}
	return OtherTenant
}

// depthGauge returns the queue-depth child of (tier, model), resolved once.
// Both come from the config (the engine queues only known tenants and
// models), so the children are bounded.
func (m *Metrics) depthGauge(tier, model string) prometheus.Gauge {
	m.depthMu.Lock()
	defer m.depthMu.Unlock()
	k := [2]string{tier, model}
	g, ok := m.depth[k]
	if !ok {
		g = m.queueDepth.WithLabelValues(tier, model)
		m.depth[k] = g
	}
	return g
}
