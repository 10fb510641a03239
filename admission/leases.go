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
	cached    int64 // prompt tokens expected from a prefix cache at admission
	output    int64 // max output tokens admitted
	outWeight int64 // output token weight at grant time
	granted   int64
	expires   int64
}

// leaseTable holds live leases in a slab indexed by slot, finds a slot by
// its lease's id, and keeps the live leases in order of expiry. A lease id
// is 64 random bits from a ChaCha8 stream seeded by crypto/rand, so that an
// id cannot be guessed from another: a lease can be released only by a
// caller that was told its id.
//
// Add, release and expiry are O(1) and allocate nothing in steady state:
// the ids are their own hash in an open-addressed index (leaseIndex), and
// expiry order is a doubly linked list through the slots, one per lease
// TTL (expiryList) — leases granted with one TTL expire in the order they
// were granted, so a new one goes at its list's tail. (A heap of expiries
// cost a release O(log leases) cache misses at 200k leases held.)
type leaseTable struct {
	chunks []*[slotsPerChunk]leaseSlot // the slab; slot s is chunks[s/slotsPerChunk][s%slotsPerChunk]
	nslots uint32                      // slots made so far
	free   []uint32                    // vacant slots, reused last-freed first
	index  leaseIndex
	lists  []expiryList // one per TTL of a live lease; a config reload adds one
	n      int
	ids    *rand.ChaCha8
}

// noSlot ends an expiry list.
const noSlot = ^uint32(0)

// slotsPerChunk is how many slots the slab adds at a time (about 1 MB): a
// slab that grows by chunks never copies the leases it holds, which for a
// slice doubling past 200k leases meant tens of megabytes moved under the
// engine's lock, with a write barrier per pointer while the GC runs.
const slotsPerChunk = 4096

// slot returns the slot numbered s.
func (t *leaseTable) slot(s uint32) *leaseSlot {
	return &t.chunks[s/slotsPerChunk][s%slotsPerChunk]
}

type leaseSlot struct {
	lease
	id         uint64 // 0 while vacant
	prev, next uint32 // neighbours in the lease's expiry list, or noSlot
}

// expiryList is the live leases granted with one TTL, earliest expiry
// first.
type expiryList struct {
	ttl        int64
	head, tail uint32
}

func newLeaseTable() leaseTable {
	var seed [32]byte
	if _, err := cryptorand.Read(seed[:]); err != nil {
		panic(fmt.Sprintf("admission: no randomness for lease ids: %v", err)) // crypto/rand does not fail on supported platforms
	}
	return leaseTable{ids: rand.NewChaCha8(seed)}
}

// add stores l and returns its id.
func (t *leaseTable) add(l lease) uint64 {
	var slot uint32
	if n := len(t.free); n > 0 {
		slot = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		if t.nslots%slotsPerChunk == 0 {
			t.chunks = append(t.chunks, new([slotsPerChunk]leaseSlot))
		}
		slot = t.nslots
		t.nslots++
	}
	// A fresh id for the slot: 0 means vacant, and an id a live lease
	// holds (a chance of live/2⁶⁴) is drawn again.
	var id uint64
	for id == 0 || !t.index.insert(id, slot) {
		id = t.ids.Uint64()
	}
	s := t.slot(slot)
	s.lease, s.id = l, id
	t.link(slot)
	t.n++
	return id
}

// get returns the live lease with id.
func (t *leaseTable) get(id uint64) (*lease, bool) {
	slot, ok := t.index.find(id)
	if !ok {
		return nil, false
	}
	return &t.slot(slot).lease, true
}

// find returns the slot of the live lease with id.
func (t *leaseTable) find(id uint64) (uint32, bool) {
	return t.index.find(id)
}

// remove deletes the live lease with id and returns it.
func (t *leaseTable) remove(id uint64) (lease, bool) {
	slot, ok := t.index.find(id)
	if !ok {
		return lease{}, false
	}
	return t.take(slot), true
}

// take deletes the live lease in slot and returns it.
func (t *leaseTable) take(slot uint32) lease {
	s := t.slot(slot)
	out := s.lease
	t.unlink(slot)
	t.index.remove(s.id)
	s.lease, s.id = lease{}, 0
	t.free = append(t.free, slot)
	t.n--
	return out
}

// popExpired removes and returns the earliest lease, and its id, if it
// expires at or before now.
func (t *leaseTable) popExpired(now int64) (lease, uint64, bool) {
	first := noSlot
	for _, l := range t.lists {
		if first == noSlot || t.slot(l.head).expires < t.slot(first).expires {
			first = l.head
		}
	}
	if first == noSlot || t.slot(first).expires > now {
		return lease{}, 0, false
	}
	id := t.slot(first).id
	return t.take(first), id, true
}

func (t *leaseTable) len() int { return t.n }

// each calls fn for every live lease.
func (t *leaseTable) each(fn func(*lease)) {
	for _, l := range t.lists {
		for slot := l.head; slot != noSlot; slot = t.slot(slot).next {
			fn(&t.slot(slot).lease)
		}
	}
}

// list returns the expiry list of leases granted with ttl, adding it if
// there is none.
func (t *leaseTable) list(ttl int64) *expiryList {
	for i := range t.lists {
		if t.lists[i].ttl == ttl {
			return &t.lists[i]
		}
	}
	t.lists = append(t.lists, expiryList{ttl: ttl, head: noSlot, tail: noSlot})
	return &t.lists[len(t.lists)-1]
}

// link puts a new lease in its expiry list. It goes at the tail but for
// the nanoseconds by which Admits that read the clock before taking the
// lock may pass each other: it steps back past any that expire later.
func (t *leaseTable) link(slot uint32) {
	s := t.slot(slot)
	l := t.list(s.expires - s.granted)
	prev := l.tail
	for prev != noSlot && t.slot(prev).expires > s.expires {
		prev = t.slot(prev).prev
	}
	s.prev = prev
	if prev == noSlot {
		s.next, l.head = l.head, slot
	} else {
		p := t.slot(prev)
		s.next, p.next = p.next, slot
	}
	if s.next == noSlot {
		l.tail = slot
	} else {
		t.slot(s.next).prev = slot
	}
}

// unlink takes a lease out of its expiry list, and drops the list once
// empty.
func (t *leaseTable) unlink(slot uint32) {
	s := t.slot(slot)
	l := t.list(s.expires - s.granted)
	if s.prev == noSlot {
		l.head = s.next
	} else {
		t.slot(s.prev).next = s.next
	}
	if s.next == noSlot {
		l.tail = s.prev
	} else {
		t.slot(s.next).prev = s.prev
	}
	if l.head == noSlot {
		i := len(t.lists) - 1
		*l = t.lists[i]
		t.lists = t.lists[:i]
	}
}

// leaseIndex maps live lease ids to slots. Ids are uniformly random, so an
// id's bits serve as its hash: the top six pick one of 64 parts, the low
// ones a cell in the part's open-addressed table (linear probing, at most
// 3/4 full, deletion by shifting back the cells after the hole: no
// tombstones). A part grows on its own, so a growth rehashes 1/64 of the
// live ids under the engine's lock (about 3k at 200k leases), not all of
// them at once.
type leaseIndex struct {
	parts [indexParts]indexPart
}

const indexParts = 64

type indexPart struct {
	cells []indexCell
	n     int
}

type indexCell struct {
	id   uint64 // 0: empty
	slot uint32
}

func (x *leaseIndex) part(id uint64) *indexPart { return &x.parts[id>>58] }

// find returns the slot of id.
func (x *leaseIndex) find(id uint64) (uint32, bool) { return x.part(id).find(id) }

// insert adds id → slot and reports true, or false if id is already
// there.
func (x *leaseIndex) insert(id uint64, slot uint32) bool { return x.part(id).insert(id, slot) }

// remove deletes id, which must be there.
func (x *leaseIndex) remove(id uint64) { x.part(id).remove(id) }

// len returns the number of ids held.
func (x *leaseIndex) len() int {
	n := 0
	for i := range x.parts {
		n += x.parts[i].n
	}
	return n
}

func (p *indexPart) find(id uint64) (uint32, bool) {
	if len(p.cells) == 0 {
		return 0, false
	}
	mask := uint64(len(p.cells) - 1)
	for i := id & mask; ; i = (i + 1) & mask {
		switch c := p.cells[i]; c.id {
		case id:
			return c.slot, true
		case 0:
			return 0, false
		}
	}
}

func (p *indexPart) insert(id uint64, slot uint32) bool {
	if 4*(p.n+1) > 3*len(p.cells) {
		p.grow()
	}
	mask := uint64(len(p.cells) - 1)
	for i := id & mask; ; i = (i + 1) & mask {
		switch p.cells[i].id {
		case id:
			return false
		case 0:
			p.cells[i] = indexCell{id: id, slot: slot}
			p.n++
			return true
		}
	}
}

func (p *indexPart) remove(id uint64) {
	mask := uint64(len(p.cells) - 1)
	hole := id & mask
	for p.cells[hole].id != id {
		hole = (hole + 1) & mask
	}
	// Shift back every cell after the hole whose home is not between the
	// hole and it (cyclically), so that no probe meets an empty cell
	// before its id.
	for j := (hole + 1) & mask; p.cells[j].id != 0; j = (j + 1) & mask {
		if home := p.cells[j].id & mask; (j-home)&mask >= (j-hole)&mask {
			p.cells[hole] = p.cells[j]
			hole = j
		}
	}
	p.cells[hole] = indexCell{}
	p.n--
}

func (p *indexPart) grow() {
	old := p.cells
	p.cells = make([]indexCell, max(2*len(old), 16))
	p.n = 0
	for _, c := range old {
		if c.id != 0 {
			p.insert(c.id, c.slot)
		}
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
