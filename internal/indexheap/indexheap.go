// Package indexheap is a min-heap of pointers to elements that record
// their own place in it, so that an element whose key changed is fixed, or
// one that left early is removed, in O(log n) without a search. It is
// container/heap behind a typed API, with the index bookkeeping written
// once instead of in every heap.Interface of the module.
package indexheap

import "container/heap"

// Element is what a heap of *T needs of its elements: an order, and the
// int in which the element records its place (Heap keeps it current while
// the element is in the heap and sets it to -1 when it leaves).
type Element[T any] interface {
	*T
	Less(other *T) bool
	HeapIndex() *int
}

// Heap is a min-heap of *T, ordered by Less. The zero Heap is empty and
// ready to use; a Heap is not safe for concurrent use.
type Heap[T any, P Element[T]] struct {
	s elements[T, P]
}

// Len returns the number of elements.
func (h *Heap[T, P]) Len() int { return len(h.s) }

// Peek returns the smallest element, nil when the heap is empty.
func (h *Heap[T, P]) Peek() P {
	if len(h.s) == 0 {
		return nil
	}
	return h.s[0]
}

// Push adds x, which must not be in the heap.
func (h *Heap[T, P]) Push(x P) { heap.Push(&h.s, x) }

// Pop removes and returns the smallest element, nil when the heap is empty.
func (h *Heap[T, P]) Pop() P {
	if len(h.s) == 0 {
		return nil
	}
	return heap.Pop(&h.s).(P)
}

// Contains reports whether x is in the heap.
func (h *Heap[T, P]) Contains(x P) bool {
	i := *x.HeapIndex()
	return i >= 0 && i < len(h.s) && h.s[i] == x
}

// Fix restores the order after x's key changed; x must be in the heap.
func (h *Heap[T, P]) Fix(x P) { heap.Fix(&h.s, *x.HeapIndex()) }

// Remove takes x out of the heap and reports whether it was in it.
func (h *Heap[T, P]) Remove(x P) bool {
	if !h.Contains(x) {
		return false
	}
	heap.Remove(&h.s, *x.HeapIndex())
	return true
}

// All returns the elements in heap order, the smallest first. The slice
// is the heap's own: read it, do not change it, and do not keep it past
// the heap's next change.
func (h *Heap[T, P]) All() []P { return h.s }

// Restore makes items, which must be in heap order (as All returned them
// at some earlier point), the heap's contents; elements in the heap but
// not in items leave it.
func (h *Heap[T, P]) Restore(items []P) {
	for _, e := range h.s {
		*e.HeapIndex() = -1
	}
	h.s = append(h.s[:0], items...)
	for i, e := range h.s {
		*e.HeapIndex() = i
	}
}

// elements is the heap.Interface behind Heap.
type elements[T any, P Element[T]] []P

func (s elements[T, P]) Len() int           { return len(s) }
func (s elements[T, P]) Less(i, j int) bool { return s[i].Less(s[j]) }

func (s elements[T, P]) Swap(i, j int) {
	s[i], s[j] = s[j], s[i]
	*s[i].HeapIndex(), *s[j].HeapIndex() = i, j
}

func (s *elements[T, P]) Push(x any) {
	e := x.(P)
	*e.HeapIndex() = len(*s)
	*s = append(*s, e)
}

func (s *elements[T, P]) Pop() any {
	old := *s
	last := len(old) - 1
	e := old[last]
	old[last] = nil // drop the reference
	*s = old[:last]
	*e.HeapIndex() = -1
	return e
}
