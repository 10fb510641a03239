package wfq

import (
	"math"
	"math/bits"
)

// tails keeps one band's non-empty lanes in a search tree ordered by their
// tail tags, for WorkAhead (see Position in the package doc). Each node
// holds its subtree's Σ w and Σ w·T, over the lanes' weights w and tail
// tags T, so that one descent towards a tag x sums both over the lanes
// with T ≤ x, and
//
//	Σ_l w_l · (min(T_l, F) − V)⁺
//	  = Σ_{V<T≤F} w·T − V · Σ_{V<T≤F} w + (F − V) · Σ_{T>F} w
//
// is read from two descents, to V and to F, in O(log lanes).
//
// The tree is a treap (a binary search tree whose nodes are also in heap
// order by a random priority, which keeps its expected depth O(log n)),
// keyed by (T, lane id). Its nodes are in an array by lane id, so a lane
// finds its node without a search.
//
// The tree is brought up to date lazily. Serving a head leaves its lane's
// tail where it was; every other change to a lane's tail or weight (an
// Enqueue, a Remove, a lane that empties) only marks the lane, in the lane
// itself, which the change has in cache anyway. The next position query
// moves each marked lane's node, in O(log lanes): so the hot path pays a
// flag and, once per lane between queries, an append, and each mark is
// paid for once, by the query after it.
type tails struct {
	// nodes[id+1] is lane id's node; nodes[0] is the empty tree, whose
	// sums are 0, so that a missing child needs no test.
	nodes  []node
	root   int32   // index in nodes; 0: the tree is empty
	marked []int32 // the lanes marked since the last query, once each
	rand   uint64  // the state of the priorities' generator
}

// node is one lane in the tree, as the tree last saw it.
type node struct {
	tag         uint64 // the lane's tail tag
	sumW        uint64 // Σ w over the subtree: < 2³¹ lanes of w < 2³², so < 2⁶³
	sumWT       u128   // Σ w·T over the subtree: < 2³¹ · 2³² · 2⁶⁴ = 2¹²⁷
	weight      uint32 // the lane's weight; 0: the lane is not in the tree
	prio        uint32
	left, right int32
}

// grow makes room for lane id, which the band has just allocated.
func (t *tails) grow(id int32) {
	if len(t.nodes) == 0 {
		t.nodes = make([]node, 1, 64)
	}
	for int(id)+1 >= len(t.nodes) {
		t.nodes = append(t.nodes, node{})
	}
}

// mark records that lane id's tail or weight has changed (or that it has
// emptied): l is the lane, which holds the mark.
func (t *tails) mark(id int32, l *lane) {
	if !l.marked {
		l.marked = true
		t.marked = append(t.marked, id)
	}
}

// update moves the marked lanes' nodes to their lanes' present tails and
// weights, or out of the tree for lanes that have emptied, and clears the
// marks.
func (t *tails) update(lanes []lane) {
	for _, id := range t.marked {
		l := &lanes[id]
		l.marked = false
		var tag uint64
		var weight uint32
		if l.n > 0 {
			tag, weight = l.tailTag(), l.weight
		}
		x := id + 1
		n := &t.nodes[x]
		if n.weight == weight && n.tag == tag {
			continue // moved and back, or only its head was served
		}
		if n.weight != 0 {
			t.root = t.delete(t.root, x)
		}
		if weight != 0 {
			t.rand = t.rand*6364136223846793005 + 1442695040888963407 // Knuth's MMIX LCG
			*n = node{tag: tag, weight: weight, prio: uint32(t.rand >> 32)}
			t.pull(x)
			t.root = t.insert(t.root, x)
		} else {
			*n = node{}
		}
	}
	t.marked = t.marked[:0]
}

// less orders nodes by (tag, lane id): the tree's keys are unique.
func (t *tails) less(x, y int32) bool {
	a, b := &t.nodes[x], &t.nodes[y]
	return a.tag < b.tag || a.tag == b.tag && x < y
}

// pull sets x's sums from its children's.
func (t *tails) pull(x int32) {
	n := &t.nodes[x]
	l, r := &t.nodes[n.left], &t.nodes[n.right]
	w := uint64(n.weight)
	n.sumW = l.sumW + r.sumW + w
	n.sumWT = l.sumWT.add(r.sumWT).add(mul128(w, n.tag))
}

// insert adds node x, not in the tree, to the subtree at root s and
// returns the subtree's root.
func (t *tails) insert(s, x int32) int32 {
	if s == 0 {
		return x
	}
	if t.nodes[x].prio > t.nodes[s].prio {
		l, r := t.split(s, x)
		t.nodes[x].left, t.nodes[x].right = l, r
		t.pull(x)
		return x
	}
	n := &t.nodes[s]
	if t.less(x, s) {
		n.left = t.insert(n.left, x)
	} else {
		n.right = t.insert(n.right, x)
	}
	t.pull(s)
	return s
}

// split divides the subtree at s into the nodes before x and those after.
func (t *tails) split(s, x int32) (before, after int32) {
	if s == 0 {
		return 0, 0
	}
	n := &t.nodes[s]
	if t.less(s, x) {
		n.right, after = t.split(n.right, x)
		t.pull(s)
		return s, after
	}
	before, n.left = t.split(n.left, x)
	t.pull(s)
	return before, s
}

// delete takes node x, which is in the subtree at s, out of it and
// returns the subtree's root.
func (t *tails) delete(s, x int32) int32 {
	n := &t.nodes[s]
	if s == x {
		return t.merge(n.left, n.right)
	}
	if t.less(x, s) {
		n.left = t.delete(n.left, x)
	} else {
		n.right = t.delete(n.right, x)
	}
	t.pull(s)
	return s
}

// merge joins two subtrees, every node of a before every node of b.
func (t *tails) merge(a, b int32) int32 {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	case t.nodes[a].prio > t.nodes[b].prio:
		n := &t.nodes[a]
		n.right = t.merge(n.right, b)
		t.pull(a)
		return a
	default:
		n := &t.nodes[b]
		n.left = t.merge(a, n.left)
		t.pull(b)
		return b
	}
}

// upTo returns Σ w and Σ w·T over the lanes with T ≤ x, in one descent.
func (t *tails) upTo(x uint64) (sumW uint64, sumWT u128) {
	for s := t.root; s != 0; {
		n := &t.nodes[s]
		if n.tag > x {
			s = n.left
			continue
		}
		l := &t.nodes[n.left]
		w := uint64(n.weight)
		sumW += l.sumW + w
		sumWT = sumWT.add(l.sumWT).add(mul128(w, n.tag))
		s = n.right
	}
	return sumW, sumWT
}

// work returns ⌊Σ_l w_l · (min(T_l, f) − v)⁺ / TagUnit⌋, saturated at
// MaxUint64, over the lanes as the tree holds them.
func (t *tails) work(v, f uint64) uint64 {
	if f <= v || t.root == 0 {
		return 0
	}
	wV, wtV := t.upTo(v)
	wF, wtF := t.upTo(f)
	all := &t.nodes[t.root]
	// Each term may wrap, but the sum is below 2¹²⁸ (it is at most
	// (f − v) · Σ w < 2⁶⁴ · 2⁶³), so it comes out exact modulo 2¹²⁸.
	sum := wtF.sub(wtV).sub(mul128(v, wF-wV)).add(mul128(f-v, all.sumW-wF))
	if sum.hi >= TagUnit {
		return math.MaxUint64
	}
	return sum.hi<<48 | sum.lo>>16
}

// u128 is an unsigned 128-bit integer; arithmetic on it wraps.
type u128 struct{ hi, lo uint64 }

func mul128(a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	return u128{hi, lo}
}

func (a u128) add(b u128) u128 {
	lo, c := bits.Add64(a.lo, b.lo, 0)
	hi, _ := bits.Add64(a.hi, b.hi, c)
	return u128{hi, lo}
}

func (a u128) sub(b u128) u128 {
	lo, c := bits.Sub64(a.lo, b.lo, 0)
	hi, _ := bits.Sub64(a.hi, b.hi, c)
	return u128{hi, lo}
}
