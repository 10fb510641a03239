package replay

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
)

// Policies a replay compares.
const (
	PolicySluice        = "sluice"         // the real admission engine
	PolicyFIFO          = "fifo"           // one FIFO queue, no tenant gates
	PolicyGlobalBucket  = "global-bucket"  // one token bucket for the cluster, then FIFO
	PolicyTenantBuckets = "tenant-buckets" // per-tenant token buckets, then FIFO; no fair queue, no floors
	// PolicyThreshold is the Gateway API Inference Extension's rule: the
	// least loaded domain whose engines are under the saturation
	// thresholds, else FIFO; it needs the engines (EngineOptions).
	PolicyThreshold = "threshold"
	// PolicyClairvoyant dispatches on each engine's outstanding prefill
	// work, known exactly from the simulator: a yardstick of what the
	// engines give within a TTFT objective, not a rule to deploy; it
	// needs the engines.
	PolicyClairvoyant = "clairvoyant"
)

// Policies lists every policy that runs without the engines, in report
// order; EnginePolicies those that run with them.
var (
	Policies       = []string{PolicySluice, PolicyFIFO, PolicyGlobalBucket, PolicyTenantBuckets}
	EnginePolicies = append(slices.Clone(Policies), PolicyThreshold, PolicyClairvoyant)
)

// ParsePolicies reads a --policy value: names separated by commas, or
// "all" (Policies).
func ParsePolicies(s string) ([]string, error) {
	if s == "all" {
		return slices.Clone(Policies), nil
	}
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(EnginePolicies, p) {
			return nil, fmt.Errorf("--policy %q: unknown policy %q (want %s, or all)", s, p, strings.Join(EnginePolicies, ", "))
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// Options is one replay: the policy, the cluster and config it runs on,
// and how requests are made from trace rows.
type Options struct {
	Policy  string
	Config  admission.Config // defaulted and validated (internal/config)
	Cluster topology.Cluster
	// Deadline is each request's deadline after its arrival; 0 leaves it
	// to the config's queue.default_wait (the engine's default), which the
	// baselines use too.
	Deadline time.Duration
	// Downgrade makes every request accept its model's lower tiers (the
	// catalog's degrade chain). Only sluice degrades; the baselines run
	// the requested model or refuse.
	Downgrade bool
	// Engine turns on the simulated serving engines (off when zero).
	Engine EngineOptions
	// DeferWithin is how long a deferrable row (Row.Deferrable) may wait
	// in sluice's backlog; 0 leaves it to the config's
	// deferral.default_within. It bounds the replay: the replay runs
	// until the backlog is empty. The baselines treat deferrable rows as
	// any other.
	DeferWithin time.Duration
}

// simReq is one request in flight through a replay.
type simReq struct {
	row      *Row
	id       int
	tenant   int
	arrive   int64
	deadline int64 // 0: the policy's default
	weighted int64 // prompt + output weight × output

	answered  bool
	wasQueued bool // answered later than its submit: counted in the tenant's backlog
	outcome   admission.Outcome
	reason    admission.Reason
	admitAt   int64
	domain    int
	lease     uint64
	cost      pd.Cost // in the granted domain, on the granted model

	// backlogged: answered DEFERRED, it waited in sluice's deferred
	// backlog, not in the queue (see deferral.go).
	backlogged bool

	finish float64 // the phase's attained service at which this request's work is done

	// With the engines: when it entered the batch, ended prefill (its
	// first token) and completed, and how many times it was released.
	startAt, firstAt, doneAt int64
	releases                 int
	// alone is how long its prefill takes on its engine with nothing
	// else in prefill (at the engine's rate when it entered the batch).
	alone int64
}

// phase is one processor-shared resource of a domain (its prefill FLOP/s
// or its decode bytes/s): the requests in it share its rate equally, as
// a batch does. s is the attained service per request since the start
// (the PS virtual time); a request that enters with work W at s0 leaves
// when s reaches s0 + W.
type phase struct {
	rate  float64 // units per second
	s     float64
	last  int64
	reqs  reqHeap
	busy  []int64 // ns busy per simulated second
	units float64 // total units served
	avail float64 // units the rate offered, busy or not
}

func (p *phase) advance(now int64) {
	if now <= p.last {
		return
	}
	p.avail += float64(now-p.last) / 1e9 * p.rate
	if len(p.reqs) == 0 {
		// Nothing refers to the attained service: restart it at 0, so that
		// its float64 keeps its precision over an hour of service.
		p.s = 0
	}
	if n := len(p.reqs); n > 0 && p.rate > 0 {
		dt := float64(now-p.last) / 1e9
		p.s += dt * p.rate / float64(n)
		p.units += dt * p.rate
		p.addBusy(p.last, now)
	}
	p.last = now
}

// addBusy adds [from, to) to the busy time per second.
func (p *phase) addBusy(from, to int64) {
	for from < to {
		sec := int(from / int64(time.Second))
		end := min(to, int64(sec+1)*int64(time.Second))
		for len(p.busy) <= sec {
			p.busy = append(p.busy, 0)
		}
		p.busy[sec] += end - from
		from = end
	}
}

// next returns when the first request in the phase finishes, or -1.
func (p *phase) next() int64 {
	if len(p.reqs) == 0 || p.rate <= 0 {
		return -1
	}
	left := p.reqs[0].finish - p.s
	if left <= 0 {
		return p.last
	}
	return p.last + int64(math.Ceil(left*float64(len(p.reqs))/p.rate*1e9))
}

// done pops the request finishing by now (within a nanosecond's service,
// the rounding of next), if any.
func (p *phase) done() *simReq {
	if len(p.reqs) == 0 {
		return nil
	}
	left := p.reqs[0].finish - p.s
	if left*float64(len(p.reqs))/p.rate*1e9 > 1 {
		return nil
	}
	return heap.Pop(&p.reqs).(*simReq)
}

func (p *phase) add(r *simReq, work float64) {
	r.finish = p.s + work
	heap.Push(&p.reqs, r)
}

type reqHeap []*simReq

func (h reqHeap) Len() int { return len(h) }
func (h reqHeap) Less(i, j int) bool {
	if h[i].finish != h[j].finish {
		return h[i].finish < h[j].finish
	}
	return h[i].id < h[j].id
}
func (h reqHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *reqHeap) Push(x any)   { *h = append(*h, x.(*simReq)) }
func (h *reqHeap) Pop() (x any) { n := len(*h) - 1; x, *h = (*h)[n], (*h)[:n]; return x }

// simDomain is a domain as the simulated hardware: its two phases at the
// pd soft-capacity rates, and the capacity model that costs requests.
type simDomain struct {
	id               string
	cap              *pd.DomainCapacity
	prefill, decode  phase
	kvLimit          int64
	prefillRate      int64
	decodeRate       int64
	admitted, served int
	eng              *simEngine // nil: the engines are off
}

// policy decides; the simulation serves. submit decides a request at its
// arrival and calls sim.decided now or, for a queued request, from a
// later tick or release; tick does the timed work; release ends an
// admitted request; observe hands it the engines' signals (with the
// engines on); queued says whether ticks are needed.
type policy interface {
	submit(now int64, r *simReq) error
	tick(now int64)
	release(now int64, r *simReq) error
	observe(now int64, signals []admission.EngineSignal)
	queued() int
	close()
}

// sim is one replay's state.
type sim struct {
	opts    Options
	cat     *pd.Catalog
	domains []*simDomain
	byID    map[string]int
	tenants []string
	tix     map[string]int
	pol     policy
	now     int64
	rec     *recorder
	outW    int64

	// With the engines on: the options (defaulted), the next report, the
	// changes in time order and the next of them, the signals of the
	// last report, and the engines' own measures.
	eng        EngineOptions
	nextReport int64
	changes    []EngineChange
	nextChange int
	signals    []admission.EngineSignal
	erec       *engineRec
	reqs       []simReq // every request of the replay, by row
	deferrable int      // rows marked deferrable
	// onEvent, when set, runs after each instant (tests check
	// invariants with it); an error ends the replay.
	onEvent func() error
}

// Run replays rows under opts and returns the report.
func Run(rows []Row, opts Options) (*Report, error) {
	s, err := newSim(rows, opts)
	if err != nil {
		return nil, err
	}
	defer s.pol.close()
	if err := s.run(rows); err != nil {
		return nil, err
	}
	return s.rec.report(s), nil
}

func newSim(rows []Row, opts Options) (*sim, error) {
	cfg := opts.Config
	cat, err := pd.NewCatalog(cfg.Models)
	if err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	s := &sim{opts: opts, cat: cat, byID: map[string]int{}, tix: map[string]int{}, outW: max(cfg.OutputTokenWeight, 1), eng: opts.Engine.withDefaults()}
	for i := range opts.Cluster.Domains {
		d := &opts.Cluster.Domains[i]
		c, err := pd.NewDomainCapacity(d, cat, cfg.Capacity, 0)
		if err != nil {
			return nil, fmt.Errorf("topology: %w", err)
		}
		_, kv := c.KV()
		sd := &simDomain{id: d.ID, cap: c, kvLimit: kv, prefillRate: c.PrefillRate(), decodeRate: c.DecodeRate()}
		sd.prefill.rate = float64(sd.prefillRate)
		sd.decode.rate = float64(sd.decodeRate)
		s.byID[d.ID] = len(s.domains)
		s.domains = append(s.domains, sd)
	}
	if err := s.eng.validate(s.byID); err != nil {
		return nil, err
	}
	if s.eng.On() {
		soft := cfg.Capacity.SoftFraction
		if soft <= 0 {
			soft = pd.DefaultConfig().SoftFraction
		}
		for _, d := range s.domains {
			d.eng = newSimEngine(d, &s.eng, soft)
		}
		s.changes = slices.Clone(s.eng.Changes)
		slices.SortStableFunc(s.changes, func(a, b EngineChange) int { return cmpInt64(int64(a.At), int64(b.At)) })
		s.signals = make([]admission.EngineSignal, len(s.domains))
		for i, d := range s.domains {
			s.signals[i] = d.eng.signal(d.id)
		}
	}
	for i := range rows {
		r := &rows[i]
		if _, ok := s.tix[r.Tenant]; !ok {
			s.tix[r.Tenant] = len(s.tenants)
			s.tenants = append(s.tenants, r.Tenant)
		}
		if _, ok := cat.Get(r.Model); !ok {
			return nil, fmt.Errorf("trace line %d: model %q is not in the catalog (%s)", r.Line, r.Model, strings.Join(cat.Names(), ", "))
		}
		if r.Deferrable {
			s.deferrable++
		}
	}
	slices.Sort(s.tenants)
	for i, t := range s.tenants {
		s.tix[t] = i
		if _, ok := cfg.Tenants[t]; !ok {
			// The engine would refuse every request with UNKNOWN_TENANT;
			// a replay of a mistyped mix would then say nothing useful.
			return nil, fmt.Errorf("tenant %q is not in the config (its tenants: %s)", t, strings.Join(sortedTenants(cfg), ", "))
		}
	}
	s.rec = newRecorder(s)
	switch opts.Policy {
	case PolicySluice:
		s.pol, err = newSluicePolicy(s)
	case PolicyFIFO, PolicyGlobalBucket, PolicyTenantBuckets:
		s.pol = newBaseline(s, opts.Policy, rows)
	case PolicyThreshold, PolicyClairvoyant:
		if !s.eng.On() {
			return nil, fmt.Errorf("policy %s reads the engines: it needs --engine-capacity", opts.Policy)
		}
		if opts.Policy == PolicyThreshold {
			s.pol = newThreshold(s)
		} else {
			s.pol = newClairvoyant(s)
		}
	default:
		err = fmt.Errorf("policy %q: want %s", opts.Policy, strings.Join(EnginePolicies, ", "))
	}
	if err != nil {
		return nil, err
	}
	if s.eng.On() {
		s.erec = newEngineRec(s, rows)
	}
	return s, nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func sortedTenants(cfg admission.Config) []string {
	var out []string
	for t := range cfg.Tenants {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// tickEvery is how often the policy's timed work runs while requests wait
// (the engine's own busy period in production).
const tickEvery = int64(time.Millisecond)

// waker is a policy with work that waits outside its queue (sluice's
// deferred backlog): wake says when it next needs a tick, -1 for never.
type waker interface {
	wake() int64
}

// wakeAt is when the policy next needs a tick for its other work; -1:
// never.
func (s *sim) wakeAt() int64 {
	if w, ok := s.pol.(waker); ok {
		return w.wake()
	}
	return -1
}

// run is the event loop over virtual time: the next event is the next
// arrival, the next phase completion, or, while requests wait, the next
// millisecond tick. At each instant completions go first (they free
// capacity), then arrivals, then the policy's tick.
func (s *sim) run(rows []Row) error {
	reqs := make([]simReq, len(rows))
	s.reqs = reqs
	i := 0
	for {
		t := int64(math.MaxInt64)
		if i < len(rows) {
			t = int64(rows[i].At)
		}
		for _, d := range s.domains {
			for _, p := range []*phase{&d.prefill, &d.decode} {
				if n := p.next(); n >= 0 && n < t {
					t = n
				}
			}
		}
		if s.pol.queued() > 0 {
			t = min(t, s.now+tickEvery)
		}
		wake := s.wakeAt()
		if wake >= 0 {
			t = min(t, max(wake, s.now))
		}
		if s.eng.On() && (i < len(rows) || s.pol.queued() > 0 || wake >= 0 || s.enginesBusy()) {
			// Reports and changes while anything is left to do.
			t = min(t, s.nextReport)
			if s.nextChange < len(s.changes) {
				t = min(t, int64(s.changes[s.nextChange].At))
			}
		}
		if t == math.MaxInt64 {
			break
		}
		s.now = max(t, s.now)
		if err := s.completions(); err != nil {
			return err
		}
		if s.eng.On() {
			s.engineEvents()
		}
		for ; i < len(rows) && int64(rows[i].At) <= s.now; i++ {
			r := &reqs[i]
			row := &rows[i]
			*r = simReq{row: row, id: i, tenant: s.tix[row.Tenant], arrive: s.now, domain: -1}
			r.weighted = row.Prompt + s.outW*row.Output
			if s.opts.Deadline > 0 {
				r.deadline = s.now + int64(s.opts.Deadline)
			}
			s.rec.arrived(r)
			if err := s.pol.submit(s.now, r); err != nil {
				return err
			}
			if !r.answered && !r.backlogged { // a ticket waits in the backlog, not the queue
				s.rec.queued(r)
			}
		}
		s.pol.tick(s.now)
		if s.rec.err != nil {
			return s.rec.err
		}
		if s.onEvent != nil {
			if err := s.onEvent(); err != nil {
				return err
			}
		}
	}
	s.rec.end(s.now)
	for _, d := range s.domains {
		if d.eng != nil {
			d.eng.end(s.now)
			d.prefill.advance(s.now)
			d.decode.advance(s.now)
		}
	}
	return nil
}

// enginesBusy reports whether any engine holds a request.
func (s *sim) enginesBusy() bool {
	for _, d := range s.domains {
		if d.eng.busy() {
			return true
		}
	}
	return false
}

// engineEvents applies the capacity changes due by now and, when a report
// is due, reads every engine's signal and hands them to the policy.
func (s *sim) engineEvents() {
	for ; s.nextChange < len(s.changes) && int64(s.changes[s.nextChange].At) <= s.now; s.nextChange++ {
		c := s.changes[s.nextChange]
		d := s.domains[s.byID[c.Domain]]
		d.prefill.advance(s.now)
		d.decode.advance(s.now)
		d.eng.setCapacity(d, c.Capacity)
	}
	if s.now < s.nextReport {
		return
	}
	for s.nextReport <= s.now {
		s.nextReport += int64(s.eng.Report)
	}
	for i, d := range s.domains {
		d.eng.sample()
		s.signals[i] = d.eng.signal(d.id)
	}
	s.pol.observe(s.now, s.signals)
}

// completions advances every phase to now, moves finished prefills to
// decode and releases finished decodes.
func (s *sim) completions() error {
	for _, d := range s.domains {
		d.prefill.advance(s.now)
		d.decode.advance(s.now)
		for r := d.prefill.done(); r != nil; r = d.prefill.done() {
			if d.eng != nil {
				d.eng.firstToken(s.now, r)
				s.erec.firstToken(r)
			}
			d.decode.add(r, float64(r.cost.DecodeBytes))
		}
		if d.eng != nil {
			d.eng.fill(s.now, d) // prefill budget freed
		}
		for r := d.decode.done(); r != nil; r = d.decode.done() {
			d.served++
			if d.eng != nil {
				d.eng.finish(s.now, r)
			}
			r.releases++
			if err := s.pol.release(s.now, r); err != nil {
				return fmt.Errorf("release of trace line %d: %w", r.row.Line, err)
			}
		}
		if d.eng != nil {
			d.eng.fill(s.now, d)
		}
	}
	return nil
}

// decided records a policy's answer for r at now and, for an admission,
// starts serving it in its domain. domain "" or unknown counts as a
// request spanning domains (a broken answer): it is counted, not run.
func (s *sim) decided(r *simReq, outcome admission.Outcome, reason admission.Reason, domain, model string, lease uint64) error {
	if r.answered {
		return errors.New("replay: a request answered twice")
	}
	r.answered, r.outcome, r.reason, r.lease = true, outcome, reason, lease
	if outcome == admission.Rejected {
		s.rec.answered(r, "")
		if s.erec != nil {
			s.erec.refused(r)
		}
		return nil
	}
	r.admitAt = s.now
	di, ok := s.byID[domain]
	if !ok {
		s.rec.spanning++
		s.rec.answered(r, model)
		return nil
	}
	r.domain = di
	m, ok := s.cat.Get(model)
	if !ok {
		return fmt.Errorf("replay: granted unknown model %q", model)
	}
	d := s.domains[di]
	c, err := d.cap.Cost(m, r.row.Prompt, r.row.Output)
	if err != nil {
		return fmt.Errorf("trace line %d: %w", r.row.Line, err)
	}
	r.cost = c
	d.admitted++
	s.rec.answered(r, model)
	if d.eng == nil {
		d.prefill.advance(s.now)
		d.prefill.add(r, float64(c.PrefillFLOP))
		return nil
	}
	if c.KVBytes > d.eng.kvCap {
		return fmt.Errorf("trace line %d: admitted to %s with %d B of KV, more than its engine holds (%d B)", r.row.Line, d.id, c.KVBytes, d.eng.kvCap)
	}
	s.erec.admitted(r, di)
	d.eng.enqueue(r)
	d.eng.fill(s.now, d)
	return nil
}
