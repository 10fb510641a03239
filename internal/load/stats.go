package load

import (
	"cmp"
	"maps"
	"math/bits"
	"slices"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"google.golang.org/grpc/codes"
)

// Histogram bounds, in nanoseconds: 1 ns to 1 h at three significant
// digits, so a loopback call of tens of microseconds and a queued wait of
// seconds are each read to 0.1%.
const (
	histLowest  = 1
	histHighest = int64(time.Hour)
	histDigits  = 3
)

// shard is one recorder, shared by the callers that map to it.
type shard struct {
	mu sync.Mutex
	st *stats
}

// tenantStats are one tenant's answers, or a pool's: then drawn has a bit
// for each of its names, set once the name was called.
type tenantStats struct {
	admitted, degraded, errors int64
	refusals                   map[string]int64
	pool                       int
	drawn                      []uint64
}

// firstError is the earliest error of a kind a run met, with when, so
// that shards merge to the one met first.
type firstError struct {
	at  time.Time
	msg string
}

// note keeps err as the first error unless an earlier one is kept.
func (f *firstError) note(at time.Time, err error) {
	if f.msg == "" || at.Before(f.at) {
		f.at, f.msg = at, err.Error()
	}
}

// merge keeps the earlier of f and o.
func (f *firstError) merge(o firstError) {
	if o.msg != "" && (f.msg == "" || o.at.Before(f.at)) {
		*f = o
	}
}

// stats are what a run (or a shard of it) recorded.
type stats struct {
	calls, held, released, dropped int64
	tenants                        map[string]*tenantStats
	admitErrors, releaseErrors     map[codes.Code]int64
	// firstAdmitError and firstReleaseError are the first error messages
	// (the counts by code say how many; the message says why).
	firstAdmitError, firstReleaseError firstError
	admit, queued, release, lag        *hdrhistogram.Histogram
	// clientCPU and serverCPU are the processes' CPU time over the run
	// (set by drive, summed by merge across rounds).
	clientCPU, serverCPU time.Duration
	serverCPUKnown       bool
	// churn is what Options.Churn did during the run (nil: none).
	churn *ChurnResult
}

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(histLowest, histHighest, histDigits) }

func newStats() *stats {
	return &stats{
		tenants:     map[string]*tenantStats{},
		admitErrors: map[codes.Code]int64{}, releaseErrors: map[codes.Code]int64{},
		admit: newHist(), queued: newHist(), release: newHist(), lag: newHist(),
	}
}

func (s *stats) tenant(name string) *tenantStats {
	t := s.tenants[name]
	if t == nil {
		t = &tenantStats{refusals: map[string]int64{}}
		s.tenants[name] = t
	}
	return t
}

// tenantOf is the row a's answers count under: its tenant's, or its
// pool's, with a's name marked as called.
func (s *stats) tenantOf(a Arrival) *tenantStats {
	if a.poolSize == 0 {
		return s.tenant(a.Tenant)
	}
	t := s.tenant(a.row)
	t.growPool(a.poolSize)
	t.drawn[a.index/64] |= 1 << (a.index % 64)
	return t
}

// growPool makes room for a pool of n names: two entries of one pattern
// share its row, the larger count its size.
func (t *tenantStats) growPool(n int) {
	t.pool = max(t.pool, n)
	if need := (n + 63) / 64; len(t.drawn) < need {
		t.drawn = append(t.drawn, make([]uint64, need-len(t.drawn))...)
	}
}

// record adds d to h, clamped to the histogram's range (a value outside it
// would be dropped silently).
func record(h *hdrhistogram.Histogram, d time.Duration) {
	_ = h.RecordValue(min(max(int64(d), histLowest), histHighest))
}

func (s *stats) recordAdmitLatency(d time.Duration)   { record(s.admit, d) }
func (s *stats) recordReleaseLatency(d time.Duration) { record(s.release, d) }
func (s *stats) recordLag(d time.Duration)            { record(s.lag, d) }

// recordQueued records an admission's queued time; 0 (admitted at once)
// counts, so that the percentiles are over every admission.
func (s *stats) recordQueued(d time.Duration) {
	_ = s.queued.RecordValue(min(max(int64(d), 0), histHighest))
}

// merge adds o into s.
func (s *stats) merge(o *stats) {
	s.clientCPU += o.clientCPU
	s.serverCPU += o.serverCPU
	s.serverCPUKnown = o.serverCPUKnown && (s.serverCPUKnown || s.calls == 0)
	s.calls += o.calls
	s.held += o.held
	s.released += o.released
	s.dropped += o.dropped
	for name, ot := range o.tenants {
		t := s.tenant(name)
		t.admitted += ot.admitted
		t.degraded += ot.degraded
		t.errors += ot.errors
		for r, n := range ot.refusals {
			t.refusals[r] += n
		}
		if ot.drawn != nil {
			t.growPool(ot.pool)
			for i, w := range ot.drawn {
				t.drawn[i] |= w
			}
		}
	}
	s.churn = s.churn.merge(o.churn)
	s.firstAdmitError.merge(o.firstAdmitError)
	s.firstReleaseError.merge(o.firstReleaseError)
	for c, n := range o.admitErrors {
		s.admitErrors[c] += n
	}
	for c, n := range o.releaseErrors {
		s.releaseErrors[c] += n
	}
	s.admit.Merge(o.admit)
	s.queued.Merge(o.queued)
	s.release.Merge(o.release)
	s.lag.Merge(o.lag)
}

// Percentiles summarise a histogram, in microseconds.
type Percentiles struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50Us"`
	P90   float64 `json:"p90Us"`
	P99   float64 `json:"p99Us"`
	P999  float64 `json:"p999Us"`
	Max   float64 `json:"maxUs"`
}

func percentiles(h *hdrhistogram.Histogram) Percentiles {
	us := func(v int64) float64 { return float64(v) / 1e3 }
	if h.TotalCount() == 0 {
		return Percentiles{}
	}
	return Percentiles{
		Count: h.TotalCount(),
		P50:   us(h.ValueAtQuantile(50)), P90: us(h.ValueAtQuantile(90)), P99: us(h.ValueAtQuantile(99)),
		P999: us(h.ValueAtQuantile(99.9)), Max: us(h.Max()),
	}
}

// TenantResult is one tenant's answers over a run.
type TenantResult struct {
	Tenant   string `json:"tenant"`
	Requests int64  `json:"requests"` // Admit calls: answers and errors
	Admitted int64  `json:"admitted"`
	Degraded int64  `json:"degraded"`
	Rejected int64  `json:"rejected"`
	Errors   int64  `json:"errors"`
	// AdmittedPerSec and DegradedPerSec are over the run's length.
	AdmittedPerSec float64          `json:"admittedPerSec"`
	DegradedPerSec float64          `json:"degradedPerSec"`
	Refusals       map[string]int64 `json:"refusals,omitempty"` // by reason
	// Pool is, for a --tenant-pool entry (Tenant its pattern), how many
	// names it draws from; Distinct how many of them were called.
	Pool     int   `json:"pool,omitempty"`
	Distinct int64 `json:"distinct,omitempty"`
}

// Result is what one run measured.
type Result struct {
	// Kind is KindHealth, KindAdmitRelease or KindAdmitOnly.
	Kind    string  `json:"kind"`
	Seconds float64 `json:"seconds"`
	// Calls are RPCs answered or failed (an Admit and its Release are two).
	Calls       int64   `json:"calls"`
	CallsPerSec float64 `json:"callsPerSec"`
	// AdmitCalls are Admit calls (answers and errors); AdmitCallsPerSec
	// their rate.
	AdmitCalls       int64   `json:"admitCalls,omitempty"`
	AdmitCallsPerSec float64 `json:"admitCallsPerSec,omitempty"`
	// Admissions are the Admit calls answered ADMITTED or DEGRADED: the
	// leases granted; AdmissionsPerSec their rate.
	Admissions       int64   `json:"admissions,omitempty"`
	AdmissionsPerSec float64 `json:"admissionsPerSec,omitempty"`
	// Released leases; Held, leases granted and not released by this run
	// (Release off, the run ended during a hold, or the Release failed).
	Released int64 `json:"released,omitempty"`
	Held     int64 `json:"held,omitempty"`
	// Dropped are open-loop arrivals that found MaxInFlight calls busy.
	Dropped  int64            `json:"dropped,omitempty"`
	Tenants  []TenantResult   `json:"tenants,omitempty"`
	Refusals map[string]int64 `json:"refusals,omitempty"` // over all tenants, by reason
	// Errors are gRPC errors by code (the health Check's, or Admit's);
	// ReleaseErrors Release's.
	Errors        map[string]int64 `json:"errors,omitempty"`
	ReleaseErrors map[string]int64 `json:"releaseErrors,omitempty"`
	// FirstError is the first error's message (the health Check's, or
	// Admit's); FirstReleaseError Release's.
	FirstError        string `json:"firstError,omitempty"`
	FirstReleaseError string `json:"firstReleaseError,omitempty"`
	// Latency is the RPC's own time: Admit, or the health Check.
	Latency        Percentiles  `json:"latency"`
	Queued         *Percentiles `json:"queued,omitempty"`
	ReleaseLatency *Percentiles `json:"releaseLatency,omitempty"`
	// StartLag is how late calls started after their scheduled arrival
	// (open loop and trace only).
	StartLag *Percentiles `json:"startLag,omitempty"`
	// ClientCPUPerCallUs is the client process's CPU time per call;
	// ServerCPUPerCallUs the server's, when its pid was given (0: not
	// measured). Their sum is what a call costs the machine.
	ClientCPUPerCallUs float64 `json:"clientCpuPerCallUs,omitempty"`
	ServerCPUPerCallUs float64 `json:"serverCpuPerCallUs,omitempty"`
	// Churn is what Options.Churn did to placement during the run.
	Churn *ChurnResult `json:"churn,omitempty"`

	st *stats // kept so that rounds can be merged
}

// result summarises s as a run of kind that lasted elapsed.
func (s *stats) result(kind string, elapsed time.Duration) *Result {
	sec := elapsed.Seconds()
	rate := func(n int64) float64 {
		if sec <= 0 {
			return 0
		}
		return float64(n) / sec
	}
	r := &Result{Kind: kind, Seconds: sec, Calls: s.calls, CallsPerSec: rate(s.calls),
		Released: s.released, Held: s.held, Dropped: s.dropped, Latency: percentiles(s.admit), st: s}
	if s.calls > 0 {
		r.ClientCPUPerCallUs = float64(s.clientCPU) / 1e3 / float64(s.calls)
		if s.serverCPUKnown {
			r.ServerCPUPerCallUs = float64(s.serverCPU) / 1e3 / float64(s.calls)
		}
	}
	r.Errors = codeNames(s.admitErrors)
	r.FirstError = s.firstAdmitError.msg
	if kind == KindHealth {
		return r
	}
	r.ReleaseErrors = codeNames(s.releaseErrors)
	r.FirstReleaseError = s.firstReleaseError.msg
	r.Refusals = map[string]int64{}
	for _, name := range slices.Sorted(maps.Keys(s.tenants)) {
		t := s.tenants[name]
		tr := TenantResult{Tenant: name, Admitted: t.admitted, Degraded: t.degraded, Errors: t.errors,
			AdmittedPerSec: rate(t.admitted), DegradedPerSec: rate(t.degraded), Pool: t.pool}
		for _, w := range t.drawn {
			tr.Distinct += int64(bits.OnesCount64(w))
		}
		for reason, n := range t.refusals {
			tr.Rejected += n
			r.Refusals[reason] += n
		}
		if len(t.refusals) > 0 {
			tr.Refusals = maps.Clone(t.refusals)
		}
		tr.Requests = tr.Admitted + tr.Degraded + tr.Rejected + tr.Errors
		r.AdmitCalls += tr.Requests
		r.Admissions += tr.Admitted + tr.Degraded
		r.Tenants = append(r.Tenants, tr)
	}
	r.Churn = s.churn
	r.AdmitCallsPerSec = rate(r.AdmitCalls)
	r.AdmissionsPerSec = rate(r.Admissions)
	q := percentiles(s.queued)
	r.Queued = &q
	if s.release.TotalCount() > 0 {
		p := percentiles(s.release)
		r.ReleaseLatency = &p
	}
	if s.lag.TotalCount() > 0 {
		p := percentiles(s.lag)
		r.StartLag = &p
	}
	return r
}

// codeNames renders a count by gRPC code by the codes' names; nil when
// empty, so that JSON omits it.
func codeNames(m map[codes.Code]int64) map[string]int64 {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]int64, len(m))
	for c, n := range m {
		out[errCodeName(c)] += n
	}
	return out
}

// mergeResults sums runs of one kind: counts and histograms added, rates
// over the summed lengths.
func mergeResults(rs []*Result) *Result {
	if len(rs) == 0 {
		return nil
	}
	total := newStats()
	var elapsed time.Duration
	for _, r := range rs {
		total.merge(r.st)
		elapsed += time.Duration(r.Seconds * float64(time.Second))
	}
	return total.result(rs[0].Kind, elapsed)
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	return slices.SortedFunc(maps.Keys(m), cmp.Compare[string])
}
