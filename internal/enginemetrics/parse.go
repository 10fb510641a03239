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

// Parse reads one endpoint's exposition, in the Prometheus text format, for
// the metrics in names. Families it does not name (histograms, counters,
// info gauges) are parsed and ignored. It fails when the exposition does not
// parse, or when it holds neither the queue nor the KV-usage metric, since
// then the endpoint is not the engine it was said to be (or not yet up); the
// error names the metrics looked for. Only one of the two missing reads as 0.
func Parse(r io.Reader, names Names) (Sample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Sample{}, fmt.Errorf("parse exposition: %w", err)
	}
	var s Sample
	queue, qok := sum(families[names.Queue])
	kv, kok := maxValue(families[names.KVUsage])
	if !kok && names.KVUsageFallback != "" {
		kv, kok = maxValue(families[names.KVUsageFallback])
	}
	if !qok && !kok {
		return Sample{}, fmt.Errorf("exposition has none of %s", names.looked())
	}
	s.Queue, s.KVUsage = queue, kv
	s.Running, _ = sum(families[names.Running])
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

// sum adds up a family's series; ok is false when it has none usable.
func sum(mf *dto.MetricFamily) (v float64, ok bool) {
	for _, m := range mf.GetMetric() {
		if x, good := value(mf.GetType(), m); good {
			v += x
			ok = true
		}
	}
	return v, ok
}

// maxValue is the largest of a family's series; ok is false when it has none
// usable.
func maxValue(mf *dto.MetricFamily) (v float64, ok bool) {
	for _, m := range mf.GetMetric() {
		if x, good := value(mf.GetType(), m); good && (!ok || x > v) {
			v, ok = x, true
		}
	}
	return v, ok
}

// value reads one series of a scalar family. A histogram or summary under a
// gauge's name, or a NaN or infinite value (an engine that has not measured
// yet), is no reading rather than a number that would poison a sum.
func value(t dto.MetricType, m *dto.Metric) (float64, bool) {
	var v float64
	switch t {
	case dto.MetricType_GAUGE:
		v = m.GetGauge().GetValue()
	case dto.MetricType_UNTYPED:
		v = m.GetUntyped().GetValue()
	case dto.MetricType_COUNTER:
		v = m.GetCounter().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}
