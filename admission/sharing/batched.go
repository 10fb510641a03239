package sharing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/tokenbucket"
	"github.com/sluice-sched/sluice/pd"
)

const (
	// idleRounds is how many reconcile intervals a tenant must be idle
	// here before it stops being reported.
	idleRounds = 10
	// quietShare: a tenant that took at most 1/quietShare of its level
	// here since its last report is not reported (see leftOutLocked).
	quietShare = 8
	// maxCallTenants bounds the tenants one call reports (after the
	// domains): a call to a shard holds its single thread for the whole
	// batch, so an unbounded one (many tenants new at once, or back from
	// a failure with everything unacknowledged) would time out, and its
	// tenants, unacknowledged, would all be reported again. Those left
	// over go in the next rounds, in map order.
	maxCallTenants = 1024
	// reportAllRounds is how many rounds after the membership shrinks
	// report every domain.
	reportAllRounds = 3
	// pruneEvery is how often entries of buckets that are gone are forgotten.
	pruneEvery = time.Minute
	// staleRounds is how many intervals of silence drop a replica out of
	// the store's shares.
	staleRounds = 3
	// SilentHoldRounds is how many reconcile intervals a replica's holding
	// of a gauge (the KV its leases hold in a domain) outlives its last
	// report where no membership says more (SharedOptions.MemberExpiry):
	// then the others reclaim it, its holding and its weight in the free
	// part. Longer than staleRounds, so that a replica that misses a round
	// or two (a pause, a slow call) loses its share of the free part
	// first, not what its leases hold.
	SilentHoldRounds = 10
	// rejoinRounds is how many intervals after a bucket is rebuilt from
	// the replicas' levels (a store back from an outage) a replica back
	// from the same outage still brings its level: the breakers probe every
	// interval, so all are back within a few.
	rejoinRounds = 30
)

// batchedState is the batched strategy: decisions are taken locally from
// this replica's grant of every bucket, and every interval one store call
// reports what was taken and brings the next grants (as CockroachDB's
// distributed token bucket does).
type batchedState struct {
	*storeLink
	reconciles sync.Mutex // one reconcile at a time

	sharded Sharded // the store, when it is sharded

	// Under the engine's lock.
	entries  map[entryKey]*syncEntry
	activity map[string]*tenantActivity
	domains  map[string]*domainActivity
	engines  map[string]*engineRelay
	shards   shardSet
	// reportAll: the membership shrank; this many more rounds report
	// every domain (see SetReplicasLocked).
	reportAll int
	lastPrune int64
	epochs    uint64 // the last epoch handed to an entry
}

func newBatchedState(link *storeLink) *batchedState {
	sharded, _ := link.store.(Sharded)
	return &batchedState{
		storeLink: link,
		sharded:   sharded,
		entries:   make(map[entryKey]*syncEntry),
		activity:  make(map[string]*tenantActivity),
		domains:   make(map[string]*domainActivity),
		engines:   make(map[string]*engineRelay),
		shards:    shardSet{byName: make(map[string]*shard)},
	}
}

// syncEntry is this replica's reporting state for one shared bucket.
type syncEntry struct {
	key       string
	kind      Kind
	owner     any   // the Tenant or *pd.DomainCapacity whose bucket was last read
	lastTaken int64 // the owner's Bucket.Taken at the last report
	scale     int64
	rem       int64 // unscaled units taken but not yet reported, |rem| < scale
	cum       int64 // scaled, modulo CumModulus
	unacked   int64
	epoch     uint64
	started   bool  // the store has acknowledged a report of this epoch
	lastAt    int64 // engine time of the last report
	ackAt     int64 // engine time of the last acknowledged report
	// frozen: the bucket stopped refilling (an idle tenant) since the last
	// acknowledged report, so its level is not the truth of an outage.
	frozen bool
	// resumed: the last report brought the level after a silence longer
	// than the store's Stale (an outage), which the store rebuilds from.
	resumed bool
	// Set by a report, used by the grant that answers it.
	snapTaken   int64
	sentUnacked int64
}

type entryKey struct {
	name string
	kind Kind
}

// tenantActivity is what decides whether a tenant is reported.
type tenantActivity struct {
	owner    Tenant
	activeAt int64 // the last round with activity
	frozen   bool  // idle: its buckets stopped refilling at their grant
	want     bool  // a quota refusal since the last round asks for a grant
}

// domainActivity is what decides whether a domain is reported.
type domainActivity struct {
	owner      *pd.DomainCapacity
	reportedAt int64 // engine time of the last report
	kvHeld     int64 // the KV its leases held then
	took       bool  // that report carried takes: the next says whether they stopped
	paused     bool  // not reported since: its buckets stopped refilling
}

// engineRelay is what this replica has published and taken of one
// domain's engine readings: a few replicas read a domain's engines, and
// the store relays their newest reading to every replica reporting the
// domain.
type engineRelay struct {
	sentAt int64 // engine time of the last own reading published
	heard  int64 // the store's stamp of the last reading taken from it
}

// A round is one reconcile, one call per shard (shard.req): each bucket
// reported, with the index of its report in its shard's request, which
// is its grant's index in the reply.

type tenantRound struct {
	t    Tenant
	b    *tokenbucket.Bucket
	en   *syncEntry
	rate int64 // the whole bucket's rate, unscaled
	at   int
}

type domainRound struct {
	d               Domain
	cap             *pd.DomainCapacity // d's capacity when reported: a reload may replace it
	prefill, decode *syncEntry
	at              int // the prefill bucket's index; the decode bucket's is at+1
	gauge           int // the KV gauge's index
	// keepKV: this replica was silent for longer than its holding lasts
	// (an outage), so the store may have let go of the others' holdings as
	// well as its own; its grant is capped at its KV limit from before for
	// this round, until they have reported again.
	keepKV bool
}

// SetReplicasLocked implements Strategy. When the membership shrinks, a
// replica that left has let go of its domains' KV holdings at the store
// (they outlive its reports until its membership lapses: holdFor), and
// the next rounds report every domain, paused ones too, so that the
// others take its capacity back within an interval rather than at their
// next due report (hold/2 away). Three rounds, not one: the store's
// clock, which lapses the holding, and etcd's, which ends the membership,
// are not the same clock.
func (s *batchedState) SetReplicasLocked(n int) {
	if n < s.replicas {
		s.reportAll = reportAllRounds
	}
	s.storeLink.SetReplicasLocked(n)
}

// TenantReadyLocked implements Strategy.
func (s *batchedState) TenantReadyLocked(t Tenant, now int64, reloaded bool) {
	// A new tenant gets no refill until the store has heard of it (unless
	// the store is down: then the slice is all there is).
	s.sliceTenant(t, now, reloaded || s.tenantDownLocked(t))
	if a := s.activity[t.Name()]; a != nil && reloaded {
		a.frozen = false // an idle tenant freezes again at the next round
	}
}

// CapacityRebuiltLocked implements Strategy.
func (s *batchedState) CapacityRebuiltLocked(now int64, d Domain, old *pd.DomainCapacity) {
	if old != nil {
		// What the old capacity took since the last report goes into the next.
		p, dc := old.Taken()
		for k, taken := range map[Kind]int64{KindPrefill: p, KindDecode: dc} {
			if en := s.entries[entryKey{d.ID(), k}]; en != nil && en.owner == old {
				en.rem += taken - en.lastTaken
				en.owner, en.lastTaken = d.Capacity(), 0 // CopyLevels does not count as taken
			}
		}
	}
	s.keepShare(now, d, old)
}

// GateLocked thaws, while the store is unreachable, a tenant frozen idle
// before it went away: no grant can come to thaw it, so it decides on its
// own 1/N slice, as a tenant new in an outage does, rather than at a rate
// of 0 until the store returns. (One comparison per decision otherwise.)
func (s *batchedState) GateLocked(t Tenant) Refusal {
	if s.tenantDownLocked(t) {
		if a := s.activity[t.Name()]; a != nil && a.owner == t && a.frozen {
			now := s.v.NowLocked()
			for k, b := range t.Buckets() {
				rate, _ := t.Limits(Kind(k))
				b.Level(now) // brings the bucket to now at rate 0: the frozen time refills nothing
				b.SetLimits(rate/int64(s.replicas), b.Burst(), b.Credit())
				if en := s.entries[entryKey{t.Name(), Kind(k)}]; en != nil {
					en.frozen = false
				}
			}
			a.activeAt, a.frozen = now, false
		}
		if t.FailClosed() {
			return Refusal{Unavailable, probeEvery(s.opts)} // the next probe may find it back
		}
	}
	return Refusal{}
}

// QuotaRefusedLocked implements Strategy.
func (s *batchedState) QuotaRefusedLocked(t Tenant, retry time.Duration) time.Duration {
	s.activityOf(t).want = true
	// The local grant changes at every reconcile (a new tenant has no
	// refill until its first), so a longer wait is not known.
	if retry > s.opts.Interval {
		return s.opts.Interval
	}
	return clampRetry(retry)
}

// Decided implements Strategy: it counts the decision.
func (s *batchedState) Decided(context.Context, string, uint64) Refusal {
	s.decisions.Add(1)
	return Refusal{}
}

// ReleasedLocked implements Strategy: a release has nothing to tell the
// store before the next report.
func (s *batchedState) ReleasedLocked(uint64, Charge, int64, pd.Cost) func(context.Context) {
	return nil
}

// Run reconciles every interval until ctx ends; failures feed the breaker
// and the metrics.
func (s *batchedState) Run(ctx context.Context) {
	clock.Every(ctx, s.opts.Interval, func() { _ = s.Reconcile(ctx) })
}

// Reconcile implements Strategy: it reports what this replica took from
// the shared buckets and applies the grants that come back, one call per
// shard, all at once, each applied as it answers. A shard whose breaker is
// open is not called until its cool-down lets a probe through
// (errBreakerOpen); the others go on. Reconcile waits for the calls at
// most Options.Patience (an interval): one slower than that (a master that
// stopped answering waits out its timeout) goes on alone, and the rounds leave its shard be
// until it answers, so that it does not hold back the others' rounds.
func (s *batchedState) Reconcile(ctx context.Context) error {
	s.reconciles.Lock()
	defer s.reconciles.Unlock()
	v := s.v
	v.Lock()
	calls, held := s.reportLocked(v.NowLocked())
	v.Unlock()

	answers := make(chan error, len(calls))
	for _, sh := range calls {
		go func() { answers <- s.reconcileOn(ctx, sh) }()
	}
	patience := time.NewTimer(s.opts.Patience)
	defer patience.Stop()
	var errs []error
	for range calls {
		select {
		case err := <-answers:
			errs = append(errs, err)
		case <-patience.C:
			errs = append(errs, errSlowShard)
			return fmt.Errorf("shared state: reconcile: %w", errors.Join(errs...))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("shared state: reconcile: %w", err)
	}
	if held {
		return errBreakerOpen
	}
	return nil
}

// errSlowShard: a shard's call has not answered within the interval.
var errSlowShard = errors.New("a shard's call is still out after an interval")

// reconcileOn sends one shard's part of the round and applies its answer:
// the grants, or a failure to the shard's breaker. The shard is no longer
// in flight then.
func (s *batchedState) reconcileOn(ctx context.Context, sh *shard) error {
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	rep, err := s.call(cctx, sh)
	cancel()
	s.v.Lock()
	defer s.v.Unlock()
	sh.inflight = false
	if err != nil {
		s.shardFailedLocked(sh)
		return err
	}
	s.shardOKLocked(sh)
	s.applyGrantsLocked(s.v.NowLocked(), sh, rep)
	return nil
}

// call sends one shard's part of the round.
func (s *batchedState) call(ctx context.Context, sh *shard) (*ReconcileReply, error) {
	rep, err := s.store.Reconcile(ctx, &sh.req)
	s.calls.Add(1)
	if err == nil && (len(rep.Buckets) != len(sh.req.Buckets) || len(rep.Gauges) != len(sh.req.Gauges) ||
		rep.Readings != nil && len(rep.Readings) != len(sh.req.Gauges)+len(sh.req.Engines)) {
		err = fmt.Errorf("reply has %d buckets, %d gauges and %d engine readings for %d, %d and %d+%d",
			len(rep.Buckets), len(rep.Gauges), len(rep.Readings), len(sh.req.Buckets), len(sh.req.Gauges), len(sh.req.Gauges), len(sh.req.Engines))
	}
	if err != nil && sh.name != "" {
		err = fmt.Errorf("shard %s: %w", sh.name, err)
	}
	return rep, err
}

// reportLocked builds this round's report, one request per shard: every
// active tenant's buckets, and the buckets and KV gauge of every domain
// this replica has used since its last report (or whose report is due:
// see domainDueLocked). It returns the shards to call, and whether a
// shard's breaker held its part back.
func (s *batchedState) reportLocked(now int64) (calls []*shard, held bool) {
	s.beginRoundLocked()
	hold := s.holdFor(s.v.LeaseTTLLocked())
	for d := range s.v.DomainsLocked() {
		if d.Removed() {
			continue
		}
		c := d.Capacity()
		shardName := s.shardOf(domainKey(d.ID(), KindPrefill))
		sh := s.partLocked(shardName)
		due := s.domainDueLocked(now, d, c, shardName, hold)
		if sh == nil {
			continue
		}
		s.enginesLocked(sh, d, due)
		if !due {
			continue
		}
		pr, dr, kvLimit := c.FullLimits()
		// Unramped: a replica's warm-up limits only its own admissions.
		pb, db := c.FullBursts()
		pf, dc := c.Bucket(false), c.Bucket(true) // copies: read only
		dround := domainRound{d: d, cap: c, at: len(sh.req.Buckets), gauge: len(sh.req.Gauges)}
		prefill := s.report(now, entryKey{d.ID(), KindPrefill}, c, &pf, pr, pb, 0)
		decode := s.report(now, entryKey{d.ID(), KindDecode}, c, &dc, dr, db, 0)
		sh.req.Buckets = append(sh.req.Buckets, prefill, decode)
		dround.prefill, dround.decode = s.entries[entryKey{d.ID(), KindPrefill}], s.entries[entryKey{d.ID(), KindDecode}]
		dround.keepKV = dround.prefill.started && now-dround.prefill.ackAt > int64(hold)
		sh.domains = append(sh.domains, dround)
		kvUsed, _ := c.KV()
		sh.req.Gauges = append(sh.req.Gauges, GaugeReport{Key: kvKey(d.ID()), Limit: kvLimit, Held: kvUsed, Share: decode.Demand, TTL: hold})
		a := s.domains[d.ID()]
		a.reportedAt, a.kvHeld = now, kvUsed
	}
	for t := range s.v.TenantsLocked() {
		name := t.Name()
		// Every shard holding a tenant here, idle or not, is called each
		// round: its answer (or its failure) is what thaws an idle tenant
		// in an outage.
		sh := s.partLocked(s.shardOf(tenantKey(name, KindRPS)))
		if s.leftOutLocked(now, t) || sh == nil {
			continue
		}
		if len(sh.tenants) >= maxCallTenants {
			continue // the next round's: a call's length stays bounded
		}
		for k, b := range t.Buckets() {
			rate, burst := t.Limits(Kind(k))
			if rate == 0 && burst == 0 {
				continue
			}
			ek := entryKey{name, Kind(k)}
			sh.tenants = append(sh.tenants, tenantRound{t: t, b: b, rate: rate, at: len(sh.req.Buckets)})
			sh.req.Buckets = append(sh.req.Buckets, s.report(now, ek, t, b, rate, burst, now-t.Created()))
			sh.tenants[len(sh.tenants)-1].en = s.entries[ek]
		}
	}
	s.pruneLocked(now)
	s.reportAll = max(s.reportAll-1, 0)
	return s.endRoundLocked()
}

// enginesLocked adds d's engine entry to the shard's report, if it needs
// one: to publish the reading this replica made of d's engines since its
// last report, or to ask for the newest reading of a domain placement
// weighs lately that this round does not report (due: the reply to its
// gauge carries its reading). A replica that reads nothing and places
// nowhere asks for nothing: a round's entries follow what it does, not
// the size of the fleet.
func (s *batchedState) enginesLocked(sh *shard, d Domain, due bool) {
	if s.readings == nil {
		return
	}
	wanted := s.readings.EngineReadingWantedLocked(d) && !due
	var published *EngineReading
	if r, at, ok := s.readings.OwnEngineReadingLocked(d); ok {
		if rel := s.relayOf(d.ID()); at > rel.sentAt {
			rel.sentAt, published = at, &r
		}
	}
	if published == nil && !wanted {
		return
	}
	sh.req.Engines = append(sh.req.Engines, EngineReport{Key: kvKey(d.ID()), Reading: published})
	sh.engines = append(sh.engines, d)
}

// heardLocked hands d's capacity loop the engine reading the store relayed
// (another replica's), unless it has taken it already.
func (s *batchedState) heardLocked(d Domain, r *EngineReading) {
	if r == nil || s.readings == nil {
		return
	}
	if rel := s.relayOf(d.ID()); r.Stamp != rel.heard {
		rel.heard = r.Stamp
		s.readings.RelayEngineReadingLocked(d, *r)
	}
}

func (s *batchedState) relayOf(id string) *engineRelay {
	rel := s.engines[id]
	if rel == nil {
		rel = &engineRelay{sentAt: math.MinInt64} // engine times start at 0, and a reading's is earlier
		s.engines[id] = rel
	}
	return rel
}

// domainDueLocked reports whether this round reports domain d (its
// capacity c, on the shard named shardName): a domain new here or
// rebuilt; one this replica took from, or whose KV its leases changed,
// since its last report; one whose last report carried takes (this one
// tells the store they stopped, so that its share of the rate goes to
// those that use it); one with a report unacknowledged; and any other once
// every refreshEvery, so that its KV holding never lapses. At fleet scale a
// replica uses a few of the domains in a round, so a round's size follows
// what the replica did, not the size of the fleet.
//
// A domain not reported pauses: its buckets stop refilling at their
// grant, keeping their level, as an idle tenant's do, so that a share the
// store no longer accounts for (it drops a replica silent for Stale)
// cannot grow; its next report brings a grant again. While its shard is
// down no grant can come, so a paused domain takes its 1/N slice.
func (s *batchedState) domainDueLocked(now int64, d Domain, c *pd.DomainCapacity, shardName string, hold time.Duration) bool {
	a := s.domains[d.ID()]
	if a == nil || a.owner != c {
		s.domains[d.ID()] = &domainActivity{owner: c, took: true}
		return true
	}
	pf, dc := s.entries[entryKey{d.ID(), KindPrefill}], s.entries[entryKey{d.ID(), KindDecode}]
	if sh := s.shards.byName[shardName]; a.paused && sh != nil && sh.down {
		s.sliceDomain(d, now)
		a.paused = false
		for _, en := range []*syncEntry{pf, dc} {
			if en != nil {
				en.frozen = false // it refills again: the store's return rebuilds from its level
			}
		}
	}
	if pf == nil || dc == nil || pf.owner != c || dc.owner != c || !pf.started || !dc.started {
		return true
	}
	p, dcTaken := c.Taken()
	kv, _ := c.KV()
	took := p != pf.lastTaken || dcTaken != dc.lastTaken
	if took || a.took || s.reportAll > 0 || kv != a.kvHeld || pf.unacked != 0 || dc.unacked != 0 || now-a.reportedAt >= int64(s.refreshEvery(hold)) {
		a.took = took
		return true
	}
	if !a.paused {
		c.Pause(now)
		pf.frozen, dc.frozen = true, true
		a.paused = true
	}
	return false
}

// report reads one bucket into its entry and returns the bucket's report;
// age is how long the bucket has existed here (0: do not credit it).
func (s *batchedState) report(now int64, ek entryKey, owner any, b *tokenbucket.Bucket, rate, burst, age int64) BucketReport {
	en := s.entries[ek]
	if en == nil {
		key := tenantKey(ek.name, ek.kind)
		if ek.kind >= KindPrefill {
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
		// Only a bucket this replica is starting is credited for its age.
		rep.Age = time.Duration(age)
	} else if !en.frozen {
		// Its level refilled at its grant since the last acknowledged
		// report: a store back from an outage (or that lost its data)
		// rebuilds the bucket from the replicas' levels.
		rep.Resume, rep.Held, rep.Span = true, floorDiv(b.Level(now), en.scale), time.Duration(now-en.ackAt)
	}
	en.resumed = rep.Resume && rep.Span > staleRounds*s.opts.Interval
	return rep
}

func (s *batchedState) activityOf(t Tenant) *tenantActivity {
	a := s.activity[t.Name()]
	if a == nil || a.owner != t {
		a = &tenantActivity{owner: t}
		s.activity[t.Name()] = a
	}
	return a
}

// leftOutLocked reports whether this round leaves tenant t out. A tenant
// is left out when it is idle here (nothing taken, nothing refused,
// nothing unacknowledged for idleRounds intervals) or quiet: since its
// last report it took at most 1/quietShare of each bucket's level here,
// and that level is at least 1/(4N) of the burst, so that the store's
// count of it is off by little. Most of a fleet's tenants are far under
// their quotas, and reporting each of them every interval made a round's
// size grow with the tenants (CockroachDB's pods likewise ask for tokens
// when their local bucket runs low, not every interval).
//
// A tenant left out stops refilling at its grant, keeping its level, so
// that a share nobody is accounting for cannot grow (the store drops a
// replica silent for Stale from the shares). Once it takes more, runs
// low, or is refused, it is reported and granted again.
func (s *batchedState) leftOutLocked(now int64, t Tenant) bool {
	a := s.activityOf(t)
	active := a.want
	a.want = false
	young := now-t.Created() < idleRounds*int64(s.opts.Interval)
	used := false
	for k, b := range t.Buckets() {
		rate, burst := t.Limits(Kind(k))
		if rate == 0 && burst == 0 {
			continue
		}
		en := s.entries[entryKey{t.Name(), Kind(k)}]
		if en == nil || en.owner != t || !en.started || en.unacked != 0 {
			active = true
			break
		}
		taken := b.Taken() - en.lastTaken + en.rem
		if taken == 0 {
			continue
		}
		used = true
		level := b.Level(now)
		if quietShare*abs(taken) > level || 4*int64(s.replicas)*level < burst {
			active = true // it took a real part of what it holds, or runs low
			break
		}
	}
	if active {
		a.activeAt, a.frozen = now, false
		return false
	}
	if used {
		a.activeAt = now
	} else if young || !a.frozen && now-a.activeAt < idleRounds*int64(s.opts.Interval) {
		return false // new, or it just stopped: its reports tell the store so
	}
	if !a.frozen {
		for k, b := range t.Buckets() {
			b.SetLimits(0, b.Burst(), b.Credit())
			if en := s.entries[entryKey{t.Name(), Kind(k)}]; en != nil {
				en.frozen = true
			}
		}
		a.frozen = true
	}
	return true
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// pruneLocked forgets, every pruneEvery, the entries whose bucket is gone
// (a swept or removed tenant, a rebuilt or removed domain) with nothing
// unacknowledged, and the activity of tenants that are gone. A live bucket
// keeps its entry: its counter must go on from where the store last saw it.
func (s *batchedState) pruneLocked(now int64) {
	if now-s.lastPrune < int64(pruneEvery) {
		return
	}
	s.lastPrune = now
	for k, en := range s.entries {
		var live bool
		if k.kind >= KindPrefill {
			d := s.v.DomainLocked(k.name)
			live = d != nil && d.Capacity() == en.owner
		} else {
			live = s.v.TenantLocked(k.name) == en.owner
		}
		if !live && en.unacked == 0 {
			delete(s.entries, k)
		}
	}
	for name, a := range s.activity {
		if s.v.TenantLocked(name) != a.owner {
			delete(s.activity, name)
		}
	}
	for id, a := range s.domains {
		if d := s.v.DomainLocked(id); d == nil || d.Capacity() != a.owner {
			delete(s.domains, id)
		}
	}
	for id := range s.engines {
		if s.v.DomainLocked(id) == nil {
			delete(s.engines, id)
		}
	}
}

// applyGrantsLocked installs the grants of the round just reported. A
// bucket's level becomes its share of the global level less what it took
// since the report.
func (s *batchedState) applyGrantsLocked(now int64, sh *shard, rep *ReconcileReply) {
	for _, tr := range sh.tenants {
		g := rep.Buckets[tr.at]
		s.acked(now, tr.en, g)
		rate, level := tr.en.granted(g, tr.b.Taken())
		level += tr.en.refilledInCall(tr.b.Rate(), now)
		credit := int64(0)
		if lent := tr.t.CreditLent(); tr.en.kind == KindTokens && lent > 0 && tr.rate > 0 {
			credit = mulDiv(lent, rate, tr.rate) // the same share of the credit
		}
		tr.b.SetLimits(rate, tr.b.Burst(), credit)
		tr.b.SetLevel(now, level)
	}
	if rep.Readings != nil {
		for _, dr := range sh.domains {
			s.heardLocked(dr.d, rep.Readings[dr.gauge])
		}
		for i, d := range sh.engines {
			s.heardLocked(d, rep.Readings[len(sh.req.Gauges)+i])
		}
	}
	for _, dr := range sh.domains {
		gp, gd := rep.Buckets[dr.at], rep.Buckets[dr.at+1]
		s.acked(now, dr.prefill, gp)
		s.acked(now, dr.decode, gd)
		if dr.d.Capacity() != dr.cap {
			continue // rebuilt by a reload meanwhile: the next round grants it
		}
		p, dc := dr.cap.Taken()
		var g pd.ShareGrant
		g.PrefillRate, g.PrefillLevel = dr.prefill.granted(gp, p)
		g.DecodeRate, g.DecodeLevel = dr.decode.granted(gd, dc)
		g.PrefillLevel += dr.prefill.refilledInCall(dr.cap.PrefillRate(), now)
		g.DecodeLevel += dr.decode.refilledInCall(dr.cap.DecodeRate(), now)
		g.KVLimit = rep.Gauges[dr.gauge]
		if dr.keepKV {
			// Back from a silence longer than the holdings last: the others
			// back from the same outage are yet to report theirs, and the
			// free part they leave out is not all this replica's.
			_, _, kv := dr.cap.BaseLimits()
			g.KVLimit = min(g.KVLimit, kv)
		}
		dr.cap.ApplyShare(now, g)
		if a := s.domains[dr.d.ID()]; a != nil && a.owner == dr.cap {
			a.paused = false
		}
	}
}

// acked records that the store has counted the entry's last report.
func (s *batchedState) acked(now int64, en *syncEntry, g BucketGrant) {
	en.unacked -= en.sentUnacked
	en.started, en.frozen, en.ackAt = true, false, now
	if g.Level < 0 {
		s.overage[en.kind].Add(-g.Level * en.scale)
	}
}

// refilledInCall is what the local bucket refilled at rate (its grant
// during the outage) between a resuming report and its answer: a store
// rebuilding the bucket takes the reported level as it is when the script
// runs and refills only from then, so that refill would otherwise be lost
// (a round trip of the grant's rate; in a normal round the store's refill
// covers it). Zero for any other report.
//
// The store is owed it too: the takes of that time are charged in the
// next report while the rebuilt level lacks the refill that covered them,
// which pushed every replica's share below zero for about the call's
// length (a first call after a pause can wait most of its timeout). So it
// also goes into the next report as a refund.
func (en *syncEntry) refilledInCall(rate, now int64) int64 {
	if !en.resumed || now <= en.lastAt {
		return 0
	}
	c := mulDiv(rate, now-en.lastAt, int64(time.Second))
	en.rem -= c
	return c
}

// granted turns a grant into the local bucket's rate and level, given what
// the bucket has taken in all (takenNow) since the report.
func (en *syncEntry) granted(g BucketGrant, takenNow int64) (rate, level int64) {
	return mulDiv(g.RateMilli, en.scale, 1000), g.Level*en.scale - (takenNow - en.snapTaken)
}
