// Package memstate implements sharing.Store in memory: the
// semantics of internal/state, for a single process and as the reference
// the conformance suite holds the Redis adapter to.
package memstate

import (
	"context"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/clock"
)

// Store is an in-memory shared state. It is safe for concurrent use.
type Store struct {
	clk clock.Clock

	mu      sync.Mutex
	buckets map[string]*bucket
	gauges  map[string]map[string]*holding  // key → replica → holding
	engines map[string]*engineReading       // gauge key → the newest reading published
	stamps  int64                           // the last reading's stamp
	kv      map[string]map[string]*hold     // key → lease → hold (strict)
	alive   map[string]map[string]time.Time // key → replica → until its holds there lapse (strict)
}

type bucket struct {
	level    float64
	at       time.Time
	born     time.Time
	rebuilt  time.Time // the last rebuild from the replicas' levels (zero: none)
	replicas map[string]*replica
}

type replica struct {
	epoch       uint64
	cum, demand int64
	seen        time.Time
	rebuilt     time.Time // the rebuild its level went into
	held        int64     // that level
}

// forget is how long a silent replica's counter is kept (as in the
// script): max(100·stale, 60 s).
func forget(stale time.Duration) time.Duration { return max(100*stale, time.Minute) }

type holding struct {
	held, share int64
	until       time.Time
}

// engineReading is a published reading, with the store time it was made.
type engineReading struct {
	sharing.EngineReading
	at time.Time
	by string // the replica that made it
}

type hold struct {
	bytes int64
	until time.Time
}

// New returns an empty store reading time from clk (nil: the real clock).
func New(clk clock.Clock) *Store {
	if clk == nil {
		clk = clock.Real{}
	}
	return &Store{
		clk:     clk,
		buckets: make(map[string]*bucket),
		gauges:  make(map[string]map[string]*holding),
		engines: make(map[string]*engineReading),
		kv:      make(map[string]map[string]*hold),
		alive:   make(map[string]map[string]time.Time),
	}
}

// refill returns the bucket of key refilled to now, creating it full.
func (s *Store) refill(key string, rate, burst int64, now time.Time) *bucket {
	b := s.buckets[key]
	if b == nil {
		b = &bucket{level: float64(burst), at: now, born: now, replicas: make(map[string]*replica)}
		s.buckets[key] = b
	}
	if now.After(b.at) {
		b.level = math.Min(float64(burst), b.level+float64(rate)*now.Sub(b.at).Seconds())
		b.at = now
	}
	return b
}

// Reconcile implements sharing.Store.
func (s *Store) Reconcile(ctx context.Context, req *sharing.ReconcileRequest) (*sharing.ReconcileReply, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	rep := &sharing.ReconcileReply{
		Buckets:  make([]sharing.BucketGrant, len(req.Buckets)),
		Gauges:   make([]int64, len(req.Gauges)),
		Readings: make([]*sharing.EngineReading, len(req.Gauges)+len(req.Engines)),
	}
	for i, r := range req.Buckets {
		prev := s.buckets[r.Key]
		var b *bucket
		var mine time.Time // the rebuild this replica's level went into
		var brought int64  // that level
		if prev != nil && prev.replicas[req.Replica] != nil {
			mine, brought = prev.replicas[req.Replica].rebuilt, prev.replicas[req.Replica].held
		}
		// Back from an outage (sharing.BucketReport.Resume): the replicas'
		// levels, refilled at their grants while the store could not, are
		// the truth; the store's own refill, capped at the burst, is not.
		switch {
		case r.Resume && (prev == nil || now.Sub(prev.at) > req.Stale):
			b = &bucket{level: float64(r.Held), at: now, rebuilt: now, replicas: make(map[string]*replica)}
			if prev != nil {
				b.born, b.replicas = prev.born, prev.replicas
			}
			s.buckets[r.Key] = b
			mine, brought = now, r.Held
		case r.Resume && !prev.rebuilt.IsZero() && now.Sub(prev.rebuilt) <= req.Rejoin &&
			now.Add(-r.Span).Before(prev.rebuilt):
			// Back from the same outage: its level joins the others'. One it
			// brought to this rebuild already (its answer was lost, or the
			// report ran late, after a pause, with a level from before the
			// outage) is replaced by this newer one.
			b = s.refill(r.Key, r.Rate, r.Burst, now)
			if !mine.Equal(b.rebuilt) {
				brought = 0
			}
			b.level += float64(r.Held - brought)
			mine, brought = b.rebuilt, r.Held
		default:
			b = s.refill(r.Key, r.Rate, r.Burst, now)
			if prev == nil { // full since the replica started it, less what it spent
				b.level += float64(r.Rate) * r.Age.Seconds()
			}
			delta := r.Unacked
			if p, ok := b.replicas[req.Replica]; ok && p.epoch == r.Epoch {
				delta = CumDelta(r.Cum, p.cum)
			}
			b.level -= float64(delta)
		}
		b.level = math.Min(b.level, float64(r.Burst))
		b.replicas[req.Replica] = &replica{epoch: r.Epoch, cum: r.Cum, demand: r.Demand, seen: now, rebuilt: mine, held: brought}
		demands := make(map[string]int64, len(b.replicas))
		for id, rp := range b.replicas {
			switch quiet := now.Sub(rp.seen); {
			case id != req.Replica && quiet > forget(req.Stale):
				delete(b.replicas, id)
			case id == req.Replica || quiet <= req.Stale:
				demands[id] = rp.demand
			}
		}
		g := Waterfill(float64(r.Rate), demands)[req.Replica]
		share := b.level / float64(len(demands))
		if r.Rate > 0 {
			share = b.level * g / float64(r.Rate)
		}
		if live := len(demands); now.Sub(b.born) <= req.Stale && live < req.Replicas {
			share = share * float64(live) / float64(req.Replicas) // replicas yet to report hold their slices
		}
		rep.Buckets[i] = sharing.BucketGrant{RateMilli: int64(math.Floor(g * 1000)), Level: int64(math.Floor(share))}
	}
	for i, g := range req.Gauges {
		hs := s.gauges[g.Key]
		if hs == nil {
			hs = make(map[string]*holding)
			s.gauges[g.Key] = hs
		}
		hs[req.Replica] = &holding{held: g.Held, share: g.Share, until: now.Add(g.TTL)}
		var held, shares int64
		for id, h := range hs {
			if id != req.Replica && !h.until.After(now) { // a vanished replica's leases have expired
				delete(hs, id)
				continue
			}
			held += h.held
			shares += h.share
		}
		free := float64(max(g.Limit-held, 0))
		// Each replica weighs at least 1/20 of an equal share (as in
		// Waterfill): one that took nothing last round (demand 0) must
		// still get some of the free part, or it could never take again.
		mine := free / float64(len(hs))
		if shares > 0 {
			least := float64(shares) / float64(20*len(hs))
			mine = free * (float64(g.Share) + least) / (float64(shares) + float64(len(hs))*least)
		}
		rep.Gauges[i] = g.Held + int64(math.Floor(mine))
		rep.Readings[i] = s.engineReading(now, req.Replica, sharing.EngineReport{Key: g.Key})
	}
	for i, e := range req.Engines {
		rep.Readings[len(req.Gauges)+i] = s.engineReading(now, req.Replica, e)
	}
	return rep, nil
}

// engineReading keeps the reading e publishes where it is the domain's
// newest (by when it was made, on the store's clock), and returns the
// newest unless replica made it.
func (s *Store) engineReading(now time.Time, replica string, e sharing.EngineReport) *sharing.EngineReading {
	held := s.engines[e.Key]
	if e.Reading != nil {
		at := now.Add(-max(e.Reading.Age, 0))
		if held == nil || at.After(held.at) {
			s.stamps++
			r := *e.Reading
			r.Stamp = s.stamps
			held = &engineReading{EngineReading: r, at: at, by: replica}
			s.engines[e.Key] = held
		}
	}
	if held == nil || held.by == replica {
		return nil
	}
	r := held.EngineReading
	r.Age = now.Sub(held.at)
	return &r
}

// Commit implements sharing.Store.
func (s *Store) Commit(ctx context.Context, c *sharing.StrictCharge) (sharing.StrictVerdict, error) {
	if err := ctx.Err(); err != nil {
		return sharing.StrictVerdict{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	if c.KV.Alive > 0 {
		if s.alive[c.KV.Key] == nil {
			s.alive[c.KV.Key] = make(map[string]time.Time)
		}
		s.alive[c.KV.Key][c.KV.Replica] = now.Add(c.KV.Alive)
	}
	if h, ok := s.kv[c.KV.Key][c.KV.Lease]; ok && h.until.After(now) {
		return sharing.StrictVerdict{Admitted: true}, nil // committed by an earlier call
	}
	for i, t := range c.Takes {
		b := s.refill(t.Key, t.Rate, t.Burst, now)
		if b.level-float64(t.Amount) < float64(t.Min) {
			return sharing.StrictVerdict{Refused: i, RetryAfter: RetryAfter(b.level, t)}, nil
		}
	}
	holds := s.kv[c.KV.Key] // (Redis keeps these under KV.Key+":holds")
	if holds == nil {
		holds = make(map[string]*hold)
		s.kv[c.KV.Key] = holds
	}
	for replica, until := range s.alive[c.KV.Key] {
		if !until.After(now) { // a replica silent past its liveness: its holds go
			for lease := range holds {
				if strings.HasPrefix(lease, replica+"/") {
					delete(holds, lease)
				}
			}
			delete(s.alive[c.KV.Key], replica)
		}
	}
	var sum int64
	for lease, h := range holds {
		if !h.until.After(now) { // past its lease TTL: a vanished replica's
			delete(holds, lease)
			continue
		}
		sum += h.bytes
	}
	if sum+c.KV.Bytes > c.KV.Limit {
		return sharing.StrictVerdict{Refused: len(c.Takes)}, nil
	}
	levels := make([]int64, len(c.Takes))
	for i, t := range c.Takes {
		b := s.buckets[t.Key]
		b.level -= float64(t.Amount)
		levels[i] = int64(math.Floor(b.level))
	}
	holds[c.KV.Lease] = &hold{bytes: c.KV.Bytes, until: now.Add(c.KV.TTL)}
	return sharing.StrictVerdict{Admitted: true, Levels: levels}, nil
}

// Settle implements sharing.Store.
func (s *Store) Settle(ctx context.Context, st *sharing.StrictSettle) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	h, ok := s.kv[st.KVKey][st.Lease]
	if !ok || !h.until.After(now) {
		return nil // not held (never committed, settled, or past its TTL): nothing to settle
	}
	for _, r := range st.Refunds {
		if s.buckets[r.Key] == nil && r.Amount >= 0 {
			continue // a bucket that expired is full: a refund changes nothing
		}
		b := s.refill(r.Key, r.Rate, r.Burst, now)
		b.level = math.Max(math.Min(b.level+float64(r.Amount), float64(r.Burst)), -float64(r.Burst))
	}
	delete(s.kv[st.KVKey], st.Lease)
	return nil
}

// Ping implements sharing.Store: memory always answers.
func (s *Store) Ping(ctx context.Context) error { return ctx.Err() }

// Level returns a bucket's level at now, for tests and tools.
func (s *Store) Level(key string) (float64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.buckets[key]
	if !ok {
		return 0, false
	}
	return b.level, true
}

// CumDelta is the difference of two cumulative counters modulo
// sharing.CumModulus, negative when the newer is behind (net refunds).
func CumDelta(cum, prev int64) int64 {
	const m = sharing.CumModulus
	d := ((cum-prev)%m + m) % m
	if d > m/2 {
		d -= m
	}
	return d
}

// RetryAfter is how long a bucket at level, refilling at t.Rate, needs
// before t.Amount can be taken leaving t.Min; 0 when it never refills.
func RetryAfter(level float64, t sharing.StrictTake) time.Duration {
	if t.Rate <= 0 {
		return 0
	}
	short := float64(t.Amount) + float64(t.Min) - level
	return time.Duration(math.Ceil(short/float64(t.Rate)*1e6)) * time.Microsecond
}

// Waterfill divides rate among replicas by max-min fairness over their
// demands: each gets at least rate/(20n); the rest goes to demand, smallest
// first, no replica above its demand while others want more; what nobody
// claims is split equally.
func Waterfill(rate float64, demands map[string]int64) map[string]float64 {
	n := len(demands)
	out := make(map[string]float64, n)
	if n == 0 {
		return out
	}
	ids := make([]string, 0, n)
	for id := range demands {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return demands[ids[i]] < demands[ids[j]] })
	least := rate / float64(20*n)
	pool := rate - least*float64(n)
	for i, id := range ids {
		give := math.Min(math.Max(float64(demands[id])-least, 0), pool/float64(n-i))
		out[id] = least + give
		pool -= give
	}
	for _, id := range ids {
		out[id] += pool / float64(n)
	}
	return out
}
