// Package metrics exports the engine's decisions, releases, domain and
// tenant state to Prometheus. It is an adapter: it implements
// admission.Observer (every answer and release), wraps the engine's Admit
// to time it (Instrumented), and reads the engine's operator views at
// scrape time.
//
// Tenant-labelled series are bounded: at most Options.MaxTenantSeries
// tenants, the busiest between two scrapes, have series of their own; every
// other tenant, and every name the config does not know, is counted under
// OtherTenant (tenantSet). On the hot path a tenant's series are found
// through an immutable map behind an atomic pointer and observed through
// children resolved once, so observing a decision allocates nothing.
package metrics

import (
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/cli"
)

// outcomes and reasons index the pre-built counters, so that observing a
// decision is one atomic add with no label hashing.
const (
	maxOutcome = int(admission.Rejected) + 1
	maxReason  = int(admission.LastReason) + 1
)

// Options configure Metrics.
type Options struct {
	// MaxTenantSeries bounds the tenants with series of their own (the
	// busiest, by decisions between scrapes); the rest are labelled
	// OtherTenant. 0 means DefaultMaxTenantSeries.
	MaxTenantSeries int
	// AdmitLatencySLA is exported as sluice_admit_latency_sla_seconds, the
	// yardstick of the Admit latency alert. 0 means 2 s (Sluice's
	// queue-wait p99 target for a tenant within its share).
	AdmitLatencySLA time.Duration
}

// Metrics is a Prometheus registry with Sluice's metrics.
type Metrics struct {
	Registry  *prometheus.Registry
	decisions [maxOutcome][maxReason]prometheus.Counter
	queueWait prometheus.Histogram
	degraded  prometheus.Counter
	releases  [3]prometheus.Counter // by releaseOutcome's index: ok, error, unobserved
	refunded  prometheus.Counter
	overrun   prometheus.Counter

	tenants    *tenantSet
	queueDepth *prometheus.GaugeVec // tier, model: requests waiting in the fair queue
	depthMu    sync.Mutex
	depth      map[[2]string]prometheus.Gauge // queueDepth's children, resolved once
}

// latencyBuckets are the Admit histogram's classic buckets, for scrapers
// without native histograms: from an at-once decision (microseconds) to
// the longest queue wait (30 s by default), with 2 s and 3 s so that the
// default SLA and its 1.5× alert threshold fall on bucket bounds.
var latencyBuckets = [...]float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30}

// New registers the metrics (and the Go and process collectors).
func New(opts Options) *Metrics {
	if opts.MaxTenantSeries <= 0 {
		opts.MaxTenantSeries = DefaultMaxTenantSeries
	}
	if opts.AdmitLatencySLA <= 0 {
		opts.AdmitLatencySLA = 2 * time.Second
	}
	m := &Metrics{Registry: prometheus.NewRegistry(), depth: map[[2]string]prometheus.Gauge{}}
	m.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	b := cli.ReadBuild()
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "sluice_build_info",
		Help:        "1, labelled with what this sluiced was built from: the module version, the VCS revision and the Go version.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	build.Set(1)
	m.Registry.MustRegister(build)
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
	releases := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_releases_total",
		Help: "Releases by outcome.",
	}, []string{"outcome"})
	for i, outcome := range releaseOutcomes {
		m.releases[i] = releases.WithLabelValues(outcome) // resolved once: a Release does no label lookup
	}
	m.refunded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_refunded_tokens_total",
		Help: "Weighted tokens given back at Release for output never generated.",
	})
	m.overrun = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_overrun_tokens_total",
		Help: "Weighted tokens charged at Release beyond what was admitted.",
	})
	vecs := &tenantVecs{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_tenant_decisions_total",
			Help: "Admit answers per tenant by decision and reason (refusals: decision=\"REJECTED\"). Tenants beyond the busiest --metrics-max-tenant-series are tenant=\"other\".",
		}, []string{"tenant", "decision", "reason"}),
		credit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_tenant_burst_credit_consumed_tokens_total",
			Help: "Weighted tokens borrowed from burst credit (the token bucket's debt) per tenant.",
		}, []string{"tenant"}),
		clamped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_release_overrun_clamped_total",
			Help: "Releases per tenant that reported more tokens than limits.release_overrun_multiple times what the lease admitted, charged at that bound.",
		}, []string{"tenant"}),
		latency: newLatencyVec("sluice_admit_latency_seconds",
			"Admit latency in the engine (decision and any wait in the fair queue) per tenant and requested model; a native histogram with classic buckets."),
	}
	m.tenants = newTenantSet(opts.MaxTenantSeries, vecs)
	m.queueDepth = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_queue_depth",
		Help: "Requests waiting in the fair queue per tenant tier and requested model (KEDA scales inference workers on it).",
	}, []string{"tier", "model"})
	sla := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_admit_latency_sla_seconds",
		Help: "The Admit latency SLA (--admit-latency-sla) the p99 alert compares with.",
	})
	sla.Set(opts.AdmitLatencySLA.Seconds())
	maxSeries := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_metrics_max_tenant_series",
		Help: "Tenants with series of their own at most (--metrics-max-tenant-series); the rest are tenant=\"other\".",
	})
	maxSeries.Set(float64(opts.MaxTenantSeries))
	m.Registry.MustRegister(dec, m.queueWait, m.degraded, releases, m.refunded, m.overrun,
		vecs.decisions, vecs.credit, vecs.clamped, vecs.latency, m.queueDepth, sla, maxSeries)
	return m
}

// Handler serves the registry. Before each scrape it ranks the tenants, so
// that the busiest since the last scrape have series of their own.
func (m *Metrics) Handler() http.Handler {
	h := promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.tenants.rank()
		h.ServeHTTP(w, r)
	})
}

// ObserveDecision implements admission.Observer.
func (m *Metrics) ObserveDecision(req admission.Request, d admission.Decision) {
	ts := m.tenants.series(req.Tenant, d.Reason != admission.ReasonUnknownTenant)
	if int(d.Outcome) < maxOutcome && int(d.Reason) < maxReason && d.Reason >= 0 {
		if c := m.decisions[d.Outcome][d.Reason]; c != nil {
			c.Inc()
		}
		if c := ts.decisions[d.Outcome][d.Reason]; c != nil {
			c.Inc()
		}
	}
	if used := d.Trace.BurstCreditBefore - d.Trace.BurstCreditAfter; used > 0 {
		ts.credit.Add(float64(used))
	}
	if d.Queued > 0 {
		m.queueWait.Observe(d.Queued.Seconds())
	}
	if d.Outcome == admission.Degraded {
		m.degraded.Inc()
	}
}

// releaseOutcomes are sluice_releases_total's outcome labels.
var releaseOutcomes = [3]string{"ok", "error", "unobserved"}

// ObserveRelease implements admission.Observer.
func (m *Metrics) ObserveRelease(rel admission.Release, res admission.ReleaseResult) {
	i := 0 // ok
	switch rel.Outcome {
	case admission.ReleaseError:
		i = 1
	case admission.ReleaseUnobserved:
		i = 2
	}
	m.releases[i].Inc()
	if res.RefundedTokens >= 0 {
		m.refunded.Add(float64(res.RefundedTokens))
	} else {
		m.overrun.Add(float64(-res.RefundedTokens))
	}
	if res.OverrunClamped {
		// find, not series: a release does not rank the tenant.
		m.tenants.find(res.Tenant).clamped.Inc()
	}
}

// Views is what the state collector reads at scrape time.
type Views interface {
	Domains() []admission.DomainInfo
	QueueLen() int
	LeaseCount() int
	IdempotencyRecords() (records int, evicted uint64)
	Tenant(name string) (admission.TenantInfo, bool)
}

// CreditViews is what the state gauges read of a credit freeze, when the
// Views have it (*admission.Engine does).
type CreditViews interface {
	CreditFrozen() (admission.CreditFreeze, bool)
}

// RegisterState adds gauges read from the engine at each scrape: the
// domains' state, and each named tenant's queue, buckets, credit and
// spend (one engine lookup per named tenant, so a scrape costs
// O(MaxTenantSeries), never O(tenants)).
func (m *Metrics) RegisterState(v Views) {
	m.Registry.MustRegister(&stateCollector{v: v, tenants: m.tenants})
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
	descUtil = prometheus.NewDesc("sluice_domain_utilization_ratio",
		"Share of the domain's soft-capacity burst in use per phase (prefill: SM-bound FLOPs, decode: HBM bytes): 1 − level/burst; 1 means the bucket is empty and requests wait.", []string{"domain", "phase"}, nil)
	descUse = prometheus.NewDesc("sluice_domain_use_ratio",
		"Share of the whole domain's prefill or decode rate taken of late (a moving average over the capacity loop's periods): how busy the domain is, where sluice_domain_utilization_ratio says how much of a burst is spent.", []string{"domain", "phase"}, nil)
	descLoad = prometheus.NewDesc("sluice_domain_load_ratio",
		"The placement's load of the domain for spreading: the larger of its use, its KV in use and its engines' signals against their thresholds.", []string{"domain"}, nil)
	descWarmup = prometheus.NewDesc("sluice_domain_warmup_fraction",
		"Share of its shared capacity the domain has while it warms up after a return (undrained, GPUs back, new after start-up): warmup.start_fraction rising linearly to 1 over warmup.period; 1 when whole.", []string{"domain"}, nil)
	descFactor = prometheus.NewDesc("sluice_domain_capacity_factor",
		"The capacity loop's correction of the domain's model: its rates are the model's times this (1: the model; below 1: its engines sustain less).", []string{"domain"}, nil)
	descEffectiveRate = prometheus.NewDesc("sluice_domain_effective_rate",
		"The whole domain's soft-capacity rate as corrected by the capacity loop, per phase (prefill FLOP/s, decode B/s).", []string{"domain", "phase"}, nil)
	descPriorRate = prometheus.NewDesc("sluice_domain_prior_rate",
		"The whole domain's soft-capacity rate as the model gives it, per phase (prefill FLOP/s, decode B/s).", []string{"domain", "phase"}, nil)
	descEngineQueue = prometheus.NewDesc("sluice_domain_engine_queue",
		"Requests waiting in the domain's serving engines, as their metrics last said (domains whose engines were read).", []string{"domain"}, nil)
	descEngineKV = prometheus.NewDesc("sluice_domain_engine_kv_usage_ratio",
		"The fullest of the domain's serving engines' KV-cache use, 0 to 1, as their metrics last said.", []string{"domain"}, nil)
	descEngineAge = prometheus.NewDesc("sluice_domain_engine_metrics_age_seconds",
		"Age of the domain's engine signals; past feedback.stale they are not acted on.", []string{"domain"}, nil)
	descEngineSaturated = prometheus.NewDesc("sluice_domain_engine_saturated",
		"1 while the domain's engines are saturated (their queue at feedback.queue_threshold or past it, or KV use past kv_threshold): only floor traffic is placed there.", []string{"domain"}, nil)
	descFloorsShort = prometheus.NewDesc("sluice_domain_floors_short",
		"1 while the floor reserves given to the domain ask more than its corrected rates hold.", []string{"domain"}, nil)
	descFrozen = prometheus.NewDesc("sluice_burst_credit_frozen",
		"1 while an operator has frozen every tenant's burst credit (FreezeBurstCredit; over-quota requests are BURST_CREDIT_FROZEN).", nil, nil)
	descFrozenLeft = prometheus.NewDesc("sluice_burst_credit_frozen_seconds",
		"Seconds until the credit freeze ends; 0 when none.", nil, nil)
	descTenantQueue = prometheus.NewDesc("sluice_tenant_queue_length",
		"Requests the tenant has waiting in the fair queue (tenant=\"other\": everybody else's).", []string{"tenant"}, nil)
	descTenantLevel = prometheus.NewDesc("sluice_tenant_token_bucket_level_tokens",
		"The tenant's token bucket level in weighted tokens (negative: borrowed from burst credit).", []string{"tenant"}, nil)
	descTenantBurst = prometheus.NewDesc("sluice_tenant_token_bucket_burst_tokens",
		"The tenant's token bucket burst in weighted tokens.", []string{"tenant"}, nil)
	descTenantCredit = prometheus.NewDesc("sluice_tenant_burst_credit_limit_tokens",
		"How far the tenant's token bucket may go into debt (weighted tokens).", []string{"tenant"}, nil)
	descTenantDebt = prometheus.NewDesc("sluice_tenant_burst_credit_debt_tokens",
		"Burst credit the tenant owes now (weighted tokens).", []string{"tenant"}, nil)
	descTenantBreaker = prometheus.NewDesc("sluice_tenant_breaker_open",
		"1 while the tenant's burst-credit breaker is open (BURST_CREDIT_EXHAUSTED).", []string{"tenant"}, nil)
	descTenantInFlight = prometheus.NewDesc("sluice_tenant_in_flight",
		"Leases the tenant holds.", []string{"tenant"}, nil)
	descTenantSpent = prometheus.NewDesc("sluice_tenant_spent_usd",
		"The tenant's spend in the current UTC day or month (period), against its budget.", []string{"tenant", "period"}, nil)
)

type stateCollector struct {
	v       Views
	tenants *tenantSet
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLevel, descKV, descKVLimit, descInFlight, descDraining, descWeight, descQueue, descLeases, descIdemRecords, descIdemEvicted,
		descUtil, descUse, descLoad, descWarmup, descFactor, descEffectiveRate, descPriorRate, descEngineQueue, descEngineKV, descEngineAge, descEngineSaturated, descFloorsShort, descFrozen, descFrozenLeft, descTenantQueue, descTenantLevel, descTenantBurst, descTenantCredit, descTenantDebt, descTenantBreaker, descTenantInFlight, descTenantSpent} {
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
		ch <- prometheus.MustNewConstMetric(descUtil, prometheus.GaugeValue, max(0, 1-ratio(d.PrefillLevel, d.PrefillBurst)), d.ID, "prefill")
		ch <- prometheus.MustNewConstMetric(descUtil, prometheus.GaugeValue, max(0, 1-ratio(d.DecodeLevel, d.DecodeBurst)), d.ID, "decode")
		ch <- prometheus.MustNewConstMetric(descUse, prometheus.GaugeValue, d.PrefillUse, d.ID, "prefill")
		ch <- prometheus.MustNewConstMetric(descUse, prometheus.GaugeValue, d.DecodeUse, d.ID, "decode")
		ch <- prometheus.MustNewConstMetric(descLoad, prometheus.GaugeValue, d.Load, d.ID)
		warm := 1.0
		if d.WarmupLeft > 0 {
			warm = d.WarmupFraction
		}
		ch <- prometheus.MustNewConstMetric(descWarmup, prometheus.GaugeValue, warm, d.ID)
		collectFeedback(ch, &d)
	}
	if cv, ok := c.v.(CreditViews); ok {
		frozen, left := 0.0, 0.0
		if f, ok := cv.CreditFrozen(); ok {
			frozen, left = 1, max(0, time.Until(f.Until).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(descFrozen, prometheus.GaugeValue, frozen)
		ch <- prometheus.MustNewConstMetric(descFrozenLeft, prometheus.GaugeValue, left)
	}
	queued := c.v.QueueLen()
	ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(queued))
	c.collectTenants(ch, queued)
	ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(c.v.LeaseCount()))
	records, evicted := c.v.IdempotencyRecords()
	ch <- prometheus.MustNewConstMetric(descIdemRecords, prometheus.GaugeValue, float64(records))
	ch <- prometheus.MustNewConstMetric(descIdemEvicted, prometheus.CounterValue, float64(evicted))
}

// collectFeedback reports a domain's capacity loop; the engine series
// only for a domain whose engines were read.
func collectFeedback(ch chan<- prometheus.Metric, d *admission.DomainInfo) {
	ch <- prometheus.MustNewConstMetric(descFactor, prometheus.GaugeValue, d.CapacityFactor, d.ID)
	ch <- prometheus.MustNewConstMetric(descEffectiveRate, prometheus.GaugeValue, float64(d.EffectivePrefillRate), d.ID, "prefill")
	ch <- prometheus.MustNewConstMetric(descEffectiveRate, prometheus.GaugeValue, float64(d.EffectiveDecodeRate), d.ID, "decode")
	ch <- prometheus.MustNewConstMetric(descPriorRate, prometheus.GaugeValue, float64(d.PriorPrefillRate), d.ID, "prefill")
	ch <- prometheus.MustNewConstMetric(descPriorRate, prometheus.GaugeValue, float64(d.PriorDecodeRate), d.ID, "decode")
	ch <- prometheus.MustNewConstMetric(descFloorsShort, prometheus.GaugeValue, boolGauge(d.FloorsShort), d.ID)
	if d.EngineMetricsAge > 0 || d.EngineMetricsStale {
		ch <- prometheus.MustNewConstMetric(descEngineQueue, prometheus.GaugeValue, d.EngineQueue, d.ID)
		ch <- prometheus.MustNewConstMetric(descEngineKV, prometheus.GaugeValue, d.EngineKVUsage, d.ID)
		ch <- prometheus.MustNewConstMetric(descEngineAge, prometheus.GaugeValue, d.EngineMetricsAge.Seconds(), d.ID)
		ch <- prometheus.MustNewConstMetric(descEngineSaturated, prometheus.GaugeValue, boolGauge(d.EngineSaturated), d.ID)
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func ratio(level, burst int64) float64 {
	if burst <= 0 {
		return 0
	}
	return float64(level) / float64(burst)
}

// collectTenants reports the named tenants' state; the queue of everybody
// else is the total less theirs (the two reads are not atomic, so it is
// clamped at 0). Bucket levels have no "other": a sum of levels means nothing.
func (c *stateCollector) collectTenants(ch chan<- prometheus.Metric, queued int) {
	rest := queued
	for _, name := range c.tenants.names() {
		t, ok := c.v.Tenant(name)
		if !ok {
			continue // removed from the config; its series go at the next ranking
		}
		rest -= t.Queued
		ch <- prometheus.MustNewConstMetric(descTenantQueue, prometheus.GaugeValue, float64(t.Queued), name)
		ch <- prometheus.MustNewConstMetric(descTenantLevel, prometheus.GaugeValue, float64(t.TokenLevel), name)
		ch <- prometheus.MustNewConstMetric(descTenantBurst, prometheus.GaugeValue, float64(t.TokenBurst), name)
		ch <- prometheus.MustNewConstMetric(descTenantCredit, prometheus.GaugeValue, float64(t.Credit), name)
		ch <- prometheus.MustNewConstMetric(descTenantDebt, prometheus.GaugeValue, float64(max(0, -t.TokenLevel)), name)
		breaker := 0.0
		if t.BreakerOpen {
			breaker = 1
		}
		ch <- prometheus.MustNewConstMetric(descTenantBreaker, prometheus.GaugeValue, breaker, name)
		ch <- prometheus.MustNewConstMetric(descTenantInFlight, prometheus.GaugeValue, float64(t.InFlight), name)
		ch <- prometheus.MustNewConstMetric(descTenantSpent, prometheus.GaugeValue, float64(t.SpentTodayMicros)/1e6, name, "day")
		ch <- prometheus.MustNewConstMetric(descTenantSpent, prometheus.GaugeValue, float64(t.SpentMonthMicros)/1e6, name, "month")
	}
	ch <- prometheus.MustNewConstMetric(descTenantQueue, prometheus.GaugeValue, float64(max(0, rest)), OtherTenant)
}
