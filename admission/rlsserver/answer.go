package rlsserver

import (
	"math"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-sched/sluice/admission"
)

// Header names of the answer.
const (
	HeaderDomain     = "x-sluice-domain"
	HeaderModel      = "x-sluice-model"
	HeaderDowngrade  = "x-sluice-downgrade"
	HeaderReason     = "x-sluice-reason"
	HeaderRetryAfter = "retry-after"
	// The IETF fields, draft-ietf-httpapi-ratelimit-headers-11.
	HeaderPolicy    = "ratelimit-policy"
	HeaderRateLimit = "ratelimit"
)

// policyName names Sluice's one advertised quota policy, the tenant's token
// bucket, in the RateLimit headers and the descriptor statuses.
const policyName = "tokens"

// maxHeaders is how many headers one answer may carry: domain, model,
// downgrade and the two RateLimit fields; or reason, Retry-After and those.
const maxHeaders = 5

// perStatus holds one descriptor status and the messages it points to.
type perStatus struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	limit  rlsv3.RateLimitResponse_RateLimit
	reset  durationpb.Duration
}

// answer holds a response and what it points to, so that the common answer
// (one descriptor) costs a few allocations rather than one per message.
type answer struct {
	resp     rlsv3.RateLimitResponse
	items    [1]item             // the one descriptor's request
	cur      admission.Decision  // the decision being rendered
	decided  *admission.Decision // the deciding one, when there are several
	one      perStatus
	oneSlice [1]*rlsv3.RateLimitResponse_DescriptorStatus
	per      []perStatus // when there are several descriptors
	hdrs     [maxHeaders]corev3.HeaderValue
	hdrPtrs  [maxHeaders]*corev3.HeaderValue
	upstream [2]*corev3.HeaderValue
}

// newAnswer returns an answer with n empty statuses (n ≥ 1).
func newAnswer(n int) *answer {
	a := new(answer)
	if n == 1 {
		a.oneSlice[0] = &a.one.status
		a.resp.Statuses = a.oneSlice[:]
		return a
	}
	a.per = make([]perStatus, n)
	a.resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
	for i := range a.per {
		a.resp.Statuses[i] = &a.per[i].status
	}
	return a
}

// slot returns descriptor i's status and its messages.
func (a *answer) slot(i int) *perStatus {
	if a.per == nil {
		return &a.one
	}
	return &a.per[i]
}

// fillStatus renders decision d of descriptor i; pol is its tenant's
// limit (nil for an unknown tenant).
func (a *answer) fillStatus(i int, d *admission.Decision, pol *policy) {
	ps := a.slot(i)
	st := &ps.status
	over := d.Outcome == admission.Rejected
	st.Code = rlsv3.RateLimitResponse_OK
	if over {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		if d.RetryAfter > 0 {
			ps.reset.Seconds = int64(d.RetryAfter / time.Second)
			ps.reset.Nanos = int32(d.RetryAfter % time.Second)
			st.DurationUntilReset = &ps.reset
		}
	}
	if pol == nil {
		return
	}
	ps.limit.Name = policyName
	ps.limit.RequestsPerUnit = sat32(pol.rate)
	ps.limit.Unit = rlsv3.RateLimitResponse_RateLimit_SECOND
	st.CurrentLimit = &ps.limit
	if !over {
		st.LimitRemaining = sat32(d.Trace.QuotaAfter)
	}
}

// headers adds the headers of the deciding decision d (pol: its tenant's
// limit, nil when unknown); placed: d is an admission, whose domain and
// model the upstream request carries (a check or a settlement places
// nothing).
func (a *answer) headers(d *admission.Decision, pol *policy, placed bool) {
	n := 0
	add := func(k, v string) {
		h := &a.hdrs[n]
		h.Key, h.Value = k, v
		a.hdrPtrs[n] = h
		n++
	}
	over := d.Outcome == admission.Rejected
	if !over && placed {
		add(HeaderDomain, d.Domain)
		add(HeaderModel, d.Model)
		// The model server behind Envoy learns where the request was
		// placed and on which tier (a downgrade) from the same headers.
		a.upstream[0], a.upstream[1] = &a.hdrs[0], &a.hdrs[1]
		a.resp.RequestHeadersToAdd = a.upstream[:]
		if len(d.DowngradePath) > 0 {
			add(HeaderDowngrade, strings.Join(d.DowngradePath, ">"))
		}
	} else if over {
		add(HeaderReason, d.Reason.String())
		if d.RetryAfter > 0 {
			add(HeaderRetryAfter, strconv.FormatInt(ceilSeconds(d.RetryAfter), 10))
		}
	}
	if pol != nil {
		add(HeaderPolicy, pol.header)
		add(HeaderRateLimit, rateLimitField(d, pol))
	}
	a.resp.ResponseHeadersToAdd = a.hdrPtrs[:n]
}

// rateLimitField is the RateLimit field: what remains of the tenant's
// tokens and the seconds until the bucket is full again; on a refusal,
// nothing remains until the Retry-After. A request too large for the
// bucket ever to carry spent nothing and waits for nothing: the field is
// the bucket's as it stands.
func rateLimitField(d *admission.Decision, pol *policy) string {
	var r, t int64
	if d.Outcome == admission.Rejected && d.Reason != admission.ReasonRequestTooLarge {
		t = ceilSeconds(d.RetryAfter)
	} else {
		r = max(d.Trace.QuotaAfter, 0)
		if pol.rate > 0 {
			t = ceilDiv(max(pol.burst-d.Trace.QuotaAfter, 0), pol.rate)
		}
	}
	var buf [64]byte
	b := append(buf[:0], `"`+policyName+`";r=`...)
	b = strconv.AppendInt(b, r, 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, t, 10)
	return string(b)
}

// policy is a tenant's token limit as its headers show it.
type policy struct {
	rate, burst int64     // weighted tokens per second, and the bucket's depth
	header      string    // the RateLimit-Policy field
	fetched     time.Time // on the engine's clock
}

// policy returns tenant's limit, from the cache while it is fresh; nil when
// the tenant is not configured.
func (s *Server) policy(tenant string, now time.Time) *policy {
	if v, ok := s.policies.Load(tenant); ok {
		if p := v.(*policy); now.Sub(p.fetched) < policyTTL {
			return p
		}
	}
	ti, ok := s.eng.Tenant(tenant)
	if !ok {
		s.policies.Delete(tenant)
		return nil
	}
	p := &policy{rate: ti.TokenRate, burst: ti.TokenBurst, fetched: now}
	// q: the bucket's depth; w: the seconds it takes to refill, the window
	// in which q can be spent at most once more than the rate allows.
	b := append(make([]byte, 0, 64), `"`+policyName+`";q=`...)
	b = strconv.AppendInt(b, max(p.burst, 0), 10)
	if p.rate > 0 {
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, max(ceilDiv(p.burst, p.rate), 1), 10)
	}
	b = append(b, `;qu="weighted-tokens"`...)
	p.header = string(b)
	s.policies.Store(tenant, p)
	return p
}

// ceilSeconds rounds d up to whole seconds, as delay-seconds are.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return ceilDiv(int64(d), int64(time.Second))
}

// ceilDiv is ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b int64) int64 { return a/b + min(a%b, 1) }

// sat32 clamps v into a uint32.
func sat32(v int64) uint32 {
	return uint32(min(max(v, 0), math.MaxUint32))
}
