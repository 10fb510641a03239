package replay

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/sluice-sched/sluice/admission"
)

// EngineOptions turn on a simulated continuous-batching serving engine in
// every domain (see the package documentation, "Engines"). The zero value
// leaves them off: the domains are the pd soft-capacity model's
// processor-shared phases, and the report is as it is without them.
type EngineOptions struct {
	// Capacity is what each engine really sustains, relative to the
	// model: its prefill FLOP/s and decode bytes/s are Capacity × the
	// domain's pd rates ÷ soft_fraction (the peak-derived rates the soft
	// capacity is a share of). 1: the model is right, and admits
	// soft_fraction of what the engine sustains; 0.6: the engine sustains
	// 0.6/0.7 of what the model admits. 0: engines off.
	Capacity float64
	// MaxBatch is how many requests an engine runs at once (vLLM's
	// max_num_seqs); default 256.
	MaxBatch int
	// PrefillTokens is how many prompt tokens an engine prefills at once
	// (vLLM's max_num_batched_tokens, the chunked-prefill budget of a
	// step); default 8192. A longer prompt is prefilled alone.
	PrefillTokens int64
	// Report is how often the engines' signals are read and given to the
	// policy; default 100ms (sluiced's read period).
	Report time.Duration
	// Changes set one domain's capacity from a time on.
	Changes []EngineChange
	// OpenLoop keeps sluice's capacity loop open: no signals, and
	// releases without the measured time to first token or duration, so
	// the model alone decides. The other policies ignore it.
	OpenLoop bool
	// SLO is the time-to-first-token objective the report measures
	// against; default 2s.
	SLO time.Duration
	// Budget is the clairvoyant dispatcher's bound on a request's prefill
	// with the work ahead of it on its engine; default the SLO. The other
	// policies ignore it.
	Budget time.Duration
}

// On reports whether the engines are on.
func (o *EngineOptions) On() bool { return o.Capacity > 0 }

// Defaults of EngineOptions.
const (
	DefaultMaxBatch      = 256
	DefaultPrefillTokens = 8192
	DefaultReport        = 100 * time.Millisecond
	DefaultSLO           = 2 * time.Second
)

func (o EngineOptions) withDefaults() EngineOptions {
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.PrefillTokens <= 0 {
		o.PrefillTokens = DefaultPrefillTokens
	}
	if o.Report <= 0 {
		o.Report = DefaultReport
	}
	if o.SLO <= 0 {
		o.SLO = DefaultSLO
	}
	if o.Budget <= 0 {
		o.Budget = o.SLO
	}
	return o
}

// validate checks o against the cluster's domains.
func (o *EngineOptions) validate(byID map[string]int) error {
	switch {
	case !o.On() && len(o.Changes) > 0:
		return fmt.Errorf("--engine-change needs --engine-capacity")
	case !o.On():
		return nil
	case o.Capacity > maxEngineCapacity || math.IsInf(o.Capacity, 0):
		return fmt.Errorf("--engine-capacity %g: must be in (0, %d]", o.Capacity, maxEngineCapacity)
	}
	for _, c := range o.Changes {
		if _, ok := byID[c.Domain]; !ok {
			return fmt.Errorf("--engine-change %s: the cluster has no domain %q", c, c.Domain)
		}
	}
	return nil
}

// maxEngineCapacity bounds --engine-capacity and a change's capacity.
const maxEngineCapacity = 100

// EngineChange sets Domain's engine capacity (relative to the model, as
// EngineOptions.Capacity) from At, in replay time (after --speed, from
// the first replayed row).
type EngineChange struct {
	Domain   string
	At       time.Duration
	Capacity float64
}

func (c EngineChange) String() string {
	return fmt.Sprintf("%s@%v=%g", c.Domain, c.At, c.Capacity)
}

// ParseEngineChange reads an --engine-change value, DOMAIN@TIME=CAPACITY
// (hgx-1@120s=0.5).
func ParseEngineChange(s string) (EngineChange, error) {
	bad := func(why string) (EngineChange, error) {
		return EngineChange{}, fmt.Errorf("--engine-change %q: %s; want DOMAIN@TIME=CAPACITY, e.g. hgx-1@120s=0.5", s, why)
	}
	at := strings.LastIndexByte(s, '@')
	eq := strings.LastIndexByte(s, '=')
	if at <= 0 || eq < at {
		return bad("no DOMAIN@TIME=CAPACITY")
	}
	d, err := time.ParseDuration(s[at+1 : eq])
	if err != nil || d < 0 {
		return bad(fmt.Sprintf("time %q is not a duration ≥ 0", s[at+1:eq]))
	}
	c, err := strconv.ParseFloat(s[eq+1:], 64)
	if err != nil || !(c > 0) || c > maxEngineCapacity {
		return bad(fmt.Sprintf("capacity %q is not a number in (0, %d]", s[eq+1:], maxEngineCapacity))
	}
	return EngineChange{Domain: s[:at], At: d, Capacity: c}, nil
}

// simEngine is one domain's serving engine: a FIFO waiting queue in front
// of a batch of at most maxBatch requests whose KV fits kvCap. The
// queue's head enters the batch when it fits the batch, the KV and the
// prefill budget (the prompt tokens in prefill, with its own, at most
// prefillTokens; any prompt when none is in prefill), and holds its KV
// until it completes. The requests in prefill share the engine's true
// prefill rate, and those in decode its true decode rate, equally
// (processor sharing, as a step is shared). The waiting queue is what
// vLLM reports as waiting: admitted requests not yet scheduled.
type simEngine struct {
	peakP, peakD float64 // the model's peak-derived rates: pd rate ÷ soft_fraction
	capacity     float64 // now
	kvCap        int64
	kvHeld       int64
	maxBatch     int
	running      int
	budget       int64 // prompt tokens in prefill at most
	inPrefill    int64 // prompt tokens in prefill now
	waiting      fifo

	busySince int64 // when the batch last became non-empty; -1: idle
	busyNs    int64

	// Measures.
	queue    *hdrhistogram.Histogram // waiting requests, one value per report
	queueMax int
	series   []int32 // waiting requests per report, for recovery
	kvMax    float64
	ttft     *hdrhistogram.Histogram // µs, dispatch to first token
	weighted int64                   // admitted weighted tokens
}

func newSimEngine(d *simDomain, o *EngineOptions, soft float64) *simEngine {
	e := &simEngine{
		peakP: float64(d.prefillRate) / soft, peakD: float64(d.decodeRate) / soft,
		kvCap: d.kvLimit, maxBatch: o.MaxBatch, budget: o.PrefillTokens, busySince: -1,
		queue: hdrhistogram.New(0, 1<<30, 3),
		ttft:  hdrhistogram.New(1, int64(24*time.Hour/time.Microsecond), 3),
	}
	e.setCapacity(d, o.Capacity)
	return e
}

// setCapacity sets the engine's true rates (the phases must be advanced
// to now first).
func (e *simEngine) setCapacity(d *simDomain, c float64) {
	e.capacity = c
	d.prefill.rate = c * e.peakP
	d.decode.rate = c * e.peakD
}

func (e *simEngine) queued() int { return e.waiting.len() }

// busy reports whether the engine holds any request.
func (e *simEngine) busy() bool { return e.running > 0 || e.queued() > 0 }

// signal is what the engine's metrics say now.
func (e *simEngine) signal(id string) admission.EngineSignal {
	kv := 0.0
	if e.kvCap > 0 {
		kv = float64(e.kvHeld) / float64(e.kvCap)
	}
	return admission.EngineSignal{Domain: id, Queue: float64(e.queued()), Running: float64(e.running), KVUsage: kv}
}

// sample records the engine's queue at a report.
func (e *simEngine) sample() {
	q := e.queued()
	_ = e.queue.RecordValue(int64(q))
	e.queueMax = max(e.queueMax, q)
	e.series = append(e.series, int32(q))
	if e.kvCap > 0 {
		e.kvMax = max(e.kvMax, float64(e.kvHeld)/float64(e.kvCap))
	}
}

// prefillWork is r's prefill FLOP on each domain whose engine could ever
// run it (its KV fits the engine, its rate is not 0), +Inf on the others;
// ever is whether any could.
func (s *sim) prefillWork(r *simReq) (work []float64, ever bool) {
	m, _ := s.cat.Get(r.row.Model)
	work = make([]float64, len(s.domains))
	for i, d := range s.domains {
		work[i] = math.Inf(1)
		if c, err := d.cap.Cost(m, r.row.Prompt, r.row.Output); err == nil && c.KVBytes <= d.eng.kvCap && d.prefill.rate > 0 {
			work[i], ever = float64(c.PrefillFLOP), true
		}
	}
	return work, ever
}

// enqueue puts an admitted request in the waiting queue.
func (e *simEngine) enqueue(r *simReq) {
	e.waiting.push(r)
}

// fill moves waiting requests into the batch, in order, while the head
// fits; each starts its prefill in d.
func (e *simEngine) fill(now int64, d *simDomain) {
	for r := e.waiting.peek(); r != nil && e.running < e.maxBatch; r = e.waiting.peek() {
		if e.kvHeld+r.cost.KVBytes > e.kvCap || e.inPrefill >= e.budget {
			return // the head waits: first come, first served
		}
		e.waiting.pop()
		e.kvHeld += r.cost.KVBytes
		if e.running == 0 {
			e.busySince = now
		}
		e.running++
		e.inPrefill += r.row.Prompt
		r.startAt = now
		if d.prefill.rate > 0 {
			r.alone = int64(float64(r.cost.PrefillFLOP) / d.prefill.rate * 1e9)
		}
		d.prefill.advance(now)
		d.prefill.add(r, float64(r.cost.PrefillFLOP))
	}
}

// firstToken records the end of r's prefill at now.
func (e *simEngine) firstToken(now int64, r *simReq) {
	r.firstAt = now
	e.inPrefill -= r.row.Prompt
	_ = e.ttft.RecordValue(max((now-r.admitAt)/int64(time.Microsecond), 1))
}

// finish takes r, done at now, out of the batch.
func (e *simEngine) finish(now int64, r *simReq) {
	r.doneAt = now
	e.kvHeld -= r.cost.KVBytes
	e.running--
	if e.running == 0 && e.busySince >= 0 {
		e.busyNs += now - e.busySince
		e.busySince = -1
	}
}

// end closes the busy time at the end of the replay.
func (e *simEngine) end(now int64) {
	if e.busySince >= 0 {
		e.busyNs += now - e.busySince
		e.busySince = now
	}
}

// recovery reads the engine's queue, sampled every period, after a
// change at at: over is how long after at it first went past threshold,
// back how long after at it was back within threshold to stay there for
// hold (or to the end of the replay). Both are -1 when no sample after at
// is past threshold; back is -1 when it never comes back.
func recovery(series []int32, period, at int64, threshold float64, hold int64) (over, back float64) {
	i := int((at + period - 1) / period)
	for i < len(series) && float64(series[i]) <= threshold {
		i++
	}
	if i == len(series) {
		return -1, -1
	}
	since := func(k int) float64 { return float64(int64(k)*period-at) / 1e9 }
	need := int(hold / period)
	for j := i; j < len(series); j++ {
		if float64(series[j]) > threshold {
			continue
		}
		k := j
		for k < len(series) && k-j < need && float64(series[k]) <= threshold {
			k++
		}
		if k-j >= need || k == len(series) {
			return since(i), since(j)
		}
		j = k
	}
	return since(i), -1
}

// EngineReport is what the engines measured in a replay with them on.
type EngineReport struct {
	Capacity float64 `json:"capacity"` // relative to the model, at the start
	// Loop is sluice's capacity loop: closed (signals and measured
	// releases reach it) or open; empty for the other policies.
	Loop           string  `json:"loop,omitempty"`
	QueueThreshold float64 `json:"queueThreshold"`
	KVThreshold    float64 `json:"kvThreshold"`
	SLOMs          float64 `json:"sloMs"`
	// TTFT is from dispatch (the admission) to the end of prefill, engine
	// queue included, over admitted requests: what a router measures.
	TTFTP50 float64 `json:"ttftP50Ms"`
	TTFTP99 float64 `json:"ttftP99Ms"`
	// AloneP99 is the p99 of the admitted requests' prefill time alone
	// on their engine (nothing queued, nothing beside it in prefill): no
	// admission policy gets TTFT p99 below it.
	AloneP99 float64 `json:"aloneP99Ms"`
	// FirstTokenP99 is from arrival (the policy's queue included).
	FirstTokenP99 float64 `json:"firstTokenP99Ms"`
	// WithinSLO is the share of all requests whose first token came within
	// the SLO of their arrival (a refused request is not within it).
	WithinSLO float64 `json:"withinSlo"`
	// AdmittedRate is the admitted weighted tokens per simulated second.
	AdmittedRate float64 `json:"admittedTokensPerS"`
	// PrefillUtil and DecodeUtil are the cluster's work served over what
	// its engines could have served (their true rates over the replay);
	// Util the larger.
	PrefillUtil float64 `json:"prefillUtilization"`
	DecodeUtil  float64 `json:"decodeUtilization"`
	Util        float64 `json:"utilization"`
	// QueueP99 is the largest of the domains' engine queue p99.
	QueueP99 float64 `json:"queueP99"`
	// FloorViolations sums the tenants' floor violation seconds;
	// WithinShareRefused counts refusals, not by the tenant's own limits,
	// in seconds when its demand was within its weighted fair share.
	FloorViolations    int `json:"floorViolationSeconds"`
	WithinShareRefused int `json:"withinShareRefused"`
	// Spread is the busiest domain's utilization (the busier phase's share
	// of its true capacity) over the least busy's, among domains of the
	// same GPUs and count (the largest ratio of such a group); FirstShareMin the smallest share of a tenant's
	// admissions on its first domain (FirstBy says how that is chosen).
	Spread        float64 `json:"spread"`
	FirstShareMin float64 `json:"firstShareMin"`
	FirstBy       string  `json:"firstBy"`
	// ExpiredLeases counts leases that expired before their request
	// completed (it waited in an engine past the lease TTL).
	ExpiredLeases int                  `json:"expiredLeases"`
	Domains       []EngineDomainReport `json:"domains"`
	Tenants       []EngineTenantReport `json:"tenants"`
	Changes       []EngineChangeReport `json:"changes,omitempty"`
}

// EngineDomainReport is one domain's engine.
type EngineDomainReport struct {
	ID             string  `json:"id"`
	Capacity       float64 `json:"capacity"` // at the end
	Admitted       int     `json:"admitted"`
	AdmittedTokens int64   `json:"admittedTokens"`
	QueueP99       float64 `json:"queueP99"`
	QueueMax       int     `json:"queueMax"`
	KVMax          float64 `json:"kvMax"`
	TTFTP99        float64 `json:"ttftP99Ms"`
	Busy           float64 `json:"busy"` // share of the replay the batch held a request
	PrefillUtil    float64 `json:"prefillUtilization"`
	DecodeUtil     float64 `json:"decodeUtilization"`
	// Factor is sluice's capacity factor for the domain at the end (0 for
	// the other policies).
	Factor float64 `json:"capacityFactor,omitempty"`
}

// EngineTenantReport is where one tenant's admissions ran.
type EngineTenantReport struct {
	Name        string  `json:"name"`
	FirstDomain string  `json:"firstDomain"`
	FirstShare  float64 `json:"firstShare"`
	TTFTP99     float64 `json:"ttftP99Ms"`
	WithinSLO   float64 `json:"withinSlo"`
}

// EngineChangeReport is one capacity change and the domain's recovery.
type EngineChangeReport struct {
	Domain   string  `json:"domain"`
	AtS      float64 `json:"atS"`
	Capacity float64 `json:"capacity"`
	// OverS is how long after the change the domain's engine queue first
	// went past the queue threshold (-1: never). RecoveryS is how long it
	// then took to be back within it to stay for RecoveryHoldS: 0 when it
	// never went past it, -1 when it never came back.
	OverS         float64 `json:"overS"`
	RecoveryS     float64 `json:"recoveryS"`
	RecoveryHoldS float64 `json:"recoveryHoldS"`
	PeakQueue     int     `json:"peakQueue"`
}

// recoveryHold is how long a queue must stay within the threshold for a
// domain to count as recovered.
const recoveryHold = 5 * time.Second

// firstChooser is a policy that knows each (tenant, model)'s first domain
// (sluice: its rendezvous first choice).
type firstChooser interface {
	firstDomain(tenant, model string) (string, bool)
}

// factorer is a policy that corrects the model per domain (sluice's
// capacity factor).
type factorer interface {
	factors() map[string]float64
}

// engineRec collects the engines' measures that are per request.
type engineRec struct {
	s            *sim
	ttft, first  *hdrhistogram.Histogram // µs: dispatch and arrival to first token
	alone        *hdrhistogram.Histogram // µs: each prefill alone on its engine
	within       int                     // first token within the SLO of arrival
	tenantTTFT   []*hdrhistogram.Histogram
	tenantWithin []int
	perDomain    [][]int        // admissions by tenant, domain
	onFirst      []int          // admissions on the tenant's first choice, by tenant
	firstOf      map[string]int // (tenant, model) → its first domain; -1: none
	tenantFirst  []int          // the first domain of each tenant's first row
	firstBy      string
	domainTokens []int64
	unfair       [][]int // refusals not by the tenant's own limits, by tenant, second
	admittedW    int64
	expired      int
}

func newHist() *hdrhistogram.Histogram {
	return hdrhistogram.New(1, int64(24*time.Hour/time.Microsecond), 3)
}

func newEngineRec(s *sim, rows []Row) *engineRec {
	e := &engineRec{s: s, ttft: newHist(), first: newHist(), alone: newHist(), firstOf: map[string]int{}, domainTokens: make([]int64, len(s.domains)),
		tenantWithin: make([]int, len(s.tenants)), onFirst: make([]int, len(s.tenants)), unfair: make([][]int, len(s.tenants))}
	for range s.tenants {
		e.tenantFirst = append(e.tenantFirst, -1)
		e.tenantTTFT = append(e.tenantTTFT, newHist())
		e.perDomain = append(e.perDomain, make([]int, len(s.domains)))
	}
	e.firstBy = "most used domain"
	if fc, ok := s.pol.(firstChooser); ok {
		e.firstBy = "rendezvous first choice"
		for i := range rows {
			k := rows[i].Tenant + "\x00" + rows[i].Model
			if _, seen := e.firstOf[k]; seen {
				continue
			}
			e.firstOf[k] = -1
			if d, ok := fc.firstDomain(rows[i].Tenant, rows[i].Model); ok {
				if di, ok := s.byID[d]; ok {
					e.firstOf[k] = di
				}
			}
			if t := s.tix[rows[i].Tenant]; e.tenantFirst[t] < 0 {
				e.tenantFirst[t] = e.firstOf[k]
			}
		}
	}
	return e
}

func (e *engineRec) admitted(r *simReq, di int) {
	e.perDomain[r.tenant][di]++
	e.domainTokens[di] += r.weighted
	e.admittedW += r.weighted
	e.s.domains[di].eng.weighted += r.weighted
	if f, ok := e.firstOf[r.row.Tenant+"\x00"+r.row.Model]; ok && f == di {
		e.onFirst[r.tenant]++
	}
}

func (e *engineRec) firstToken(r *simReq) {
	us := func(ns int64) int64 { return max(ns/int64(time.Microsecond), 1) }
	_ = e.ttft.RecordValue(us(r.firstAt - r.admitAt))
	_ = e.alone.RecordValue(us(r.alone))
	_ = e.tenantTTFT[r.tenant].RecordValue(us(r.firstAt - r.admitAt))
	_ = e.first.RecordValue(us(r.firstAt - r.arrive))
	if r.firstAt-r.arrive <= int64(e.s.eng.SLO) {
		e.within++
		e.tenantWithin[r.tenant]++
	}
}

func (e *engineRec) refused(r *simReq) {
	if ownLimit(r.reason) {
		return
	}
	x := sec(e.s.now)
	e.unfair[r.tenant] = grow(e.unfair[r.tenant], x)
	e.unfair[r.tenant][x]++
}

func ms(h *hdrhistogram.Histogram, q float64) float64 {
	if h.TotalCount() == 0 {
		return 0
	}
	return float64(h.ValueAtQuantile(q)) / 1000
}

// report builds the EngineReport of the replay whose Report is rep.
func (e *engineRec) report(rep *Report) *EngineReport {
	s := e.s
	fb := &s.opts.Config.Feedback
	er := &EngineReport{
		Capacity: s.eng.Capacity, QueueThreshold: fb.QueueThreshold, KVThreshold: fb.KVThreshold,
		SLOMs: float64(s.eng.SLO) / 1e6, TTFTP50: ms(e.ttft, 50), TTFTP99: ms(e.ttft, 99), AloneP99: ms(e.alone, 99), FirstTokenP99: ms(e.first, 99),
		ExpiredLeases: e.expired, FirstBy: e.firstBy,
	}
	if s.opts.Policy == PolicySluice {
		er.Loop = "closed"
		if s.eng.OpenLoop {
			er.Loop = "open"
		}
	}
	if rep.Requests > 0 {
		er.WithinSLO = float64(e.within) / float64(rep.Requests)
	}
	if rep.Seconds > 0 {
		er.AdmittedRate = float64(e.admittedW) / rep.Seconds
	}
	var factors map[string]float64
	if f, ok := s.pol.(factorer); ok {
		factors = f.factors()
	}
	var units, avail [2]float64
	for i, d := range s.domains {
		en := d.eng
		dr := EngineDomainReport{
			ID: d.id, Capacity: en.capacity, Admitted: d.admitted, AdmittedTokens: e.domainTokens[i],
			QueueP99: float64(en.queue.ValueAtQuantile(99)), QueueMax: en.queueMax, KVMax: en.kvMax,
			TTFTP99: ms(en.ttft, 99), Factor: factors[d.id],
		}
		if rep.Seconds > 0 {
			dr.Busy = float64(en.busyNs) / (rep.Seconds * 1e9)
		}
		for k, p := range []*phase{&d.prefill, &d.decode} {
			units[k] += p.units
			avail[k] += p.avail
		}
		if d.prefill.avail > 0 {
			dr.PrefillUtil = d.prefill.units / d.prefill.avail
		}
		if d.decode.avail > 0 {
			dr.DecodeUtil = d.decode.units / d.decode.avail
		}
		er.QueueP99 = max(er.QueueP99, dr.QueueP99)
		er.Domains = append(er.Domains, dr)
	}
	if avail[0] > 0 {
		er.PrefillUtil = units[0] / avail[0]
	}
	if avail[1] > 0 {
		er.DecodeUtil = units[1] / avail[1]
	}
	er.Util = max(er.PrefillUtil, er.DecodeUtil)
	er.Spread = spread(s, er.Domains)
	er.FirstShareMin = 1
	for i, name := range s.tenants {
		t := &rep.Tenants[i]
		tr := EngineTenantReport{Name: name, TTFTP99: ms(e.tenantTTFT[i], 99)}
		if t.Requests > 0 {
			tr.WithinSLO = float64(e.tenantWithin[i]) / float64(t.Requests)
		}
		admitted, most := 0, 0
		for di, n := range e.perDomain[i] {
			admitted += n
			if n > e.perDomain[i][most] {
				most = di
			}
		}
		onFirst := e.perDomain[i][most]
		if len(e.firstOf) > 0 {
			onFirst, most = e.onFirst[i], e.tenantFirst[i]
		}
		if most >= 0 {
			tr.FirstDomain = s.domains[most].id
		}
		if admitted > 0 {
			tr.FirstShare = float64(onFirst) / float64(admitted)
			er.FirstShareMin = min(er.FirstShareMin, tr.FirstShare)
		}
		er.FloorViolations += t.FloorViolations
		for x, n := range e.unfair[i] {
			if x < len(t.Demand) && t.Demand[x] > 0 && t.Target[x] >= t.Demand[x] {
				er.WithinShareRefused += n
			}
		}
		er.Tenants = append(er.Tenants, tr)
	}
	for _, c := range s.changes {
		d := s.domains[s.byID[c.Domain]]
		cr := EngineChangeReport{Domain: c.Domain, AtS: c.At.Seconds(), Capacity: c.Capacity, RecoveryHoldS: recoveryHold.Seconds()}
		over, back := recovery(d.eng.series, int64(s.eng.Report), int64(c.At), fb.QueueThreshold, int64(recoveryHold))
		cr.OverS, cr.RecoveryS = over, 0
		switch {
		case over >= 0 && back < 0:
			cr.RecoveryS = -1
		case over >= 0:
			cr.RecoveryS = back - over
		}
		for j := int(int64(c.At) / int64(s.eng.Report)); j >= 0 && j < len(d.eng.series); j++ {
			cr.PeakQueue = max(cr.PeakQueue, int(d.eng.series[j]))
		}
		er.Changes = append(er.Changes, cr)
	}
	return er
}

// spread is the largest ratio of the busiest to the least busy domain's
// utilization among domains of the same GPU model and count.
func spread(s *sim, domains []EngineDomainReport) float64 {
	groups := map[string][]float64{}
	var keys []string
	for i, d := range s.domains {
		k := fmt.Sprintf("%s×%d", d.cap.GPUModel(), d.cap.GPUs())
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], max(domains[i].PrefillUtil, domains[i].DecodeUtil))
	}
	worst := 0.0
	for _, k := range keys {
		g := groups[k]
		if len(g) < 2 {
			continue
		}
		hi, lo := slices.Max(g), slices.Min(g)
		if hi == 0 {
			continue
		}
		worst = max(worst, hi/max(lo, 1e-9))
	}
	return worst
}
