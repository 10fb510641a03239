package rendezvous

import "math"

// A Tree ranks nodes for a key as weighted rendezvous does, in time that
// grows with the logarithm of the node count instead of the count.
//
// The nodes are the leaves of a trie on their hashes: a group of more than
// LeafSize nodes splits into up to 16 subgroups by the next 4 bits of the
// node hash, so that every group holds at most LeafSize nodes or subgroups.
// Each group has a weight, the sum of its positive node weights, and a hash
// of its place in the trie. A key's ranking descends it: the subgroups of a
// group are ranked by weighted rendezvous on their weights, and the nodes of
// a bottom group by weighted rendezvous on theirs; the order is depth-first
// in that ranking. At each level the key's first choice is a subgroup with
// probability its share of the group's weight, so over the whole descent
//
//	P(node i first) = wᵢ / Σⱼ wⱼ
//
// exactly as in flat rendezvous, and a cluster of at most LeafSize nodes is
// one group: its ranking is the flat one (Order), to the tie-breaks.
//
// What a weight change moves. Changing node i's weight changes the weights
// of the groups that hold it, so a key moves when the change flips one of
// the choices it makes on i's path down the trie: a lower weight moves keys
// only out of the top-level group that holds i, a higher one only into it,
// and no key whose choices avoid i's groups moves at all. A flat rendezvous
// moves only the keys whose first choice is i; the tree moves up to about as
// many again per level of i's path below the root (measured in the tests:
// 2.7 times as many at 1,400 nodes, where the path has three levels).
//
// Costs: First is at most LeafSize scores per level, ⌈log₁₆(n/LeafSize)⌉ + 1
// levels; SetWeight re-sums the groups on one path; a Cursor ranks one
// group at a time, when the walk reaches it. A Tree is not safe for
// concurrent use.
type Tree struct {
	groups []group
	kids   []int32   // the subgroups of inner groups, by group index
	nodes  []int32   // the nodes of bottom groups, by node index
	hash   []uint64  // per node: its NodeHash
	weight []float64 // per node
	leaf   []int32   // per node: the bottom group holding it
}

// LeafSize is the most nodes or subgroups a group ranks at once.
const LeafSize = 16

// fanBits is how many bits of a node hash a split uses.
const fanBits = 4

// group is a node of the trie.
type group struct {
	hash   uint64
	weight float64 // Σ positive weights of its nodes
	parent int32   // -1 for the root
	lo, hi int32   // its subgroups in kids[lo:hi], or for a bottom group its nodes in nodes[lo:hi]
	bottom bool
}

// NewTree returns a tree over nodes whose hashes are nodeHashes (NodeHash
// of each node's ID), every weight zero: a node is ranked once SetWeight
// gives it a positive weight. Node i is index i in every call.
func NewTree(nodeHashes []uint64) *Tree {
	n := len(nodeHashes)
	t := &Tree{
		hash:   append([]uint64(nil), nodeHashes...),
		weight: make([]float64, n),
		leaf:   make([]int32, n),
	}
	all := make([]int32, n)
	for i := range all {
		all[i] = int32(i)
	}
	t.build(all, 0, 0, -1)
	return t
}

// build adds the group of members (node indexes sharing their top depth
// digits, prefix) under parent, and returns its index.
func (t *Tree) build(members []int32, depth int, prefix uint64, parent int32) int32 {
	gi := int32(len(t.groups))
	t.groups = append(t.groups, group{hash: groupHash(depth, prefix), parent: parent})
	if len(members) <= LeafSize || depth*fanBits >= 64 {
		lo := int32(len(t.nodes))
		t.nodes = append(t.nodes, members...)
		for _, m := range members {
			t.leaf[m] = gi
		}
		t.groups[gi].lo, t.groups[gi].hi, t.groups[gi].bottom = lo, int32(len(t.nodes)), true
		return gi
	}
	var split [1 << fanBits][]int32
	shift := 64 - fanBits*(depth+1)
	for _, m := range members {
		d := t.hash[m] >> shift & (1<<fanBits - 1)
		split[d] = append(split[d], m)
	}
	var children []int32
	for d, sub := range split {
		if len(sub) > 0 {
			children = append(children, t.build(sub, depth+1, prefix|uint64(d)<<shift, gi))
		}
	}
	lo := int32(len(t.kids))
	t.kids = append(t.kids, children...)
	t.groups[gi].lo, t.groups[gi].hi = lo, int32(len(t.kids))
	return gi
}

// groupHash is the hash a group is ranked by: its depth and digits, mixed
// so that it is unrelated to any node's.
func groupHash(depth int, prefix uint64) uint64 {
	return mix(mix(prefix^0x6a09e667f3bcc909) + uint64(depth))
}

// Len returns the number of nodes.
func (t *Tree) Len() int { return len(t.hash) }

// Weight returns node i's weight.
func (t *Tree) Weight(i int) float64 { return t.weight[i] }

// Depth returns the number of groups on the path from the root to node i's
// bottom group, itself included.
func (t *Tree) Depth(i int) int {
	d := 0
	for g := t.leaf[i]; g >= 0; g = t.groups[g].parent {
		d++
	}
	return d
}

// SetWeight sets node i's weight; a weight that is not positive takes it
// out of every ranking. The groups above it are summed again, each from
// its members in their order, so the sums are the same in every process
// that set the same weights.
func (t *Tree) SetWeight(i int, w float64) {
	if !(w > 0) {
		w = 0
	}
	if t.weight[i] == w {
		return
	}
	t.weight[i] = w
	for g := t.leaf[i]; g >= 0; g = t.groups[g].parent {
		gr := &t.groups[g]
		sum := 0.0
		if gr.bottom {
			for _, m := range t.nodes[gr.lo:gr.hi] {
				sum += t.weight[m]
			}
		} else {
			for _, k := range t.kids[gr.lo:gr.hi] {
				sum += t.groups[k].weight
			}
		}
		gr.weight = sum
	}
}

// First returns the key's first choice, the node a Cursor returns first;
// -1 when no node has a positive weight.
func (t *Tree) First(keyHash uint64) int {
	if len(t.groups) == 0 || !(t.groups[0].weight > 0) {
		return -1
	}
	g := &t.groups[0]
	for !g.bottom {
		best, bestScore := int32(-1), math.Inf(-1)
		for _, k := range t.kids[g.lo:g.hi] {
			if s := ScoreHashed(keyHash, t.groups[k].hash, t.groups[k].weight); s > bestScore {
				best, bestScore = k, s
			}
		}
		g = &t.groups[best]
	}
	best, bestScore := int32(-1), math.Inf(-1)
	for _, m := range t.nodes[g.lo:g.hi] {
		if s := ScoreHashed(keyHash, t.hash[m], t.weight[m]); s > bestScore {
			best, bestScore = m, s
		}
	}
	return int(best)
}

// A Cursor walks a key's ranking of a Tree's nodes with positive weight,
// ranking each group only when the walk reaches it. Its buffers are kept
// from one walk to the next: a Cursor reused allocates nothing once it has
// walked as deep as the tree goes. The tree must not change during a walk.
type Cursor struct {
	t      *Tree
	key    uint64
	depth  int
	frames []frame
	scores []float64
}

// frame is one group being walked: its members in ranked order, and how
// many have been taken.
type frame struct {
	group  int32
	ranked []int32
	next   int
}

// Walk starts c on the key's ranking of t.
func (c *Cursor) Walk(t *Tree, keyHash uint64) {
	c.t, c.key, c.depth = t, keyHash, 0
	if len(t.groups) > 0 && t.groups[0].weight > 0 {
		c.push(0)
	}
}

// Next returns the next node of the ranking; false when the walk is done.
func (c *Cursor) Next() (int, bool) {
	for c.depth > 0 {
		f := &c.frames[c.depth-1]
		if f.next == len(f.ranked) {
			c.depth--
			continue
		}
		m := f.ranked[f.next]
		f.next++
		if c.t.groups[f.group].bottom {
			return int(m), true
		}
		c.push(m)
	}
	return -1, false
}

// push ranks group g's members of positive weight for the key, as the
// walk's next frame.
func (c *Cursor) push(g int32) {
	if c.depth == len(c.frames) {
		c.frames = append(c.frames, frame{})
	}
	f := &c.frames[c.depth]
	c.depth++
	f.group, f.next, f.ranked = g, 0, f.ranked[:0]
	c.scores = c.scores[:0]
	t, gr := c.t, &c.t.groups[g]
	if gr.bottom {
		for _, m := range t.nodes[gr.lo:gr.hi] {
			c.rank(f, m, t.hash[m], t.weight[m])
		}
		return
	}
	for _, k := range t.kids[gr.lo:gr.hi] {
		c.rank(f, k, t.groups[k].hash, t.groups[k].weight)
	}
}

// rank inserts member m, hashed h with weight w, into f's ranking:
// descending score, ties to the lower index (members come in ascending
// index, so a tie stays behind), as First breaks them.
func (c *Cursor) rank(f *frame, m int32, h uint64, w float64) {
	if !(w > 0) {
		return
	}
	s := ScoreHashed(c.key, h, w)
	j := len(f.ranked)
	f.ranked, c.scores = append(f.ranked, m), append(c.scores, s)
	for ; j > 0 && c.scores[j-1] < s; j-- {
		f.ranked[j], c.scores[j] = f.ranked[j-1], c.scores[j-1]
	}
	f.ranked[j], c.scores[j] = m, s
}
