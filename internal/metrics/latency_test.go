package metrics

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"
)

// gatherOne scrapes reg and returns its one family.
func gatherOne(t *rapid.T, reg *prometheus.Registry) *dto.MetricFamily {
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	if len(fams) != 1 {
		t.Fatalf("%d families, want 1", len(fams))
	}
	for _, m := range fams[0].Metric {
		m.Histogram.CreatedTimestamp = nil // each side's own clock
	}
	return fams[0]
}

// latencies draws latencies spanning at most 18 octaves (so that both sides
// keep schema 3: ≤ 160 buckets) anywhere from 2^-40 s to 2^20 s (in and
// outside latencySeries' flat window), and some exact zeros.
func latencies(t *rapid.T) []float64 {
	low := rapid.IntRange(-40, 2).Draw(t, "lowOctave")
	return rapid.SliceOfN(rapid.Custom(func(t *rapid.T) float64 {
		if rapid.IntRange(0, 20).Draw(t, "zero?") == 0 {
			return 0
		}
		frac := rapid.Float64Range(0.5, 1).Draw(t, "mantissa")
		return math.Ldexp(frac, low+rapid.IntRange(0, 18).Draw(t, "octave"))
	}), 1, 400).Draw(t, "latencies")
}

// TestLatencyMatchesClientGolang: for any latencies, the scrape of
// latencyVec is the scrape client_golang's HistogramVec gives with the
// options sluice_admit_latency_seconds had (native, factor 1.1, the classic
// buckets): counts, sum, classic buckets, schema, zero bucket and spans.
func TestLatencyMatchesClientGolang(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const name, help = "sluice_admit_latency_seconds", "h"
		ref := prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: name, Help: help, Buckets: latencyBuckets[:],
			NativeHistogramBucketFactor: 1.1, NativeHistogramMaxBucketNumber: latencyMaxBuckets,
			NativeHistogramMinResetDuration: time.Hour,
		}, []string{"tenant", "model"})
		ours := newLatencyVec(name, help)
		refReg, ourReg := prometheus.NewRegistry(), prometheus.NewRegistry()
		refReg.MustRegister(ref)
		ourReg.MustRegister(ours)
		for _, model := range []string{"large", "small"} {
			r, o := ref.WithLabelValues("acme", model), ours.with("acme", model)
			for _, v := range latencies(t) {
				r.Observe(v)
				o.Observe(v)
			}
		}
		want, got := gatherOne(t, refReg), gatherOne(t, ourReg)
		if !proto.Equal(want, got) {
			t.Fatalf("scrapes differ:\nclient_golang %v\nlatencyVec    %v", want, got)
		}
	})
}

// TestLatencyWideSpreadHalvesResolution: latencies spread over more than
// 160 schema-3 buckets are shown at a coarser schema with at most 160
// buckets, every observation still counted.
func TestLatencyWideSpreadHalvesResolution(t *testing.T) {
	v := newLatencyVec("l", "h")
	s := v.with("acme", "small")
	var n uint64
	for e := -30; e < 10; e++ { // 40 octaves: 320 buckets at schema 3
		for k := range 8 {
			s.Observe(math.Ldexp(1+float64(k)/8, e))
			n++
		}
	}
	var m dto.Metric
	if err := s.metric(v.desc).Write(&m); err != nil {
		t.Fatal(err)
	}
	h := m.GetHistogram()
	buckets := 0
	for _, sp := range h.GetPositiveSpan() {
		buckets += int(sp.GetLength())
	}
	if h.GetSchema() != 1 || buckets > latencyMaxBuckets || h.GetSampleCount() != n {
		t.Fatalf("schema %d, %d buckets, count %d; want schema 1, ≤ %d buckets, count %d",
			h.GetSchema(), buckets, h.GetSampleCount(), latencyMaxBuckets, n)
	}
	var count, sum int64 // the deltas give each bucket's count from the last one's
	for _, d := range h.GetPositiveDelta() {
		count += d
		sum += count
	}
	if uint64(sum) != n {
		t.Fatalf("buckets hold %d observations, want %d", sum, n)
	}
}

// TestLatencyScrapeDuringObserve: a scrape concurrent with observations
// never shows a classic bucket above the count, and the count is always
// the sum of the native buckets (run with -race).
func TestLatencyScrapeDuringObserve(t *testing.T) {
	v := newLatencyVec("l", "h")
	s := v.with("acme", "small")
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := range 20000 {
				s.Observe(float64(i%1000+w) * 1e-5)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	scrape := func() *dto.Histogram {
		var m dto.Metric
		if err := s.metric(v.desc).Write(&m); err != nil {
			t.Fatal(err) // NewConstNativeHistogram refuses a count unequal to its buckets' sum
		}
		h := m.GetHistogram()
		for _, b := range h.GetBucket() {
			if b.GetCumulativeCount() > h.GetSampleCount() {
				t.Fatalf("bucket le=%g holds %d > count %d", b.GetUpperBound(), b.GetCumulativeCount(), h.GetSampleCount())
			}
		}
		return h
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			scrape()
		}
	}
	if h := scrape(); h.GetSampleCount() != 40000 || h.GetBucket()[len(latencyBuckets)-1].GetCumulativeCount() != 40000 {
		t.Fatalf("after every observation: count %d, le=30 %d; want 40000", h.GetSampleCount(), h.GetBucket()[len(latencyBuckets)-1].GetCumulativeCount())
	}
}
