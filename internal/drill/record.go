package drill

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/load"
)

// answer is one Admit as the drill saw it: when it was sent and answered
// (offsets from the drill's start), whose, what it cost in weighted tokens,
// and what came back.
type answer struct {
	sent, answered time.Duration
	tenant         string
	weight         int64
	code           codes.Code // OK when the server answered
	decision       admissionv1.Decision
	reason         string
	domain         string
	retryAfter     time.Duration
	replica        string // the replica that granted the lease
	deferrable     bool   // the request was sent deferrable
	ticket         string // on DEFERRED answers
}

// admitted reports whether the answer placed the request: a DEFERRED one
// has a ticket, not a place.
func (a *answer) admitted() bool {
	return a.code == codes.OK && (a.decision == admissionv1.Decision_ADMITTED || a.decision == admissionv1.Decision_DEGRADED)
}

// release is one Release: when, of which lease's answer, and how it ended.
type release struct {
	at      time.Duration
	granted time.Duration // when its Admit was answered
	replica string
	domain  string
	code    codes.Code
}

// recorder is the load's Target: it passes every call to the fleet's Router
// and keeps what came back, so that the drill can cut the answers into
// phases by time, domain and tenant (internal/load keeps totals only).
type recorder struct {
	t0           time.Time
	next         load.Target
	outputWeight int64

	mu       sync.Mutex
	answers  []answer
	releases []release
	leases   map[string]int // lease id → index in answers
}

func newRecorder(t0 time.Time, next load.Target, outputWeight int64) *recorder {
	return &recorder{t0: t0, next: next, outputWeight: outputWeight, leases: map[string]int{}}
}

func (r *recorder) now() time.Duration { return time.Since(r.t0) }

// errStopped answers the calls a stopped segment does not send.
var errStopped = status.Error(codes.Canceled, "drill: this load segment has ended")

// segment is one load.Run feeding the recorder, stopped without cancelling
// a call in flight: once stopped, new arrivals are not sent, and stop waits
// for the calls and leases outstanding before it ends the run.
type segment struct {
	rec         *recorder
	stopped     atomic.Bool
	outstanding atomic.Int64    // Admits in flight and leases not yet released
	parent      context.Context // the drill's: once it ends, stop waits for nothing
	cancel      context.CancelFunc
	done        chan struct{}
	err         error
	// deferEvery > 0 sends every deferEvery-th request deferrable
	// (internal/load sends none); calls counts them.
	deferEvery int64
	calls      atomic.Int64
}

// startSegment runs opts (its Duration ignored: the segment runs until
// stop) through rec.
func startSegment(ctx context.Context, rec *recorder, opts load.Options) *segment {
	return startDeferring(ctx, rec, opts, 0)
}

// startDeferring is startSegment with every every-th request sent
// deferrable (0: none).
func startDeferring(ctx context.Context, rec *recorder, opts load.Options, every int64) *segment {
	s := &segment{rec: rec, parent: ctx, done: make(chan struct{}), deferEvery: every}
	ctx, s.cancel = context.WithCancel(ctx)
	opts.Duration = 24 * time.Hour
	go func() {
		defer close(s.done)
		_, s.err = load.Run(ctx, opts, []load.Target{s})
	}()
	return s
}

// stop ends the segment: no new call, then at most wait for the calls in
// flight and the leases held to be released (not at all when the drill was
// interrupted).
func (s *segment) stop(wait time.Duration) {
	s.stopped.Store(true)
	_ = waitFor(s.parent, wait, func() bool { return s.outstanding.Load() == 0 })
	s.cancel()
	<-s.done
}

// halt stops new calls at once, without waiting for those in flight: a
// call recorded was sent before halt returned.
func (s *segment) halt() { s.stopped.Store(true) }

// Admit implements load.Target.
func (s *segment) Admit(ctx context.Context, req *admissionv1.AdmitRequest) (*admissionv1.AdmitResponse, error) {
	// The time is taken before the check, so that every call recorded was
	// sent before the segment was halted: a drill that halts one segment
	// and starts the next knows which segment a time belongs to.
	sent := s.rec.now()
	if s.stopped.Load() {
		return nil, errStopped
	}
	s.outstanding.Add(1)
	if s.deferEvery > 0 && s.calls.Add(1)%s.deferEvery == 0 {
		req = proto.CloneOf(req)
		req.Deferrable = true
	}
	r := s.rec
	a := answer{sent: sent, tenant: req.GetTenant(), weight: req.GetPromptTokens() + r.outputWeight*req.GetMaxOutputTokens(),
		deferrable: req.GetDeferrable()}
	resp, err := r.next.Admit(ctx, req)
	a.answered = r.now()
	a.code = status.Code(err)
	if err == nil {
		a.decision, a.reason, a.domain = resp.GetDecision(), strings.TrimPrefix(resp.GetReason().String(), "REASON_"), resp.GetDomain()
		a.retryAfter = resp.GetRetryAfter().AsDuration()
		a.ticket = resp.GetTicketId()
		if _, owner, ok := strings.Cut(resp.GetLeaseId(), "@"); ok {
			a.replica = owner
		}
	}
	r.mu.Lock()
	r.answers = append(r.answers, a)
	if lease := resp.GetLeaseId(); err == nil && lease != "" {
		r.leases[lease] = len(r.answers) - 1
	} else {
		s.outstanding.Add(-1)
	}
	r.mu.Unlock()
	return resp, err
}

// Release implements load.Target.
func (s *segment) Release(ctx context.Context, req *admissionv1.ReleaseRequest) (*admissionv1.ReleaseResponse, error) {
	defer s.outstanding.Add(-1)
	r := s.rec
	resp, err := r.next.Release(ctx, req)
	rel := release{at: r.now(), code: status.Code(err)}
	r.mu.Lock()
	if i, ok := r.leases[req.GetLeaseId()]; ok {
		rel.replica, rel.domain, rel.granted = r.answers[i].replica, r.answers[i].domain, r.answers[i].answered
		delete(r.leases, req.GetLeaseId())
	}
	r.releases = append(r.releases, rel)
	r.mu.Unlock()
	return resp, err
}

// snapshot returns copies of what was recorded.
func (r *recorder) snapshot() ([]answer, []release) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]answer(nil), r.answers...), append([]release(nil), r.releases...)
}
