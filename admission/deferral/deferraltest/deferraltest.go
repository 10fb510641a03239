// Package deferraltest is the conformance suite of the deferral.Store
// port: Run holds an implementation to the contract written on
// deferral.Store, so that the backlog can run on any of them (in memory,
// a bbolt file, Redis Streams) and behave the same.
//
// The suite speaks only through the interface. Durability is tested by
// reopening: a new store instance on the same durable data, as after a
// kill -9 restart (the suite closes the old instance first, so that an
// embedded store releases its file lock; it never finishes the tickets
// before, so the new instance sees what a crash would leave). A store
// that keeps nothing across instances (deferral.MemStore) runs the suite
// without reopen: those checks run on the one instance, or are skipped.
package deferraltest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission/deferral"
)

// Run runs the suite. open returns a fresh, empty store for each subtest;
// reopen returns a new instance on the durable data of the store open
// returned last in the same subtest (for a store shared by replicas: a
// restarted replica with the same identity), or is nil for a store that
// is not durable. The suite closes every store it gets, each exactly
// once, and the old one before it calls reopen.
func Run(t *testing.T, open, reopen func(t *testing.T) deferral.Store) {
	t.Run("add assigns increasing seq and get returns the record", func(t *testing.T) {
		s := newStores(t, open, reopen)
		st := s.open()
		// Increasing within a tenant: a store sharded by tenant draws the
		// Seqs of different tenants from different counters.
		last := map[string]uint64{}
		var added []deferral.Record
		for i := range 12 {
			rec := record(fmt.Sprintf("t%02d", i), tenants[i%3], i)
			seq := add(t, st, rec)
			if seq == 0 {
				t.Fatalf("Add(%s) = seq 0; seqs start at 1", rec.ID)
			}
			if seq <= last[rec.Work.Tenant] {
				t.Fatalf("Add(%s) = seq %d after %d in tenant %s; want increasing", rec.ID, seq, last[rec.Work.Tenant], rec.Work.Tenant)
			}
			last[rec.Work.Tenant] = seq
			rec.Seq, rec.State = seq, deferral.StatePending
			added = append(added, rec)
		}
		for _, want := range added {
			same(t, "Get after Add", get(t, st, want.ID), want)
		}
	})

	t.Run("claim of a pending ticket", func(t *testing.T) {
		st := newStores(t, open, reopen).open()
		want := addRecord(t, st, record("c1", "acme", 1))
		c := claim(1)
		cur, ok, err := st.Claim(ctx, want.ID, c)
		if err != nil || !ok {
			t.Fatalf("Claim(pending) = ok %v, err %v; want ok", ok, err)
		}
		want.State, want.Claim = deferral.StateClaimed, c
		same(t, "Claim's record", cur, want)
		same(t, "Get after Claim", get(t, st, want.ID), want)
	})

	t.Run("claim of a ticket no longer pending returns it with ok false", func(t *testing.T) {
		st := newStores(t, open, reopen).open()
		// Cancelled while pending (a CancelTicket through any replica).
		cancelled := addRecord(t, st, record("x1", "acme", 1))
		finish(t, st, cancelled.ID, deferral.StateCancelled, "cancelled by the submitter", at)
		cancelled.State, cancelled.Reason, cancelled.Finished = deferral.StateCancelled, "cancelled by the submitter", at
		// Claimed, then done.
		done := addRecord(t, st, record("x2", "acme", 2))
		mustClaim(t, st, done.ID, claim(2))
		finish(t, st, done.ID, deferral.StateDone, "", at)
		done.State, done.Claim, done.Finished = deferral.StateDone, claim(2), at
		// Claimed already.
		held := addRecord(t, st, record("x3", "acme", 3))
		mustClaim(t, st, held.ID, claim(3))
		held.State, held.Claim = deferral.StateClaimed, claim(3)
		for _, want := range []deferral.Record{cancelled, done, held} {
			cur, ok, err := st.Claim(ctx, want.ID, claim(9))
			if err != nil || ok {
				t.Fatalf("Claim(%s, %s) = ok %v, err %v; want ok false", want.ID, want.State, ok, err)
			}
			same(t, "Claim's current record", cur, want)
			same(t, "Get after a refused Claim", get(t, st, want.ID), want)
		}
	})

	t.Run("unclaim puts a claimed ticket back to pending", func(t *testing.T) {
		st := newStores(t, open, reopen).open()
		want := addRecord(t, st, record("u1", "acme", 1))
		mustClaim(t, st, want.ID, claim(1))
		// Another lease's Unclaim (a replica whose claim was lost, the
		// ticket adopted and claimed since) leaves the claim alone.
		if err := st.Unclaim(ctx, want.ID, claim(7).LeaseID); err != nil {
			t.Fatalf("Unclaim with another lease: %v", err)
		}
		claimed := want
		claimed.State, claimed.Claim = deferral.StateClaimed, claim(1)
		same(t, "Get after another lease's Unclaim", get(t, st, want.ID), claimed)
		if err := st.Unclaim(ctx, want.ID, claim(1).LeaseID); err != nil {
			t.Fatalf("Unclaim: %v", err)
		}
		same(t, "Get after Unclaim", get(t, st, want.ID), want) // pending, no claim
		mustClaim(t, st, want.ID, claim(2))
		want.State, want.Claim = deferral.StateClaimed, claim(2)
		same(t, "Get after a second Claim", get(t, st, want.ID), want)
	})

	t.Run("a claimed ticket is not cancelled; a final one keeps its first state", func(t *testing.T) {
		st := newStores(t, open, reopen).open()
		// A CancelTicket through another replica that read the ticket
		// pending, after its holder claimed it: the worker runs it.
		held := addRecord(t, st, record("k1", "acme", 1))
		mustClaim(t, st, held.ID, claim(1))
		finish(t, st, held.ID, deferral.StateCancelled, "cancelled by the submitter", at)
		held.State, held.Claim = deferral.StateClaimed, claim(1)
		same(t, "Get after a cancel of a claimed ticket", get(t, st, held.ID), held)
		finish(t, st, held.ID, deferral.StateDone, "", at)
		held.State, held.Finished = deferral.StateDone, at
		same(t, "Get after its Release", get(t, st, held.ID), held)
		// A final ticket: neither Unclaim nor another Finish moves it.
		if err := st.Unclaim(ctx, held.ID, claim(1).LeaseID); err != nil {
			t.Fatalf("Unclaim(final): %v", err)
		}
		finish(t, st, held.ID, deferral.StateExpired, "late", at.Add(time.Second))
		same(t, "Get after Unclaim and Finish of a final ticket", get(t, st, held.ID), held)
	})

	t.Run("finish keeps the record, adopt never returns it", func(t *testing.T) {
		s := newStores(t, open, reopen)
		st := s.open()
		var want []deferral.Record
		for i, fs := range []deferral.State{deferral.StateDone, deferral.StateExpired, deferral.StateCancelled} {
			rec := addRecord(t, st, record(fmt.Sprintf("f%d", i), "acme", i))
			if fs == deferral.StateDone {
				mustClaim(t, st, rec.ID, claim(i))
				rec.Claim = claim(i)
			}
			reason := "reason " + fs.String()
			finish(t, st, rec.ID, fs, reason, at.Add(time.Duration(i)*time.Second))
			rec.State, rec.Reason, rec.Finished = fs, reason, at.Add(time.Duration(i)*time.Second)
			same(t, "Get after Finish", get(t, st, rec.ID), rec)
			want = append(want, rec)
		}
		if s.durable() {
			st = s.reopen()
		}
		for _, rec := range want {
			same(t, "Get of a final ticket (after a restart, if durable)", get(t, st, rec.ID), rec)
		}
		if got := adopt(t, st); len(got) != 0 {
			t.Fatalf("Adopt = %v; want nothing: every ticket is final", ids(got))
		}
	})

	t.Run("unknown ids are ErrNotFound", func(t *testing.T) {
		st := newStores(t, open, reopen).open()
		addRecord(t, st, record("known", "acme", 1))
		const id = "no-such-ticket"
		if _, err := st.Get(ctx, id); !errors.Is(err, deferral.ErrNotFound) {
			t.Errorf("Get(unknown) = %v; want ErrNotFound", err)
		}
		if _, _, err := st.Claim(ctx, id, claim(1)); !errors.Is(err, deferral.ErrNotFound) {
			t.Errorf("Claim(unknown) = %v; want ErrNotFound", err)
		}
		if err := st.Unclaim(ctx, id, 1); !errors.Is(err, deferral.ErrNotFound) {
			t.Errorf("Unclaim(unknown) = %v; want ErrNotFound", err)
		}
		if err := st.Finish(ctx, id, deferral.StateCancelled, "", at); !errors.Is(err, deferral.ErrNotFound) {
			t.Errorf("Finish(unknown) = %v; want ErrNotFound", err)
		}
	})

	t.Run("adopt after a restart returns every unfinished ticket once", func(t *testing.T) {
		s := newStores(t, open, reopen)
		if !s.durable() {
			t.Skip("the store is not durable: nothing to adopt after a restart")
		}
		st := s.open()
		if got := adopt(t, st); len(got) != 0 {
			t.Fatalf("first Adopt of an empty store = %v; want nothing", ids(got))
		}
		want := map[string]deferral.Record{}
		for i := range 30 {
			rec := addRecord(t, st, record(fmt.Sprintf("a%02d", i), tenants[i%3], i))
			switch i % 5 {
			case 1: // claimed: adopted with its claim, its lease may still run
				mustClaim(t, st, rec.ID, claim(i))
				rec.State, rec.Claim = deferral.StateClaimed, claim(i)
			case 2: // claimed and unclaimed: pending again
				mustClaim(t, st, rec.ID, claim(i))
				if err := st.Unclaim(ctx, rec.ID, claim(i).LeaseID); err != nil {
					t.Fatal(err)
				}
			case 3: // final: gone from the backlog
				finish(t, st, rec.ID, deferral.StateExpired, "deadline passed", at)
				continue
			}
			want[rec.ID] = rec
		}
		st = s.reopen()
		got := adopt(t, st)
		checkAdopted(t, got, want)
		if again := adopt(t, st); len(again) != 0 {
			t.Fatalf("second Adopt = %v; want nothing: the first took them all", ids(again))
		}
		// The adopted tickets are this instance's to work on.
		for _, rec := range got {
			if rec.State == deferral.StatePending {
				mustClaim(t, st, rec.ID, claim(7))
			}
			finish(t, st, rec.ID, deferral.StateDone, "", at)
		}
		st = s.reopen()
		if got := adopt(t, st); len(got) != 0 {
			t.Fatalf("Adopt after finishing everything = %v; want nothing", ids(got))
		}
	})

	t.Run("concurrent adds are all kept, across a restart", func(t *testing.T) {
		s := newStores(t, open, reopen)
		st := s.open()
		const goroutines, tickets = 64, 1000
		var (
			mu   sync.Mutex
			want = map[string]deferral.Record{}
			wg   sync.WaitGroup
			errs = make(chan error, goroutines)
		)
		for g := range goroutines {
			wg.Go(func() {
				for i := g; i < tickets; i += goroutines {
					rec := record(fmt.Sprintf("p%04d", i), tenants[i%len(tenants)], i)
					seq, err := st.Add(ctx, rec)
					if err != nil {
						errs <- fmt.Errorf("Add(%s): %w", rec.ID, err)
						return
					}
					rec.Seq, rec.State = seq, deferral.StatePending
					mu.Lock()
					want[rec.ID] = rec
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if !s.durable() {
			for _, rec := range want {
				same(t, "Get after concurrent Adds", get(t, st, rec.ID), rec)
			}
			return
		}
		st = s.reopen()
		checkAdopted(t, adopt(t, st), want)
	})
}

// tenants are the tenants the suite's tickets belong to.
var tenants = []string{"acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "tyrell"}

var (
	ctx = context.Background()
	// at is the time the suite finishes tickets at: fixed, in UTC, so that
	// a record read back compares equal whatever the store's encoding.
	at = time.Date(2030, 1, 2, 3, 4, 5, 600700800, time.UTC)
)

// record returns a new ticket for tenant, its fields distinct by i.
func record(id, tenant string, i int) deferral.Record {
	created := time.Date(2030, 1, 2, 3, 0, 0, i*1000+7, time.UTC)
	return deferral.Record{
		ID: id,
		Work: deferral.Work{
			RequestID: "req-" + id, Tenant: tenant, Model: "llama-70b",
			PromptTokens: int64(100 + i), MaxOutputTokens: int64(200 + i), Priority: int32(i % 3),
			AcceptDowngrade: []string{"llama-8b"}, ExpectedCachedTokens: int64(i),
		},
		Created:  created,
		Deadline: created.Add(time.Hour),
		State:    deferral.StatePending,
	}
}

// claim returns a distinct claim for i.
func claim(i int) deferral.Claim {
	granted := time.Date(2030, 1, 2, 3, 1, 0, i, time.UTC)
	return deferral.Claim{
		LeaseID: uint64(1000 + i), Domain: fmt.Sprintf("dom-%d", i%2), Model: "llama-70b",
		At: granted, Expires: granted.Add(10 * time.Minute),
	}
}

// stores opens and reopens one subtest's stores, closing each once.
type stores struct {
	t            *testing.T
	openF, reopF func(t *testing.T) deferral.Store
	closeCur     func() // closes the current instance, once
}

func newStores(t *testing.T, open, reopen func(t *testing.T) deferral.Store) *stores {
	s := &stores{t: t, openF: open, reopF: reopen}
	t.Cleanup(func() {
		if s.closeCur != nil {
			s.closeCur()
		}
	})
	return s
}

func (s *stores) open() deferral.Store { return s.take(s.openF(s.t)) }

func (s *stores) durable() bool { return s.reopF != nil }

// reopen closes the current instance and returns a new one on its data.
func (s *stores) reopen() deferral.Store {
	s.t.Helper()
	s.closeCur()
	s.closeCur = nil
	return s.take(s.reopF(s.t))
}

func (s *stores) take(st deferral.Store) deferral.Store {
	var once sync.Once
	s.closeCur = func() {
		once.Do(func() {
			if err := st.Close(); err != nil {
				s.t.Errorf("Close: %v", err)
			}
		})
	}
	return st
}

func add(t *testing.T, st deferral.Store, rec deferral.Record) uint64 {
	t.Helper()
	seq, err := st.Add(ctx, rec)
	if err != nil {
		t.Fatalf("Add(%s): %v", rec.ID, err)
	}
	return seq
}

// addRecord adds rec and returns it as the store should now hold it.
func addRecord(t *testing.T, st deferral.Store, rec deferral.Record) deferral.Record {
	t.Helper()
	rec.Seq, rec.State = add(t, st, rec), deferral.StatePending
	return rec
}

func get(t *testing.T, st deferral.Store, id string) deferral.Record {
	t.Helper()
	rec, err := st.Get(ctx, id)
	if err != nil {
		t.Fatalf("Get(%s): %v", id, err)
	}
	return rec
}

func mustClaim(t *testing.T, st deferral.Store, id string, c deferral.Claim) {
	t.Helper()
	if _, ok, err := st.Claim(ctx, id, c); err != nil || !ok {
		t.Fatalf("Claim(%s) = ok %v, err %v; want ok", id, ok, err)
	}
}

func finish(t *testing.T, st deferral.Store, id string, state deferral.State, reason string, at time.Time) {
	t.Helper()
	if err := st.Finish(ctx, id, state, reason, at); err != nil {
		t.Fatalf("Finish(%s, %s): %v", id, state, err)
	}
}

func adopt(t *testing.T, st deferral.Store) []deferral.Record {
	t.Helper()
	got, err := st.Adopt(ctx)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	return got
}

// checkAdopted checks that got holds every record of want once, as
// want has it, and in Seq order within each tenant.
func checkAdopted(t *testing.T, got []deferral.Record, want map[string]deferral.Record) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]uint64{}
	for _, rec := range got {
		if seen[rec.ID] {
			t.Fatalf("Adopt returned %s twice", rec.ID)
		}
		seen[rec.ID] = true
		w, ok := want[rec.ID]
		if !ok {
			t.Fatalf("Adopt returned %s (%s), which it should not", rec.ID, rec.State)
		}
		same(t, "adopted record", rec, w)
		if rec.Seq <= last[rec.Work.Tenant] {
			t.Fatalf("Adopt returned %s (seq %d) after seq %d of tenant %s; want Seq order within a tenant", rec.ID, rec.Seq, last[rec.Work.Tenant], rec.Work.Tenant)
		}
		last[rec.Work.Tenant] = rec.Seq
	}
	if len(seen) != len(want) {
		var missing []string
		for id := range want {
			if !seen[id] {
				missing = append(missing, id)
			}
		}
		t.Fatalf("Adopt returned %d of %d unfinished tickets; missing %v", len(seen), len(want), missing)
	}
}

// same fails unless got equals want, times compared as instants.
func same(t *testing.T, what string, got, want deferral.Record) {
	t.Helper()
	if g, w := normal(got), normal(want); !reflect.DeepEqual(g, w) {
		t.Fatalf("%s:\n got %+v\nwant %+v", what, g, w)
	}
}

// normal returns rec with its times in UTC without a monotonic reading,
// and an empty list as nil: what any encoding reads back.
func normal(rec deferral.Record) deferral.Record {
	utc := func(t *time.Time) {
		if t.IsZero() {
			*t = time.Time{}
		} else {
			*t = t.UTC().Round(0)
		}
	}
	for _, p := range []*time.Time{&rec.Created, &rec.Deadline, &rec.Finished, &rec.Claim.At, &rec.Claim.Expires} {
		utc(p)
	}
	if len(rec.Work.AcceptDowngrade) == 0 {
		rec.Work.AcceptDowngrade = nil
	}
	return rec
}

func ids(recs []deferral.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ID + "/" + r.State.String()
	}
	return out
}
