package wfq

import "unsafe"

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
type lane struct {
	tag    [inline]uint64 // finish tags, when more is nil
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
	return l.more[j].tag, l.more[j].seq
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

// set writes the k-th item and its key.
func (l *lane) set(k uint32, tag uint64, seq uint32, it *Item) {
	j := l.index(k)
	if l.more == nil {
		l.tag[j], l.seq[j], l.item[j] = tag, seq, it
	} else {
		l.more[j] = slot{tag: tag, seq: seq, item: it}
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

// push appends it, with its key, at the tail.
func (l *lane) push(tag uint64, seq uint32, it *Item) {
	if c := l.cap(); int(l.n) == c {
		l.resize(2 * c)
	}
	l.set(l.n, tag, seq, it)
	l.n++
}

// pop takes the head item out and returns it and its finish tag; the lane
// must not be empty.
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
		tag, it = s.tag, s.item
		s.item = nil
	}
	l.head = l.index(1)
	l.n--
	l.shrink()
	return tag, it
}

// find returns the position of it, which must be in the lane, counted from
// the head. It looks from the tail, so it costs the items behind it.
func (l *lane) find(it *Item) uint32 {
	k := l.n - 1
	for l.at(k) != it {
		k--
	}
	return k
}

// cut takes the k-th item out. The items behind it move up one place, and
// their tags, here and in the items, down by d, saturating at 0.
func (l *lane) cut(k uint32, d uint64) {
	for ; k+1 < l.n; k++ {
		tag, seq := l.key(k + 1)
		it := l.at(k + 1)
		tag = satSub(tag, d)
		it.tag = tag
		l.set(k, tag, seq, it)
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
// on: the lane's arrays if c is inline, else a new slice. The two never
// overlap: one is always the arrays, or a new slice.
func (l *lane) resize(c int) {
	var more []slot
	if c > inline {
		more = make([]slot, c)
	}
	for k := range l.n {
		tag, seq := l.key(k)
		it := l.at(k)
		if more != nil {
			more[k] = slot{tag: tag, seq: seq, item: it}
		} else {
			l.tag[k], l.seq[k], l.item[k] = tag, seq, it
		}
	}
	if more != nil {
		l.item = [inline]*Item{} // unused while the lane holds more
	}
	l.more, l.head = more, 0
}

// warm prefetches both of the lane's cache lines. It computes their
// addresses from l's without naming a field: &l.tag would make the compiler
// check l for nil with a load, which waits for the very line being
// prefetched.
func (l *lane) warm() {
	prefetchLines(uintptr(unsafe.Pointer(l)), 2)
}
