// Package client is the Go client routers use to call sluiced's Admission
// service.
//
// Admit retries where a retry can succeed and the caller's deadline allows
// it, always with the same request_id, which the server makes idempotent (the
// same id gets the same answer and is charged once):
//
//   - a REJECTED answer with a retry_after > 0 and a transient reason
//     (QUOTA_EXCEEDED, CAPACITY_EXCEEDED, QUEUE_FULL, CONCURRENCY_EXCEEDED,
//     SHUTTING_DOWN) is retried after retry_after plus a small jitter;
//   - a codes.Unavailable error is retried after a capped exponential backoff
//     plus the same jitter.
//
// A wait that would not end before ctx's deadline is not started: the last
// answer is returned at once. Every other answer and error is returned as it
// came. A request without a request_id is given a random one, so that its
// retries stay idempotent.
//
// With several sluiced replicas, a Router keeps each tenant on one replica
// (rendezvous hashing over the live members, so that the tenant's flow lives
// in one fair queue) and follows membership changes; package etcdmembers
// supplies the members from the etcd control plane.
//
// A sluiced that serves TLS or requires a principal (--auth) is dialled with
// a Security: TLS files and a bearer token, sent on every call as
// "authorization: Bearer <token>" (Dial, or Security.Dialer for a Router).
package client

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/clock"
)

// Defaults for the options.
const (
	DefaultMaxAttempts = 3
	DefaultJitter      = 0.1
	DefaultBackoffBase = 50 * time.Millisecond
	DefaultBackoffMax  = time.Second
	// DefaultReleaseGrace is how long a Router keeps a departed replica's
	// connection for Release (see WithReleaseGrace).
	DefaultReleaseGrace = 30 * time.Second
)

// Client calls the Admission service. It is safe for concurrent use.
type Client struct {
	adm         admissionv1.AdmissionClient
	maxAttempts int
	sleep       func(ctx context.Context, d time.Duration) error
	jitter      float64
	backoffBase time.Duration
	backoffMax  time.Duration
	now         func() time.Time
	// releaseGrace is read by NewRouter only (WithReleaseGrace).
	releaseGrace time.Duration
}

// Option configures a Client.
type Option func(*Client)

// WithMaxAttempts sets how many times Admit calls the server at most, the
// first call included (default DefaultMaxAttempts; values below 1 mean 1).
func WithMaxAttempts(n int) Option {
	return func(c *Client) { c.maxAttempts = max(n, 1) }
}

// WithSleep replaces the function that waits between attempts. It must
// return early with an error when ctx is done. Tests inject one that records
// the durations and returns at once.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(c *Client) { c.sleep = sleep }
}

// WithJitter sets the jitter: each wait is lengthened by a uniformly random
// share in [0, fraction) of itself, so that rejected routers do not return in
// step (default DefaultJitter; 0 waits exactly retry_after or the backoff).
func WithJitter(fraction float64) Option {
	return func(c *Client) {
		if !(fraction > 0) { // also NaN
			fraction = 0
		}
		c.jitter = fraction
	}
}

// WithBackoff sets the backoff after an UNAVAILABLE error: base before the
// first retry, doubling after each, at most maxWait (defaults
// DefaultBackoffBase and DefaultBackoffMax).
func WithBackoff(base, maxWait time.Duration) Option {
	return func(c *Client) {
		c.backoffBase = max(base, 0)
		c.backoffMax = max(maxWait, c.backoffBase)
	}
}

// WithReleaseGrace sets, for a Router, how long a replica that left the
// membership keeps its connection for Release (default DefaultReleaseGrace;
// 0 or less closes it at once). A replica leaves the list while still
// serving, for a moment (an etcd outage longer than its lease TTL, a
// graceful shutdown): its leases' Releases must still reach it. New Admits
// stop going there at once. A Client alone ignores it.
func WithReleaseGrace(d time.Duration) Option {
	return func(c *Client) { c.releaseGrace = max(d, 0) }
}

// New returns a Client over conn.
func New(conn grpc.ClientConnInterface, opts ...Option) *Client {
	c := &Client{
		adm:         admissionv1.NewAdmissionClient(conn),
		maxAttempts: DefaultMaxAttempts,
		sleep:       clock.Sleep,
		jitter:      DefaultJitter,
		backoffBase: DefaultBackoffBase,
		backoffMax:  DefaultBackoffMax,
		now:         time.Now,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Admit asks whether req may run now, retrying as the package documentation
// describes. The gRPC deadline, and so the request's deadline, is ctx's. req
// is not modified; without a request_id a copy carrying a random one is sent.
func (c *Client) Admit(ctx context.Context, req *admissionv1.AdmitRequest) (*admissionv1.AdmitResponse, error) {
	if req.GetRequestId() == "" {
		req = proto.CloneOf(req)
		req.RequestId = NewRequestID()
	}
	backoff := c.backoffBase
	for attempt := 1; ; attempt++ {
		resp, err := c.adm.Admit(ctx, req)
		var wait time.Duration
		switch {
		case err != nil:
			if status.Code(err) != codes.Unavailable {
				return nil, err
			}
			wait = backoff
			backoff = min(2*backoff, c.backoffMax)
		case retryable(resp):
			wait = resp.GetRetryAfter().AsDuration()
		default:
			return resp, nil
		}
		if attempt >= c.maxAttempts {
			return resp, err
		}
		wait = c.withJitter(wait)
		if deadline, ok := ctx.Deadline(); ok && !c.now().Add(wait).Before(deadline) {
			return resp, err
		}
		if c.sleep(ctx, wait) != nil {
			return resp, err
		}
	}
}

// Release ends a lease. It is not retried: a Release that reached the server
// before an UNAVAILABLE error would make its retry fail with NOT_FOUND.
func (c *Client) Release(ctx context.Context, req *admissionv1.ReleaseRequest) (*admissionv1.ReleaseResponse, error) {
	return c.adm.Release(ctx, req)
}

// retryable reports whether resp is a rejection that a retry after its
// retry_after can turn into an admission.
func retryable(resp *admissionv1.AdmitResponse) bool {
	if resp.GetDecision() != admissionv1.Decision_REJECTED || resp.GetRetryAfter().AsDuration() <= 0 {
		return false
	}
	switch resp.GetReason() {
	case admissionv1.Reason_REASON_QUOTA_EXCEEDED,
		admissionv1.Reason_REASON_CAPACITY_EXCEEDED,
		admissionv1.Reason_REASON_QUEUE_FULL,
		admissionv1.Reason_REASON_CONCURRENCY_EXCEEDED,
		admissionv1.Reason_REASON_SHUTTING_DOWN:
		return true
	}
	return false
}

// withJitter lengthens d by a random share in [0, c.jitter) of it.
func (c *Client) withJitter(d time.Duration) time.Duration {
	if c.jitter == 0 || d <= 0 {
		return d
	}
	extra := time.Duration(float64(d) * c.jitter * rand.Float64())
	if extra < 0 || d+extra < d { // overflow
		return d
	}
	return d + extra
}

// NewRequestID returns a random request id: 16 bytes from crypto/rand in hex.
// Admit uses it for requests without one; a router that logs its request ids
// can call it itself.
func NewRequestID() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // never fails (Go ≥ 1.24 crashes the process instead)
	return hex.EncodeToString(b[:])
}
