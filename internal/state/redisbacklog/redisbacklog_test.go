package redisbacklog_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-sched/sluice/admission/deferral"
	"github.com/sluice-sched/sluice/admission/deferral/deferraltest"
	"github.com/sluice-sched/sluice/internal/state/redisbacklog"
	"github.com/sluice-sched/sluice/internal/state/redistest"
	"github.com/sluice-sched/sluice/internal/testwait"
)

var ctx = context.Background()

// open returns a store closed at the end of the test.
func open(t testing.TB, rdb redis.UniversalClient, opts redisbacklog.Options) *redisbacklog.Store {
	t.Helper()
	s, err := redisbacklog.Open(ctx, rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// conformance runs the suite on rdb: each subtest under its own prefix,
// reopened as a restart of the same replica (the same consumer name).
func conformance(t *testing.T, rdb redis.UniversalClient) {
	prefixes := map[*testing.T]string{}
	opts := func(t *testing.T) redisbacklog.Options {
		return redisbacklog.Options{Consumer: "replica-1", Prefix: prefixes[t]}
	}
	deferraltest.Run(t,
		func(t *testing.T) deferral.Store {
			prefixes[t] = "conf" + strconv.Itoa(len(prefixes))
			s, err := redisbacklog.Open(ctx, rdb, opts(t))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		func(t *testing.T) deferral.Store {
			s, err := redisbacklog.Open(ctx, rdb, opts(t))
			if err != nil {
				t.Fatal(err)
			}
			return s
		})
}

func TestConformance(t *testing.T) {
	conformance(t, redistest.Start(t).Client())
}

// On a Redis Cluster of 3 masters: the suite passes (every script's keys
// in one slot), and the shards spread over the masters.
func TestCluster(t *testing.T) {
	c := redistest.StartShardedCluster(t, 3, 0)
	rdb := c.Client()
	t.Run("conformance", func(t *testing.T) { conformance(t, rdb) })
	t.Run("shards spread over the masters", func(t *testing.T) {
		s := open(t, rdb, redisbacklog.Options{Consumer: "r", Prefix: "spread"})
		for i := range 64 {
			if _, err := s.Add(ctx, ticket(fmt.Sprintf("s%02d", i), fmt.Sprintf("tenant-%d", i))); err != nil {
				t.Fatal(err)
			}
		}
		for m, n := range c.KeysPerMaster() {
			if n == 0 {
				t.Errorf("master %s holds no key; want the 16 shards spread over all 3 (%v)", m, c.KeysPerMaster())
			}
		}
	})
}

func ticket(id, tenant string) deferral.Record {
	created := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	return deferral.Record{
		ID: id, Work: deferral.Work{Tenant: tenant, Model: "m", PromptTokens: 10},
		Created: created, Deadline: created.Add(time.Hour),
	}
}

func lease(i int) deferral.Claim {
	at := time.Date(2030, 1, 1, 0, 1, 0, 0, time.UTC)
	return deferral.Claim{LeaseID: uint64(i + 1), Domain: "d", Model: "m", At: at, Expires: at.Add(time.Minute)}
}

// addMany adds n tickets over 8 tenants from 16 goroutines, claims every
// third, and returns them as the store holds them.
func addMany(t *testing.T, s deferral.Store, prefix string, n int) map[string]deferral.Record {
	t.Helper()
	var mu sync.Mutex
	out := map[string]deferral.Record{}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < n; i += 16 {
				rec := ticket(fmt.Sprintf("%s%05d", prefix, i), fmt.Sprintf("tenant-%d", i%8))
				seq, err := s.Add(ctx, rec)
				if err != nil {
					t.Error(err)
					return
				}
				rec.Seq, rec.State = seq, deferral.StatePending
				if i%3 == 0 {
					if _, ok, err := s.Claim(ctx, rec.ID, lease(i)); err != nil || !ok {
						t.Errorf("Claim(%s) = %v, %v", rec.ID, ok, err)
						return
					}
					rec.State, rec.Claim = deferral.StateClaimed, lease(i)
				}
				mu.Lock()
				out[rec.ID] = rec
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return out
}

// checkOnce checks that got holds each of want once, pending or claimed
// as want has it.
func checkOnce(t *testing.T, got []deferral.Record, want map[string]deferral.Record) {
	t.Helper()
	seen := map[string]bool{}
	for _, r := range got {
		w, ok := want[r.ID]
		switch {
		case seen[r.ID]:
			t.Fatalf("%s adopted twice", r.ID)
		case !ok:
			t.Fatalf("%s adopted, which it should not be", r.ID)
		case r.Seq != w.Seq || r.State != w.State || r.Claim.LeaseID != w.Claim.LeaseID || !r.Claim.Expires.Equal(w.Claim.Expires):
			t.Fatalf("%s adopted as seq %d %s lease %d; want seq %d %s lease %d", r.ID, r.Seq, r.State, r.Claim.LeaseID, w.Seq, w.State, w.Claim.LeaseID)
		}
		seen[r.ID] = true
	}
	if len(seen) != len(want) {
		t.Fatalf("adopted %d of %d tickets", len(seen), len(want))
	}
}

// A replica that stopped without finishing its tickets: two others, with
// a ReclaimIdle of 2 s (their holds refreshed every 100 ms: a stall of
// the loaded test machine does not let one take the other's), adopt them
// all, each ticket by one of them. 2,500 tickets in 2 shards: the holds,
// the reclaim and the reads page. XCLAIM's IDLE option ages the stopped
// replica's entries past the ReclaimIdle at once, so that the test waits
// on no clock.
func TestStoppedReplicaIsAdoptedOnce(t *testing.T) {
	rdb := redistest.Start(t).Client()
	opts := func(consumer string) redisbacklog.Options {
		return redisbacklog.Options{Consumer: consumer, Prefix: "stop", Shards: 2, ReclaimIdle: 2 * time.Second, HoldRefresh: 100 * time.Millisecond}
	}
	a := open(t, rdb, opts("a"))
	want := addMany(t, a, "t", 2500)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, stream := range []string{"stop:{0}:s", "stop:{1}:s"} {
		msgs, err := rdb.XRange(ctx, stream, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if err := rdb.Do(ctx, "XCLAIM", stream, "sluice", "a", 0, m.ID, "IDLE", time.Hour.Milliseconds(), "JUSTID").Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	var (
		mu  sync.Mutex
		got []deferral.Record
		wg  sync.WaitGroup
	)
	for _, name := range []string{"b", "c"} {
		s := open(t, rdb, opts(name))
		wg.Go(func() {
			// Every entry is reclaimable now: the two adopt until none
			// is left, a page a call (a bound on the calls, not a clock).
			for range 100 {
				recs, err := s.Adopt(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				got = append(got, recs...)
				n := len(got)
				mu.Unlock()
				if n >= len(want) {
					return
				}
			}
		})
	}
	wg.Wait()
	checkOnce(t, got, want)
}

// A live replica's tickets are never adopted by another, however long the
// other's Adopt runs past its ReclaimIdle; once the holder stops, they are.
func TestLiveHolderKeepsItsTickets(t *testing.T) {
	rdb := redistest.Start(t).Client()
	const reclaimIdle = 1500 * time.Millisecond // 30 refreshes of the holder's
	holder := open(t, rdb, redisbacklog.Options{Consumer: "holder", Prefix: "live", ReclaimIdle: reclaimIdle, HoldRefresh: 50 * time.Millisecond})
	want := addMany(t, holder, "h", 200)
	other := open(t, rdb, redisbacklog.Options{Consumer: "other", Prefix: "live", ReclaimIdle: reclaimIdle})
	for end := time.Now().Add(4 * reclaimIdle); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if got, err := other.Adopt(ctx); err != nil || len(got) != 0 {
			t.Fatalf("Adopt beside a live holder = %d tickets, %v; want none", len(got), err)
		}
	}
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	var got []deferral.Record
	testwait.Until(t, 10*time.Second, "the stopped holder's tickets adopted", func() bool {
		recs, err := other.Adopt(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, recs...)
		return len(got) >= len(want)
	})
	checkOnce(t, got, want)
}

// A replica whose hold refresh ran late does not adopt its own tickets
// (it holds them): its Adopt refreshes them instead, so that another
// replica does not take them either. XCLAIM's IDLE option stands for the
// late refresh.
func TestOwnLateHoldsAreRefreshedNotAdopted(t *testing.T) {
	rdb := redistest.Start(t).Client()
	a := open(t, rdb, redisbacklog.Options{Consumer: "a", Prefix: "late", Shards: 1})
	b := open(t, rdb, redisbacklog.Options{Consumer: "b", Prefix: "late", Shards: 1, ReclaimIdle: time.Minute})
	// The first Adopt, past: it reads the holder's own history (which
	// refreshes it too); later ones only reclaim.
	if got, err := a.Adopt(ctx); err != nil || len(got) != 0 {
		t.Fatalf("first Adopt of an empty store = %v, %v", got, err)
	}
	if _, err := a.Add(ctx, ticket("x", "acme")); err != nil {
		t.Fatal(err)
	}
	ids, err := rdb.XRange(ctx, "late:{0}:s", "-", "+").Result()
	if err != nil || len(ids) != 1 {
		t.Fatalf("xrange = %v, %v", ids, err)
	}
	if err := rdb.Do(ctx, "XCLAIM", "late:{0}:s", "sluice", "a", 0, ids[0].ID, "IDLE", time.Hour.Milliseconds(), "JUSTID").Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Adopt(ctx); err != nil || len(got) != 0 {
		t.Fatalf("holder's Adopt = %v, %v; want nothing: it holds the ticket", got, err)
	}
	if got, err := b.Adopt(ctx); err != nil || len(got) != 0 {
		t.Fatalf("other's Adopt after the holder's = %v, %v; want nothing: the holder's Adopt refreshed its hold", got, err)
	}
}

// A cancel through a replica that does not hold the ticket (it finds the
// shard by asking every one) wins over the holder's later claim.
func TestCancelThroughAnotherReplicaWins(t *testing.T) {
	rdb := redistest.Start(t).Client()
	holder := open(t, rdb, redisbacklog.Options{Consumer: "holder", Prefix: "cancel"})
	other := open(t, rdb, redisbacklog.Options{Consumer: "other", Prefix: "cancel"})
	seq, err := holder.Add(ctx, ticket("x", "acme"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := other.Get(ctx, "x"); err != nil || got.Seq != seq || got.State != deferral.StatePending {
		t.Fatalf("Get through the other replica = %+v, %v; want it pending", got, err)
	}
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := other.Finish(ctx, "x", deferral.StateCancelled, "cancelled by the submitter", at); err != nil {
		t.Fatal(err)
	}
	cur, ok, err := holder.Claim(ctx, "x", lease(1))
	if err != nil || ok || cur.State != deferral.StateCancelled || cur.Reason != "cancelled by the submitter" || !cur.Finished.Equal(at) {
		t.Fatalf("holder's Claim after the cancel = %+v, %v, %v; want the cancelled record, ok false", cur, ok, err)
	}
	if err := holder.Finish(ctx, "x", deferral.StateExpired, "deadline", at); err != nil {
		t.Fatal(err)
	}
	if got, err := holder.Get(ctx, "x"); err != nil || got.State != deferral.StateCancelled {
		t.Fatalf("Get after a second Finish = %+v, %v; want the first final state to stand", got, err)
	}
	if _, err := other.Get(ctx, "nope"); !errors.Is(err, deferral.ErrNotFound) {
		t.Fatalf("Get(unknown) through the other replica = %v; want ErrNotFound", err)
	}
}

// A retried Add is the same ticket.
func TestAddIsIdempotent(t *testing.T) {
	s := open(t, redistest.Start(t).Client(), redisbacklog.Options{Consumer: "r", Prefix: "idem"})
	a, err1 := s.Add(ctx, ticket("x", "acme"))
	b, err2 := s.Add(ctx, ticket("x", "acme"))
	if err1 != nil || err2 != nil || a != b {
		t.Fatalf("Add twice = %d, %v and %d, %v; want the same seq", a, err1, b, err2)
	}
}

// Final tickets expire from Redis after the retention.
func TestFinalTicketsExpireAfterRetention(t *testing.T) {
	rdb := redistest.Start(t).Client()
	s := open(t, rdb, redisbacklog.Options{Consumer: "r", Prefix: "ret", Retention: 300 * time.Millisecond})
	for _, id := range []string{"done", "pending"} {
		if _, err := s.Add(ctx, ticket(id, "acme")); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Finish(ctx, "done", deferral.StateDone, "", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "done"); err != nil {
		t.Fatalf("Get(done) within the retention = %v", err)
	}
	// Redis expires the key on its own clock.
	testwait.Until(t, 5*time.Second, "Get(done) to answer ErrNotFound after the 300 ms retention", func() bool {
		_, err := s.Get(ctx, "done")
		return errors.Is(err, deferral.ErrNotFound)
	})
	if _, err := s.Get(ctx, "pending"); err != nil {
		t.Fatalf("Get(pending) = %v; an unfinished ticket never expires", err)
	}
}

// With the append-only file fsynced at every write, a kill -9 of
// redis-server loses no ticket: restarted on the same directory, a
// restarted replica adopts every unfinished one, and the final ones are
// still readable.
func TestAOFSurvivesKill9(t *testing.T) {
	srv := redistest.StartDurable(t)
	opts := redisbacklog.Options{Consumer: "r", Prefix: "aof"}
	s := open(t, srv.Client(), opts)
	want := addMany(t, s, "k", 300)
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var final []string
	for id := range want {
		if len(final) == 50 {
			break
		}
		if err := s.Finish(ctx, id, deferral.StateExpired, "deadline passed", at); err != nil {
			t.Fatal(err)
		}
		final = append(final, id)
		delete(want, id)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	srv.Stop() // SIGKILL
	srv.Restart()
	s = open(t, srv.Client(), opts)
	got, err := s.Adopt(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkOnce(t, got, want)
	for _, id := range final {
		if r, err := s.Get(ctx, id); err != nil || r.State != deferral.StateExpired || r.Reason != "deadline passed" {
			t.Fatalf("Get(%s) after the restart = %+v, %v; want it expired", id, r, err)
		}
	}
}

// A restart reads its own history past a page: 2,500 tickets in one
// shard.
func TestRestartAdoptsMoreThanAPage(t *testing.T) {
	rdb := redistest.Start(t).Client()
	opts := redisbacklog.Options{Consumer: "r", Prefix: "page", Shards: 1}
	s := open(t, rdb, opts)
	want := addMany(t, s, "p", 2500)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, rdb, opts)
	got, err := s.Adopt(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkOnce(t, got, want)
	for i := 1; i < len(got); i++ {
		if got[i].Seq <= got[i-1].Seq {
			t.Fatalf("adopted %s (seq %d) after seq %d; want Seq order", got[i].ID, got[i].Seq, got[i-1].Seq)
		}
	}
}

func TestOptionsAreChecked(t *testing.T) {
	rdb := redistest.Start(t).Client()
	for _, o := range []redisbacklog.Options{
		{},
		{Consumer: "r", ReclaimIdle: time.Second, HoldRefresh: time.Second},
	} {
		if s, err := redisbacklog.Open(ctx, rdb, o); err == nil {
			_ = s.Close()
			t.Errorf("Open(%+v) = nil error; want one", o)
		}
	}
}
