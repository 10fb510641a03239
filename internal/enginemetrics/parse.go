package enginemetrics

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The engine kinds built in. Options.Kinds may add others or replace these.
const (
	KindVLLM   = "vllm"
	KindSGLang = "sglang"
)

// Names are the metric names one engine kind exports for the signals read.
// An empty name is a signal that kind does not export; Queue and KVUsage may
// not both be empty, since a kind with neither says nothing about saturation.
type Names struct {
	// Queue is the gauge of requests waiting for a slot.
	Queue string
	// KVUsage is the gauge of the KV cache's used fraction, 0..1.
	KVUsage string
	// KVUsageFallback is read only when KVUsage is absent, so one engine
	// version or the next is read by the same kind without counting a
	// renamed gauge twice (vLLM renamed gpu_cache_usage_perc to
	// kv_cache_usage_perc).
	KVUsageFallback string
	// Running is the gauge of requests being served; it is informational
	// (a busy engine is not a saturated one) and may be empty.
	Running string
}

// builtin holds the names of the model-server protocol's engines.
var builtin = map[string]Names{
	KindVLLM: {
		Queue:           "vllm:num_requests_waiting",
		KVUsage:         "vllm:kv_cache_usage_perc",
		KVUsageFallback: "vllm:gpu_cache_usage_perc",
		Running:         "vllm:num_requests_running",
	},
	KindSGLang: {
		Queue:   "sglang:num_queue_reqs",
		KVUsage: "sglang:token_usage",
		Running: "sglang:num_running_reqs",
	},
}

// BuiltinNames returns the names built in for kind ("vllm" or "sglang"). It
// returns a copy, so no caller can change what every Reader reads.
func BuiltinNames(kind string) (Names, bool) {
	n, ok := builtin[kind]
	return n, ok
}

// validate says why n cannot describe an engine, or nil.
func (n Names) validate() error {
	if n.Queue == "" && n.KVUsage == "" {
		return errors.New("names neither a queue nor a KV-usage metric")
	}
	if n.KVUsageFallback != "" && n.KVUsage == "" {
		return errors.New("names a KV-usage fallback without a KV-usage metric")
	}
	return nil
}

// Sample is what one endpoint's exposition said. A signal the exposition
// lacked reads 0.
type Sample struct {
	// Queue is the waiting gauge summed over its series.
	Queue float64
	// Running is the running gauge summed over its series.
	Running float64
	// KVUsage is the largest KV-usage series: the fullest engine decides.
	KVUsage float64
}

// The bounds of a sane reading. A value past them is not an engine's
// state but a broken exporter's (or a gauge in other units), and two of
// them summed may overflow to +Inf.
const (
	// MaxRequests bounds one series of a queue or running gauge: more
	// requests than any engine holds.
	MaxRequests = 1 << 24
	// MaxKVUsage bounds one series of a KV-usage gauge, a fraction: a
	// little past 1 is an engine's rounding and reads as full; a
	// percentage (85 for 85%) is past it.
	MaxKVUsage = 1.5
)

// The reasons a value is not a reading, as InvalidReadingError.Reason
// gives them.
const (
	ReasonNegative = "negative"
	ReasonNaN      = "nan"
	ReasonInfinite = "infinite"
	ReasonTooLarge = "too_large"
)

// InvalidReadingError says that a series of a metric read holds a value
// that is no reading: negative, NaN, infinite or past its bound
// (MaxRequests, MaxKVUsage). The endpoint's whole reading is then
// invalid: an engine that reports one number wrong may report the others
// wrong too, and a sum that took it in would hide the other engines'
// saturation or invent some.
type InvalidReadingError struct {
	// Metric is the metric's name.
	Metric string
	// Value is the value read.
	Value float64
	// Reason is ReasonNegative, ReasonNaN, ReasonInfinite or
	// ReasonTooLarge.
	Reason string
}

func (e *InvalidReadingError) Error() string {
	return fmt.Sprintf("%s is %g, not a reading (%s)", e.Metric, e.Value, e.Reason)
}

// Parse reads one endpoint's exposition, in the Prometheus text format, for
// the metrics in names. Families it does not name (histograms, counters,
// info gauges) are parsed and ignored. It fails when the exposition does not
// parse, or when it holds neither the queue nor the KV-usage metric, since
// then the endpoint is not the engine it was said to be (or not yet up); the
// error names the metrics looked for. Only one of the two missing reads as 0.
// It fails with an *InvalidReadingError when a series of a metric it reads
// is negative, NaN, infinite or past its bound.
func Parse(r io.Reader, names Names) (Sample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Sample{}, fmt.Errorf("parse exposition: %w", err)
	}
	var s Sample
	queue, qok, err := sum(families[names.Queue], MaxRequests)
	if err != nil {
		return Sample{}, err
	}
	kv, kok, err := maxValue(families[names.KVUsage])
	if err != nil {
		return Sample{}, err
	}
	if !kok && names.KVUsageFallback != "" {
		if kv, kok, err = maxValue(families[names.KVUsageFallback]); err != nil {
			return Sample{}, err
		}
	}
	if !qok && !kok {
		return Sample{}, fmt.Errorf("exposition has none of %s", names.looked())
	}
	s.Queue, s.KVUsage = queue, kv
	if s.Running, _, err = sum(families[names.Running], MaxRequests); err != nil {
		return Sample{}, err
	}
	return s, nil
}

// looked lists the saturation metrics n names, for an error.
func (n Names) looked() string {
	var l []string
	for _, name := range []string{n.Queue, n.KVUsage, n.KVUsageFallback} {
		if name != "" {
			l = append(l, fmt.Sprintf("%q", name))
		}
	}
	return strings.Join(l, ", ")
}

// sum adds up a family's series, each at most bound; ok is false when it
// has none usable.
func sum(mf *dto.MetricFamily, bound float64) (v float64, ok bool, err error) {
	for _, m := range mf.GetMetric() {
		x, good := value(mf.GetType(), m)
		if !good {
			continue
		}
		if err := check(mf.GetName(), x, bound); err != nil {
			return 0, false, err
		}
		v += x
		ok = true
	}
	return v, ok, nil
}

// maxValue is the largest of a KV-usage family's series; ok is false when
// it has none usable.
func maxValue(mf *dto.MetricFamily) (v float64, ok bool, err error) {
	for _, m := range mf.GetMetric() {
		x, good := value(mf.GetType(), m)
		if !good {
			continue
		}
		if err := check(mf.GetName(), x, MaxKVUsage); err != nil {
			return 0, false, err
		}
		if !ok || x > v {
			v, ok = x, true
		}
	}
	return v, ok, nil
}

// check says why x, a series of metric, is no reading (bound is the
// largest sane), or nil.
func check(metric string, x, bound float64) error {
	reason := ""
	switch {
	case math.IsNaN(x):
		reason = ReasonNaN
	case math.IsInf(x, 0):
		reason = ReasonInfinite
	case x < 0:
		reason = ReasonNegative
	case x > bound:
		reason = ReasonTooLarge
	default:
		return nil
	}
	return &InvalidReadingError{Metric: metric, Value: x, Reason: reason}
}

// value reads one series of a scalar family; a histogram or summary under
// a gauge's name is no series of it.
func value(t dto.MetricType, m *dto.Metric) (float64, bool) {
	switch t {
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue(), true
	case dto.MetricType_UNTYPED:
		return m.GetUntyped().GetValue(), true
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue(), true
	}
	return 0, false
}
