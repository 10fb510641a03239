package deferral_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/admissiontest"
	"github.com/sluice-sched/sluice/admission/deferral"
	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/state/memstate"
	"github.com/sluice-sched/sluice/internal/testwait"
	"github.com/sluice-sched/sluice/topology/topologytest"
)

// While the drain loop's Admit of a head waits on the shared store (a
// strict commit, a round trip to Redis), the backlog's own calls answer:
// Admit, Get, Cancel and a new worker's Claim. The head is delivered once
// the store answers, and a ticket cancelled meanwhile is not.
func TestBacklogAnswersWhileTheEngineWaits(t *testing.T) {
	clk := clock.NewManual(epoch)
	gate := admissiontest.NewGated(memstate.New(clk), 4)
	e, err := admission.New(quotaConfig(1000), topologytest.HGX(t, 2), admission.WithClock(clk),
		admission.WithSharedState(gate, sharing.Options{Mode: sharing.Strict, Replica: "r", Timeout: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	r := &rig{t: t, clk: clk, e: e, b: deferral.New(e, deferral.NewMemStore(), clk, nil)}
	ctx := context.Background()

	// b's first request is admitted (its commit let through); the next two
	// are over its quota and get tickets without reaching the store.
	first := make(chan deferral.Answer, 1)
	go func() { first <- r.admit(deferrable("b", 1000, 10)) }()
	<-gate.Entered()
	gate.Pass()
	if a := <-first; a.Decision.Outcome != admission.Admitted {
		t.Fatalf("first: %v", a.Decision.Outcome)
	}
	head, other := r.admit(deferrable("b", 1000, 10)), r.admit(deferrable("b", 1000, 10))
	if head.Ticket == "" || other.Ticket == "" {
		t.Fatalf("want two tickets, got %+v and %+v", head, other)
	}
	w := r.worker(deferral.ClaimOptions{MaxInFlight: 4})
	testwait.Until(t, 10*time.Second, "the worker to register", func() bool { return r.b.Claiming() == 1 })

	// The quota refills for one: the drain loop admits the head, whose
	// commit waits at the gate.
	r.clk.Advance(2 * time.Second)
	stepped := make(chan struct{})
	go func() { r.b.Step(ctx); close(stepped) }()
	<-gate.Entered()

	answers := make(chan string, 4)
	go func() {
		rec, err := r.b.Get(ctx, head.Ticket, nil)
		if err != nil || rec.State != deferral.StatePending {
			t.Errorf("Get of the head being admitted: %v %v, want PENDING", rec.State, err)
		}
		answers <- "Get"
	}()
	go func() {
		rec, err := r.b.Cancel(ctx, other.Ticket, nil)
		if err != nil || rec.State != deferral.StateCancelled {
			t.Errorf("Cancel: %v %v, want CANCELLED", rec.State, err)
		}
		answers <- "Cancel"
	}()
	go func() {
		a, err := r.b.Admit(ctx, deferrable("b", 1000, 10))
		if err != nil || a.Decision.Outcome != admission.Deferred {
			t.Errorf("Admit: %+v %v, want DEFERRED", a, err)
		}
		answers <- "Admit"
	}()
	r.worker(deferral.ClaimOptions{})
	for _, want := range []string{"Get", "Cancel", "Admit"} {
		select {
		case got := <-answers:
			t.Logf("%s answered while the engine waits", got)
		case <-time.After(10 * time.Second):
			t.Fatalf("the backlog's %s (or another call) did not answer while the engine waits on the store", want)
		}
	}
	testwait.Until(t, 10*time.Second, "the second worker to register", func() bool { return r.b.Claiming() == 2 })

	gate.Pass()
	<-stepped
	got := w.take(t, r, 1)
	if got[0].Record.ID != head.Ticket {
		t.Fatalf("delivered %s, want the head %s", got[0].Record.ID, head.Ticket)
	}
	if rec, err := r.b.Get(ctx, other.Ticket, nil); err != nil || rec.State != deferral.StateCancelled {
		t.Fatalf("the cancelled ticket: %v %v, want CANCELLED", rec.State, err)
	}
}
