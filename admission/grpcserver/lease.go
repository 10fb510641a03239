package grpcserver

import (
	"strconv"
	"strings"
)

// leasePrefix starts every lease id on the wire. The rest is the engine's
// uint64 lease id in base 10, without sign or leading zeros.
const leasePrefix = "l-"

// formatLeaseID renders an engine lease id for the wire, e.g. "l-123".
func formatLeaseID(id uint64) string {
	var buf [len(leasePrefix) + 20]byte
	b := append(buf[:0], leasePrefix...)
	return string(strconv.AppendUint(b, id, 10))
}

// parseLeaseID accepts exactly the strings formatLeaseID produces for a
// non-zero id; anything else is INVALID_ARGUMENT on field lease_id.
func parseLeaseID(s string) (uint64, error) {
	if s == "" {
		return 0, invalidArgument("lease_id", "required")
	}
	digits, ok := strings.CutPrefix(s, leasePrefix)
	if !ok || digits == "" || digits[0] == '0' {
		return 0, invalidArgument("lease_id", "malformed")
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, invalidArgument("lease_id", "malformed")
		}
	}
	id, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return 0, invalidArgument("lease_id", "out of range")
	}
	return id, nil
}
