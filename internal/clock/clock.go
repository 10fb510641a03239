// Package clock gives the decision logic an injected notion of time, so that
// every timed rule (refill, leases, deadlines, breakers) is tested on a manual
// clock instead of by sleeping.
package clock

import (
	"context"
	"sync"
	"time"
)

// Clock is the only source of time the core packages use.
type Clock interface {
	// Now returns the current time. Real clocks carry a monotonic reading,
	// so differences between two Now calls never jump with wall-clock steps.
	Now() time.Time
	// Since returns the time elapsed since t, a time this clock gave.
	Since(t time.Time) time.Duration
}

// Real is the process clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// Since returns time.Since(t): for a t with a monotonic reading it reads
// only the monotonic clock, half of what Now reads (each a vDSO call, tens
// of nanoseconds on some virtual machines).
func (Real) Since(t time.Time) time.Duration { return time.Since(t) }

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

// Since returns the manual time elapsed since t.
func (m *Manual) Since(t time.Time) time.Duration { return m.Now().Sub(t) }

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

// Sleep waits d on the process's clock, or until ctx ends: then it
// returns ctx's error. It is for the real time retries and pacing wait, not
// for decision logic (which reads an injected Clock).
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Every calls fn every d on the process's clock until ctx ends; the first
// call is d after the start. It is for background loops (reconciles,
// probes, reloads), which pace themselves in real time.
func Every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if ctx.Err() != nil { // both ready: the end wins
				return
			}
			fn()
		}
	}
}
