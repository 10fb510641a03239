package enginesim

import (
	"encoding/binary"
	"hash/fnv"
	"math/rand/v2"
	"strings"
)

// BytesPerToken is how many bytes of prompt text count as one prompt
// token: a request's prompt tokens are ⌈bytes/4⌉ (at least 1), about what
// BPE tokenizers give English text.
const BytesPerToken = 4

// BlockTokens is the prefix cache's block: a prompt's cached tokens are a
// whole number of blocks of 16 tokens (64 bytes), as vLLM's prefix cache
// hashes blocks of 16.
const BlockTokens = 16

// The generated answer's length, in tokens, before max_tokens cuts it:
// drawn uniformly in [MinOutput, MaxOutput].
const (
	MinOutput = 16
	MaxOutput = 512
)

// promptTokens counts text's tokens.
func promptTokens(text string) int64 {
	return max((int64(len(text))+BytesPerToken-1)/BytesPerToken, 1)
}

// blockHashes returns the chained hashes of text's whole blocks: the
// i-th names the prompt's first i+1 blocks, so two prompts share a hash
// only where they share the whole prefix.
func blockHashes(text string) []uint64 {
	const blockBytes = BlockTokens * BytesPerToken
	var out []uint64
	var prev [8]byte
	for i := 0; i+blockBytes <= len(text); i += blockBytes {
		h := fnv.New64a()
		_, _ = h.Write(prev[:])
		_, _ = h.Write([]byte(text[i : i+blockBytes]))
		v := h.Sum64()
		binary.LittleEndian.PutUint64(prev[:], v)
		out = append(out, v)
	}
	return out
}

// prefixCache remembers the block hashes an engine computed, the oldest
// forgotten first beyond its size.
type prefixCache struct {
	size  int
	known map[uint64]struct{}
	order []uint64 // a ring, oldest at next
	next  int
}

func newPrefixCache(size int) *prefixCache {
	return &prefixCache{size: size, known: make(map[uint64]struct{}, size)}
}

// cached returns how many of a prompt's leading blocks the cache holds.
func (c *prefixCache) cached(blocks []uint64) int {
	n := 0
	for n < len(blocks) {
		if _, ok := c.known[blocks[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// add remembers blocks.
func (c *prefixCache) add(blocks []uint64) {
	for _, b := range blocks {
		if _, ok := c.known[b]; ok {
			continue
		}
		if len(c.order) < c.size {
			c.order = append(c.order, b)
		} else {
			delete(c.known, c.order[c.next])
			c.order[c.next] = b
			c.next = (c.next + 1) % c.size
		}
		c.known[b] = struct{}{}
	}
}

// vocabulary is the words answers are made of; each word is one token.
var vocabulary = strings.Fields(`the a of and to in is that for it as was with be by on not he this are or
his from at which but have an they you were her she there one all we their been has when who will more no
if out so said what up its about into than them can only other new some could time these two may then do
first any my now such like our over man me even most made after also did many before must through back years
where much your way well down should because each just those people how too little state good very make world
still own see men work long get here between both life being under never day same another know while last might
us great old year off come since against go came right used take three`)

// answer is the generated text of a request: its length before max_tokens
// and its words, from a generator seeded by the simulator's seed and the
// request's model, prompt and own seed, so that one request gets one
// answer whatever else the engine runs.
type answer struct {
	tokens []string // the first without a leading space, the others with one
	cut    bool     // max_tokens cut it short
}

func newAnswer(seed uint64, model, prompt string, reqSeed int64, maxTokens int64) answer {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	_, _ = h.Write(b[:])
	_, _ = h.Write([]byte(model))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(prompt))
	binary.LittleEndian.PutUint64(b[:], uint64(reqSeed))
	_, _ = h.Write(b[:])
	rng := rand.New(rand.NewPCG(seed, h.Sum64()))
	n := int64(MinOutput + rng.IntN(MaxOutput-MinOutput+1))
	cut := maxTokens > 0 && maxTokens < n
	if cut {
		n = maxTokens
	}
	a := answer{tokens: make([]string, n), cut: cut}
	for i := range a.tokens {
		w := vocabulary[rng.IntN(len(vocabulary))]
		if i > 0 {
			w = " " + w
		}
		a.tokens[i] = w
	}
	return a
}

// text is tokens [from, to) joined.
func (a answer) text(from, to int64) string {
	return strings.Join(a.tokens[from:to], "")
}
