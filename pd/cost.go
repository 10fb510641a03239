package pd

import (
	"fmt"
	"math"
	"math/bits"
)

// Cost is what a request draws from a domain: FLOPs from the prefill
// bucket, bytes from the decode bucket, and bytes of KV cache held in the KV
// gauge until Release. Costs from Cost are never negative.
type Cost struct {
	PrefillFLOP int64
	DecodeBytes int64
	KVBytes     int64
}

// Cost returns the formula cost of a request of prompt and output tokens on
// model m (see the package documentation), without calibration; use
// DomainCapacity.Cost for the cost in a domain. The error wraps
// ErrUnknownModel, ErrNegativeTokens or ErrOverflow: the request is invalid.
func (c *Catalog) Cost(m *Model, prompt, output int64) (Cost, error) {
	k, err := c.consts(m)
	if err != nil {
		return Cost{}, err
	}
	return k.cost(m.Name, prompt, output, 0, 0)
}

// cost computes a request's cost. prefillPerToken and decodePerToken, when
// positive, are calibrated costs per prompt and per output token that
// replace the formulas; KV is always the formula.
func (k *consts) cost(name string, p, o, prefillPerToken, decodePerToken int64) (Cost, error) {
	if p < 0 || o < 0 {
		return Cost{}, fmt.Errorf("pd: model %q: %d prompt, %d output tokens: %w", name, p, o, ErrNegativeTokens)
	}
	var c Cost
	ok := true
	if prefillPerToken <= 0 {
		prefillPerToken = k.prefillPerToken
	}
	c.PrefillFLOP, ok = mul(p, prefillPerToken)
	if decodePerToken > 0 {
		var ok1 bool
		c.DecodeBytes, ok1 = mul(o, decodePerToken)
		ok = ok && ok1
	} else {
		// O·w + ⌈kv·O·(2P + O)/2⌉ = O·(w + kv·(P + O/2)), in integers.
		weights, ok1 := mul(o, k.weightPerToken)
		ctx, ok2 := add(p, p)
		ctx, ok3 := add(ctx, o)
		kv, ok4 := mul(k.kvPerToken, o)
		kv, ok5 := mul(kv, ctx)
		var ok6 bool
		c.DecodeBytes, ok6 = add(weights, kv/2+kv%2)
		ok = ok && ok1 && ok2 && ok3 && ok4 && ok5 && ok6
	}
	tokens, ok1 := add(p, o)
	var ok2 bool
	c.KVBytes, ok2 = mul(tokens, k.kvPerToken)
	if !ok || !ok1 || !ok2 {
		return Cost{}, fmt.Errorf("pd: model %q: %d prompt, %d output tokens: %w", name, p, o, ErrOverflow)
	}
	return c, nil
}

// mul returns a·b for a, b ≥ 0, and whether it fit in int64.
func mul(a, b int64) (int64, bool) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	return int64(lo), hi == 0 && lo <= math.MaxInt64
}

// add returns a+b for a, b ≥ 0, and whether it fit in int64.
func add(a, b int64) (int64, bool) {
	s := a + b
	return s, s >= a
}

// mulDiv returns ⌊a·b/c⌋ computed in 128 bits, and whether it fit in int64.
func mulDiv(a, b, c uint64) (int64, bool) {
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return 0, false
	}
	q, _ := bits.Div64(hi, lo, c)
	return int64(q), q <= math.MaxInt64
}
