// Package rendezvous is weighted rendezvous (highest random weight) hashing:
// for a key, every node gets a score and the key's preferred nodes are the
// nodes in descending score order.
//
// Node i with weight wᵢ scores sᵢ = −wᵢ / ln(uᵢ), where uᵢ ∈ (0, 1) is a
// uniform value hashed from the key and the node's ID. Then sᵢ is distributed
// so that P(node i scores highest) = wᵢ / Σⱼ wⱼ (Schindelhauer and Schomaker,
// "Weighted distributed hash tables", 2005), and removing a node moves only
// the keys whose first choice it was; adding one moves keys only onto it.
//
// Hashes are FNV-1a (64-bit) followed by a fixed 64-bit finalizer, with no
// per-process seed: every process, on every machine and every run, maps a key
// to the same nodes. Changing the hash functions reshuffles every placement,
// which is why the tests pin their values.
package rendezvous

import (
	"math"
)

// FNV-1a 64-bit parameters.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// mix is a strong 64-bit finalizer (the splitmix64 / Stafford "Mix13"
// function): a bijection in which every input bit affects every output bit
// with probability close to ½. FNV-1a alone mixes its last bytes poorly.
func mix(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// Hash returns the 64-bit hash of key, identical in every process.
func Hash(key string) uint64 {
	h := uint64(fnvOffset)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= fnvPrime
	}
	return mix(h)
}

// NodeHash returns the hash of a node ID, for callers that cache it and call
// ScoreHashed. It is Hash under a name that says what it is for.
func NodeHash(id string) uint64 { return Hash(id) }

// unit maps a 64-bit hash to a uniform float64 in the open interval (0, 1):
// the top 52 bits, centred in their cell, (k + ½)·2⁻⁵², k ∈ [0, 2⁵²). Every
// value is exact in a float64, so neither 0 nor 1 is ever produced.
func unit(h uint64) float64 {
	return (float64(h>>12) + 0.5) * (1.0 / (1 << 52))
}

// ScoreHashed is Score for a node whose hash the caller already has. A weight
// that is not positive (zero, negative or NaN) scores −Inf.
func ScoreHashed(keyHash, nodeHash uint64, weight float64) float64 {
	if !(weight > 0) {
		return math.Inf(-1)
	}
	// Combine asymmetrically (key and node play different roles) and mix
	// again so that nearby key hashes give unrelated values per node.
	u := unit(mix(keyHash ^ mix(nodeHash+0x9e3779b97f4a7c15)))
	return -weight / math.Log(u)
}

// Score returns node's weighted rendezvous score for the key hashed to
// keyHash: −weight / ln(u) with u ∈ (0, 1) hashed from keyHash and node. The
// highest score is the key's first choice. Weight ≤ 0 scores −Inf, below any
// positive weight.
func Score(keyHash uint64, node string, weight float64) float64 {
	return ScoreHashed(keyHash, NodeHash(node), weight)
}

// Node is a placement target: an ID, hashed for scoring, and a weight,
// proportional to the share of keys it should receive first.
type Node struct {
	ID     string
	Weight float64
}

// stackNodes is how many nodes Order ranks without allocating scratch space.
const stackNodes = 128

// Order appends to out[:0] the indexes of nodes in descending score order for
// the key hashed to keyHash, ties broken by ascending ID and then by index,
// and returns it. It allocates nothing when cap(out) ≥ len(nodes) and
// len(nodes) ≤ 128. It is an insertion sort: meant for the tens of nodes a
// placement domain has.
func Order(keyHash uint64, nodes []Node, out []int) []int {
	var buf [stackNodes]float64
	scores := buf[:0]
	if len(nodes) > stackNodes {
		scores = make([]float64, 0, len(nodes))
	}
	for _, n := range nodes {
		scores = append(scores, Score(keyHash, n.ID, n.Weight))
	}
	return sortByScore(nodes, scores, out)
}

// OrderHashed is Order with node hashes the caller has cached:
// nodeHashes[i] must be NodeHash(nodes[i].ID).
func OrderHashed(keyHash uint64, nodes []Node, nodeHashes []uint64, out []int) []int {
	var buf [stackNodes]float64
	scores := buf[:0]
	if len(nodes) > stackNodes {
		scores = make([]float64, 0, len(nodes))
	}
	for i, n := range nodes {
		scores = append(scores, ScoreHashed(keyHash, nodeHashes[i], n.Weight))
	}
	return sortByScore(nodes, scores, out)
}

// sortByScore insertion-sorts the indexes of nodes by descending score, then
// ascending ID; the sort is stable, so equal IDs keep index order.
func sortByScore(nodes []Node, scores []float64, out []int) []int {
	out = out[:0]
	for i := range nodes {
		out = append(out, i)
		for j := len(out) - 1; j > 0 && before(nodes, scores, i, out[j-1]); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// before reports whether node a ranks strictly before node b.
func before(nodes []Node, scores []float64, a, b int) bool {
	if scores[a] != scores[b] {
		return scores[a] > scores[b]
	}
	return nodes[a].ID < nodes[b].ID
}
