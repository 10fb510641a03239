package sharing

import (
	"errors"
	"sync"
	"time"
)

// errBreakerOpen is what a store call the breaker holds back fails with.
var errBreakerOpen = errors.New("shared state: breaker open")

// storeBreaker is the shared store's circuit breaker: it opens after limit
// consecutive failures and lets one probe through every cool-down while
// open. It has its own lock: strict decisions use it concurrently,
// outside the engine's lock.
type storeBreaker struct {
	mu       sync.Mutex
	limit    int
	cooldown time.Duration
	fails    int
	open     bool
	openedAt time.Time
	probeAt  time.Time
	fallback time.Duration // total time spent open, up to the last close
}

// allow reports whether a store call may go ahead now; while open, one
// call per cool-down goes ahead as the probe.
func (b *storeBreaker) allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return true
	}
	if now.Before(b.probeAt) {
		return false
	}
	b.probeAt = now.Add(b.cooldown)
	return true
}

// isOpen reports whether the breaker is open, without asking to probe.
func (b *storeBreaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

// failure counts a failed call and reports whether the breaker just opened.
func (b *storeBreaker) failure(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fails++
	if b.open || b.fails < b.limit {
		return false
	}
	b.open, b.openedAt, b.probeAt = true, now, now.Add(b.cooldown)
	return true
}

// success counts a successful ordinary call. While the breaker is open it
// changes nothing: a call let through before it opened may still answer
// after, and only a call that may close it (recovered) does.
func (b *storeBreaker) success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		b.fails = 0
	}
}

// recovered counts a successful call that closes an open breaker — a
// strict probe, which sent the resume report first, or a batched
// reconcile, which carries its own — and reports whether it just closed.
func (b *storeBreaker) recovered(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fails = 0
	if !b.open {
		return false
	}
	b.open = false
	b.fallback += now.Sub(b.openedAt)
	return true
}

// status reports whether the breaker is open and the total seconds spent open.
func (b *storeBreaker) status(now time.Time) (open bool, seconds float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	total := b.fallback
	if b.open {
		total += now.Sub(b.openedAt)
	}
	return b.open, total.Seconds()
}
