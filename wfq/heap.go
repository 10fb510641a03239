package wfq

import (
	"math/bits"
	"unsafe"
)

// arity is the heap's fan-out. A 4-ary heap is half as deep as a binary one,
// and a node's four children, 64 bytes, fill one cache line (see root).
const arity = 4

// root is the root's index in heap.e; indexes below it are unused. The
// children of the node at p are at arity·(p−2) … arity·(p−2)+3, the parent
// of c at c/arity + 2: with the root at 3, every group of four siblings
// starts at a multiple of four entries, 64 bytes, and a large slice starts
// on a page, so a sift loads one cache line per level instead of two.
const root = 3

func firstChild(p int) int { return arity * (p - 2) }
func parent(c int) int     { return c/arity + 2 }

// prefetchFrom is the index from which heap.down prefetches grandchildren:
// the levels above it, 32 KiB, stay in cache anyway.
const prefetchFrom = 2048

// entry is a non-empty lane in its band's heap, keyed by its head's finish
// tag and sequence number, copied here so that sifting reads no lane and no
// item, and naming the lane by its id (see band). At 16 bytes, four
// siblings share a cache line; the lane itself, band.lanes[id], is an
// address computed from the id, so that Dequeue can prefetch it without
// loading anything first. Sifting records each moved entry's index in
// pos[id], a dense array that stays in cache.
type entry struct {
	tag uint64
	seq uint32
	id  int32
}

func (a *entry) less(b *entry) bool {
	return a.tag < b.tag || (a.tag == b.tag && a.seq < b.seq)
}

// heap is a min-heap of entries, from e[root] on; pos[id] is the index in e
// of the entry with that id.
type heap struct {
	e   []entry
	pos []int32
}

// len returns the number of entries.
func (h *heap) len() int { return max(len(h.e)-root, 0) }

// entries returns the entries, in heap order.
func (h *heap) entries() []entry {
	if len(h.e) < root {
		return nil
	}
	return h.e[root:]
}

func (h *heap) push(e entry) {
	if len(h.e) < root {
		h.e = make([]entry, root, 64)
	}
	h.e = append(h.e, e)
	h.up(len(h.e) - 1)
}

// remove deletes the entry at index i.
func (h *heap) remove(i int) {
	last := len(h.e) - 1
	if i != last {
		h.e[i] = h.e[last]
	}
	h.e = h.e[:last]
	if i != last {
		h.fix(i)
	}
}

// fix restores the heap order after the key at index i changed.
func (h *heap) fix(i int) {
	if i > root && h.e[i].less(&h.e[parent(i)]) {
		h.up(i)
	} else {
		h.down(i)
	}
}

func (h *heap) up(i int) {
	es, pos := h.e, h.pos
	e := es[i]
	for i > root {
		p := parent(i)
		if !e.less(&es[p]) {
			break
		}
		es[i] = es[p]
		pos[es[i].id] = int32(i)
		i = p
	}
	es[i] = e
	pos[e.id] = int32(i)
}

func (h *heap) down(i int) {
	es, pos := h.e, h.pos
	e := es[i]
	n := len(es)
	for c := firstChild(i); c < n; c = firstChild(i) {
		var m int
		if g := firstChild(c); g >= prefetchFrom && g+arity*arity <= n {
			// The next level's children are among c's 16 grandchildren,
			// side by side (4 lines, aligned as the root's comment
			// says): prefetching them now overlaps the next level's
			// cache miss with this one's, instead of paying the two in
			// turn.
			prefetchLines(uintptr(unsafe.Pointer(&es[g])), arity*arity*int(unsafe.Sizeof(entry{}))/cacheLine)
		}
		if c+arity <= n {
			// Which of four children is smallest is a coin toss, so a
			// branch per comparison would be mispredicted half the time;
			// pick it with arithmetic instead, as a tournament: two
			// independent comparisons, then one between their winners.
			// (Written out: as a function it is too large to inline.)
			s := (*[arity]entry)(es[c : c+arity])
			a := before(&s[1], &s[0])     // 0 or 1
			b := 2 + before(&s[3], &s[2]) // 2 or 3
			m = c + (a ^ ((a ^ b) & -before(&s[b&3], &s[a&3])))
		} else {
			m = c
			for j := c + 1; j < n; j++ {
				if es[j].less(&es[m]) {
					m = j
				}
			}
		}
		if !es[m].less(&e) {
			break
		}
		es[i] = es[m]
		pos[es[i].id] = int32(i)
		i = m
	}
	es[i] = e
	pos[e.id] = int32(i)
}

// before returns 1 if a's key is below b's, else 0, without a branch: the
// borrow out of the 96-bit subtraction (a.tag, a.seq) − (b.tag, b.seq).
func before(a, b *entry) int {
	_, borrow := bits.Sub64(uint64(a.seq), uint64(b.seq), 0)
	_, borrow = bits.Sub64(a.tag, b.tag, borrow)
	return int(borrow)
}

// candidates is a binary min-heap of indexes into h, ordered by h's keys:
// the frontier of a best-first walk of h.
type candidates struct {
	h   []entry
	idx []int
}

// pushChildren adds the children of h[i] to the frontier.
func (c *candidates) pushChildren(i int) {
	for j, end := firstChild(i), min(firstChild(i)+arity, len(c.h)); j < end; j++ {
		c.idx = append(c.idx, j)
		for k := len(c.idx) - 1; k > 0; {
			p := (k - 1) / 2
			if !c.h[c.idx[k]].less(&c.h[c.idx[p]]) {
				break
			}
			c.idx[k], c.idx[p] = c.idx[p], c.idx[k]
			k = p
		}
	}
}

// pop removes and returns the frontier's smallest index.
func (c *candidates) pop() int {
	top := c.idx[0]
	last := len(c.idx) - 1
	c.idx[0] = c.idx[last]
	c.idx = c.idx[:last]
	for k := 0; ; {
		m, l, r := k, 2*k+1, 2*k+2
		if l < last && c.h[c.idx[l]].less(&c.h[c.idx[m]]) {
			m = l
		}
		if r < last && c.h[c.idx[r]].less(&c.h[c.idx[m]]) {
			m = r
		}
		if m == k {
			break
		}
		c.idx[k], c.idx[m] = c.idx[m], c.idx[k]
		k = m
	}
	return top
}
