package rendezvous

import (
	"fmt"
	"math"
	"testing"

	"pgregory.net/rapid"
)

// treeOf builds a tree over n nodes named node-0… with the given weights
// (nil: all 1).
func treeOf(n int, weight func(i int) float64) *Tree {
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = NodeHash(fmt.Sprintf("node-%d", i))
	}
	t := NewTree(hashes)
	for i := 0; i < n; i++ {
		w := 1.0
		if weight != nil {
			w = weight(i)
		}
		t.SetWeight(i, w)
	}
	return t
}

// walk returns the key's whole ranking of t.
func walk(t *Tree, c *Cursor, key uint64) []int {
	var out []int
	c.Walk(t, key)
	for i, ok := c.Next(); ok; i, ok = c.Next() {
		out = append(out, i)
	}
	return out
}

func drawWeights(rt *rapid.T, n int) []float64 {
	ws := make([]float64, n)
	for i := range ws {
		switch rapid.IntRange(0, 5).Draw(rt, "kind") {
		case 0:
			ws[i] = 0 // drained
		case 1:
			ws[i] = rapid.Float64Range(0.01, 1).Draw(rt, "cut")
		default:
			ws[i] = 1
		}
	}
	return ws
}

// A cluster of at most LeafSize nodes is one group: its ranking is the flat
// rendezvous order of the nodes with a positive weight.
func TestTreeIsFlatRendezvousWhenSmall(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, LeafSize).Draw(rt, "n")
		ws := drawWeights(rt, n)
		tr := treeOf(n, func(i int) float64 { return ws[i] })
		var nodes []Node
		var hashes []uint64
		var index []int
		for i := 0; i < n; i++ {
			if ws[i] > 0 {
				id := fmt.Sprintf("node-%d", i)
				nodes, hashes, index = append(nodes, Node{ID: id, Weight: ws[i]}), append(hashes, NodeHash(id)), append(index, i)
			}
		}
		var c Cursor
		for k := 0; k < 50; k++ {
			key := rapid.Uint64().Draw(rt, "key")
			var want []int
			for _, o := range OrderHashed(key, nodes, hashes, nil) {
				want = append(want, index[o])
			}
			if got := walk(tr, &c, key); fmt.Sprint(got) != fmt.Sprint(want) {
				rt.Fatalf("key %#x: tree ranks %v, flat rendezvous %v", key, got, want)
			}
		}
	})
}

// At any size the walk is a ranking of exactly the nodes with a positive
// weight, First is its first node, and the root's weight is their sum.
func TestTreeWalkRanksEveryWeightedNodeOnce(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(0, 1500).Draw(rt, "n")
		ws := drawWeights(rt, n)
		tr := treeOf(n, func(i int) float64 { return ws[i] })
		for j := rapid.IntRange(0, 5).Draw(rt, "changes"); j > 0 && n > 0; j-- {
			i := rapid.IntRange(0, n-1).Draw(rt, "node")
			ws[i] = drawWeights(rt, 1)[0]
			tr.SetWeight(i, ws[i])
		}
		sum, positive := 0.0, 0
		for _, w := range ws {
			if w > 0 {
				sum += w
				positive++
			}
		}
		if n > 0 && math.Abs(tr.groups[0].weight-sum) > 1e-9*max(sum, 1) {
			rt.Fatalf("root weight %v, want Σ positive weights %v", tr.groups[0].weight, sum)
		}
		var c Cursor
		for k := 0; k < 5; k++ {
			key := rapid.Uint64().Draw(rt, "key")
			got := walk(tr, &c, key)
			if len(got) != positive {
				rt.Fatalf("walk of %d nodes, %d with a positive weight", len(got), positive)
			}
			seen := map[int]bool{}
			for _, i := range got {
				if seen[i] || !(ws[i] > 0) {
					rt.Fatalf("walk %v: node %d twice or of weight %v", got, i, ws[i])
				}
				seen[i] = true
			}
			first := tr.First(key)
			if (positive == 0 && first != -1) || (positive > 0 && first != got[0]) {
				rt.Fatalf("First %d, walk starts %v", first, got)
			}
		}
	})
}

// pathBelowRoot reports whether node j is in a group of node i's path
// other than the root.
func pathBelowRoot(t *Tree, i, j int) bool {
	top := func(n int) int32 {
		g := t.leaf[n]
		for t.groups[g].parent > 0 {
			g = t.groups[g].parent
		}
		return g
	}
	return t.groups[t.leaf[i]].parent >= 0 && top(i) == top(j)
}

// A weight change moves only keys on the changed node's path: a lower
// weight moves a key only if its first choice was the node or in the
// node's top-level group; a higher one only onto the node or into that
// group. With one group (a small cluster) that is flat rendezvous's
// promise: only the node's own keys move off it, and keys move only onto it.
func TestTreeWeightChangeMovesOnlyKeysOnItsPath(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 1500).Draw(rt, "n")
		ws := drawWeights(rt, n)
		tr := treeOf(n, func(i int) float64 { return ws[i] })
		keys := make([]uint64, 300)
		before := make([]int, len(keys))
		for k := range keys {
			keys[k] = Hash(fmt.Sprintf("tenant-%d/%d", k, rapid.IntRange(0, 1<<20).Draw(rt, "salt")))
			before[k] = tr.First(keys[k])
		}
		i := rapid.IntRange(0, n-1).Draw(rt, "node")
		old, w := ws[i], drawWeights(rt, 1)[0]
		tr.SetWeight(i, w)
		for k, key := range keys {
			after := tr.First(key)
			if after == before[k] {
				continue
			}
			switch {
			case w < old && !(before[k] == i || pathBelowRoot(tr, i, before[k])):
				rt.Fatalf("weight %v → %v of node %d moved a key from %d to %d, outside its path", old, w, i, before[k], after)
			case w > old && !(after == i || pathBelowRoot(tr, i, after)):
				rt.Fatalf("weight %v → %v of node %d moved a key from %d to %d, outside its path", old, w, i, before[k], after)
			case w == old:
				rt.Fatalf("an unchanged weight moved a key")
			}
		}
	})
}

// Each node is the first choice of its weight's share of keys.
func TestTreeSharesFollowWeights(t *testing.T) {
	const n, keys = 1400, 350_000
	weight := func(i int) float64 { return []float64{1, 1, 1, 0.5, 0.1, 0}[i%6] }
	tr := treeOf(n, weight)
	counts := make([]int, n)
	for k := 0; k < keys; k++ {
		counts[tr.First(Hash(fmt.Sprintf("tenant-%d/m", k)))]++
	}
	sum := 0.0
	for i := 0; i < n; i++ {
		sum += weight(i)
	}
	worst := 0.0
	for i := 0; i < n; i++ {
		want := keys * weight(i) / sum
		if weight(i) == 0 {
			if counts[i] != 0 {
				t.Fatalf("node %d of weight 0 is the first choice of %d keys", i, counts[i])
			}
			continue
		}
		// Binomial: five standard deviations, a bound these fixed keys
		// either meet or not.
		z := math.Abs(float64(counts[i])-want) / math.Sqrt(want)
		worst = max(worst, z)
		if z > 5 {
			t.Errorf("node %d (weight %v): %d keys, want %.0f ± %.0f", i, weight(i), counts[i], want, 5*math.Sqrt(want))
		}
	}
	t.Logf("largest deviation from the weight's share: %.2f standard deviations", worst)
}

// A drain moves few keys beyond the drained node's own: measured against
// flat rendezvous over the same 1,400 nodes and keys.
func TestTreeDrainMovesFewKeys(t *testing.T) {
	const n, keys = 1400, 30_000
	tr := treeOf(n, nil)
	nodes := make([]Node, n)
	hashes := make([]uint64, n)
	for i := range nodes {
		nodes[i] = Node{ID: fmt.Sprintf("node-%d", i), Weight: 1}
		hashes[i] = NodeHash(nodes[i].ID)
	}
	first := make([]int, keys)
	key := make([]uint64, keys)
	for k := range key {
		key[k] = Hash(fmt.Sprintf("tenant-%d/m", k))
		first[k] = tr.First(key[k])
	}
	own, moved := 0, 0
	for d := 0; d < 28; d++ {
		i := d * 50
		tr.SetWeight(i, 0)
		for k := range key {
			if first[k] == i {
				own++ // flat rendezvous moves exactly these
			}
			if tr.First(key[k]) != first[k] {
				moved++
			}
		}
		tr.SetWeight(i, 1)
	}
	ratio := float64(moved) / float64(own)
	t.Logf("28 drains of 1,400 nodes: %d key moves, %d of them off the drained node (%.2f×)", moved, own, ratio)
	if ratio > 3 {
		t.Fatalf("a drain moved %.2f× the drained node's keys, want ≤ 3×", ratio)
	}
}

func TestTreeCursorAllocatesNothingOnceWarm(t *testing.T) {
	tr := treeOf(1400, nil)
	var c Cursor
	walk(tr, &c, 1)
	k := uint64(0)
	if a := testing.AllocsPerRun(100, func() {
		k++
		c.Walk(tr, k)
		for _, ok := c.Next(); ok; _, ok = c.Next() {
		}
	}); a != 0 {
		t.Fatalf("a walk allocated %v times", a)
	}
}

func BenchmarkTree(b *testing.B) {
	for _, n := range []int{6, 100, 1400, 10000} {
		tr := treeOf(n, nil)
		b.Run(fmt.Sprintf("First/nodes=%d", n), func(b *testing.B) {
			k := uint64(0)
			for b.Loop() {
				k++
				tr.First(k)
			}
		})
		b.Run(fmt.Sprintf("SetWeight/nodes=%d", n), func(b *testing.B) {
			i := 0
			for b.Loop() {
				i = (i + 7919) % n
				tr.SetWeight(i, 0.5)
				tr.SetWeight(i, 1)
			}
		})
	}
}
