// Package indexheap is a min-heap of pointers to elements that record
// their own place in it, so that an element whose key changed is fixed, or
// one that left early is removed, in O(log n) without a search. It is
// container/heap behind a typed API, with the index bookkeeping written
// once instead of in every heap.Interface of the module.
package indexheap

import "container/heap"

// Heap is a min-heap of *T ordered by less. index returns the address of
// the int in which an element records its place: Heap keeps it current
// while the element is in the heap and sets it to -1 when it leaves. A
// Heap is not safe for concurrent use. The zero Heap is not usable: make
// one with New.
type Heap[T any] struct {
	s elements[T]
}

// New returns an empty heap ordered by less, whose elements record their
// place at index.
func New[T any](less func(a, b *T) bool, index func(*T) *int) Heap[T] {
	return Heap[T]{s: elements[T]{less: less, index: index}}
}

// Len returns the number of elements.
func (h *Heap[T]) Len() int { return len(h.s.items) }

// Peek returns the smallest element, nil when the heap is empty.
func (h *Heap[T]) Peek() *T {
	if len(h.s.items) == 0 {
		return nil
	}
	return h.s.items[0]
}

// Push adds x, which must not be in the heap.
func (h *Heap[T]) Push(x *T) { heap.Push(&h.s, x) }

// Pop removes and returns the smallest element, nil when the heap is empty.
func (h *Heap[T]) Pop() *T {
	if len(h.s.items) == 0 {
		return nil
	}
	return heap.Pop(&h.s).(*T)
}

// Contains reports whether x is in the heap.
func (h *Heap[T]) Contains(x *T) bool {
	i := *h.s.index(x)
	return i >= 0 && i < len(h.s.items) && h.s.items[i] == x
}

// Fix restores the order after x's key changed; x must be in the heap.
func (h *Heap[T]) Fix(x *T) { heap.Fix(&h.s, *h.s.index(x)) }

// Remove takes x out of the heap and reports whether it was in it.
func (h *Heap[T]) Remove(x *T) bool {
	if !h.Contains(x) {
		return false
	}
	heap.Remove(&h.s, *h.s.index(x))
	return true
}

// elements is the heap.Interface behind Heap.
type elements[T any] struct {
	items []*T
	less  func(a, b *T) bool
	index func(*T) *int
}

func (s *elements[T]) Len() int           { return len(s.items) }
func (s *elements[T]) Less(i, j int) bool { return s.less(s.items[i], s.items[j]) }

func (s *elements[T]) Swap(i, j int) {
	s.items[i], s.items[j] = s.items[j], s.items[i]
	*s.index(s.items[i]), *s.index(s.items[j]) = i, j
}

func (s *elements[T]) Push(x any) {
	e := x.(*T)
	*s.index(e) = len(s.items)
	s.items = append(s.items, e)
}

func (s *elements[T]) Pop() any {
	last := len(s.items) - 1
	e := s.items[last]
	s.items[last] = nil // drop the reference
	s.items = s.items[:last]
	*s.index(e) = -1
	return e
}
