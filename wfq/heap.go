package wfq

import (
	"math/bits"
	"unsafe"
)

// arity is the heap's fan-out. A 4-ary heap is half as deep as a binary one,
// and a node's four children sit side by side in memory.
const arity = 4

// prefetchFrom is the index from which heap.down prefetches grandchildren:
// the levels above it, 24 KiB, stay in cache anyway.
const prefetchFrom = 1024

// entry is a non-empty lane in its band's heap, keyed by its head's finish
// tag and sequence number, copied here so that sifting reads no item.
type entry struct {
	tag, seq uint64
	l        *lane
}

func (a *entry) less(b *entry) bool {
	return a.tag < b.tag || (a.tag == b.tag && a.seq < b.seq)
}

// heap is a min-heap of entries; each lane records its index in idx. Those
// stores to the lanes moved have a use beyond Remove: the first moves the
// next root's lane into cache, one Dequeue ahead.
type heap []entry

func (h *heap) push(e entry) {
	*h = append(*h, e)
	h.up(len(*h) - 1)
}

// remove deletes the entry at index i.
func (h *heap) remove(i int) {
	last := len(*h) - 1
	if i != last {
		(*h)[i] = (*h)[last]
	}
	(*h)[last] = entry{} // drop the lane pointer
	*h = (*h)[:last]
	if i != last {
		h.fix(i)
	}
}

// fix restores the heap order after the key at index i changed.
func (h heap) fix(i int) {
	if i > 0 && h[i].less(&h[(i-1)/arity]) {
		h.up(i)
	} else {
		h.down(i)
	}
}

func (h heap) up(i int) {
	e := h[i]
	for i > 0 {
		p := (i - 1) / arity
		if !e.less(&h[p]) {
			break
		}
		h[i] = h[p]
		h[i].l.idx = int32(i)
		i = p
	}
	h[i] = e
	e.l.idx = int32(i)
}

func (h heap) down(i int) {
	e := h[i]
	n := len(h)
	for c := arity*i + 1; c < n; c = arity*i + 1 {
		var m int
		if g := arity*c + 1; g >= prefetchFrom && g+arity*arity <= n {
			// The next level's children are among c's 16 grandchildren,
			// side by side: prefetching them now overlaps the next
			// level's cache miss with this one's, instead of paying
			// the two in turn.
			start := uintptr(unsafe.Pointer(&h[g]))
			end := start + arity*arity*unsafe.Sizeof(entry{})
			start &^= 63
			prefetchLines(start, int((end-start+63)/64))
		}
		if c+arity <= n {
			// Which of four children is smallest is a coin toss, so a
			// branch per comparison would be mispredicted half the time;
			// pick it with arithmetic instead, as a tournament: two
			// independent comparisons, then one between their winners.
			// (Written out: as a function it is too large to inline.)
			s := (*[arity]entry)(h[c : c+arity])
			a := before(&s[1], &s[0])     // 0 or 1
			b := 2 + before(&s[3], &s[2]) // 2 or 3
			m = c + (a ^ ((a ^ b) & -before(&s[b&3], &s[a&3])))
		} else {
			m = c
			for j := c + 1; j < n; j++ {
				if h[j].less(&h[m]) {
					m = j
				}
			}
		}
		if !h[m].less(&e) {
			break
		}
		h[i] = h[m]
		h[i].l.idx = int32(i)
		i = m
	}
	h[i] = e
	e.l.idx = int32(i)
}

// before returns 1 if a's key is below b's, else 0, without a branch: the
// borrow out of the 128-bit subtraction (a.tag, a.seq) − (b.tag, b.seq).
func before(a, b *entry) int {
	_, borrow := bits.Sub64(a.seq, b.seq, 0)
	_, borrow = bits.Sub64(a.tag, b.tag, borrow)
	return int(borrow)
}

// candidates is a binary min-heap of indexes into h, ordered by h's keys:
// the frontier of a best-first walk of h.
type candidates struct {
	h   heap
	idx []int
}

// pushChildren adds the children of h[i] to the frontier.
func (c *candidates) pushChildren(i int) {
	for j, end := arity*i+1, min(arity*i+1+arity, len(c.h)); j < end; j++ {
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
