package admission

import (
	"context"
	"testing"

	"github.com/sluice-sched/sluice/topology"
)

// What the external tests (package admission_test: the scenarios and the
// shared-state tests, which use admissiontest) need of the engine's
// internals. Compiled only into the tests.

// Epoch is the manual clock's start in the tests: a fixed wall time.
var Epoch = epoch

// HGXCluster returns n HGX H200 domains of one node each: d1, d2, ...
func HGXCluster(t testing.TB, n int) topology.Cluster { return hgxCluster(t, n) }

// Ticket is a queued request, submitted without waiting for its answer.
type Ticket struct {
	w   *waiter
	req Request
}

// Submit decides a request as Admit does, without blocking on the queue:
// it returns the answer (confirmed with the shared store and observed, as
// Admit's), or a ticket when the request was queued; Await answers it.
func (e *Engine) Submit(ctx context.Context, req Request) (Decision, *Ticket, error) {
	if err := validateRequest(&req); err != nil {
		return Decision{}, nil, err
	}
	d, w, err := e.admit(ctx, &req)
	if err != nil {
		return Decision{}, nil, err
	}
	if w != nil {
		return Decision{}, &Ticket{w: w, req: req}, nil
	}
	if why := e.shared.decided(ctx, req.RequestID, d.LeaseID); why.refused() {
		d = refused(d, why)
	}
	if e.observer != nil {
		e.observer.ObserveDecision(req, d)
	}
	return d, nil, nil
}

// Answered reports whether the queued request has its answer.
func (tk *Ticket) Answered() bool {
	select {
	case <-tk.w.done:
		return true
	default:
		return false
	}
}

// Await is the rest of Admit for a queued request: it waits for the
// answer or for ctx to end (a ctx already ended is a caller giving up,
// which takes its request out of the queue) and confirms an admission
// with the shared store.
func (e *Engine) Await(ctx context.Context, tk *Ticket) Decision {
	d := e.wait(ctx, tk.w)
	if why := e.shared.decided(ctx, tk.req.RequestID, d.LeaseID); why.refused() {
		d = refused(d, why)
	}
	if e.observer != nil {
		e.observer.ObserveDecision(tk.req, d)
	}
	return d
}

// LeaseSlot returns the id of the latest lease whose low half (the slot
// number scenarios print) is n — released or not — or 0 when no lease has
// used that slot.
func (e *Engine) LeaseSlot(n uint32) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	slot := n - 1
	if n == 0 || int(slot) >= len(e.mu.leases.slots) {
		return 0
	}
	return uint64(e.mu.leases.slots[slot].gen)<<32 | uint64(n)
}

// WaitBackground waits for the store calls the engine runs in the
// background (a refund after a failed commit, say) to finish, so that
// what they change is seen by what the test does next. Call it only while
// Run is not running.
func (e *Engine) WaitBackground() { e.bg.Wait() }
