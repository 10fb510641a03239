package rendezvous

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestHashPinned pins Hash: it must be FNV-1a (checked against hash/fnv)
// followed by mix, and these values must never change, or every process
// running a new build would place keys differently from the old ones.
func TestHashPinned(t *testing.T) {
	for _, key := range []string{"", "a", "tenant-7/llama-70b", "gpu-domain-12"} {
		f := fnv.New64a()
		f.Write([]byte(key))
		if got, want := Hash(key), mix(f.Sum64()); got != want {
			t.Errorf("Hash(%q) = %#x, want mix(fnv1a) = %#x", key, got, want)
		}
	}
	pinned := map[string]uint64{ // computed independently (Python) from the definition
		"":                   0xf52a15e9a9b5e89b,
		"a":                  0x02c0bdbf481420f8,
		"tenant-7/llama-70b": 0xfc21d133b52ec811,
	}
	for key, want := range pinned {
		if got := Hash(key); got != want {
			t.Errorf("Hash(%q) = %#x, pinned %#x", key, got, want)
		}
	}
}

func TestUnitOpenInterval(t *testing.T) {
	for _, h := range []uint64{0, 1, 1 << 12, math.MaxUint64 >> 1, math.MaxUint64 - 1, math.MaxUint64} {
		if u := unit(h); !(u > 0 && u < 1) {
			t.Errorf("unit(%#x) = %v, not in (0, 1)", h, u)
		}
	}
}

func TestScore(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.Uint64().Draw(t, "keyHash")
		n := rapid.Uint64().Draw(t, "nodeHash")
		w := rapid.Float64Range(1e-9, 1e9).Draw(t, "weight")
		s := ScoreHashed(k, n, w)
		if !(s > 0) || math.IsInf(s, 0) {
			t.Fatalf("score %v for positive weight %v: want finite, > 0", s, w)
		}
		if s2 := ScoreHashed(k, n, 2*w); !(s2 > s) {
			t.Fatalf("doubling the weight did not raise the score: %v → %v", s, s2)
		}
		for _, bad := range []float64{0, -w, math.NaN()} {
			if s := ScoreHashed(k, n, bad); !math.IsInf(s, -1) {
				t.Fatalf("weight %v scored %v, want -Inf", bad, s)
			}
		}
	})
	if Score(Hash("k"), "n1", 3) != ScoreHashed(Hash("k"), NodeHash("n1"), 3) {
		t.Fatal("Score and ScoreHashed disagree")
	}
}

func nodeNames(n int) []Node {
	nodes := make([]Node, n)
	for i := range nodes {
		nodes[i] = Node{ID: fmt.Sprintf("node-%02d", i), Weight: 1}
	}
	return nodes
}

// TestOrderIsSorted: Order is a permutation in descending score, ties by ID.
func TestOrderIsSorted(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) Node {
			return Node{
				ID:     rapid.StringMatching(`[a-c]{1,2}`).Draw(t, "id"),
				Weight: rapid.SampledFrom([]float64{-1, 0, 1, 2, 0.5}).Draw(t, "w"),
			}
		}), 0, 20).Draw(t, "nodes")
		k := rapid.Uint64().Draw(t, "keyHash")
		order := Order(k, nodes, nil)
		if got := slices.Sorted(slices.Values(order)); !slices.Equal(got, rangeN(len(nodes))) {
			t.Fatalf("order %v is not a permutation of %d nodes", order, len(nodes))
		}
		for i := 1; i < len(order); i++ {
			a, b := nodes[order[i-1]], nodes[order[i]]
			sa, sb := Score(k, a.ID, a.Weight), Score(k, b.ID, b.Weight)
			if sa < sb || (sa == sb && a.ID > b.ID) || (sa == sb && a.ID == b.ID && order[i-1] > order[i]) {
				t.Fatalf("%v (%v) ranked before %v (%v)", a, sa, b, sb)
			}
		}
		hashes := make([]uint64, len(nodes))
		for i, n := range nodes {
			hashes[i] = NodeHash(n.ID)
		}
		if h := OrderHashed(k, nodes, hashes, nil); !slices.Equal(h, order) {
			t.Fatalf("OrderHashed %v != Order %v", h, order)
		}
	})
}

func rangeN(n int) []int {
	r := make([]int, n)
	for i := range r {
		r[i] = i
	}
	return r
}

// TestRemoveMovesOnlyItsKeys: removing a node leaves every key's order of the
// remaining nodes unchanged, so only keys whose first choice was the removed
// node get a new first choice. Adding it back restores every placement.
func TestRemoveMovesOnlyItsKeys(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(2, 12).Draw(t, "nodes")
		nodes := nodeNames(n)
		for i := range nodes {
			nodes[i].Weight = rapid.SampledFrom([]float64{0.25, 1, 1, 2, 5}).Draw(t, "w")
		}
		gone := rapid.IntRange(0, n-1).Draw(t, "removed")
		rest := slices.Delete(slices.Clone(nodes), gone, gone+1)
		for _, key := range rapid.SliceOfN(rapid.String(), 1, 50).Draw(t, "keys") {
			k := Hash(key)
			before := Order(k, nodes, nil)
			after := Order(k, rest, nil)
			var want []string // before, without the removed node
			for _, i := range before {
				if i != gone {
					want = append(want, nodes[i].ID)
				}
			}
			var got []string
			for _, i := range after {
				got = append(got, rest[i].ID)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("key %q: removing %s reordered the rest: %v → %v", key, nodes[gone].ID, want, got)
			}
			if before[0] != gone && rest[after[0]].ID != nodes[before[0]].ID {
				t.Fatalf("key %q moved off %s, which was not removed", key, nodes[before[0]].ID)
			}
		}
	})
}

// firstChoiceShares places keys key-0 … key-(n−1) and returns each node's
// share of first choices.
func firstChoiceShares(nodes []Node, keys int) []float64 {
	counts := make([]int, len(nodes))
	out := make([]int, 0, len(nodes))
	for i := range keys {
		out = Order(Hash(fmt.Sprintf("key-%d", i)), nodes, out)
		counts[out[0]]++
	}
	shares := make([]float64, len(nodes))
	for i, c := range counts {
		shares[i] = float64(c) / float64(keys)
	}
	return shares
}

func TestEqualWeightsSpreadEvenly(t *testing.T) {
	nodes := nodeNames(10)
	for i, s := range firstChoiceShares(nodes, 100_000) {
		if math.Abs(s/0.1-1) > 0.03 {
			t.Errorf("%s: share %.4f, want 0.1 within 3%%", nodes[i].ID, s)
		}
	}
}

func TestWeightedShares(t *testing.T) {
	for _, weights := range [][]float64{{1, 2}, {1, 2, 3, 4}, {0.5, 8}} {
		nodes := nodeNames(len(weights))
		var sum float64
		for i, w := range weights {
			nodes[i].Weight = w
			sum += w
		}
		for i, s := range firstChoiceShares(nodes, 100_000) {
			if want := weights[i] / sum; math.Abs(s/want-1) > 0.03 {
				t.Errorf("weights %v: node %d share %.4f, want %.4f within 3%%", weights, i, s, want)
			}
		}
	}
}

func TestZeroWeightLast(t *testing.T) {
	nodes := []Node{{"z", 0}, {"b", -1}, {"a", 1}, {"y", 0}}
	for i := range 1000 {
		got := Order(Hash(fmt.Sprint(i)), nodes, nil)
		if !slices.Equal(got, []int{2, 1, 3, 0}) { // a first, then -Inf by ID: b, y, z
			t.Fatalf("key %d: order %v", i, got)
		}
	}
}

func TestOrderAllocatesNothing(t *testing.T) {
	nodes := nodeNames(64)
	out := make([]int, 0, len(nodes))
	k := Hash("some-key")
	if a := testing.AllocsPerRun(100, func() { out = Order(k, nodes, out) }); a != 0 {
		t.Fatalf("Order: %v allocs per run, want 0", a)
	}
	hashes := make([]uint64, len(nodes))
	for i, n := range nodes {
		hashes[i] = NodeHash(n.ID)
	}
	if a := testing.AllocsPerRun(100, func() { out = OrderHashed(k, nodes, hashes, out) }); a != 0 {
		t.Fatalf("OrderHashed: %v allocs per run, want 0", a)
	}
	big := nodeNames(300) // beyond the stack buffer: still correct
	if got := Order(k, big, nil); len(got) != 300 {
		t.Fatalf("Order of 300 nodes returned %d", len(got))
	}
}

func BenchmarkOrder(b *testing.B) {
	for _, n := range []int{8, 64} {
		nodes := nodeNames(n)
		hashes := make([]uint64, n)
		for i, nd := range nodes {
			hashes[i] = NodeHash(nd.ID)
		}
		out := make([]int, 0, n)
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			k := uint64(0)
			for b.Loop() {
				k++
				out = OrderHashed(k, nodes, hashes, out)
			}
		})
	}
}
