package indexheap

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

type elem struct {
	key int
	id  int
	pos int
}

func (e *elem) Less(o *elem) bool { return e.key < o.key }
func (e *elem) HeapIndex() *int   { return &e.pos }

func newHeap() Heap[elem, *elem] { return Heap[elem, *elem]{} }

// TestAgainstModel runs random pushes, pops, key changes and removals on a
// heap and on a plain slice of what it holds: the smallest key, every
// element's recorded place and membership agree after every step.
func TestAgainstModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := newHeap()
		var all []*elem // every element ever made
		var in []*elem  // the model: what the heap holds
		pick := func(from []*elem, label string) *elem {
			return from[rapid.IntRange(0, len(from)-1).Draw(t, label)]
		}
		for step := range rapid.IntRange(1, 200).Draw(t, "steps") {
			switch op := rapid.IntRange(0, 3).Draw(t, "op"); {
			case op == 0 || len(all) == 0:
				e := &elem{key: rapid.IntRange(-50, 50).Draw(t, "key"), id: step}
				all = append(all, e)
				h.Push(e)
				in = append(in, e)
			case op == 1:
				got := h.Pop()
				if len(in) == 0 {
					if got != nil {
						t.Fatalf("Pop of an empty heap = %v", got)
					}
					continue
				}
				least := slices.MinFunc(in, func(a, b *elem) int { return a.key - b.key })
				if got == nil || got.key != least.key {
					t.Fatalf("Pop = %v, want key %d", got, least.key)
				}
				if got.pos != -1 {
					t.Fatalf("popped element records place %d, want -1", got.pos)
				}
				in = slices.DeleteFunc(in, func(e *elem) bool { return e == got })
			case op == 2 && len(in) > 0:
				e := pick(in, "fix")
				e.key = rapid.IntRange(-50, 50).Draw(t, "newkey")
				h.Fix(e)
			default:
				e := pick(all, "remove")
				want := slices.Contains(in, e)
				if got := h.Remove(e); got != want {
					t.Fatalf("Remove(%d) = %v, want %v", e.id, got, want)
				}
				in = slices.DeleteFunc(in, func(x *elem) bool { return x == e })
			}
			if h.Len() != len(in) {
				t.Fatalf("Len = %d, want %d", h.Len(), len(in))
			}
			for _, e := range all {
				if h.Contains(e) != slices.Contains(in, e) {
					t.Fatalf("Contains(%d) = %v, want %v", e.id, h.Contains(e), !h.Contains(e))
				}
			}
			for i, e := range h.All() {
				if e.pos != i {
					t.Fatalf("element %d at %d records place %d", e.id, i, e.pos)
				}
			}
			if len(in) > 0 {
				least := slices.MinFunc(in, func(a, b *elem) int { return a.key - b.key })
				if h.Peek().key != least.key {
					t.Fatalf("Peek key %d, want %d", h.Peek().key, least.key)
				}
			} else if h.Peek() != nil {
				t.Fatalf("Peek of an empty heap = %v", h.Peek())
			}
		}
	})
}

// TestRemoveOfAFreshElement: an element never pushed records place 0, the
// zero value; Remove must not take the heap's first element for it.
func TestRemoveOfAFreshElement(t *testing.T) {
	h := newHeap()
	first := &elem{key: 1}
	h.Push(first)
	if h.Remove(&elem{key: 1}) {
		t.Fatal("Remove of an element never pushed reported true")
	}
	if h.Len() != 1 || h.Peek() != first {
		t.Fatalf("heap changed: len %d, peek %v", h.Len(), h.Peek())
	}
}
