package sharing

import (
	"math"
	"math/bits"
	"strconv"
)

// Kind names the buckets that shared state keeps.
type Kind uint8

// Bucket kinds: a tenant's four (in the order of Tenant.Buckets), then a
// domain's two.
const (
	KindRPS Kind = iota
	KindTokens
	KindFloor
	KindCritical
	KindPrefill
	KindDecode
	// NumKinds counts the kinds.
	NumKinds
	// TenantKinds counts a tenant's kinds: those below KindPrefill.
	TenantKinds = KindPrefill
)

// RequestUnit is one request in a tenant's RPS bucket, here and in the
// store: milli-requests, so that fractional rates such as 0.5 requests/s
// stay integers.
const RequestUnit = 1000

var kindSuffix = [NumKinds]string{"rps", "tok", "floor", "crit", "pf", "dc"}

// KindNames are the bucket kinds as metrics label them, by kind.
var KindNames = [NumKinds]string{"rps", "tokens", "floor", "critical", "prefill", "decode"}

// Store keys: "t/<tenant>/<kind>", "d/<domain>/<kind>", "d/<domain>/kv".
// The adapter adds its prefix and hash tag.
func tenantKey(name string, k Kind) string { return "t/" + name + "/" + kindSuffix[k] }
func domainKey(id string, k Kind) string   { return "d/" + id + "/" + kindSuffix[k] }
func kvKey(id string) string               { return "d/" + id + "/kv" }

// replicaLease names a lease in the store: unique across replicas.
func replicaLease(replica string, id uint64) string {
	return replica + "/" + strconv.FormatUint(id, 10)
}

// scaleFor returns the unit a bucket of this rate and burst is reported in:
// a power of two keeping both below 2^32 units, so that cumulative counters
// modulo CumModulus wrap only after days and Lua's doubles stay exact.
func scaleFor(rate, burst int64) int64 {
	n := bits.Len64(uint64(max(rate, burst, 1)))
	if n <= 32 {
		return 1
	}
	return 1 << (n - 32)
}

// mulDiv returns a·b/c for non-negative a, b and positive c, saturating.
func mulDiv(a, b, c int64) int64 {
	if a <= 0 || b <= 0 || c <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(min(q, math.MaxInt64))
}

// floorDiv is a/b rounded down (toward −∞), b positive.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return a / b
	}
	return (a + b - 1) / b
}
