package load

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/clock"
)

// Mode is how calls arrive.
type Mode string

// The arrival modes (see the package documentation).
const (
	ModeClosed Mode = "closed"
	ModeOpen   Mode = "open"
	ModeTrace  Mode = "trace"
)

// Target is what Admit and Release go to: one server's generated client
// (NewTarget) or a client.Router over a fleet's members.
type Target interface {
	Admit(ctx context.Context, req *admissionv1.AdmitRequest) (*admissionv1.AdmitResponse, error)
	Release(ctx context.Context, req *admissionv1.ReleaseRequest) (*admissionv1.ReleaseResponse, error)
}

// NewTarget returns a Target that calls the server behind cc through the
// generated admission/v1 client, with no retry and nothing in between: the
// calls the tool counts are the calls the server answers.
func NewTarget(cc grpc.ClientConnInterface) Target {
	return generated{admissionv1.NewAdmissionClient(cc)}
}

type generated struct{ c admissionv1.AdmissionClient }

func (g generated) Admit(ctx context.Context, req *admissionv1.AdmitRequest) (*admissionv1.AdmitResponse, error) {
	return g.c.Admit(ctx, req)
}

func (g generated) Release(ctx context.Context, req *admissionv1.ReleaseRequest) (*admissionv1.ReleaseResponse, error) {
	return g.c.Release(ctx, req)
}

// Mix is one part of a tenant mix: the share of the calls that go to Tenant
// on Model. With Pool > 0 it stands for Pool tenants: Tenant is then a
// pattern with one integer verb (ParseTenantPools), and each call draws
// one of its names.
type Mix struct {
	Tenant string  `json:"tenant"`
	Model  string  `json:"model"`
	Share  float64 `json:"share"`
	Pool   int     `json:"pool,omitempty"`
}

// ParseTenants reads a --tenants value, "tenant:model:share,…" (the form of
// replay's --mix). Shares are positive and normalised to sum to 1.
func ParseTenants(s string) ([]Mix, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("--tenants: empty; want tenant:model:share,…")
	}
	var out []Mix
	sum := 0.0
	for _, part := range strings.Split(s, ",") {
		f := strings.Split(strings.TrimSpace(part), ":")
		if len(f) != 3 || f[0] == "" || f[1] == "" {
			return nil, fmt.Errorf("--tenants %q: %q: want tenant:model:share", s, part)
		}
		share, err := strconv.ParseFloat(f[2], 64)
		if err != nil || !(share > 0) || math.IsInf(share, 0) {
			return nil, fmt.Errorf("--tenants %q: %q: share must be a positive number", s, part)
		}
		out = append(out, Mix{Tenant: f[0], Model: f[1], Share: share})
		sum += share
	}
	for i := range out {
		out[i].Share /= sum
	}
	return out, nil
}

// Arrival is one call of a trace: when it starts (an offset from the run's
// start), whose it is, the model and its tokens. Output is both the
// request's max_output_tokens and the output the Release reports.
type Arrival struct {
	At     time.Duration
	Tenant string
	Model  string
	Prompt int64
	Output int64

	// Drawn from a pool: the pattern its answers are counted under, the
	// pool's size and the name's index in it.
	row             string
	poolSize, index int
}

// Options say what load to offer.
type Options struct {
	Mode Mode
	// Concurrency is the closed loop's number of callers.
	Concurrency int
	// Rate is the open loop's arrivals per second; Poisson draws
	// exponential gaps (seeded), else they are evenly spaced.
	Rate    float64
	Poisson bool
	// MaxInFlight bounds the calls outstanding in the open loop and trace
	// modes (an arrival past it is Dropped); 0: 10,000.
	MaxInFlight int
	// Arrivals are the trace mode's calls, sorted by At.
	Arrivals []Arrival
	// Tenants is the closed and open loops' mix; Prompt and Output their
	// requests' token counts.
	Tenants        []Mix
	Prompt, Output int64
	// Sequential makes the mix's pools hand out their names in turn (0,
	// 1, …, and round again), shared by the callers (and by Compare's
	// rounds), so that n calls reach min(n, Pool) tenants; else each call
	// draws one at random.
	Sequential bool
	// AcceptDowngrade is every request's accept_downgrade.
	AcceptDowngrade []string
	// Duration is how long calls start (trace: 0 runs the whole trace).
	Duration time.Duration
	// Deadline is each Admit's gRPC deadline, which is the request's
	// deadline in sluiced's queue; 0 sends none (the server's
	// queue.default_wait applies).
	Deadline time.Duration
	// Hold is how long a lease is held before its Release.
	Hold time.Duration
	// Release says whether leases are released; false lets them accumulate
	// on the server until their TTL.
	Release bool
	// RequestIDs sends a unique request_id with every Admit, as
	// client.Client does (the server keeps an idempotency record for each).
	RequestIDs bool
	// Seed seeds the tenant draws and the Poisson gaps.
	Seed uint64
	// ServerPID is the server's process id when it runs on this machine:
	// its CPU time per call is then reported beside the client's (read
	// from /proc; 0: not measured).
	ServerPID int
	// Churn, when set, changes placement on the server through its public
	// API while each run of the load lasts (not the reference's).
	Churn *Churn

	draw *picker // Compare's, shared by its rounds; nil: each run its own
}

// defaultMaxInFlight is MaxInFlight's default: enough for any rate a
// loopback server answers, and a bound on the goroutines the client starts.
const defaultMaxInFlight = 10000

// Validate reports the first option that cannot run, naming its flag.
func (o *Options) Validate() error {
	switch o.Mode {
	case ModeClosed:
		if o.Concurrency < 1 {
			return fmt.Errorf("--concurrency %d: want at least 1 caller", o.Concurrency)
		}
	case ModeOpen:
		if !(o.Rate > 0) || math.IsInf(o.Rate, 0) {
			return fmt.Errorf("--rate %g: want a positive number of arrivals per second", o.Rate)
		}
	case ModeTrace:
		if len(o.Arrivals) == 0 {
			return errors.New("--trace: no arrivals")
		}
	default:
		return fmt.Errorf("mode %q: want closed, open or trace", o.Mode)
	}
	if o.Mode != ModeTrace {
		if len(o.Tenants) == 0 {
			return errors.New("--tenants: want at least one tenant:model:share")
		}
		for _, m := range o.Tenants {
			if m.Pool < 0 || m.Pool > maxPool {
				return fmt.Errorf("--tenant-pool %s: count %d: want 1 to %d", m.Tenant, m.Pool, maxPool)
			}
			if m.Pool > 0 {
				if _, err := parsePattern(m.Tenant); err != nil {
					return fmt.Errorf("--tenant-pool: %w", err)
				}
			}
		}
		if o.Prompt < 1 || o.Output < 1 {
			return fmt.Errorf("--prompt %d --output %d: want at least 1 token each", o.Prompt, o.Output)
		}
		if o.Duration <= 0 {
			return fmt.Errorf("--duration %v: want a positive duration", o.Duration)
		}
	}
	if o.Duration < 0 {
		return fmt.Errorf("--duration %v: want ≥ 0", o.Duration)
	}
	if o.Deadline < 0 || o.Hold < 0 {
		return fmt.Errorf("--deadline %v --hold %v: want ≥ 0", o.Deadline, o.Hold)
	}
	if o.MaxInFlight < 0 {
		return fmt.Errorf("--max-in-flight %d: want ≥ 0", o.MaxInFlight)
	}
	for _, m := range o.AcceptDowngrade {
		if m == "" {
			return errors.New("--accept-downgrade: an empty model name")
		}
	}
	return nil
}

// caller is what one call of a run does: the load's Admit (and Release),
// or the reference's health Check. worker numbers the closed loop's
// caller (or the open loop's arrival), for its connection.
type caller func(ctx context.Context, worker int, sh *shard, a Arrival)

// Run offers the load opts describes to targets (worker i calls
// targets[i % len(targets)], so several connections share the callers) and
// returns what came back. ctx ends the run early: calls in flight then fail
// CANCELED.
func Run(ctx context.Context, opts Options, targets []Target) (*Result, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if len(targets) == 0 {
		return nil, errors.New("load: no target")
	}
	ids := newIDs(opts.RequestIDs)
	do := func(ctx context.Context, worker int, sh *shard, a Arrival) {
		admitOne(ctx, &opts, targets[worker%len(targets)], ids, sh, a)
	}
	var stopChurn func() *ChurnResult
	if opts.Churn != nil {
		stopChurn = opts.Churn.start(ctx, &opts)
	}
	st, elapsed, err := drive(ctx, &opts, do)
	if stopChurn != nil {
		ch := stopChurn()
		if st != nil {
			st.churn = ch
		}
	}
	if err != nil {
		return nil, err
	}
	return st.result(KindLoad(opts.Release), elapsed), nil
}

// RunHealth runs the reference: the same callers, arrivals and connections
// as Run with opts, each call a gRPC health Check of the overall service
// ("").
func RunHealth(ctx context.Context, opts Options, conns []grpc.ClientConnInterface) (*Result, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if len(conns) == 0 {
		return nil, errors.New("load: no connection")
	}
	clients := make([]healthpb.HealthClient, len(conns))
	for i, c := range conns {
		clients[i] = healthpb.NewHealthClient(c)
	}
	req := &healthpb.HealthCheckRequest{}
	opts.draw = &picker{} // a Check names no tenant: nothing to draw
	do := func(ctx context.Context, worker int, sh *shard, _ Arrival) {
		cctx, cancel := withDeadline(ctx, opts.Deadline)
		t0 := time.Now()
		_, err := clients[worker%len(clients)].Check(cctx, req)
		lat := time.Since(t0)
		cancel()
		sh.mu.Lock()
		defer sh.mu.Unlock()
		sh.st.calls++
		sh.st.recordAdmitLatency(lat)
		if err != nil {
			sh.st.admitErrors[status.Code(err)]++
			sh.st.firstAdmitError.note(t0, err)
		}
	}
	st, elapsed, err := drive(ctx, &opts, do)
	if err != nil {
		return nil, err
	}
	return st.result(KindHealth, elapsed), nil
}

// Result kinds.
const (
	KindHealth       = "health-check"
	KindAdmitRelease = "admit+release"
	KindAdmitOnly    = "admit-only"
)

// KindLoad names a load run by whether it releases.
func KindLoad(release bool) string {
	if release {
		return KindAdmitRelease
	}
	return KindAdmitOnly
}

// withDeadline is ctx with a timeout d, or ctx itself when d is 0.
func withDeadline(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// ids hands out request ids: a random prefix per run and a counter, unique
// without a call to crypto/rand per request (which would be client work the
// reference does not do).
type ids struct {
	on     bool
	prefix string
	n      atomic.Uint64
}

func newIDs(on bool) *ids {
	var b [6]byte
	_, _ = crand.Read(b[:])
	return &ids{on: on, prefix: "load-" + hex.EncodeToString(b[:]) + "-"}
}

func (i *ids) next() string {
	if !i.on {
		return ""
	}
	return i.prefix + strconv.FormatUint(i.n.Add(1), 10)
}

// admitOne is one Admit, recorded, and its Release after the hold when
// asked.
func admitOne(ctx context.Context, opts *Options, t Target, ids *ids, sh *shard, a Arrival) {
	req := &admissionv1.AdmitRequest{
		RequestId: ids.next(), Tenant: a.Tenant, Model: a.Model, PromptTokens: a.Prompt, MaxOutputTokens: a.Output,
		Priority: admissionv1.Priority_PRIORITY_NORMAL, AcceptDowngrade: opts.AcceptDowngrade,
	}
	cctx, cancel := withDeadline(ctx, opts.Deadline)
	t0 := time.Now()
	resp, err := t.Admit(cctx, req)
	lat := time.Since(t0)
	cancel()
	sh.mu.Lock()
	sh.st.calls++
	sh.st.recordAdmitLatency(lat)
	ts := sh.st.tenantOf(a)
	if err != nil {
		code := status.Code(err)
		sh.st.admitErrors[code]++
		sh.st.firstAdmitError.note(t0, err)
		ts.errors++
		sh.mu.Unlock()
		return
	}
	switch resp.GetDecision() {
	case admissionv1.Decision_ADMITTED:
		ts.admitted++
	case admissionv1.Decision_DEGRADED:
		ts.degraded++
	default:
		ts.refusals[reasonName(resp.GetReason())]++
	}
	if resp.GetDecision() != admissionv1.Decision_REJECTED {
		sh.st.recordQueued(resp.GetQueued().AsDuration())
	}
	lease := resp.GetLeaseId()
	if lease == "" {
		sh.mu.Unlock()
		return
	}
	if !opts.Release {
		sh.st.held++
		sh.mu.Unlock()
		return
	}
	sh.mu.Unlock()
	if opts.Hold > 0 && clock.Sleep(ctx, opts.Hold) != nil {
		sh.mu.Lock()
		sh.st.held++ // the run ended during the hold: the lease stays until its TTL
		sh.mu.Unlock()
		return
	}
	rctx, rcancel := withDeadline(ctx, opts.Deadline)
	t0 = time.Now()
	_, err = t.Release(rctx, &admissionv1.ReleaseRequest{LeaseId: lease, PromptTokens: a.Prompt, OutputTokens: a.Output,
		Outcome: admissionv1.Outcome_OUTCOME_OK})
	lat = time.Since(t0)
	rcancel()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.st.calls++
	sh.st.recordReleaseLatency(lat)
	if err != nil {
		sh.st.releaseErrors[status.Code(err)]++
		sh.st.firstReleaseError.note(t0, err)
		sh.st.held++
		return
	}
	sh.st.released++
}

// reasonName is a refusal reason without its enum prefix:
// "QUOTA_EXCEEDED".
func reasonName(r admissionv1.Reason) string {
	return strings.TrimPrefix(r.String(), "REASON_")
}

// maxShards bounds the recorders: each holds four HdrHistograms (a few
// hundred KB), and callers share them under a mutex that is rarely
// contended next to an RPC's tens of microseconds.
const maxShards = 8

// drive starts calls as opts says, each through do, and returns the merged
// stats and the run's length: from the first call's start to the last
// one's end.
func drive(ctx context.Context, opts *Options, do caller) (*stats, time.Duration, error) {
	nShards := maxShards
	if opts.Mode == ModeClosed {
		nShards = min(opts.Concurrency, maxShards)
	}
	shards := make([]*shard, nShards)
	for i := range shards {
		shards[i] = &shard{st: newStats()}
	}
	pick := opts.draw
	if pick == nil {
		pick = newPicker(opts)
	}
	cpu0 := sampleCPU(opts.ServerPID)
	start := time.Now()
	var err error
	switch opts.Mode {
	case ModeClosed:
		driveClosed(ctx, opts, do, pick, shards, start)
	default:
		err = driveOpen(ctx, opts, do, pick, shards, start)
	}
	elapsed := time.Since(start)
	cpu1 := sampleCPU(opts.ServerPID)
	if err != nil {
		return nil, 0, err
	}
	total := shards[0].st
	for _, sh := range shards[1:] {
		total.merge(sh.st)
	}
	total.clientCPU = cpu1.client - cpu0.client
	total.serverCPU, total.serverCPUKnown = cpu1.server-cpu0.server, cpu0.serverOK && cpu1.serverOK
	if ctx.Err() != nil {
		return total, elapsed, fmt.Errorf("load: stopped early: %w", ctx.Err())
	}
	return total, elapsed, nil
}

// driveClosed runs Concurrency callers until Duration has passed: each
// starts its next call as soon as the last one (with its hold and
// Release) ended. A call in flight when the time is up is finished, not
// cancelled, so that every call counted has its answer.
func driveClosed(ctx context.Context, opts *Options, do caller, pick *picker, shards []*shard, start time.Time) {
	var stop atomic.Bool
	timer := time.AfterFunc(opts.Duration, func() { stop.Store(true) })
	defer timer.Stop()
	var wg sync.WaitGroup
	for w := range opts.Concurrency {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(opts.Seed, uint64(w)))
			sh := shards[w%len(shards)]
			for !stop.Load() && ctx.Err() == nil {
				do(ctx, w, sh, pick.pick(rng))
			}
		})
	}
	wg.Wait()
}

// driveOpen starts one goroutine per arrival at its scheduled time (the
// open loop's gaps or the trace's offsets), at most MaxInFlight at once;
// an arrival that finds them all busy is dropped and counted. A late
// scheduler sends what is due at once and records how late in the start
// lag.
func driveOpen(ctx context.Context, opts *Options, do caller, pick *picker, shards []*shard, start time.Time) error {
	limit := opts.MaxInFlight
	if limit == 0 {
		limit = defaultMaxInFlight
	}
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	defer wg.Wait()
	rng := rand.New(rand.NewPCG(opts.Seed, math.MaxUint64))
	var at time.Duration
	for i := 0; ; i++ {
		var a Arrival
		if opts.Mode == ModeTrace {
			if i >= len(opts.Arrivals) {
				return nil
			}
			a = opts.Arrivals[i]
			at = a.At
		} else {
			gap := 1 / opts.Rate
			if opts.Poisson {
				gap = rng.ExpFloat64() / opts.Rate
			}
			at += time.Duration(gap * float64(time.Second))
			a = pick.pick(rng)
		}
		if opts.Duration > 0 && at >= opts.Duration {
			return nil
		}
		due := start.Add(at)
		if d := time.Until(due); d > 0 && clock.Sleep(ctx, d) != nil {
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		sh := shards[i%len(shards)]
		select {
		case sem <- struct{}{}:
		default:
			sh.mu.Lock()
			sh.st.dropped++
			sh.mu.Unlock()
			continue
		}
		lag := time.Since(due)
		sh.mu.Lock()
		sh.st.recordLag(lag)
		sh.mu.Unlock()
		wg.Go(func() {
			defer func() { <-sem }()
			do(ctx, i, sh, a)
		})
	}
}

// errCodeName is a gRPC code's name as grpc-go spells it ("Unavailable").
func errCodeName(c codes.Code) string { return c.String() }
