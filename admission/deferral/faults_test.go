package deferral_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/deferral"
	"github.com/sluice-sched/sluice/internal/testwait"
)

// faultyStore is a MemStore whose writes fail as a test asks: a claim
// written whose answer is lost, claims that fail, an Add held at a gate.
type faultyStore struct {
	*deferral.MemStore
	mu         sync.Mutex
	loseClaims int           // the next claims are written, then answered with an error
	failClaims bool          // every claim fails unwritten
	claims     int           // Claim calls
	addGate    chan struct{} // Add waits for it to close
	addErr     error         // Add fails with it, unwritten
	loseAdds   int           // the next adds are written, then answered with an error
	failUncl   int           // the next unclaims fail unwritten
}

func (s *faultyStore) Unclaim(ctx context.Context, id string, leaseID uint64) error {
	s.mu.Lock()
	fail := s.failUncl > 0
	if fail {
		s.failUncl--
	}
	s.mu.Unlock()
	if fail {
		return errStore
	}
	return s.MemStore.Unclaim(ctx, id, leaseID)
}

var errStore = errors.New("store: timed out")

func (s *faultyStore) Claim(ctx context.Context, id string, c deferral.Claim) (deferral.Record, bool, error) {
	s.mu.Lock()
	s.claims++
	fail, lose := s.failClaims, s.loseClaims > 0
	if lose {
		s.loseClaims--
	}
	s.mu.Unlock()
	if fail {
		return deferral.Record{}, false, errStore
	}
	cur, ok, err := s.MemStore.Claim(ctx, id, c)
	if lose {
		return deferral.Record{}, false, errStore
	}
	return cur, ok, err
}

func (s *faultyStore) Add(ctx context.Context, rec deferral.Record) (uint64, error) {
	if s.addGate != nil {
		<-s.addGate
	}
	if s.addErr != nil {
		return 0, s.addErr
	}
	s.mu.Lock()
	lose := s.loseAdds > 0
	if lose {
		s.loseAdds--
	}
	s.mu.Unlock()
	seq, err := s.MemStore.Add(ctx, rec)
	if lose {
		return 0, errStore
	}
	return seq, err
}

func (s *faultyStore) claimCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claims
}

// overQuota defers n requests of tenant b (its burst taken first) and
// returns their tickets.
func (r *rig) overQuota(n int) []string {
	r.t.Helper()
	r.admit(deferrable("b", 1000, 10)) // takes the burst
	var ids []string
	for range n {
		a := r.admit(deferrable("b", 1000, 10))
		if a.Ticket == "" {
			r.t.Fatalf("not deferred: %v %v", a.Decision.Outcome, a.Decision.Reason)
		}
		ids = append(ids, a.Ticket)
	}
	return ids
}

func (r *rig) state(id string) deferral.State {
	r.t.Helper()
	rec, err := r.b.Get(context.Background(), id, nil)
	if err != nil {
		r.t.Fatalf("Get %s: %v", id, err)
	}
	return rec.State
}

// An engine that closes (sluiced shutting down) refuses everything
// SHUTTING_DOWN: the backlog's tickets wait for the next start, they do
// not expire.
func TestClosedEngineLeavesTicketsPending(t *testing.T) {
	store := deferral.NewMemStore()
	r := newRig(t, quotaConfig(1000), store)
	ids := r.overQuota(3)
	r.worker(deferral.ClaimOptions{MaxInFlight: 4})
	testwait.Until(t, 10*time.Second, "the worker to register", func() bool { return r.b.Claiming() == 1 })
	r.clk.Advance(5 * time.Second) // the quota refills
	r.e.Close()
	r.b.Step(context.Background())
	for _, id := range ids {
		if st := r.state(id); st != deferral.StatePending {
			t.Errorf("ticket %s: %v after the engine closed, want PENDING", id, st)
		}
		if rec, err := store.Get(context.Background(), id); err != nil || rec.State != deferral.StatePending {
			t.Errorf("stored ticket %s: %v (%v), want PENDING", id, rec.State, err)
		}
	}
}

// A claim written whose answer was lost (a store call timed out after it
// ran): the ticket is claimed in the store but pending here. The next
// claim finds it claimed, puts it back to pending, and it is delivered
// once.
func TestLostClaimAnswerIsTakenBack(t *testing.T) {
	store := &faultyStore{MemStore: deferral.NewMemStore(), loseClaims: 1}
	r := newRig(t, quotaConfig(1000), store)
	ids := r.overQuota(1)
	w := r.worker(deferral.ClaimOptions{})
	r.clk.Advance(5 * time.Second)
	got := w.take(t, r, 1)
	if got[0].Record.ID != ids[0] {
		t.Fatalf("delivered %s, want %s", got[0].Record.ID, ids[0])
	}
	r.release(got[0])
	if st := r.state(ids[0]); st != deferral.StateDone {
		t.Fatalf("ticket %v, want DONE", st)
	}
	r.clk.Advance(time.Minute)
	r.b.Step(context.Background())
	if n := w.count(); n != 0 {
		t.Fatalf("%d more deliveries of a done ticket", n)
	}
}

// A store whose claims all fail: Step returns (the drain loop tries again
// at its next turn) rather than trying the same tickets for ever, and
// every ticket stays pending.
func TestFailingClaimsEndTheStep(t *testing.T) {
	store := &faultyStore{MemStore: deferral.NewMemStore(), failClaims: true}
	r := newRig(t, quotaConfig(1000), store)
	ids := r.overQuota(2)
	r.worker(deferral.ClaimOptions{MaxInFlight: 4})
	testwait.Until(t, 10*time.Second, "the worker to register", func() bool { return r.b.Claiming() == 1 })
	r.clk.Advance(5 * time.Second)
	done := make(chan struct{})
	go func() { r.b.Step(context.Background()); close(done) }()
	testwait.Until(t, time.Minute, "Step to return", func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
	if n := store.claimCalls(); n > len(ids) {
		t.Errorf("%d claim writes in one Step for %d tickets", n, len(ids))
	}
	for _, id := range ids {
		if st := r.state(id); st != deferral.StatePending {
			t.Errorf("ticket %s: %v, want PENDING", id, st)
		}
	}
}

// A request id repeated while its ticket's first write is under way gets
// its answer once the write returns: the ticket when it is stored, the
// write's error when it is not; never a ticket that does not exist.
func TestRepeatWaitsForTheTicketsWrite(t *testing.T) {
	for _, fail := range []bool{false, true} {
		store := &faultyStore{MemStore: deferral.NewMemStore()}
		r := newRig(t, quotaConfig(100), store)
		r.admit(deferrable("b", 1000, 10)) // takes the burst
		store.addGate = make(chan struct{})
		if fail {
			store.addErr = errStore
		}
		req := deferrable("b", 1000, 10)
		req.RequestID = "job-1"
		type result struct {
			a   deferral.Answer
			err error
		}
		first, again := make(chan result, 1), make(chan result, 1)
		go func() { a, err := r.b.Admit(context.Background(), req); first <- result{a, err} }()
		testwait.Until(t, 10*time.Second, "the first write to start", func() bool { return r.b.Held() == 1 })
		go func() { a, err := r.b.Admit(context.Background(), req); again <- result{a, err} }()
		select {
		case res := <-again:
			t.Fatalf("fail=%v: the repeat answered %+v (%v) before the write returned", fail, res.a, res.err)
		case <-time.After(50 * time.Millisecond):
		}
		close(store.addGate)
		f, g := <-first, <-again
		switch {
		case fail && (f.err == nil || g.err == nil || g.a.Ticket != ""):
			t.Errorf("failed write: first %v, repeat %+v %v; want both errors and no ticket", f.err, g.a, g.err)
		case !fail && (f.err != nil || g.err != nil || g.a.Ticket == "" || g.a.Ticket != f.a.Ticket):
			t.Errorf("stored: first %q %v, repeat %q %v; want one ticket", f.a.Ticket, f.err, g.a.Ticket, g.err)
		case !fail:
			if rec, err := store.Get(context.Background(), g.a.Ticket); err != nil || rec.State != deferral.StatePending {
				t.Errorf("the repeat's ticket in the store: %v %v", rec.State, err)
			}
		}
	}
}

// A ticket another replica holds and has handed to a worker cannot be
// cancelled through this one: its worker releases it.
func TestCancelOfATicketClaimedElsewhere(t *testing.T) {
	store := deferral.NewMemStore()
	other := newRig(t, quotaConfig(1000), store)
	ids := other.overQuota(1)
	w := other.worker(deferral.ClaimOptions{})
	other.clk.Advance(5 * time.Second)
	w.take(t, other, 1)
	here := newRig(t, quotaConfig(1000), store)
	rec, err := here.b.Cancel(context.Background(), ids[0], nil)
	if !errors.Is(err, deferral.ErrClaimed) || rec.State != deferral.StateClaimed {
		t.Fatalf("Cancel through another replica: %v %v, want CLAIMED and ErrClaimed", rec.State, err)
	}
	if cur, _ := store.Get(context.Background(), ids[0]); cur.State != deferral.StateClaimed {
		t.Fatalf("stored ticket %v, want still CLAIMED", cur.State)
	}
}

// A deferrable request a router runs at once is charged as any other if
// its lease ends unreleased: only a backlog ticket's lease is settled as
// unused (its ticket runs again and is charged then).
func TestDeferrableRunAtOnceIsChargedAtExpiry(t *testing.T) {
	cfg := quotaConfig(1000)
	cfg.Leases.TTL = admission.Duration{Duration: 100 * time.Millisecond}
	r := newRig(t, cfg, deferral.NewMemStore())
	if a := r.admit(deferrable("b", 1000, 10)); a.Decision.Outcome != admission.Admitted {
		t.Fatalf("not admitted at once: %v", a.Decision.Outcome)
	}
	r.clk.Advance(101 * time.Millisecond)
	r.e.Tick()
	info, _ := r.e.Tenant("b")
	// The burst is 2,000: charged 1,040 and refilled 100, the level is
	// about 1,060; settled as unused it would be back at 2,000.
	if info.TokenLevel > 1200 {
		t.Fatalf("token level %d after the lease expired: the run was not charged", info.TokenLevel)
	}
}

// Close ends the drain loop Start began and every worker's Claim stream
// (ErrClosed), so that the engine can close after it without refusing a
// ticket.
func TestCloseEndsTheLoopAndTheClaims(t *testing.T) {
	r := newRig(t, quotaConfig(1000), deferral.NewMemStore())
	if err := r.b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	claimed := make(chan error, 1)
	go func() {
		claimed <- r.b.Claim(context.Background(), deferral.ClaimOptions{}, func(deferral.Delivery) error { return nil })
	}()
	testwait.Until(t, 10*time.Second, "the worker to register", func() bool { return r.b.Claiming() == 1 })
	r.b.Close()
	if err := <-claimed; !errors.Is(err, deferral.ErrClosed) {
		t.Fatalf("Claim after Close: %v, want ErrClosed", err)
	}
	if err := r.b.Claim(context.Background(), deferral.ClaimOptions{}, nil); !errors.Is(err, deferral.ErrClosed) {
		t.Fatalf("a new Claim after Close: %v, want ErrClosed", err)
	}
}

// A ticket another replica claimed (it adopted the ticket while this
// replica's hold lapsed) is that replica's: this one lets it go and
// leaves the claim alone, rather than taking it back to pending.
func TestClaimOfAnotherReplicaIsLeftAlone(t *testing.T) {
	store := deferral.NewMemStore()
	r := newRig(t, quotaConfig(1000), store)
	ids := r.overQuota(1)
	theirs := deferral.Claim{LeaseID: 42, Domain: "elsewhere", Model: "small", At: epoch, Expires: epoch.Add(time.Hour)}
	if _, ok, err := store.Claim(context.Background(), ids[0], theirs); !ok || err != nil {
		t.Fatalf("the other replica's claim: %v %v", ok, err)
	}
	w := r.worker(deferral.ClaimOptions{})
	testwait.Until(t, 10*time.Second, "the worker to register", func() bool { return r.b.Claiming() == 1 })
	r.clk.Advance(5 * time.Second)
	r.b.Step(context.Background())
	r.b.Step(context.Background())
	if n := w.count(); n != 0 {
		t.Fatalf("%d deliveries of a ticket another replica claimed", n)
	}
	rec, err := r.b.Get(context.Background(), ids[0], nil)
	if err != nil || rec.State != deferral.StateClaimed || rec.Claim.LeaseID != 42 {
		t.Fatalf("ticket %v lease %d (%v), want CLAIMED by the other replica's lease 42", rec.State, rec.Claim.LeaseID, err)
	}
	if got := r.b.Tenants(); len(got) != 0 {
		t.Fatalf("backlog %+v, want the ticket let go", got)
	}
}

// A ticket's write whose answer was lost is tried again and found
// written: the request is DEFERRED with that ticket, which runs, rather
// than an error that leaves the ticket in the store held by nobody.
func TestLostAddAnswerIsTriedAgain(t *testing.T) {
	store := &faultyStore{MemStore: deferral.NewMemStore(), loseAdds: 2}
	r := newRig(t, quotaConfig(1000), store)
	ids := r.overQuota(1)
	if rec, err := store.Get(context.Background(), ids[0]); err != nil || rec.State != deferral.StatePending {
		t.Fatalf("stored ticket %v (%v), want PENDING", rec.State, err)
	}
	w := r.worker(deferral.ClaimOptions{})
	r.clk.Advance(5 * time.Second)
	if got := w.take(t, r, 1); got[0].Record.ID != ids[0] {
		t.Fatalf("delivered %s, want %s", got[0].Record.ID, ids[0])
	}
}

// A worker dies holding a ticket and the Unclaim after its lease's expiry
// fails: the ticket, pending here and still claimed in the store, is taken
// back at its next claim (the claim is this replica's) and delivered.
func TestFailedUnclaimIsTakenBackLater(t *testing.T) {
	store := &faultyStore{MemStore: deferral.NewMemStore()}
	cfg := quotaConfig(1000)
	cfg.Leases.TTL = admission.Duration{Duration: 100 * time.Millisecond}
	r := newRig(t, cfg, store)
	ids := r.overQuota(1)
	r.clk.Advance(5 * time.Second)
	first := r.worker(deferral.ClaimOptions{})
	first.take(t, r, 1)
	first.cancel() // dies holding it
	<-first.done
	first.done <- nil
	store.mu.Lock()
	store.failUncl = 1
	store.mu.Unlock()
	r.clk.Advance(101 * time.Millisecond)
	r.e.Tick() // the lease expires; its Unclaim fails
	second := r.worker(deferral.ClaimOptions{})
	if got := second.take(t, r, 1); got[0].Record.ID != ids[0] {
		t.Fatalf("delivered %s, want %s", got[0].Record.ID, ids[0])
	}
}
