package deferral

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// MemStore keeps tickets in memory: what a server without --data-dir
// uses, and tests. Nothing survives the process.
type MemStore struct {
	mu       sync.Mutex
	recs     map[string]Record
	finished []string // final tickets in the order they finished, dropped after retention
	seq      uint64
	adopted  bool
}

// memRetention is how long a MemStore keeps final tickets for Get.
const memRetention = 24 * time.Hour

// NewMemStore returns an empty in-memory store.
func NewMemStore() *MemStore { return &MemStore{recs: make(map[string]Record)} }

// Add implements Store.
func (m *MemStore) Add(_ context.Context, rec Record) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, dup := m.recs[rec.ID]; dup {
		return old.Seq, nil
	}
	m.seq++
	rec.Seq = m.seq
	m.recs[rec.ID] = rec
	return rec.Seq, nil
}

// Claim implements Store.
func (m *MemStore) Claim(_ context.Context, id string, c Claim) (Record, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.recs[id]
	if !ok {
		return Record{}, false, fmt.Errorf("claim %s: %w", id, ErrNotFound)
	}
	if rec.State != StatePending {
		return rec, false, nil
	}
	rec.State, rec.Claim = StateClaimed, c
	m.recs[id] = rec
	return rec, true, nil
}

// Unclaim implements Store.
func (m *MemStore) Unclaim(_ context.Context, id string, leaseID uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.recs[id]
	if !ok {
		return fmt.Errorf("unclaim %s: %w", id, ErrNotFound)
	}
	if rec.ClaimedWith(leaseID) {
		rec.State, rec.Claim = StatePending, Claim{}
		m.recs[id] = rec
	}
	return nil
}

// Finish implements Store.
func (m *MemStore) Finish(_ context.Context, id string, state State, reason string, at time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.recs[id]
	if !ok {
		return fmt.Errorf("finish %s: %w", id, ErrNotFound)
	}
	if !state.Final() {
		return fmt.Errorf("finish %s: %v is not a final state", id, state)
	}
	if !rec.State.Finishes(state) {
		return nil
	}
	rec.State, rec.Reason, rec.Finished = state, reason, at
	m.recs[id] = rec
	m.finished = append(m.finished, id)
	for len(m.finished) > 0 {
		old, ok := m.recs[m.finished[0]]
		if ok && at.Sub(old.Finished) < memRetention {
			break
		}
		delete(m.recs, m.finished[0])
		m.finished = m.finished[1:]
	}
	return nil
}

// Get implements Store.
func (m *MemStore) Get(_ context.Context, id string) (Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.recs[id]
	if !ok {
		return Record{}, fmt.Errorf("get %s: %w", id, ErrNotFound)
	}
	return rec, nil
}

// Adopt implements Store: every unfinished ticket on the first call.
func (m *MemStore) Adopt(context.Context) ([]Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.adopted {
		return nil, nil
	}
	m.adopted = true
	var out []Record
	for _, rec := range m.recs {
		if !rec.State.Final() {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b Record) int { return cmp.Compare(a.Seq, b.Seq) })
	return out, nil
}

// Close implements Store.
func (m *MemStore) Close() error { return nil }
