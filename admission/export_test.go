package admission

// What the external tests (package admission_test: the scenarios and the
// shared-state tests, which use admissiontest) need of the engine's
// internals. Compiled only into the tests.

// Epoch is the manual clock's start in the tests: a fixed wall time.
var Epoch = epoch

// Answered reports whether the queued request has its answer.
func (tk *Ticket) Answered() bool {
	select {
	case <-tk.Done():
		return true
	default:
		return false
	}
}

// LeaseNumber is the number scenarios print for a live lease: its slot + 1
// (ids are random; slot numbers read as the order leases were taken, and
// a slot is reused once its lease ends). 0 when the lease is not held.
func (e *Engine) LeaseNumber(id uint64) uint32 {
	e.mu.Lock()
	defer e.mu.Unlock()
	slot, ok := e.mu.leases.find(id)
	if !ok {
		return 0
	}
	return slot + 1
}

// LeaseSlot returns the id of the lease held in the slot numbered n, or an
// id no lease has (its lease ended: a release answers NOT_FOUND).
func (e *Engine) LeaseSlot(n uint32) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	slot := n - 1
	if n == 0 || slot >= e.mu.leases.nslots || e.mu.leases.slot(slot).id == 0 {
		return ^uint64(0)
	}
	return e.mu.leases.slot(slot).id
}

// WaitBackground waits for the store calls the engine runs in the
// background (a refund after a failed commit, say) to finish, so that
// what they change is seen by what the test does next. Call it only while
// Run is not running.
func (e *Engine) WaitBackground() { e.bg.Wait() }
