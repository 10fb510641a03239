package grpcserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"slices"
	"strings"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// MaxTenantPage is ListTenants' default and largest page: a fleet of a few
// hundred tenants still comes back in one answer, as before pagination,
// while 100k tenants no longer make one 19 MB message.
const MaxTenantPage = 1000

// TenantPager is an optional method of an Engine: up to n tenants whose
// names sort after after, in name order, and whether more follow. An
// Engine without it is paged over Tenants(), which builds every tenant's
// description for each page.
type TenantPager interface {
	TenantsAfter(after string, n int) (ts []admission.TenantInfo, more bool)
}

// pageTokenVersion starts every decoded page token, so that a token of
// another layout is refused rather than read as a name.
const pageTokenVersion = 2

// pageTokenCheckLen is how many bytes of SHA-256 end a page token: a token
// this server did not write (typed by hand, cut, or built from its layout
// without the check) is refused, bar a 2^-48 chance for a random one.
const pageTokenCheckLen = 6

// maxPageToken bounds a page token: the name inside is at most maxNameLen
// bytes, and its base64 about 4/3 of that with the version and the check.
const maxPageToken = 4 * (1 + maxNameLen + pageTokenCheckLen + 2) / 3

// EncodePageToken returns the opaque token of the page that follows the
// tenant name last. It is base64 (URL alphabet, no padding) of a version
// byte, the name and a check (pageTokenSum): opaque to callers, who must
// not build it, and self-checking rather than secret, so that it stays
// good across restarts and on every replica.
func EncodePageToken(last string) string {
	b := make([]byte, 0, 1+len(last)+pageTokenCheckLen)
	b = append(b, pageTokenVersion)
	b = append(b, last...)
	b = append(b, pageTokenSum(b)...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// pageTokenSum is the check of a page token's version and name: the first
// pageTokenCheckLen bytes of their SHA-256 after a label of its own, so
// that no other hash of the same bytes is a check.
func pageTokenSum(versionAndName []byte) []byte {
	h := sha256.New()
	h.Write([]byte("sluice ListTenants page token\x00"))
	h.Write(versionAndName)
	return h.Sum(nil)[:pageTokenCheckLen]
}

// DecodePageToken returns the name a page token continues after; "" for an
// empty token (the first page). ok is false for a token EncodePageToken did
// not write: another length, alphabet, padding, version or check, or no
// name.
func DecodePageToken(tok string) (after string, ok bool) {
	if tok == "" {
		return "", true
	}
	if len(tok) > maxPageToken {
		return "", false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(tok)
	if err != nil || len(b) < 1+1+pageTokenCheckLen || b[0] != pageTokenVersion {
		return "", false
	}
	body, sum := b[:len(b)-pageTokenCheckLen], b[len(b)-pageTokenCheckLen:]
	if !bytes.Equal(sum, pageTokenSum(body)) {
		return "", false
	}
	return string(body[1:]), true
}

// PageSize turns a request's page_size into the page's length: 0 and
// anything above MaxTenantPage are MaxTenantPage; negative is an error
// naming field.
func PageSize(field string, size int32) (int, error) {
	switch {
	case size < 0:
		return 0, invalidArgument(field, "must not be negative")
	case size == 0 || size > MaxTenantPage:
		return MaxTenantPage, nil
	}
	return int(size), nil
}

// ListTenants implements admissionv1.OperatorServer: one page of the
// tenants in name order.
func (s *operatorServer) ListTenants(_ context.Context, in *admissionv1.ListTenantsRequest) (*admissionv1.ListTenantsResponse, error) {
	n, err := PageSize("page_size", in.GetPageSize())
	if err != nil {
		return nil, err
	}
	after, ok := DecodePageToken(in.GetPageToken())
	if !ok {
		return nil, invalidArgument("page_token", "not a token this server wrote (pass next_page_token as it came)")
	}
	ts, more := tenantsAfter(s.eng, after, n)
	out := &admissionv1.ListTenantsResponse{Tenants: make([]*admissionv1.TenantInfo, len(ts))}
	for i := range ts {
		out.Tenants[i] = tenantToProto(&ts[i])
	}
	if more && len(ts) > 0 {
		out.NextPageToken = EncodePageToken(ts[len(ts)-1].Name)
	}
	return out, nil
}

// tenantsAfter pages eng's tenants through its TenantPager, or else over
// Tenants() (sorted by name).
func tenantsAfter(eng Engine, after string, n int) ([]admission.TenantInfo, bool) {
	if p, ok := eng.(TenantPager); ok {
		return p.TenantsAfter(after, n)
	}
	all := eng.Tenants()
	i := 0
	if after != "" {
		i, _ = slices.BinarySearchFunc(all, after, func(t admission.TenantInfo, name string) int {
			return strings.Compare(t.Name, name)
		})
		if i < len(all) && all[i].Name == after {
			i++
		}
	}
	end := min(i+n, len(all))
	return all[i:end:end], end < len(all)
}
