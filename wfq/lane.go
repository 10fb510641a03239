package wfq

import (
	"math/bits"
	"unsafe"
)

// inline is how many items a lane holds in its own arrays; a lane with more
// moves them to a ring of its own (lane.more).
const inline = 4

// cacheLine is the size the layouts here are planned for.
const cacheLine = 64

// lane is one flow's FIFO in one band, while it has items: band.lanes[id]
// for the id the flow holds there (Flow.lane). It holds each queued item's
// key (finish tag and sequence number, copies of the item's own) beside the
// item, in a ring, so that Enqueue writes only the lane, and Dequeue reads
// the next head's key from the lane, not from a cold item.
//
// A lane is 128 bytes, two cache lines in the band's array: the first holds
// the keys and the ring's bounds, the second the items. Up to inline items
// live in the arrays here; past that the lane moves them to more, a ring of
// its own that doubles when full and halves when a quarter full (back into
// the arrays from 8 slots), so a lane allocates only as its length passes
// a power of two, not per item.
//
// A ring lowers its tags lazily. Removing an item moves the items behind
// it up by its increment (see Removal in the package doc), which for the
// head of a long lane, as a mass expiry removes from each lane in turn,
// would be every item in it. So a ring keeps a drop, by which every tag in
// it is to be lowered (saturating at 0): the tags stored in the ring, and
// in its items' tag fields, are their finish tags plus the drop. Removing
// the head adds its increment to the drop, in O(1); reading a key takes
// the drop off; and the drop comes out into the stored tags when the ring
// is resized, or when a new tag plus the drop would pass 2⁶⁴−1. A ring
// keeps its drop in tag[0], which it does not use otherwise.
type lane struct {
	tag    [inline]uint64 // finish tags, when more is nil; else tag[0] is the ring's drop
	seq    [inline]uint32 // sequence numbers, when more is nil
	head   uint32         // ring index of the first item
	n      uint32         // items queued
	weight uint32         // the weight of the last item enqueued (for WorkAhead), at most MaxUint32
	marked bool           // in its band's tails.marked: the tree has not seen its tail since it changed

	item [inline]*Item // the items, when more is nil
	flow *Flow         // the flow the lane belongs to
	more []slot        // the ring, once the lane holds more than inline items; its length a power of two
}

// slot is one item of a lane that has outgrown its arrays.
type slot struct {
	tag  uint64
	seq  uint32
	item *Item
}

// index returns the ring index of the k-th item from the head.
func (l *lane) index(k uint32) uint32 {
	if l.more == nil {
		return (l.head + k) & (inline - 1)
	}
	return (l.head + k) & uint32(len(l.more)-1)
}

// key returns the finish tag and sequence number of the k-th item.
func (l *lane) key(k uint32) (uint64, uint32) {
	j := l.index(k)
	if l.more == nil {
		return l.tag[j], l.seq[j]
	}
	return satSub(l.more[j].tag, l.tag[0]), l.more[j].seq
}

// drop returns how far the tags stored in the lane are above the finish
// tags: the ring's drop, or 0 for a lane in its arrays.
func (l *lane) drop() uint64 {
	if l.more == nil {
		return 0
	}
	return l.tag[0]
}

// at returns the k-th item.
func (l *lane) at(k uint32) *Item {
	j := l.index(k)
	if l.more == nil {
		return l.item[j]
	}
	return l.more[j].item
}

// tailTag returns the last item's finish tag; the lane must not be empty.
func (l *lane) tailTag() uint64 {
	tag, _ := l.key(l.n - 1)
	return tag
}

// set writes the k-th item and its key, whose tag is as stored (with the
// drop).
func (l *lane) set(k uint32, stored uint64, seq uint32, it *Item) {
	j := l.index(k)
	if l.more == nil {
		l.tag[j], l.seq[j], l.item[j] = stored, seq, it
	} else {
		l.more[j] = slot{tag: stored, seq: seq, item: it}
	}
}

// seqAt returns where the k-th item's sequence number is kept, for renumber.
func (l *lane) seqAt(k uint32) *uint32 {
	j := l.index(k)
	if l.more == nil {
		return &l.seq[j]
	}
	return &l.more[j].seq
}

// push appends it at the tail with finish tag tag and sequence number
// seq, and sets its tag field to the tag as stored.
func (l *lane) push(tag uint64, seq uint32, it *Item) {
	if c := l.cap(); int(l.n) == c {
		l.resize(2 * c)
	}
	stored := tag
	if d := l.drop(); d != 0 {
		var carry uint64
		if stored, carry = bits.Add64(tag, d, 0); carry != 0 {
			// The drop comes out into the stored tags.
			for k := range l.n {
				s := &l.more[l.index(k)]
				s.tag = satSub(s.tag, d)
				s.item.tag = s.tag
			}
			l.tag[0], stored = 0, tag
		}
	}
	it.tag = stored
	l.set(l.n, stored, seq, it)
	l.n++
}

// pop takes the head item out and returns it and its finish tag, which it
// also sets in the item's tag field; the lane must not be empty.
func (l *lane) pop() (uint64, *Item) {
	j := l.index(0)
	var (
		tag uint64
		it  *Item
	)
	if l.more == nil {
		tag, it = l.tag[j], l.item[j]
		l.item[j] = nil
	} else {
		s := &l.more[j]
		tag, it = satSub(s.tag, l.tag[0]), s.item
		it.tag = tag
		s.item = nil
	}
	l.head = l.index(1)
	l.n--
	l.shrink()
	return tag, it
}

// find returns the position of it, which must be in the lane, counted from
// the head: a binary search of the sequence numbers, which increase from
// the head (Enqueue gives each item the next, renumber keeps their order).
func (l *lane) find(it *Item) uint32 {
	lo, hi := uint32(0), l.n-1
	for lo < hi {
		if mid := lo + (hi-lo)/2; *l.seqAt(mid) < it.seq {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// cut takes the k-th item out and sets its tag field to its finish tag.
// The items behind it move up one place, and their tags down by d,
// saturating at 0: for the head of a ring, in O(1), by the drop; else one
// by one.
func (l *lane) cut(k uint32, d uint64) {
	tag, _ := l.key(k)
	l.at(k).tag = tag
	if l.more != nil && k == 0 {
		l.more[l.index(0)] = slot{}
		l.head = l.index(1)
		l.n--
		l.tag[0] = satAdd(l.tag[0], d)
		l.shrink()
		return
	}
	drop := l.drop()
	for ; k+1 < l.n; k++ {
		tag, seq := l.key(k + 1)
		it := l.at(k + 1)
		// At most the tag stored before, or the drop: no overflow.
		stored := satSub(tag, d) + drop
		it.tag = stored
		l.set(k, stored, seq, it)
	}
	l.set(l.n-1, 0, 0, nil)
	l.n--
	l.shrink()
}

// cap returns how many items the lane holds before it must grow.
func (l *lane) cap() int {
	if l.more == nil {
		return inline
	}
	return len(l.more)
}

// shrink halves a ring that is at most a quarter full, so that a lane's
// memory follows its length (with room to grow back before it reallocates).
func (l *lane) shrink() {
	if c := len(l.more); c > 0 && int(l.n) <= c/4 {
		l.resize(c / 2)
	}
}

// resize moves the items, in order, to a ring of c ≥ n slots from the head
// on: the lane's arrays if c is inline, else a new slice. The new ring's
// drop is 0: the finish tags are stored as they are, in the ring and in
// the items.
func (l *lane) resize(c int) {
	old := *l
	*l = lane{n: old.n, weight: old.weight, marked: old.marked, flow: old.flow}
	if c > inline {
		l.more = make([]slot, c)
	}
	drop := old.drop()
	for k := range l.n {
		tag, seq := old.key(k)
		it := old.at(k)
		if drop != 0 {
			it.tag = tag
		}
		l.set(k, tag, seq, it)
	}
}

// warm prefetches both of the lane's cache lines. It computes their
// addresses from l's without naming a field: &l.tag would make the compiler
// check l for nil with a load, which waits for the very line being
// prefetched.
func (l *lane) warm() {
	prefetchLines(uintptr(unsafe.Pointer(l)), 2)
}
