package admission

import (
	cryptorand "crypto/rand"
	"fmt"
	"math/rand/v2"
)

// lease is an admitted request holding domain capacity until Release or
// expiry. Its charge is what Release settles.
type lease struct {
	charge
	modelName string // resolved again at release: the catalog may have been reloaded
	prompt    int64
	output    int64 // max output tokens admitted
	outWeight int64 // output token weight at grant time
	granted   int64
	expires   int64
}

// leaseTable holds live leases in a slab indexed by slot, with a min-heap of
// slots by expiry, and finds a slot by its lease's id. A lease id is 64
// random bits from a ChaCha8 stream seeded by crypto/rand, so that an id
// cannot be guessed from another: a lease can be released only by a caller
// that was told its id. The slab keeps leases out of the garbage
// collector's way (no pointer per lease in a map), and steady-state
// admission and release allocate nothing. The heap holds live leases only
// (release removes its entry), so it is bounded by what is in flight.
type leaseTable struct {
	slots []leaseSlot
	free  []uint32          // vacant slots
	heap  []uint32          // slots of live leases, by expires
	byID  map[uint64]uint32 // live lease id → slot
	ids   *rand.ChaCha8
}

type leaseSlot struct {
	lease
	id      uint64 // 0 while vacant
	heapIdx int
}

func newLeaseTable() leaseTable {
	var seed [32]byte
	if _, err := cryptorand.Read(seed[:]); err != nil {
		panic(fmt.Sprintf("admission: no randomness for lease ids: %v", err)) // crypto/rand does not fail on supported platforms
	}
	return leaseTable{byID: make(map[uint64]uint32), ids: rand.NewChaCha8(seed)}
}

// add stores l and returns its id.
func (t *leaseTable) add(l lease) uint64 {
	var slot uint32
	if n := len(t.free); n > 0 {
		slot = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		t.slots = append(t.slots, leaseSlot{})
		slot = uint32(len(t.slots) - 1)
	}
	// A fresh id for the slot. A collision with a live lease's id (a chance
	// of live/2⁶⁴) shows as a map that did not grow: that lease gets its
	// entry back and another id is drawn.
	var id uint64
	for {
		id = t.ids.Uint64()
		if id == 0 {
			continue
		}
		n := len(t.byID)
		t.byID[id] = slot
		if len(t.byID) > n {
			break
		}
		for i := range t.slots {
			if t.slots[i].id == id {
				t.byID[id] = uint32(i)
			}
		}
	}
	s := &t.slots[slot]
	s.lease, s.id = l, id
	s.heapIdx = len(t.heap)
	t.heap = append(t.heap, slot)
	t.up(s.heapIdx)
	return id
}

// get returns the live lease with id.
func (t *leaseTable) get(id uint64) (*lease, bool) {
	slot, ok := t.byID[id]
	if !ok {
		return nil, false
	}
	return &t.slots[slot].lease, true
}

// find returns the slot of the live lease with id.
func (t *leaseTable) find(id uint64) (uint32, bool) {
	slot, ok := t.byID[id]
	return slot, ok
}

// remove deletes the live lease with id and returns it.
func (t *leaseTable) remove(id uint64) (lease, bool) {
	slot, ok := t.byID[id]
	if !ok {
		return lease{}, false
	}
	return t.take(slot), true
}

// take deletes the live lease in slot and returns it.
func (t *leaseTable) take(slot uint32) lease {
	out := t.slots[slot].lease
	t.removeSlot(slot)
	return out
}

func (t *leaseTable) removeSlot(slot uint32) {
	s := &t.slots[slot]
	i := s.heapIdx
	last := len(t.heap) - 1
	if i != last {
		t.swap(i, last)
	}
	t.heap = t.heap[:last]
	if i != last {
		t.down(i)
		t.up(i)
	}
	delete(t.byID, s.id)
	s.lease, s.id = lease{}, 0
	t.free = append(t.free, slot)
}

// popExpired removes and returns the earliest lease if it expires at or before now.
func (t *leaseTable) popExpired(now int64) (lease, bool) {
	if len(t.heap) == 0 {
		return lease{}, false
	}
	slot := t.heap[0]
	if t.slots[slot].expires > now {
		return lease{}, false
	}
	return t.take(slot), true
}

func (t *leaseTable) len() int { return len(t.heap) }

// each calls fn for every live lease.
func (t *leaseTable) each(fn func(*lease)) {
	for _, slot := range t.heap {
		fn(&t.slots[slot].lease)
	}
}

func (t *leaseTable) less(i, j int) bool {
	return t.slots[t.heap[i]].expires < t.slots[t.heap[j]].expires
}

func (t *leaseTable) swap(i, j int) {
	t.heap[i], t.heap[j] = t.heap[j], t.heap[i]
	t.slots[t.heap[i]].heapIdx = i
	t.slots[t.heap[j]].heapIdx = j
}

func (t *leaseTable) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !t.less(i, p) {
			return
		}
		t.swap(i, p)
		i = p
	}
}

func (t *leaseTable) down(i int) {
	n := len(t.heap)
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && t.less(l, m) {
			m = l
		}
		if r < n && t.less(r, m) {
			m = r
		}
		if m == i {
			return
		}
		t.swap(i, m)
		i = m
	}
}

// answer rebuilds the answer a live lease was granted with, for a repeat of
// its request (r, resolved again from the repeat): the same lease, domain,
// model and downgrade path; the trace's levels are read now.
func (l *lease) answer(d *Decision, id uint64, r *pending, now int64) {
	*d = Decision{Outcome: Admitted, LeaseID: id, Domain: l.dom.ID(), Model: l.modelName}
	for i, m := range r.tiers() {
		if i > 0 && m.name == l.modelName {
			d.Outcome = Degraded
			d.DowngradePath = make([]string, i+1)
			for j := range d.DowngradePath {
				d.DowngradePath[j] = r.tierBuf[j].name
			}
			break
		}
	}
	r.tenant, r.weighted, r.price = l.tenant, l.gates.weighted, l.gates.price
	tenantTrace(&d.Trace, r, now)
	tr := &d.Trace
	tr.Floor, tr.Critical = l.floor, l.gates.critical
	tr.PrefillLevel, tr.DecodeLevel = l.dom.cap.Levels(now)
	tr.KVInUse, tr.KVLimit = l.dom.cap.KV()
}
