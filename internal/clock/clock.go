// Package clock gives the decision logic an injected notion of time, so that
// every timed rule (refill, leases, deadlines, breakers) is tested on a manual
// clock instead of by sleeping.
package clock

import (
	"sync"
	"time"
)

// Clock is the only source of time the core packages use.
type Clock interface {
	// Now returns the current time. Real clocks carry a monotonic reading,
	// so differences between two Now calls never jump with wall-clock steps.
	Now() time.Time
}

// Real is the process clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// Manual is a clock that moves only when told to. It is safe for concurrent use.
type Manual struct {
	mu  sync.Mutex
	now time.Time
}

// NewManual returns a manual clock reading start.
func NewManual(start time.Time) *Manual { return &Manual{now: start} }

// Now returns the clock's current reading.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Advance moves the clock forward (or backward, for a negative d) by d.
func (m *Manual) Advance(d time.Duration) {
	m.mu.Lock()
	m.now = m.now.Add(d)
	m.mu.Unlock()
}

// Set moves the clock to t.
func (m *Manual) Set(t time.Time) {
	m.mu.Lock()
	m.now = t
	m.mu.Unlock()
}
