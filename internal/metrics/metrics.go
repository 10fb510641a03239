// Package metrics exports the engine's decisions, releases and domain
// state to Prometheus. It is an adapter: it implements admission.Observer
// and reads the engine's operator views at scrape time.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluice-sched/sluice/admission"
)

// outcomes and reasons index the pre-built counters, so that observing a
// decision is one atomic add with no label hashing.
const (
	maxOutcome = int(admission.Rejected) + 1
	maxReason  = int(admission.ReasonStateUnavailable) + 1
)

// Metrics is a Prometheus registry with Sluice's metrics.
type Metrics struct {
	Registry  *prometheus.Registry
	decisions [maxOutcome][maxReason]prometheus.Counter
	queueWait prometheus.Histogram
	degraded  prometheus.Counter
	releases  *prometheus.CounterVec
	refunded  prometheus.Counter
	overrun   prometheus.Counter
}

// New registers the metrics (and the Go and process collectors).
func New() *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry()}
	m.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	dec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_decisions_total",
		Help: "Admit answers by decision and reason.",
	}, []string{"decision", "reason"})
	for o := admission.Admitted; o <= admission.Rejected; o++ {
		for r := admission.ReasonNone; int(r) < maxReason; r++ {
			if (o == admission.Rejected) == (r == admission.ReasonNone) {
				continue // admissions have no reason; rejections always have one
			}
			m.decisions[o][r] = dec.WithLabelValues(o.String(), r.String())
		}
	}
	m.queueWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_queue_wait_seconds",
		Help:    "Time requests spent in the fair queue before their answer.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	})
	m.degraded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_degraded_total",
		Help: "Admissions granted a lower model tier than requested.",
	})
	m.releases = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_releases_total",
		Help: "Releases by outcome.",
	}, []string{"outcome"})
	m.refunded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_refunded_tokens_total",
		Help: "Weighted tokens given back at Release for output never generated.",
	})
	m.overrun = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_overrun_tokens_total",
		Help: "Weighted tokens charged at Release beyond what was admitted.",
	})
	m.Registry.MustRegister(dec, m.queueWait, m.degraded, m.releases, m.refunded, m.overrun)
	return m
}

// ObserveDecision implements admission.Observer.
func (m *Metrics) ObserveDecision(_ admission.Request, d admission.Decision) {
	if int(d.Outcome) < maxOutcome && int(d.Reason) < maxReason && d.Reason >= 0 {
		if c := m.decisions[d.Outcome][d.Reason]; c != nil {
			c.Inc()
		}
	}
	if d.Queued > 0 {
		m.queueWait.Observe(d.Queued.Seconds())
	}
	if d.Outcome == admission.Degraded {
		m.degraded.Inc()
	}
}

// ObserveRelease implements admission.Observer.
func (m *Metrics) ObserveRelease(rel admission.Release, res admission.ReleaseResult) {
	outcome := "ok"
	if rel.Outcome == admission.ReleaseError {
		outcome = "error"
	}
	m.releases.WithLabelValues(outcome).Inc()
	if res.RefundedTokens >= 0 {
		m.refunded.Add(float64(res.RefundedTokens))
	} else {
		m.overrun.Add(float64(-res.RefundedTokens))
	}
}

// Views is what the state collector reads at scrape time.
type Views interface {
	Domains() []admission.DomainInfo
	QueueLen() int
	LeaseCount() int
	IdempotencyRecords() (records int, evicted uint64)
}

// RegisterState adds gauges read from the engine at each scrape.
func (m *Metrics) RegisterState(v Views) {
	m.Registry.MustRegister(&stateCollector{v: v})
}

var (
	descLevel = prometheus.NewDesc("sluice_domain_bucket_level_ratio",
		"Domain soft-capacity bucket level as a share of its burst.", []string{"domain", "bucket"}, nil)
	descKV = prometheus.NewDesc("sluice_domain_kv_in_use_bytes",
		"KV cache bytes held by leases in the domain.", []string{"domain"}, nil)
	descKVLimit = prometheus.NewDesc("sluice_domain_kv_limit_bytes",
		"KV gauge limit of the domain.", []string{"domain"}, nil)
	descInFlight = prometheus.NewDesc("sluice_domain_in_flight",
		"Leases held in the domain.", []string{"domain"}, nil)
	descDraining = prometheus.NewDesc("sluice_domain_draining",
		"1 while the domain is drained.", []string{"domain"}, nil)
	descWeight = prometheus.NewDesc("sluice_domain_health_weight",
		"Placement weight from Release outcomes (1 healthy, cut to 0.05 on errors).", []string{"domain"}, nil)
	descQueue = prometheus.NewDesc("sluice_queue_length",
		"Requests waiting in the fair queue.", nil, nil)
	descLeases = prometheus.NewDesc("sluice_leases",
		"Leases held across all domains.", nil, nil)
	descIdemRecords = prometheus.NewDesc("sluice_idempotency_records",
		"Request ids remembered for idempotency.", nil, nil)
	descIdemEvicted = prometheus.NewDesc("sluice_idempotency_evicted_total",
		"Request ids forgotten before their TTL because leases.max_idempotency_records was reached.", nil, nil)
)

type stateCollector struct{ v Views }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLevel, descKV, descKVLimit, descInFlight, descDraining, descWeight, descQueue, descLeases, descIdemRecords, descIdemEvicted} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	for _, d := range c.v.Domains() {
		ch <- prometheus.MustNewConstMetric(descLevel, prometheus.GaugeValue, ratio(d.PrefillLevel, d.PrefillBurst), d.ID, "prefill")
		ch <- prometheus.MustNewConstMetric(descLevel, prometheus.GaugeValue, ratio(d.DecodeLevel, d.DecodeBurst), d.ID, "decode")
		ch <- prometheus.MustNewConstMetric(descKV, prometheus.GaugeValue, float64(d.KVInUse), d.ID)
		ch <- prometheus.MustNewConstMetric(descKVLimit, prometheus.GaugeValue, float64(d.KVLimit), d.ID)
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(d.InFlight), d.ID)
		draining := 0.0
		if d.Draining {
			draining = 1
		}
		ch <- prometheus.MustNewConstMetric(descDraining, prometheus.GaugeValue, draining, d.ID)
		ch <- prometheus.MustNewConstMetric(descWeight, prometheus.GaugeValue, d.HealthWeight, d.ID)
	}
	ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(c.v.QueueLen()))
	ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(c.v.LeaseCount()))
	records, evicted := c.v.IdempotencyRecords()
	ch <- prometheus.MustNewConstMetric(descIdemRecords, prometheus.GaugeValue, float64(records))
	ch <- prometheus.MustNewConstMetric(descIdemEvicted, prometheus.CounterValue, float64(evicted))
}

func ratio(level, burst int64) float64 {
	if burst <= 0 {
		return 0
	}
	return float64(level) / float64(burst)
}
