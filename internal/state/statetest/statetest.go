// Package statetest is the conformance suite of the sharing.Store
// port: Run holds an implementation to the semantics of package
// internal/state. Both the memory and the Redis adapter pass it.
//
// Time runs for real (Redis reads its own clock), so the buckets here
// refill at 1 unit per second against bursts of a million: a test's few
// milliseconds move a level by at most a unit or two.
package statetest

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission/sharing"
)

// Factory returns a fresh, empty store for one subtest.
type Factory func(t *testing.T) sharing.Store

const (
	rate  = 1
	burst = 1_000_000
	slack = 3 // units a level may drift by refill during a test
)

// Run runs the suite.
func Run(t *testing.T, newStore Factory) {
	ctx := context.Background()
	t.Run("first report starts full and charges what was taken", func(t *testing.T) {
		s := newStore(t)
		g := reconcile(t, s, "a", bucket("k", 1, 100, 100, 10))
		near(t, "level", g.Level, burst-100)
		if g.RateMilli != 1000*rate {
			t.Errorf("rate grant = %d thousandths, want the whole rate %d for a lone replica", g.RateMilli, rate)
		}
	})
	t.Run("a repeated report is not charged twice", func(t *testing.T) {
		s := newStore(t)
		reconcile(t, s, "a", bucket("k", 1, 100, 100, 10))
		g := reconcile(t, s, "a", bucket("k", 1, 100, 100, 10)) // the first answer was lost
		near(t, "level after a repeat", g.Level, burst-100)
		g = reconcile(t, s, "a", bucket("k", 1, 150, 50, 10))
		near(t, "level after 50 more", g.Level, burst-150)
	})
	t.Run("refunds lower the cumulative and give back", func(t *testing.T) {
		s := newStore(t)
		reconcile(t, s, "a", bucket("k", 1, 500, 500, 10))
		g := reconcile(t, s, "a", bucket("k", 1, 200, -300, 10))
		near(t, "level", g.Level, burst-200)
	})
	t.Run("cumulative counters wrap modulo CumModulus", func(t *testing.T) {
		s := newStore(t)
		reconcile(t, s, "a", bucket("k", 1, sharing.CumModulus-10, 0, 10))
		g := reconcile(t, s, "a", bucket("k", 1, 30, 40, 10))
		near(t, "level", g.Level, burst-40)
	})
	t.Run("a new epoch applies only the unacked part", func(t *testing.T) {
		s := newStore(t)
		reconcile(t, s, "a", bucket("k", 1, 1000, 1000, 10))
		g := reconcile(t, s, "a", bucket("k", 2, 5000, 30, 10)) // counting restarted
		near(t, "level", g.Level, burst-1030)
	})
	t.Run("a replica out of the shares keeps its counter", func(t *testing.T) {
		s := newStore(t)
		rep := func(id string, cum, unacked int64) sharing.BucketGrant {
			r, err := s.Reconcile(ctx, &sharing.ReconcileRequest{Replica: id, Replicas: 2, Stale: time.Microsecond,
				Buckets: []sharing.BucketReport{{Key: "k", Rate: rate, Burst: burst, Epoch: 1, Cum: cum, Unacked: unacked, Demand: 1_000_000}}})
			if err != nil {
				t.Fatal(err)
			}
			return r.Buckets[0]
		}
		rep("a", 100, 100)
		waitPast(time.Millisecond)
		rep("b", 0, 0) // a is quiet past Stale: out of the shares
		// a's answer was lost and a comes back (a breaker's cool-down) with
		// the same report: its counter is still there, nothing is charged
		// twice. (Stale is 1µs: a reports alone, its share is the level.)
		g := rep("a", 100, 100)
		near(t, "level", g.Level, burst-100)
	})
	t.Run("small rates are not rounded away", func(t *testing.T) {
		s := newStore(t)
		for _, id := range []string{"a", "b", "c"} {
			reconcile(t, s, id, sharing.BucketReport{Key: "k", Rate: 1, Burst: burst, Epoch: 1, Demand: 1})
		}
		g := reconcile(t, s, "a", sharing.BucketReport{Key: "k", Rate: 1, Burst: burst, Epoch: 1, Demand: 1})
		within(t, "a third of 1 unit/s, in thousandths", g.RateMilli, 333, 1)
	})
	t.Run("a new bucket is credited for the reporter's age, up to the burst", func(t *testing.T) {
		s := newStore(t)
		g := reconcile(t, s, "a", sharing.BucketReport{Key: "k", Rate: 100, Burst: 1000, Epoch: 1, Cum: 800, Unacked: 800, Demand: 10, Age: 5 * time.Second})
		// Full at 1000 five seconds ago, refilling 100/s while 800 went:
		// min(1000 + 500 − 800, 1000) = 700 (not 200).
		within(t, "level", g.Level, 700, 3)
		// An hour's refill covers the 100 taken: the level is the burst (no more).
		g = reconcile(t, s, "b", sharing.BucketReport{Key: "k2", Rate: 100, Burst: 1000, Epoch: 1, Cum: 100, Unacked: 100, Demand: 10, Age: time.Hour})
		within(t, "level capped at the burst", g.Level, 1000, 0)
	})
	t.Run("an overage comes back as a negative share", func(t *testing.T) {
		s := newStore(t)
		g := reconcile(t, s, "a", sharing.BucketReport{Key: "k", Rate: rate, Burst: 1000, Epoch: 1, Cum: 1500, Unacked: 1500, Demand: 10})
		near(t, "level", g.Level, -500)
	})
	t.Run("the rate is shared by demand, max-min fair", func(t *testing.T) {
		s := newStore(t)
		const r = 100_000
		rep := func(id string, demand int64) sharing.BucketGrant {
			return reconcile(t, s, id, sharing.BucketReport{Key: "k", Rate: r, Burst: burst, Demand: demand, Epoch: 1})
		}
		rep("busy", 1_000_000)
		idle := rep("idle", 0)
		busy := rep("busy", 1_000_000)
		// least = r/40 = 2500 each; the busy one takes the remaining 95000.
		within(t, "idle replica's rate", idle.RateMilli/1000, 2500, 1)
		within(t, "busy replica's rate", busy.RateMilli/1000, 97_500, 1)
		if busy.RateMilli+idle.RateMilli > 1000*r {
			t.Errorf("grants %d + %d thousandths exceed the rate %d", busy.RateMilli, idle.RateMilli, r)
		}
		// The level is shared in the same proportion.
		within(t, "busy replica's level", busy.Level, burst*975/1000, burst/1000)
	})
	t.Run("equal demands get equal shares; unclaimed rate is split", func(t *testing.T) {
		s := newStore(t)
		const r = 100_000
		for _, demand := range []int64{1_000_000, 10} {
			s := s
			key := fmt.Sprintf("k%d", demand)
			rep := func(id string) sharing.BucketGrant {
				return reconcile(t, s, id, sharing.BucketReport{Key: key, Rate: r, Burst: burst, Demand: demand, Epoch: 1})
			}
			rep("a")
			b := rep("b")
			a := rep("a")
			within(t, key+" a's rate", a.RateMilli/1000, r/2, 1)
			within(t, key+" b's rate", b.RateMilli/1000, r/2, 1)
		}
	})
	t.Run("a replica not heard from within Stale leaves the shares", func(t *testing.T) {
		s := newStore(t)
		req := func(id string) sharing.BucketGrant {
			rep, err := s.Reconcile(ctx, &sharing.ReconcileRequest{Replica: id, Replicas: 2, Stale: time.Microsecond,
				Buckets: []sharing.BucketReport{{Key: "k", Rate: 100_000, Burst: burst, Demand: 1_000_000, Epoch: 1}}})
			if err != nil {
				t.Fatal(err)
			}
			return rep.Buckets[0]
		}
		req("a")
		waitPast(time.Millisecond)
		if b := req("b"); b.RateMilli != 100_000_000 {
			t.Errorf("b's rate = %d thousandths; a went silent, so b should have all 100000", b.RateMilli)
		}
	})
	t.Run("a gauge gives what is held plus a share of the free part", func(t *testing.T) {
		s := newStore(t)
		gauge := func(id string, held, share int64, ttl time.Duration) int64 {
			rep, err := s.Reconcile(ctx, &sharing.ReconcileRequest{Replica: id, Replicas: 2, Stale: time.Second,
				Gauges: []sharing.GaugeReport{{Key: "kv", Limit: 1000, Held: held, Share: share, TTL: ttl}}})
			if err != nil {
				t.Fatal(err)
			}
			return rep.Gauges[0]
		}
		// Shares weigh their demand plus 1/20 of an equal share (0.1 here).
		gauge("a", 100, 1, time.Minute)
		if b := gauge("b", 300, 3, time.Minute); b != 300+442 {
			t.Errorf("b's limit = %d, want 300 held + 3.1/4.2 of 600 free = 742", b)
		}
		if a := gauge("a", 100, 1, time.Minute); a != 100+157 {
			t.Errorf("a's limit = %d, want 100 held + 1.1/4.2 of 600 free = 257", a)
		}
		// A replica whose holding outlived its TTL (it vanished; its leases
		// expired) is reclaimed.
		gauge("c", 500, 1, time.Microsecond)
		waitPast(time.Millisecond)
		if a := gauge("a", 100, 1, time.Minute); a != 100+157 {
			t.Errorf("a's limit after c vanished = %d, want 257", a)
		}
		// Back after its holding was reclaimed (silent, not dead), c's
		// report replaces it: 500 counted once, leaving a 100 held plus
		// 1.083/5.25 of the 100 free, not nothing.
		gauge("c", 500, 1, time.Minute)
		if a := gauge("a", 100, 1, time.Minute); a != 100+20 {
			t.Errorf("a's limit after c's return = %d, want 100 held + 1.083/5.25 of 100 free = 120", a)
		}
		// A replica that took nothing last round still gets some of the free part.
		if z := gauge("z", 0, 0, time.Minute); z <= 0 {
			t.Errorf("z's limit = %d with demand 0, want a share of the free part", z)
		}
	})
	t.Run("engine readings reach the domain's other replicas", func(t *testing.T) {
		s := newStore(t)
		publish := func(id string, queue float64, age time.Duration) {
			if _, err := s.Reconcile(ctx, &sharing.ReconcileRequest{Replica: id, Replicas: 2, Stale: time.Second,
				Engines: []sharing.EngineReport{{Key: "kv", Reading: &sharing.EngineReading{Queue: queue, Running: 3, KVUsage: 0.25, Age: age}}}}); err != nil {
				t.Fatal(err)
			}
		}
		heard := func() (int64, *sharing.EngineReading) {
			rep, err := s.Reconcile(ctx, &sharing.ReconcileRequest{Replica: "b", Replicas: 2, Stale: time.Second,
				Gauges:  []sharing.GaugeReport{{Key: "kv", Limit: 1000, Held: 100, Share: 1, TTL: time.Minute}},
				Engines: []sharing.EngineReport{{Key: "kv"}}})
			if err != nil {
				t.Fatal(err)
			}
			viaGauge, asked := rep.Readings[0], rep.Readings[1]
			if (viaGauge == nil) != (asked == nil) || viaGauge != nil && *viaGauge != *asked {
				t.Errorf("the gauge's reading %+v and the entry's %+v differ", viaGauge, asked)
			}
			return rep.Gauges[0], viaGauge
		}
		if _, r := heard(); r != nil {
			t.Fatalf("reading before any was published = %+v, want none", *r)
		}
		publish("a", 7, 20*time.Millisecond)
		limit, r := heard()
		if r == nil {
			t.Fatal("no reading after a published one")
		}
		if r.Queue != 7 || r.Running != 3 || r.KVUsage != 0.25 {
			t.Errorf("reading = %+v, want a's: queue 7, running 3, kv 0.25", *r)
		}
		if r.Age < 20*time.Millisecond || r.Age > 5*time.Second {
			t.Errorf("reading's age = %v, want its age when published (20ms) and what passed since", r.Age)
		}
		if limit != 1000 {
			t.Errorf("b's KV limit = %d, want all 1000: publishing a reading holds no share of the gauge", limit)
		}
		first := r.Stamp
		publish("c", 9, time.Second) // made before a's: dropped
		if _, r = heard(); r.Queue != 7 || r.Stamp != first {
			t.Errorf("after an older reading, reading = %+v, want a's (queue 7, stamp %d)", *r, first)
		}
		publish("a", 2, 0)
		if _, r = heard(); r.Queue != 2 || r.Stamp == first {
			t.Errorf("after a newer reading, reading = %+v, want queue 2 with a new stamp (not %d)", *r, first)
		}
		// a is not answered its own reading.
		rep, err := s.Reconcile(ctx, &sharing.ReconcileRequest{Replica: "a", Replicas: 2, Stale: time.Second,
			Gauges:  []sharing.GaugeReport{{Key: "kv", Limit: 1000, Held: 100, Share: 1, TTL: time.Minute}},
			Engines: []sharing.EngineReport{{Key: "kv"}}})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Readings[0] != nil || rep.Readings[1] != nil {
			t.Errorf("a's own reading answered to a: %+v, %+v", rep.Readings[0], rep.Readings[1])
		}
	})
	t.Run("an admission returns each bucket's level after the take", func(t *testing.T) {
		s := newStore(t)
		kv := sharing.KVHold{Key: "kv", Lease: "l1", Limit: 1000, Bytes: 1, TTL: time.Minute}
		v := commit(t, s, kv, take("k1", 100, 10, 0), take("k2", 1000, 300, 0))
		if !v.Admitted || len(v.Levels) != 2 {
			t.Fatalf("verdict %+v, want admitted with two levels", v)
		}
		near(t, "k1's level", v.Levels[0], 90)
		near(t, "k2's level", v.Levels[1], 700)
	})
	// Back from an outage (BucketReport.Resume): the store rebuilds a lost
	// or silent bucket from the replicas' levels, each replica's once, and
	// charges every other report as usual.
	resume := func(t *testing.T, s sharing.Store, id string, stale time.Duration, b sharing.BucketReport) sharing.BucketGrant {
		t.Helper()
		b.Key, b.Rate, b.Burst, b.Epoch, b.Demand = "k", rate, burst, 1, 10
		r, err := s.Reconcile(ctx, &sharing.ReconcileRequest{Replica: id, Replicas: 1, Stale: stale, Rejoin: time.Minute, Buckets: []sharing.BucketReport{b}})
		if err != nil {
			t.Fatal(err)
		}
		return r.Buckets[0]
	}
	t.Run("a lost bucket is rebuilt from the replicas' levels", func(t *testing.T) {
		s := newStore(t)
		// a's takes (5000) were netted in its level by its own refill: the
		// level is what a holds, not the burst less the takes.
		g := resume(t, s, "a", time.Minute, sharing.BucketReport{Cum: 5000, Unacked: 5000, Resume: true, Held: 300, Span: 10 * time.Second})
		near(t, "a's share after the rebuild", g.Level, 300)
		// b was away through the same outage: its level is added, once.
		g = resume(t, s, "b", time.Minute, sharing.BucketReport{Cum: 7000, Unacked: 7000, Resume: true, Held: 200, Span: 10 * time.Second})
		near(t, "b's half of 300 + 200", g.Level, 250)
		// b did not get the answer (or that report had run late, after a
		// pause): its newer level replaces the one it brought, and its
		// takes are not charged.
		g = resume(t, s, "b", time.Minute, sharing.BucketReport{Cum: 7100, Unacked: 7100, Resume: true, Held: 150, Span: 10 * time.Second})
		near(t, "b's half of 300 + 150", g.Level, 225)
		// Reports after the rebuild are charged as usual.
		g = resume(t, s, "a", time.Minute, sharing.BucketReport{Cum: 5100, Unacked: 100, Resume: true, Held: 200, Span: 100 * time.Millisecond})
		near(t, "a's half after 100 more", g.Level, 175)
	})
	t.Run("a bucket nobody reported past Stale is rebuilt; a live one is charged", func(t *testing.T) {
		s := newStore(t)
		const stale = 50 * time.Millisecond
		g := resume(t, s, "a", stale, sharing.BucketReport{Cum: 100, Unacked: 100})
		near(t, "level", g.Level, burst-100)
		// Live (reported within Stale): a resume is charged its takes.
		g = resume(t, s, "a", stale, sharing.BucketReport{Cum: 150, Unacked: 50, Resume: true, Held: 7, Span: time.Millisecond})
		near(t, "level after 50 more", g.Level, burst-150)
		waitPast(2 * stale)
		g = resume(t, s, "a", stale, sharing.BucketReport{Cum: 900, Unacked: 750, Resume: true, Held: 42, Span: 2 * stale})
		near(t, "level rebuilt from a's", g.Level, 42)
	})
	t.Run("a frozen replica's report is charged against the store's refill", func(t *testing.T) {
		s := newStore(t)
		g := resume(t, s, "a", time.Minute, sharing.BucketReport{Cum: 100, Unacked: 100})
		near(t, "level", g.Level, burst-100)
		g = resume(t, s, "a", time.Minute, sharing.BucketReport{Cum: 400, Unacked: 300, Held: 5, Span: time.Hour})
		near(t, "level", g.Level, burst-400)
	})
	t.Run("commit takes everything or nothing", func(t *testing.T) {
		s := newStore(t)
		kv := sharing.KVHold{Key: "kv", Lease: "l1", Limit: 1000, Bytes: 1, TTL: time.Minute}
		v := commit(t, s, kv, take("k1", 100, 10, 0), take("k2", 100, 200, 0))
		if v.Admitted || v.Refused != 1 {
			t.Fatalf("verdict %+v, want refused by take 1", v)
		}
		kv.Lease = "l2"
		if v := commit(t, s, kv, take("k1", 100, 100, 0)); !v.Admitted {
			t.Fatalf("k1 was charged by the refused commit: %+v", v)
		}
		kv.Lease = "l3"
		v = commit(t, s, kv, take("k1", 100, 5, 0))
		if v.Admitted || v.Refused != 0 {
			t.Fatalf("verdict %+v, want refused by the empty k1", v)
		}
		if v.RetryAfter < 4*time.Second || v.RetryAfter > 5*time.Second {
			t.Errorf("retry after %v, want about 5 units at 1/s", v.RetryAfter)
		}
	})
	t.Run("commit lends credit down to Min", func(t *testing.T) {
		s := newStore(t)
		kv := sharing.KVHold{Key: "kv", Lease: "l1", Limit: 1000, Bytes: 1, TTL: time.Minute}
		if v := commit(t, s, kv, take("k", 100, 140, -50)); !v.Admitted {
			t.Fatalf("140 of 100 with credit 50 refused: %+v", v)
		}
		kv.Lease = "l2"
		if v := commit(t, s, kv, take("k", 100, 20, -50)); v.Admitted {
			t.Fatal("20 more admitted past the credit")
		}
	})
	t.Run("KV holds: limit, settle frees, TTL lapses", func(t *testing.T) {
		s := newStore(t)
		hold := func(lease string, bytes int64, ttl time.Duration) sharing.StrictVerdict {
			return commit(t, s, sharing.KVHold{Key: "kv", Lease: lease, Limit: 100, Bytes: bytes, TTL: ttl}, take("k", burst, 1, 0))
		}
		if v := hold("a", 60, time.Minute); !v.Admitted {
			t.Fatalf("60 of 100 refused: %+v", v)
		}
		if v := hold("b", 50, time.Minute); v.Admitted || v.Refused != 1 {
			t.Fatalf("50 more: %+v, want refused by KV (index 1)", v)
		}
		if err := s.Settle(ctx, &sharing.StrictSettle{KVKey: "kv", Lease: "a"}); err != nil {
			t.Fatal(err)
		}
		if v := hold("b", 50, time.Microsecond); !v.Admitted {
			t.Fatalf("after a settled, 50 refused: %+v", v)
		}
		waitPast(time.Millisecond) // b's lease TTL lapses: a vanished replica's hold
		if v := hold("c", 100, time.Minute); !v.Admitted {
			t.Fatalf("b's expired hold still counted: %+v", v)
		}
	})
	t.Run("settle gives back up to the burst and takes overruns", func(t *testing.T) {
		s := newStore(t)
		kv := func(lease string) sharing.KVHold {
			return sharing.KVHold{Key: "kv", Lease: lease, Limit: 1000, Bytes: 1, TTL: time.Minute}
		}
		settle := func(lease string, amount int64) {
			t.Helper()
			if err := s.Settle(ctx, &sharing.StrictSettle{KVKey: "kv", Lease: lease, Refunds: []sharing.StrictTake{{Key: "k", Rate: rate, Burst: 1000, Amount: amount}}}); err != nil {
				t.Fatal(err)
			}
		}
		commit(t, s, kv("l1"), take("k", 1000, 600, 0))
		settle("l1", -300) // an overrun: level 400 → 100
		if v := commit(t, s, kv("l2"), take("k", 1000, 110, 0)); v.Admitted {
			t.Error("the overrun was not taken")
		}
		settle("l1", 900) // settled already: nothing happens
		if v := commit(t, s, kv("l3"), take("k", 1000, 110, 0)); v.Admitted {
			t.Error("a second settle of the same lease gave units back")
		}
		commit(t, s, kv("l4"), take("k", 1000, 1, 0))
		settle("l4", 5000) // capped at the burst
		if v := commit(t, s, kv("l5"), take("k", 1000, 1000, 0)); !v.Admitted {
			t.Errorf("after a refund to the burst, the whole burst refused: %+v", v)
		}
	})
	t.Run("an overrun on a bucket the store does not hold is taken from the full bucket", func(t *testing.T) {
		s := newStore(t)
		kv := sharing.KVHold{Key: "kv", Lease: "l1", Limit: 1000, Bytes: 1, TTL: time.Minute}
		commit(t, s, kv) // a lease whose takes are on buckets it does not hold
		overrun := sharing.StrictTake{Key: "k", Rate: rate, Burst: 1000, Amount: -300}
		refund := sharing.StrictTake{Key: "k2", Rate: rate, Burst: 1000, Amount: 300}
		if err := s.Settle(ctx, &sharing.StrictSettle{KVKey: "kv", Lease: "l1", Refunds: []sharing.StrictTake{overrun, refund}}); err != nil {
			t.Fatal(err)
		}
		kv.Lease = "l2"
		if v := commit(t, s, kv, take("k", 1000, 750, 0)); v.Admitted {
			t.Error("the overrun on an absent (full) bucket was not taken: 750 of 700 admitted")
		}
		kv.Lease = "l3"
		if v := commit(t, s, kv, take("k2", 1000, 1001, 0)); v.Admitted {
			t.Error("a refund to an absent (full) bucket lifted it past its burst")
		}
	})
	t.Run("a repeated commit takes nothing; a settle without a commit gives nothing", func(t *testing.T) {
		s := newStore(t)
		kv := sharing.KVHold{Key: "kv", Lease: "l", Limit: 1000, Bytes: 1, TTL: time.Minute}
		commit(t, s, kv, take("k", 1000, 600, 0))
		if v := commit(t, s, kv, take("k", 1000, 600, 0)); !v.Admitted {
			t.Fatalf("a repeated commit (its answer was lost) refused: %+v", v)
		}
		if err := s.Settle(ctx, &sharing.StrictSettle{KVKey: "kv", Lease: "never", Refunds: []sharing.StrictTake{{Key: "k", Rate: rate, Burst: 1000, Amount: 600}}}); err != nil {
			t.Fatal(err)
		}
		kv.Lease = "l2"
		if v := commit(t, s, kv, take("k", 1000, 400, 0)); !v.Admitted {
			t.Errorf("400 of the 400 left refused: %+v", v)
		}
		kv.Lease = "l3"
		if v := commit(t, s, kv, take("k", 1000, 5, 0)); v.Admitted {
			t.Error("units taken twice by a repeated commit, or given by a settle without one, made room")
		}
	})
	t.Run("concurrent commits never take more than the bucket holds", func(t *testing.T) {
		s := newStore(t)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for g := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 4 {
					kv := sharing.KVHold{Key: "kv", Lease: fmt.Sprintf("%d/%d", g, i), Limit: burst, Bytes: 1, TTL: time.Minute}
					v, err := s.Commit(ctx, &sharing.StrictCharge{Takes: []sharing.StrictTake{take("k", 100, 1, 0)}, KV: kv})
					if err != nil {
						t.Error(err)
						return
					}
					if v.Admitted {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		// 200 tries at 1 unit against 100 (plus a unit or two of refill).
		if n := admitted.Load(); n < 100 || n > 100+slack {
			t.Errorf("admitted %d of 200 against a bucket of 100", n)
		}
	})
}

func bucket(key string, epoch uint64, cum, unacked, demand int64) sharing.BucketReport {
	return sharing.BucketReport{Key: key, Rate: rate, Burst: burst, Epoch: epoch, Cum: cum, Unacked: unacked, Demand: demand}
}

func take(key string, b, amount, floor int64) sharing.StrictTake {
	return sharing.StrictTake{Key: key, Rate: rate, Burst: b, Amount: amount, Min: floor}
}

func reconcile(t *testing.T, s sharing.Store, replica string, b sharing.BucketReport) sharing.BucketGrant {
	t.Helper()
	rep, err := s.Reconcile(context.Background(), &sharing.ReconcileRequest{Replica: replica, Replicas: 1, Stale: time.Minute, Buckets: []sharing.BucketReport{b}})
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if len(rep.Buckets) != 1 {
		t.Fatalf("reconcile: %d grants for 1 bucket", len(rep.Buckets))
	}
	return rep.Buckets[0]
}

func commit(t *testing.T, s sharing.Store, kv sharing.KVHold, takes ...sharing.StrictTake) sharing.StrictVerdict {
	t.Helper()
	v, err := s.Commit(context.Background(), &sharing.StrictCharge{Takes: takes, KV: kv})
	if err != nil {
		t.Fatalf("commit: %v", err)
	}
	return v
}

// near checks a level, allowing for the refill of the test's duration.
func near(t *testing.T, what string, got, want int64) {
	t.Helper()
	if got < want-1 || got > want+slack {
		t.Errorf("%s = %d, want %d (refill allows up to +%d)", what, got, want, slack)
	}
}

func within(t *testing.T, what string, got, want, tol int64) {
	t.Helper()
	if math.Abs(float64(got-want)) > float64(tol) {
		t.Errorf("%s = %d, want %d ± %d", what, got, want, tol)
	}
}

// waitPast waits until d has surely passed on every clock involved (the
// store's TTLs and staleness are on its own clock).
func waitPast(d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		time.Sleep(d / 4)
	}
}
