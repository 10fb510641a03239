package admission

import "time"

// CreditFreeze is an operator's emergency switch for bursts across many
// tenants: until Until no tenant's token bucket lends burst credit, so only
// requests within quota pass (over-quota ones are BURST_CREDIT_FROZEN).
// Debts already taken are repaid as usual; critical bands and floors are
// untouched.
type CreditFreeze struct {
	Until  time.Time // when it ends, on the engine's clock
	Reason string    // what the operator gave, for status and audit
}

// creditFreeze is the tenant gates' record of a freeze.
type creditFreeze struct {
	until  int64 // engine time it ends; 0: none
	reason string
}

// frozenLocked returns what is left of the credit freeze at now (0: none).
// A freeze that has ended is forgotten here, so its expiry needs no timer.
func (g *tenantGates) frozenLocked(now int64) time.Duration {
	if g.freeze.until == 0 {
		return 0
	}
	if now >= g.freeze.until {
		g.freeze = creditFreeze{}
		return 0
	}
	return time.Duration(g.freeze.until - now)
}

// FreezeCredit freezes every tenant's burst credit until until (wall time
// on the engine's clock, so that replicas handed the same absolute deadline
// agree); a later call replaces it, and an until already past thaws.
func (e *Engine) FreezeCredit(until time.Time, reason string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	end := int64(until.Sub(e.base))
	if end <= e.nowLocked() {
		e.mu.gates.freeze = creditFreeze{}
		return
	}
	e.mu.gates.freeze = creditFreeze{until: end, reason: reason}
}

// FreezeCreditFor freezes every tenant's burst credit for d from now on the
// engine's clock, and returns the freeze (d ≤ 0 thaws).
func (e *Engine) FreezeCreditFor(d time.Duration, reason string) CreditFreeze {
	until := e.clk.Now().Add(d)
	e.FreezeCredit(until, reason)
	return CreditFreeze{Until: until, Reason: reason}
}

// ThawCredit ends a credit freeze at once and reports whether one was in
// force (none is not an error).
func (e *Engine) ThawCredit() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	was := e.mu.gates.frozenLocked(e.nowLocked()) > 0
	e.mu.gates.freeze = creditFreeze{}
	return was
}

// CreditFrozen returns the credit freeze in force, if any.
func (e *Engine) CreditFrozen() (CreditFreeze, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.gates.frozenLocked(e.nowLocked()) == 0 {
		return CreditFreeze{}, false
	}
	return CreditFreeze{Until: e.base.Add(time.Duration(e.mu.gates.freeze.until)), Reason: e.mu.gates.freeze.reason}, true
}
