package metrics

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// latencyVec is sluice_admit_latency_seconds: one native histogram with
// classic buckets per (tenant, model), as client_golang's HistogramVec with
// NativeHistogramBucketFactor 1.1 exposes it (schema 3), but observed into
// flat arrays of atomic counters. client_golang keeps a native histogram's
// buckets in a sync.Map, and finding the bucket there costs an Admit over
// gRPC ~2 µs of cache misses (its trie nodes are cold between two calls);
// here it is one atomic add at a computed index. Scrapes build the
// exposition with client_golang's own encoder (NewConstNativeHistogram).
type latencyVec struct {
	desc *prometheus.Desc
	mu   sync.Mutex
	all  map[[2]string]*latencySeries // tenant, model
}

func newLatencyVec(name, help string) *latencyVec {
	return &latencyVec{
		desc: prometheus.NewDesc(name, help, []string{"tenant", "model"}, nil),
		all:  make(map[[2]string]*latencySeries),
	}
}

// with returns the series of (tenant, model), made on first use.
func (v *latencyVec) with(tenant, model string) *latencySeries {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := [2]string{tenant, model}
	s, ok := v.all[k]
	if !ok {
		s = &latencySeries{tenant: tenant, model: model, created: time.Now()}
		v.all[k] = s
	}
	return s
}

// deleteTenant drops every series of tenant.
func (v *latencyVec) deleteTenant(tenant string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for k := range v.all {
		if k[0] == tenant {
			delete(v.all, k)
		}
	}
}

// Describe implements prometheus.Collector.
func (v *latencyVec) Describe(ch chan<- *prometheus.Desc) { ch <- v.desc }

// Collect implements prometheus.Collector.
func (v *latencyVec) Collect(ch chan<- prometheus.Metric) {
	v.mu.Lock()
	all := make([]*latencySeries, 0, len(v.all))
	for _, s := range v.all {
		all = append(all, s)
	}
	v.mu.Unlock()
	for _, s := range all {
		ch <- s.metric(v.desc)
	}
}

// The native buckets: schema 3 (each bucket 2^(1/8) wider than the last),
// bucket i holding (2^((i-1)/8), 2^(i/8)] seconds. Indexes nativeLow up to
// nativeLow+nativeSlots-1 (0.14 µs to 512 s) are counted in a flat array;
// the rare latency outside it in a locked map.
const (
	latencySchema     = 3
	latencyMaxBuckets = 160 // populated buckets a scrape shows at most, as NativeHistogramMaxBucketNumber
	nativeLow         = -184
	nativeSlots       = 256
)

// nativeBounds are client_golang's schema-3 bounds of a mantissa in
// [0.5, 1) (its nativeHistogramBounds[3]): a value's bucket is found as it
// finds it, so that both agree to the last bit.
var nativeBounds = [1 << latencySchema]float64{
	0.5, 0.5452538663326288, 0.5946035575013605, 0.6484197773255048,
	0.7071067811865475, 0.7711054127039704, 0.8408964152537144, 0.9170040432046711,
}

// nativeZeroThreshold is client_golang's default zero bucket width
// (DefNativeHistogramZeroThreshold, 2^-128).
const nativeZeroThreshold = prometheus.DefNativeHistogramZeroThreshold

// latencySeries is one (tenant, model) histogram. Observe adds to the sum,
// then to the native bucket, then to the classic one; a scrape reads the
// classic counts first and takes the count from the native buckets, so a
// scrape during an observation never shows a classic bucket above the
// count, nor a count unequal to its buckets' sum.
type latencySeries struct {
	tenant, model string
	created       time.Time
	sumBits       atomic.Uint64
	zero          atomic.Uint64
	native        [nativeSlots]atomic.Uint64
	classic       [len(latencyBuckets)]atomic.Uint64 // not cumulative; +Inf is the count
	wide          struct {
		sync.Mutex
		counts map[int]uint64 // native buckets outside the array
	}
}

// Observe records a latency of seconds: finite (a time.Duration's), and
// a negative one counts as zero (latencies come from a monotonic clock).
func (s *latencySeries) Observe(seconds float64) {
	seconds = max(seconds, 0)
	for {
		old := s.sumBits.Load()
		if s.sumBits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+seconds)) {
			break
		}
	}
	if seconds <= nativeZeroThreshold {
		s.zero.Add(1)
	} else if i := nativeIndex(seconds); i >= nativeLow && i < nativeLow+nativeSlots {
		s.native[i-nativeLow].Add(1)
	} else {
		s.wide.Lock()
		if s.wide.counts == nil {
			s.wide.counts = make(map[int]uint64)
		}
		s.wide.counts[i]++
		s.wide.Unlock()
	}
	if i := classicIndex(seconds); i < len(s.classic) {
		s.classic[i].Add(1)
	}
}

// nativeIndex is the schema-3 bucket of a finite v > 0, as client_golang
// computes it: the mantissa's place among the bounds, plus 8 per octave.
func nativeIndex(v float64) int {
	frac, exp := math.Frexp(v)
	i, _ := slices.BinarySearch(nativeBounds[:], frac)
	return i + (exp-1)*len(nativeBounds)
}

// classicIndex is the first classic bucket whose upper bound is ≥ v, or
// len(latencyBuckets) for none (+Inf).
func classicIndex(v float64) int {
	i, _ := slices.BinarySearch(latencyBuckets[:], v)
	return i
}

// metric is the series' exposition now.
func (s *latencySeries) metric(desc *prometheus.Desc) prometheus.Metric {
	var classic [len(latencyBuckets)]uint64
	for i := range classic {
		classic[i] = s.classic[i].Load()
	}
	buckets := make(map[int]int64)
	for i := range s.native {
		if n := s.native[i].Load(); n > 0 {
			buckets[i+nativeLow] = int64(n)
		}
	}
	s.wide.Lock()
	for i, n := range s.wide.counts {
		buckets[i] = int64(n)
	}
	s.wide.Unlock()
	zero := s.zero.Load()
	count := zero
	for _, n := range buckets {
		count += uint64(n)
	}
	schema := int32(latencySchema)
	for len(buckets) > latencyMaxBuckets {
		buckets = halveResolution(buckets)
		schema--
	}
	native, err := prometheus.NewConstNativeHistogram(desc, count, math.Float64frombits(s.sumBits.Load()),
		buckets, nil, zero, schema, nativeZeroThreshold, s.created, s.tenant, s.model)
	if err != nil {
		return prometheus.NewInvalidMetric(desc, err)
	}
	return withClassic{native, classic}
}

// halveResolution merges a native histogram's buckets pairwise: bucket i
// at schema s lies in bucket ⌈i/2⌉ at schema s-1.
func halveResolution(buckets map[int]int64) map[int]int64 {
	out := make(map[int]int64, len(buckets)/2+1)
	for i, n := range buckets {
		out[(i+1)>>1] += n
	}
	return out
}

// withClassic is a native histogram with the classic buckets beside it.
type withClassic struct {
	prometheus.Metric
	classic [len(latencyBuckets)]uint64 // not cumulative
}

// Write implements prometheus.Metric.
func (m withClassic) Write(out *dto.Metric) error {
	if err := m.Metric.Write(out); err != nil {
		return err
	}
	h := out.GetHistogram()
	h.Bucket = make([]*dto.Bucket, len(latencyBuckets))
	var cum uint64
	for i, le := range latencyBuckets {
		cum += m.classic[i]
		h.Bucket[i] = &dto.Bucket{CumulativeCount: new(cum), UpperBound: new(le)}
	}
	return nil
}
