package admission

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
// slots by expiry. A lease id is (generation << 32 | slot+1): lookups need
// no map, a reused slot never answers to an old id, and steady-state
// admission and release allocate nothing. The heap holds live leases only
// (release removes its entry), so it is bounded by what is in flight.
type leaseTable struct {
	slots []leaseSlot
	free  []uint32 // vacant slots
	heap  []uint32 // slots of live leases, by expires
}

type leaseSlot struct {
	lease
	gen     uint32
	live    bool
	heapIdx int
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
	s := &t.slots[slot]
	s.lease, s.live = l, true
	s.gen++
	s.heapIdx = len(t.heap)
	t.heap = append(t.heap, slot)
	t.up(s.heapIdx)
	return uint64(s.gen)<<32 | uint64(slot+1)
}

// get returns the live lease with id.
func (t *leaseTable) get(id uint64) (*lease, bool) {
	slot := uint32(id) - 1
	if uint32(id) == 0 || int(slot) >= len(t.slots) {
		return nil, false
	}
	s := &t.slots[slot]
	if !s.live || s.gen != uint32(id>>32) {
		return nil, false
	}
	return &s.lease, true
}

// remove deletes the live lease with id and returns it.
func (t *leaseTable) remove(id uint64) (lease, bool) {
	l, ok := t.get(id)
	if !ok {
		return lease{}, false
	}
	out := *l
	t.removeSlot(uint32(id) - 1)
	return out, true
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
	s.lease, s.live = lease{}, false
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
	out := t.slots[slot].lease
	t.removeSlot(slot)
	return out, true
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
