package admission

import (
	"time"

	"github.com/sluice-sched/sluice/internal/tokenbucket"
)

// creditState is where a tenant's burst credit stands: lending, cut off by
// its breaker, or half-open after the breaker's period.
type creditState uint8

const (
	// creditLending: the token bucket may go into debt down to its credit.
	creditLending creditState = iota
	// creditBreakerOpen: debt was not repaid inside the window; every
	// request is BURST_CREDIT_EXHAUSTED until openUntil.
	creditBreakerOpen
	// creditHalfOpen: the open period is over; requests pass without
	// credit until the debt is repaid, which restores lending.
	creditHalfOpen
)

// burstCredit is a tenant's debt and the breaker that ends a debt left
// unpaid for longer than its window (docs/policy.md, "Burst credit").
type burstCredit struct {
	state     creditState
	inDebt    bool  // the token bucket went below zero and has not been seen repaid
	debtSince int64 // when it went below zero
	openUntil int64 // while creditBreakerOpen
}

// lending reports whether the token bucket may lend its credit now.
func (c *burstCredit) lending() bool { return c.state == creditLending }

// settled reports whether the credit holds nothing a fresh state would not.
func (c *burstCredit) settled() bool { return !c.inDebt && c.state == creditLending }

// open reports whether the breaker refuses at now.
func (c *burstCredit) open(now int64) bool {
	return c.state == creditBreakerOpen && now < c.openUntil
}

// advance moves the breaker to time now: an open period that has ended
// half-opens it; repaid debt closes it (credit lent again); debt older than
// the window opens it. While it is open it returns the wait until it
// half-opens; otherwise 0.
func (c *burstCredit) advance(now int64, tokens *tokenbucket.Bucket, p *TierPolicy) (openFor time.Duration) {
	if c.state == creditBreakerOpen {
		if now < c.openUntil {
			return time.Duration(c.openUntil - now)
		}
		c.state = creditHalfOpen
	}
	if !c.inDebt {
		return 0
	}
	if tokens.Level(now) >= 0 {
		c.inDebt = false
		if c.state == creditHalfOpen { // repaid: close and lend again
			c.state = creditLending
			tokens.SetLimits(tokens.Rate(), tokens.Burst(), creditLimit(*p))
		}
		return 0
	}
	if c.state == creditLending && now-c.debtSince > int64(p.BurstCredit.Window.Duration) {
		c.state = creditBreakerOpen
		c.openUntil = now + int64(p.BurstCredit.BreakerOpen.Duration)
		tokens.SetLimits(tokens.Rate(), tokens.Burst(), 0)
		return time.Duration(c.openUntil - now)
	}
	return 0
}

// noteTake starts the repay window when a take moved the token bucket from
// a level of before (≥ 0) to after (< 0); debt repaid in the meantime does
// not count against the new window.
func (c *burstCredit) noteTake(before, after, now int64) {
	if before >= 0 && after < 0 {
		c.inDebt, c.debtSince = true, now
	}
}

// creditLimit is how far below zero a policy lets the token bucket go.
func creditLimit(p TierPolicy) int64 { return roundUnits(p.BurstCredit.Multiple * p.Tokens.Rate) }

// availableCredit is how much of its credit a bucket still has to lend.
func availableCredit(level, credit int64) int64 {
	if level >= 0 {
		return credit
	}
	return max(credit+level, 0)
}
