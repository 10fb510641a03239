package controlplane

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the control plane's Prometheus metrics. A nil *Metrics is
// valid and records nothing, for callers that export none.
type Metrics struct {
	connected prometheus.Gauge
	refusals  *prometheus.CounterVec
	revision  prometheus.Gauge
	replicas  prometheus.Gauge
	agents    prometheus.Gauge
	drains    prometheus.Gauge
	resyncs   prometheus.Counter
}

// NewMetrics registers the control plane's metrics on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_control_plane_connected",
			Help: "1 while etcd is reachable, 0 while the replica serves its last good config, topology and drains without it; absent without etcd.",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_config_refusals_total",
			Help: "Config documents refused (the last good config kept serving), by where they came from: file or etcd.",
		}, []string{"source"}),
		revision: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_config_revision",
			Help: "etcd revision of the serving config; 0 when it came from a file or the embedded default.",
		}),
		replicas: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_control_plane_replicas",
			Help: "Live sluiced replicas registered in etcd, this one included.",
		}),
		agents: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_control_plane_agent_nodes",
			Help: "Nodes whose agent's record is in the serving topology.",
		}),
		drains: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_control_plane_drain_marks",
			Help: "Drain marks in etcd.",
		}),
		resyncs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_control_plane_resyncs_total",
			Help: "Full re-reads of the control-plane keys (at start, and after a watch lost its revision to compaction).",
		}),
	}
	m.refusals.WithLabelValues("file")
	m.refusals.WithLabelValues(SourceEtcd)
	for _, c := range []prometheus.Collector{m.connected, m.refusals, m.revision, m.replicas, m.agents, m.drains, m.resyncs} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// DropConnected unregisters sluice_control_plane_connected from reg, for a
// server without a control plane: there is nothing to be connected to, and
// the gauge's 1 would read as a reachable etcd. Its other metrics stay (the
// file reloads' refusals, revision 0).
func (m *Metrics) DropConnected(reg prometheus.Registerer) {
	if m != nil {
		reg.Unregister(m.connected)
	}
}

func (m *Metrics) setConnected(ok bool) {
	if m == nil {
		return
	}
	v := 0.0
	if ok {
		v = 1
	}
	m.connected.Set(v)
}

func (m *Metrics) applied(rev int64) {
	if m != nil {
		m.revision.Set(float64(rev))
	}
}

func (m *Metrics) refused(source string) {
	if m != nil {
		m.refusals.WithLabelValues(source).Inc()
	}
}

func (m *Metrics) gauges(replicas, agents, drains int) {
	if m != nil {
		m.replicas.Set(float64(replicas))
		m.agents.Set(float64(agents))
		m.drains.Set(float64(drains))
	}
}

func (m *Metrics) resynced() {
	if m != nil {
		m.resyncs.Inc()
	}
}
