package admission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-sched/sluice/internal/tokenbucket"
	"github.com/sluice-sched/sluice/pd"
)

// bucketKind names the buckets that shared state reconciles.
type bucketKind uint8

const (
	kindRPS bucketKind = iota
	kindTokens
	kindFloor
	kindCritical
	kindPrefill
	kindDecode
	numKinds
)

var kindSuffix = [numKinds]string{"rps", "tok", "floor", "crit", "pf", "dc"}

// KindNames are the bucket kinds as metrics label them, by kind.
var KindNames = [numKinds]string{"rps", "tokens", "floor", "critical", "prefill", "decode"}

// Store keys: "t/<tenant>/<kind>", "d/<domain>/<kind>", "d/<domain>/kv".
// The adapter adds its prefix and hash tag.
func tenantKey(name string, k bucketKind) string { return "t/" + name + "/" + kindSuffix[k] }
func domainKey(id string, k bucketKind) string   { return "d/" + id + "/" + kindSuffix[k] }
func kvKey(id string) string                     { return "d/" + id + "/kv" }

// scaleFor returns the unit a bucket of this rate and burst is reported in:
// a power of two keeping both below 2^32 units, so that cumulative counters
// modulo CumModulus wrap only after days and Lua's doubles stay exact.
func scaleFor(rate, burst int64) int64 {
	n := bits.Len64(uint64(max(rate, burst, 1)))
	if n <= 32 {
		return 1
	}
	return 1 << (n - 32)
}

// mulDiv returns a·b/c for non-negative a, b and positive c, saturating.
func mulDiv(a, b, c int64) int64 {
	if a <= 0 || b <= 0 || c <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(min(q, math.MaxInt64))
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return a / b
	}
	return (a + b - 1) / b
}

// syncEntry is this replica's reporting state for one shared bucket.
type syncEntry struct {
	key       string
	kind      bucketKind
	owner     any   // the *tenantState or *pd.DomainCapacity whose bucket was last read
	lastTaken int64 // the owner's Bucket.Taken at the last report
	scale     int64
	rem       int64 // unscaled units taken but not yet reported, |rem| < scale
	cum       int64 // scaled, modulo CumModulus
	unacked   int64
	epoch     uint64
	started   bool  // the store has acknowledged a report of this epoch
	lastAt    int64 // engine time of the last report
	// Set by a report, used by the apply that follows.
	snapTaken   int64
	sentUnacked int64
}

type entryKey struct {
	name string
	kind bucketKind
}

// roundItem is one bucket of a reconcile round.
type roundItem struct {
	en   *syncEntry
	b    *tokenbucket.Bucket // tenant buckets (domains' are d.cap's)
	t    *tenantState
	d    *domainState
	cap  *pd.DomainCapacity // d's capacity when reported: a reload may replace it
	rate int64              // the whole bucket's rate, unscaled
}

// sharedSync is the engine's side of shared state.
type sharedSync struct {
	store      SharedState
	opts       SharedOptions
	br         breaker
	reconciles sync.Mutex // one reconcile at a time

	// Under Engine.mu.
	replicas  int
	down      bool // the breaker is open: fail modes apply
	entries   map[entryKey]*syncEntry
	round     []roundItem
	lastPrune int64
	epochs    uint64 // the last epoch handed to an entry

	calls, decisions, failures atomic.Uint64
	lastOK                     atomic.Int64 // wall-clock unix nanoseconds of the last successful call
	overage                    [numKinds]atomic.Int64
}

func newSharedSync(store SharedState, o SharedOptions) *sharedSync {
	return &sharedSync{
		store:    store,
		opts:     o,
		br:       breaker{limit: o.Failures, cooldown: o.Cooldown},
		replicas: o.Replicas,
		entries:  make(map[entryKey]*syncEntry),
	}
}

// SetReplicas sets N, the number of live replicas sharing the quotas (from
// membership). The next reconcile re-slices; nothing already reported is
// counted again.
func (e *Engine) SetReplicas(n int) {
	if e.shared == nil {
		return
	}
	e.mu.Lock()
	e.shared.replicas = max(n, 1)
	e.mu.Unlock()
}

// SharedStatus describes the shared-state link; ok is false when the engine
// runs embedded.
func (e *Engine) SharedStatus() (st SharedStatus, ok bool) {
	s := e.shared
	if s == nil {
		return SharedStatus{}, false
	}
	e.mu.Lock()
	st.Mode, st.Replicas = s.opts.Mode, s.replicas
	e.mu.Unlock()
	wall := e.clk.Now()
	st.BreakerOpen, st.FallbackSeconds = s.br.status(wall)
	if last := s.lastOK.Load(); last != 0 {
		st.ReconcileLag = wall.Sub(time.Unix(0, last))
	}
	for k := range s.overage {
		st.Overage += s.overage[k].Load()
	}
	st.Calls, st.Decisions, st.Failures = s.calls.Load(), s.decisions.Load(), s.failures.Load()
	return st, true
}

// SharedOverage returns the units given up to overages, per bucket kind
// (in KindNames order).
func (e *Engine) SharedOverage() (out [numKinds]int64) {
	if e.shared != nil {
		for k := range out {
			out[k] = e.shared.overage[k].Load()
		}
	}
	return out
}

// runShared reconciles every interval until ctx ends (batched mode), or
// (strict mode) probes the store while the breaker is open: fail-closed
// tiers are refused before any store call, so their traffic alone would
// never find out that the store is back.
func (e *Engine) runShared(ctx context.Context) {
	s := e.shared
	period := s.opts.Interval
	if s.opts.Mode == SharedStrict {
		period = s.opts.Cooldown
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.opts.Mode == SharedBatched {
			_ = e.Reconcile(ctx) // failures feed the breaker and the metrics
			continue
		}
		if open, _ := s.br.status(e.clk.Now()); open && s.br.allow(e.clk.Now()) {
			cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
			err := s.store.Ping(cctx)
			cancel()
			e.storeAnswered(err)
		}
	}
}

// Reconcile runs one batched reconcile now: it reports what this replica
// took from every shared bucket and applies the grants that come back. Run
// calls it every interval; tests call it directly. While the breaker is
// open it returns an error without calling the store, until the cool-down
// lets a probe through.
func (e *Engine) Reconcile(ctx context.Context) error {
	s := e.shared
	if s == nil || s.opts.Mode != SharedBatched {
		return nil
	}
	s.reconciles.Lock()
	defer s.reconciles.Unlock()
	if !s.br.allow(e.clk.Now()) {
		return errBreakerOpen
	}
	e.mu.Lock()
	req := e.sharedReportLocked(e.nowLocked())
	e.mu.Unlock()

	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	rep, err := s.store.Reconcile(cctx, req)
	cancel()
	s.calls.Add(1)
	if err == nil && (len(rep.Buckets) != len(req.Buckets) || len(rep.Gauges) != len(req.Gauges)) {
		err = fmt.Errorf("reply has %d buckets and %d gauges for %d and %d", len(rep.Buckets), len(rep.Gauges), len(req.Buckets), len(req.Gauges))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.storeFailedLocked()
		return fmt.Errorf("shared state: reconcile: %w", err)
	}
	e.storeOKLocked()
	e.applyGrantsLocked(e.nowLocked(), rep)
	return nil
}

var errBreakerOpen = errors.New("shared state: breaker open")

// storeAnswered counts the outcome of a store call made outside the lock.
func (e *Engine) storeAnswered(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.storeFailedLocked()
	} else {
		e.storeOKLocked()
	}
}

// storeFailedLocked counts a failed store call; the breaker may open.
func (e *Engine) storeFailedLocked() {
	s := e.shared
	s.failures.Add(1)
	if s.br.failure(e.clk.Now()) {
		e.setStateDownLocked(true)
	}
}

// storeOKLocked counts a successful store call; an open breaker closes.
func (e *Engine) storeOKLocked() {
	s := e.shared
	wall := e.clk.Now()
	s.lastOK.Store(wall.UnixNano())
	if s.br.success(wall) {
		e.setStateDownLocked(false)
	}
}

// setStateDownLocked enters or leaves fallback. Batched replicas keep
// deciding from their last grants. Strict replicas, whose local buckets are
// whole while the store decides, cut them to a 1/N slice while it cannot.
func (e *Engine) setStateDownLocked(down bool) {
	s := e.shared
	if s.down == down {
		return
	}
	s.down = down
	if s.opts.OnBreaker != nil {
		s.opts.OnBreaker(down)
	}
	if s.opts.Mode != SharedStrict {
		return
	}
	now := e.nowLocked()
	for _, t := range e.mu.tenants {
		t.setPolicy(t.policy, now, false)
		if down {
			s.sliceTenant(t, now, true)
		}
	}
	for _, d := range e.mu.domains {
		if down {
			s.sliceDomain(d, now)
		} else {
			_ = d.cap.Resize(&d.topo) // the same domain: cannot fail
		}
	}
}

// sliceTenant cuts a tenant's buckets to a 1/N slice of their bursts,
// refilling at 1/N of their rates, or not at all until a grant comes
// (refill false: a tenant new to this replica, whose refill before the
// store has heard of it would be taken from nobody's quota).
func (s *sharedSync) sliceTenant(t *tenantState, now int64, refill bool) {
	n := int64(s.replicas)
	for k, b := range t.buckets() {
		rate := b.Rate() / n
		if !refill {
			rate = 0
		}
		credit := int64(0)
		if bucketKind(k) == kindTokens {
			credit = b.Credit() / n
		}
		level := min(b.Level(now), b.Burst()/n)
		b.SetLimits(rate, b.Burst(), credit)
		b.SetLevel(now, level)
	}
}

// capacityRebuiltLocked follows a domain whose capacity a reload or a
// topology change rebuilt (old nil: a new domain). What the old capacity
// took since the last report is carried into the next one, and the new
// capacity keeps this replica's share (scaled to the domain's new size), or
// starts from a 1/N slice: until a grant, N replicas together hold one
// domain's capacity, not N.
func (s *sharedSync) capacityRebuiltLocked(now int64, d *domainState, old *pd.DomainCapacity) {
	if old != nil {
		p, dc := old.Taken()
		for k, taken := range map[bucketKind]int64{kindPrefill: p, kindDecode: dc} {
			if en := s.entries[entryKey{d.ID(), k}]; en != nil && en.owner == old {
				en.rem += taken - en.lastTaken
				en.owner, en.lastTaken = d.cap, 0 // CopyLevels does not count as taken
			}
		}
	}
	if s.opts.Mode != SharedBatched && !s.down {
		return // strict: whole while the store decides
	}
	if old == nil {
		s.sliceDomain(d, now)
		return
	}
	oldP, oldD, oldKV := old.FullLimits()
	newP, newD, newKV := d.cap.FullLimits()
	_, kvLimit := old.KV()
	p, dc := d.cap.Levels(now)
	d.cap.ApplyShare(now, pd.ShareGrant{
		PrefillRate: mulDiv(old.PrefillRate(), newP, oldP), PrefillLevel: p,
		DecodeRate: mulDiv(old.DecodeRate(), newD, oldD), DecodeLevel: dc,
		KVLimit: mulDiv(kvLimit, newKV, oldKV),
	})
}

// sliceDomain cuts a domain's capacity to a 1/N share.
func (s *sharedSync) sliceDomain(d *domainState, now int64) {
	n := int64(s.replicas)
	pr, dr, kv := d.cap.FullLimits()
	p, dc := d.cap.Levels(now)
	d.cap.ApplyShare(now, pd.ShareGrant{
		PrefillRate: pr / n, PrefillLevel: min(p, d.cap.PrefillBurst()/n),
		DecodeRate: dr / n, DecodeLevel: min(dc, d.cap.DecodeBurst()/n),
		KVLimit: kv / n,
	})
}

// buckets returns the tenant's four buckets in kind order.
func (t *tenantState) buckets() [4]*tokenbucket.Bucket {
	return [4]*tokenbucket.Bucket{&t.rps, &t.tokens, &t.floor, &t.critical}
}

// globalLimits returns the whole (all-replica) rate and burst of a tenant
// bucket, from its policy.
func (t *tenantState) globalLimits(k bucketKind) (rate, burst int64) {
	p := &t.policy
	switch k {
	case kindRPS:
		return roundUnits(p.RPS.Rate * rpsUnit), roundUnits(p.RPS.Burst * rpsUnit)
	case kindTokens:
		return roundUnits(p.Tokens.Rate), roundUnits(p.Tokens.Burst)
	case kindFloor:
		return p.Floor, p.Floor
	}
	return roundUnits(p.Critical.Rate), roundUnits(p.Critical.Burst)
}

// sharedReportLocked builds this round's report: every active tenant's
// buckets and every domain's buckets and KV gauge.
func (e *Engine) sharedReportLocked(now int64) *ReconcileRequest {
	s := e.shared
	s.round = s.round[:0]
	req := &ReconcileRequest{
		Replica:  s.opts.Replica,
		Replicas: s.replicas,
		Stale:    3 * s.opts.Interval,
	}
	for name, t := range e.mu.tenants {
		if s.idleLocked(now, name, t) {
			continue
		}
		for k, b := range t.buckets() {
			rate, burst := t.globalLimits(bucketKind(k))
			if rate == 0 && burst == 0 {
				continue
			}
			req.Buckets = append(req.Buckets, s.report(now, entryKey{name, bucketKind(k)}, t, b, rate, burst, now-t.created))
			s.round = append(s.round, roundItem{en: s.entries[entryKey{name, bucketKind(k)}], b: b, t: t, rate: rate})
		}
	}
	ttl := e.mu.cfg.Leases.TTL.Duration
	for _, d := range e.mu.domains {
		if d.removed {
			continue
		}
		pr, dr, kvLimit := d.cap.FullLimits()
		pb, db := d.cap.PrefillBurst(), d.cap.DecodeBurst()
		var dem int64
		for _, k := range [2]bucketKind{kindPrefill, kindDecode} {
			b := d.cap.Bucket(k == kindDecode) // a copy: read only
			rate, burst := pr, pb
			if k == kindDecode {
				rate, burst = dr, db
			}
			ek := entryKey{d.ID(), k}
			rep := s.report(now, ek, d.cap, &b, rate, burst, 0)
			dem = rep.Demand
			req.Buckets = append(req.Buckets, rep)
			s.round = append(s.round, roundItem{en: s.entries[ek], d: d, cap: d.cap, rate: rate})
		}
		kvUsed, _ := d.cap.KV()
		req.Gauges = append(req.Gauges, GaugeReport{Key: kvKey(d.ID()), Limit: kvLimit, Held: kvUsed, Share: dem, TTL: ttl})
	}
	e.pruneEntriesLocked(now)
	return req
}

// report reads one bucket into its entry and returns the bucket's report;
// age is how long the bucket has existed here (0: do not credit it).
func (s *sharedSync) report(now int64, ek entryKey, owner any, b *tokenbucket.Bucket, rate, burst, age int64) BucketReport {
	en := s.entries[ek]
	if en == nil {
		key := tenantKey(ek.name, ek.kind)
		if ek.kind >= kindPrefill {
			key = domainKey(ek.name, ek.kind)
		}
		s.epochs++
		en = &syncEntry{key: key, kind: ek.kind, scale: scaleFor(rate, burst), epoch: s.epochs, lastAt: now - int64(s.opts.Interval)}
		s.entries[ek] = en
	}
	if en.owner != owner { // a rebuilt tenant or domain: its bucket counts from 0
		en.owner, en.lastTaken = owner, 0
	}
	taken := b.Taken()
	en.rem += taken - en.lastTaken
	en.lastTaken = taken
	d := en.rem / en.scale
	en.rem -= d * en.scale
	en.cum = ((en.cum+d)%CumModulus + CumModulus) % CumModulus
	en.unacked += d

	// Demand: what it used, more when the bucket ran low (it was held back):
	// doubling finds a replica's real demand in a few rounds.
	elapsed := max(now-en.lastAt, int64(time.Millisecond))
	used := max(d, 0) * int64(time.Second) / elapsed
	demand := used + used/4
	if b.Level(now) < b.Burst()/10 {
		// Held back: it wants at least twice what it has (a blocked
		// replica uses nothing, which must not read as no demand).
		demand = max(2*used, 2*b.Rate()/en.scale, 1)
	}
	en.lastAt = now
	en.snapTaken, en.sentUnacked = taken, en.unacked
	rep := BucketReport{
		Key: en.key, Rate: rate / en.scale, Burst: burst / en.scale,
		Cum: en.cum, Unacked: en.unacked, Epoch: en.epoch, Demand: demand,
	}
	if !en.started {
		// Only a bucket this replica is starting is credited for its age; a
		// store that lost its data (a restart) starts from the burst.
		rep.Age = time.Duration(age)
	}
	return rep
}

// idleLocked reports whether a tenant has been idle here for ten
// intervals: nothing taken, nothing refused, nothing unacknowledged. An
// idle tenant is not reported (a round costs the store per bucket, and a
// replica sees many tenants come and go); its buckets stop refilling at
// their grant, keeping the level they had, so that a share nobody is
// accounting for cannot grow. Its next take or refusal makes it active
// and reported again.
func (s *sharedSync) idleLocked(now int64, name string, t *tenantState) bool {
	active := t.sharedWant || now-t.created < 10*int64(s.opts.Interval)
	t.sharedWant = false
	for k, b := range t.buckets() {
		if rate, burst := t.globalLimits(bucketKind(k)); rate == 0 && burst == 0 {
			continue
		}
		en := s.entries[entryKey{name, bucketKind(k)}]
		if en == nil || en.owner != t || !en.started || en.unacked != 0 || en.rem != 0 || b.Taken() != en.lastTaken {
			active = true
			break
		}
	}
	if active {
		t.sharedActiveAt, t.sharedFrozen = now, false
		return false
	}
	if now-t.sharedActiveAt < 10*int64(s.opts.Interval) {
		return false
	}
	if !t.sharedFrozen {
		for _, b := range t.buckets() {
			b.SetLimits(0, b.Burst(), b.Credit())
		}
		t.sharedFrozen = true
	}
	return true
}

// pruneEntriesLocked forgets, once a minute, the entries whose bucket is
// gone (a swept or removed tenant, a rebuilt or removed domain) with
// nothing unacknowledged. A live bucket keeps its entry: its counter must
// go on from where the store last saw it.
func (e *Engine) pruneEntriesLocked(now int64) {
	s := e.shared
	if now-s.lastPrune < int64(time.Minute) {
		return
	}
	s.lastPrune = now
	for k, en := range s.entries {
		var live bool
		if k.kind >= kindPrefill {
			d := e.mu.domainByID[k.name]
			live = d != nil && d.cap == en.owner
		} else {
			live = e.mu.tenants[k.name] == en.owner
		}
		if !live && en.unacked == 0 {
			delete(s.entries, k)
		}
	}
}

// applyGrantsLocked installs the grants of the round just reported. A
// bucket's level becomes its share of the global level less what it took
// since the report.
func (e *Engine) applyGrantsLocked(now int64, rep *ReconcileReply) {
	s := e.shared
	var prefill pd.ShareGrant
	kv := 0
	for i, it := range s.round {
		g, en := rep.Buckets[i], it.en
		en.unacked -= en.sentUnacked
		en.started = true
		if g.Level < 0 {
			s.overage[en.kind].Add(-g.Level * en.scale)
		}
		gauge := kv
		if it.d != nil && en.kind == kindDecode {
			kv++ // one KV gauge per domain, in the order of the decode items
		}
		if it.d != nil && it.d.cap != it.cap {
			continue // rebuilt by a reload meanwhile: the next round grants it
		}
		var since int64
		if it.t != nil {
			since = it.b.Taken() - en.snapTaken
		} else {
			p, d := it.d.cap.Taken()
			since = p - en.snapTaken
			if en.kind == kindDecode {
				since = d - en.snapTaken
			}
		}
		rate, level := mulDiv(g.RateMilli, en.scale, 1000), g.Level*en.scale-since
		switch {
		case it.t != nil:
			credit := int64(0)
			if en.kind == kindTokens && it.t.breaker == breakerClosed && it.rate > 0 {
				credit = mulDiv(creditLimit(it.t.policy), rate, it.rate) // the same share of the credit
			}
			it.b.SetLimits(rate, it.b.Burst(), credit)
			it.b.SetLevel(now, level)
		case en.kind == kindPrefill:
			prefill = pd.ShareGrant{PrefillRate: rate, PrefillLevel: level}
		default: // decode, which follows its domain's prefill
			g := prefill
			g.DecodeRate, g.DecodeLevel = rate, level
			g.KVLimit = rep.Gauges[gauge]
			it.d.cap.ApplyShare(now, g)
		}
	}
}

// breaker opens after limit consecutive failures and lets one probe through
// every cooldown while open. It has its own lock: strict decisions use it
// concurrently, outside the engine's lock.
type breaker struct {
	mu       sync.Mutex
	limit    int
	cooldown time.Duration
	fails    int
	open     bool
	openedAt time.Time
	probeAt  time.Time
	fallback time.Duration // total time spent open, up to the last close
}

// allow reports whether a store call may go ahead now.
func (b *breaker) allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return true
	}
	if now.Before(b.probeAt) {
		return false
	}
	b.probeAt = now.Add(b.cooldown) // one probe per cool-down
	return true
}

// failure counts a failed call and reports whether the breaker just opened.
func (b *breaker) failure(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fails++
	if b.open || b.fails < b.limit {
		return false
	}
	b.open, b.openedAt, b.probeAt = true, now, now.Add(b.cooldown)
	return true
}

// success counts a successful call and reports whether the breaker just closed.
func (b *breaker) success(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fails = 0
	if !b.open {
		return false
	}
	b.open = false
	b.fallback += now.Sub(b.openedAt)
	return true
}

// status reports whether the breaker is open and the total seconds spent open.
func (b *breaker) status(now time.Time) (open bool, seconds float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	total := b.fallback
	if b.open {
		total += now.Sub(b.openedAt)
	}
	return b.open, total.Seconds()
}

// replicaLease names a lease in the store: unique across replicas.
func replicaLease(replica string, id uint64) string {
	return replica + "/" + strconv.FormatUint(id, 10)
}
