package admission

import "math/bits"

// A share is a part of a whole in parts per million, an integer so that
// what it scales stays exact: the share of every floor the capacity
// carries (placer.floorShare), and the share of a request's weighted
// tokens its quota pays on a lower tier (charge.tierShare).
const wholeShare = 1_000_000

// shareOf is the share of want that have is: wholeShare when have covers
// want, 0 when it is nothing.
func shareOf(have, want int64) int64 {
	if want <= have {
		return wholeShare
	}
	if have <= 0 {
		return 0
	}
	// have < want: the quotient fits, and Div64 does not panic.
	hi, lo := bits.Mul64(uint64(have), wholeShare)
	q, _ := bits.Div64(hi, lo, uint64(want))
	return int64(q)
}

// scaled is n × share / wholeShare for n ≥ 0 and 0 ≤ share ≤ wholeShare,
// rounded up when up, else down.
func scaled(n, share int64, up bool) int64 {
	if n <= 0 || share <= 0 {
		return 0
	}
	if share >= wholeShare {
		return n
	}
	hi, lo := bits.Mul64(uint64(n), uint64(share))
	if up {
		var carry uint64
		lo, carry = bits.Add64(lo, wholeShare-1, 0)
		hi += carry
	}
	q, _ := bits.Div64(hi, lo, wholeShare) // share < wholeShare: the quotient fits
	return int64(q)
}
