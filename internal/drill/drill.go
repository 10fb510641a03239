package drill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/controlplane"
	"github.com/sluice-sched/sluice/internal/load"
)

// Options say how a drill loads the fleet, how long its phases are and how
// strictly its promises are judged. Zero fields take the defaults of
// Defaults.
type Options struct {
	// Before, During and After are the phases' lengths: steady load, the
	// fault (it lasts at least as long as its stop takes), and after the
	// recovery action.
	Before, During, After time.Duration
	// Rate is the load's Poisson arrivals per second; Tenants its mix;
	// Prompt and Output each request's tokens; OutputWeight the config's
	// output_token_weight (a request costs Prompt + OutputWeight·Output).
	Rate           float64
	Tenants        []load.Mix
	Prompt, Output int64
	OutputWeight   int64
	// Arrivals, when set, are a trace's calls (tenants and models drawn,
	// sorted by At, timed for Rate): each load segment plays them from an
	// offset drawn by Seed, round again at the trace's end, in place of
	// Poisson arrivals of Prompt and Output tokens.
	Arrivals []load.Arrival
	// Deadline is each Admit's deadline; Hold how long a lease is held.
	Deadline, Hold time.Duration
	Seed           uint64
	// QuotaTenant is the tenant driven past its quota, whose admitted
	// tokens are held to [R·T·(1−Undershoot), R·T + burst + (N−1)·R·W].
	QuotaTenant string
	Undershoot  float64
	// Grace is how long after a drain mark (or a node's departure) the fleet
	// may still place there: one watch round-trip.
	Grace time.Duration
	// RecoverWithin bounds the time to recover: from the fault's end (the
	// recovery action done) to the first second of the mix's load back
	// within the promise: its share admitted at least RecoverFraction of
	// before's, its p50 and p99 Admit latency at most RecoverLatency times
	// before's plus RecoverSlack (before: the before phase less its first
	// second).
	RecoverWithin   time.Duration
	RecoverFraction float64
	RecoverLatency  float64
	RecoverSlack    time.Duration
	// LateBudget is the share of answers that may come past their deadline.
	LateBudget float64
	// FloorTolerance: a floor is held in a second when the tenant's admitted
	// tokens reach (1−FloorTolerance)·min(floor, offered).
	FloorTolerance float64
	// CreditTenant is credit-exhaustion's tenant, offered CreditOverload
	// times its token rate during the fault and CreditCalm times it
	// otherwise; BreakerOpen is its tier's burst_credit.breaker_open (taken
	// from Config when it is known).
	CreditTenant               string
	CreditOverload, CreditCalm float64
	BreakerOpen                time.Duration
	// RetryAfterTolerance bounds |answer time + retry_after − breaker
	// close| for BURST_CREDIT_EXHAUSTED answers.
	RetryAfterTolerance time.Duration
	// BurstTenants are deferred-burst's bursting tenants, each with its
	// share of BurstRate: the Admits per second they offer, interactive,
	// before and after the burst. The burst is BurstFactor times that for
	// BurstFor, every other request of it deferrable.
	BurstTenants []load.Mix
	BurstRate    float64
	BurstFactor  float64
	BurstFor     time.Duration
	// Workers is how many Claim streams deferred-burst's worker pool holds
	// on each replica, each with WorkerInFlight tickets at most, each
	// ticket run for WorkerRun before its Release.
	Workers, WorkerInFlight int
	WorkerRun               time.Duration
	// DrainWithin bounds the wait, from the burst's end, for every ticket
	// to be done.
	DrainWithin time.Duration
	// ShareTolerance: in a second in which two or more tenants are
	// backlogged on one replica, each one's share of the work claimed
	// there is within ShareTolerance of its weight's share.
	ShareTolerance float64
	// Config is the fleet's config, where the tenants' floors, quotas and
	// burst credit are read; nil: each tenant's replica is asked
	// (GetTenant), which in batched mode reports the replica's share of the
	// rate rather than the tenant's.
	Config *admission.Config
	// Log receives progress lines (nil: none).
	Log io.Writer
}

// Defaults are the options of the self-contained fleet (its config's tenants
// and breaker).
func Defaults() Options {
	return Options{
		Before: 3 * time.Second, During: 3 * time.Second, After: 4 * time.Second,
		Rate:    200,
		Tenants: []load.Mix{{Tenant: "gold", Model: "small", Share: 0.3}, {Tenant: "silver", Model: "small", Share: 0.2}, {Tenant: "bronze", Model: "small", Share: 0.5}},
		Prompt:  100, Output: 10, OutputWeight: 4,
		Deadline: 2 * time.Second, Hold: 50 * time.Millisecond, Seed: 1,
		QuotaTenant: "bronze", Undershoot: 0.10,
		Grace:         500 * time.Millisecond,
		RecoverWithin: 5 * time.Second, RecoverFraction: 0.85, RecoverLatency: 3, RecoverSlack: 5 * time.Millisecond,
		LateBudget: 0.01, FloorTolerance: 0.10,
		CreditTenant: "spiky", CreditOverload: 3, CreditCalm: 0.5, BreakerOpen: 3 * time.Second,
		RetryAfterTolerance: 250 * time.Millisecond,
		BurstTenants:        []load.Mix{{Tenant: "corpus", Model: "large", Share: 0.5}, {Tenant: "labels", Model: "large", Share: 0.5}},
		BurstRate:           30, BurstFactor: 15, BurstFor: 30 * time.Second,
		Workers: 2, WorkerInFlight: 8, WorkerRun: 160 * time.Millisecond,
		DrainWithin: 3 * time.Minute, ShareTolerance: 0.05,
	}
}

// Report is what one drill found.
type Report struct {
	Drill  string `json:"drill"`
	Target string `json:"target,omitempty"`
	Fleet  string `json:"fleet"`
	// Timeline lists what the drill did and saw, in seconds from its start.
	Timeline []Mark         `json:"timeline"`
	Phases   []*PhaseReport `json:"phases"`
	// Fault is when the fault was asked for, took hold and ended (nil: no
	// fault began).
	Fault *FaultSpan `json:"fault,omitempty"`
	// RecoverSeconds is the whole seconds from the fault's end to the first
	// second of the load back within the promise (Options.RecoverWithin);
	// nil when none was before the drill's end.
	RecoverSeconds *float64 `json:"timeToRecoverS"`
	// CapacityBackSeconds is, for kill-replica, the time from the kill
	// until the others held the killed replica's share of the domains'
	// KV again; nil when it did not come back within the promise.
	CapacityBackSeconds *float64 `json:"capacityBackS,omitempty"`
	// Deferred is deferred-burst's account of the burst and its backlog.
	Deferred *DeferredReport `json:"deferred,omitempty"`
	Promises []Promise       `json:"promises"`
	// Held is true when every promise held.
	Held bool `json:"held"`
}

// FaultSpan is a fault's asked and real span, in seconds from the drill's
// start: it began when its action did (the stop asked, the mark written,
// the overload started), held from when it took effect (the stop
// returned, the agent's record left etcd) and ended when the recovery
// action was done (the part started again, the mark deleted, the load
// calmed). SpanS is the real span, EndedS − HeldS; AskedS is --during,
// which a fault is held for from when it took effect.
type FaultSpan struct {
	AskedS float64 `json:"askedS"`
	BeganS float64 `json:"beganS"`
	HeldS  float64 `json:"heldS"`
	EndedS float64 `json:"endedS"`
	SpanS  float64 `json:"spanS"`
}

// Mark is one event of a drill's timeline.
type Mark struct {
	At   float64 `json:"atS"`
	What string  `json:"what"`
}

// Promise is one promise and whether it held.
type Promise struct {
	Name   string `json:"promise"`
	Held   bool   `json:"held"`
	Detail string `json:"detail"`
}

// PhaseReport measures one phase: answers by fate, latency, floors, the
// quota tenant and placements where none may go.
type PhaseReport struct {
	Name string  `json:"phase"`
	From float64 `json:"fromS"`
	To   float64 `json:"toS"`
	Sent int64   `json:"sent"`
	// Lost: Admits that got no decision (a gRPC error other than the
	// deadline); PastDeadline: Admits that got none before their deadline.
	Lost         int64 `json:"lost"`
	PastDeadline int64 `json:"pastDeadline"`
	Admitted     int64 `json:"admitted"`
	Rejected     int64 `json:"rejected"`
	// Deferred: deferrable Admits answered DEFERRED (a ticket, not a
	// placement: neither admitted nor refused).
	Deferred       int64            `json:"deferred,omitempty"`
	AdmittedPerSec float64          `json:"admittedPerS"`
	Refusals       map[string]int64 `json:"refusals,omitempty"`
	Errors         map[string]int64 `json:"errors,omitempty"`
	// P50Ms and P99Ms are the Admit latencies; the changes are relative to
	// the before phase (1.0: unchanged).
	P50Ms     float64  `json:"p50Ms"`
	P99Ms     float64  `json:"p99Ms"`
	P50Change *float64 `json:"p50Change,omitempty"`
	P99Change *float64 `json:"p99Change,omitempty"`
	// Floors: per floor tenant, the whole seconds in which it was held.
	Floors []FloorReport `json:"floors,omitempty"`
	Quota  *QuotaReport  `json:"quota,omitempty"`
	// Forbidden counts placements on the drained (or departed) domain of
	// requests sent after its mark and the grace.
	Forbidden *int64 `json:"placementsAfterMark,omitempty"`
	// OnTarget counts placements on the drill's domain.
	OnTarget      *int64           `json:"placementsOnDomain,omitempty"`
	ReleaseErrors map[string]int64 `json:"releaseErrors,omitempty"`
}

// FloorReport is one floor tenant in one phase.
type FloorReport struct {
	Tenant  string `json:"tenant"`
	Floor   int64  `json:"floor"`
	Held    int    `json:"secondsHeld"`
	Seconds int    `json:"seconds"`
}

// QuotaReport is the quota tenant in one phase: admitted weighted tokens
// against rate × the phase's length.
type QuotaReport struct {
	Tenant    string  `json:"tenant"`
	Admitted  int64   `json:"admittedTokens"`
	Quota     int64   `json:"quotaTokens"` // what one exact token bucket of its rate and burst, empty at the phase start, admits of the same requests
	Upper     int64   `json:"upperBoundTokens"`
	Overshoot float64 `json:"overshootPct"` // admitted over rate × the phase's length, the burst included
	Under     float64 `json:"undershootPct"`
	// Excess is the most the tenant had been admitted, at any instant of
	// the phase, beyond one exact token bucket of its rate and burst
	// charged the same admissions (full at the drill's start, its debt
	// forgiven at each phase's start); Bound is what the fleet's mode
	// allows beyond it (Mode, BoundText).
	Excess    int64  `json:"excessTokens"`
	Bound     int64  `json:"boundTokens"`
	Mode      string `json:"mode"`
	BoundText string `json:"bound"`
}

// policy is a tenant's floor, quota, credit and weight: from the config,
// or as its replica describes it.
type policy struct {
	floor, rate, burst, credit, weight int64
}

// run is one drill in progress.
type run struct {
	d      *drillSpec
	f      *Fleet
	o      Options
	target string // the drill's target, as given or picked
	part   Part   // what its fault stops, for target
	rep    *Report
	rec    *recorder
	t0     time.Time
	pols   map[string]policy
	mu     sync.Mutex
	fault  time.Duration // when the fault began
	held   time.Duration // when it took effect
	mend   time.Duration // when the recovery action began
	begun  time.Duration // when the recovery action ended: the after phase
	ended  time.Duration
	domain string        // the domain no placement may go to, from mark
	mark   time.Duration // when it became forbidden (-1: never)
	burst  *burstRun     // deferred-burst's workers and tickets
}

func (r *run) now() time.Duration { return time.Since(r.t0) }

func (r *run) note(format string, args ...any) {
	at := r.now()
	what := fmt.Sprintf(format, args...)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rep.Timeline = append(r.rep.Timeline, Mark{At: secs(at), What: what})
	if r.o.Log != nil {
		fmt.Fprintf(r.o.Log, "drill %s: %6.2fs %s\n", r.rep.Drill, secs(at), what)
	}
}

func secs(d time.Duration) float64 { return float64(d.Round(time.Millisecond)) / 1e9 }

// sleepUntil waits until offset at of the drill.
func (r *run) sleepUntil(ctx context.Context, at time.Duration) error {
	d := at - r.now()
	if d <= 0 {
		return ctx.Err()
	}
	return clock.Sleep(ctx, d)
}

// Run runs one drill on f. target is the drill's DOMAIN, NODE or replica ID
// ("" picks one: the busiest domain, its node, the replica of the first
// floor tenant). The report says which promises held; an error means the
// drill could not be run (a hook failed, the fleet did not answer).
func Run(ctx context.Context, f *Fleet, name, target string, o Options) (*Report, error) {
	d := drillNamed(name)
	if d == nil {
		return nil, fmt.Errorf("drill %q: want one of %v or all", name, Names)
	}
	if why := d.canRun(f); why != "" {
		return nil, errors.New(why)
	}
	if c := o.Config; c != nil {
		// The config is the truth where it speaks.
		if c.OutputTokenWeight > 0 {
			o.OutputWeight = c.OutputTokenWeight
		}
		if p, ok := c.Policy(o.CreditTenant); ok && p.BurstCredit.BreakerOpen.Duration > 0 {
			o.BreakerOpen = p.BurstCredit.BreakerOpen.Duration
		}
	}
	r := &run{d: d, f: f, o: o, target: target, t0: time.Now(), mark: -1, rep: &Report{Drill: name, Fleet: describe(f)}}
	r.rec = newRecorder(r.t0, f.Router, o.OutputWeight)
	if opts := r.loadOptions(); opts.Validate() != nil {
		// A segment's load.Run fails only here; say so before the fleet is
		// touched rather than run a drill without load.
		return nil, fmt.Errorf("load: %w", opts.Validate())
	}
	var err error
	if r.pols, err = r.policies(ctx); err != nil {
		return nil, err
	}
	if err := d.drive(r, ctx); err != nil {
		return r.rep, err
	}
	r.analyze(name)
	r.rep.Held = true
	for _, p := range r.rep.Promises {
		r.rep.Held = r.rep.Held && p.Held
	}
	return r.rep, nil
}

func describe(f *Fleet) string {
	s := fmt.Sprintf("%d replicas", f.Replicas)
	if f.Etcd != nil {
		s += ", etcd " + f.Prefix
	} else {
		s += ", no etcd (Operator API)"
	}
	if f.Local != nil {
		s = "self-contained: " + s + ", redis-server, agents " + fmt.Sprint(FleetNodes)
	}
	return s
}

// policies reads each tenant's floor and quota from the config, or else
// asks its replica.
func (r *run) policies(ctx context.Context) (map[string]policy, error) {
	out := map[string]policy{}
	names := []string{}
	for _, m := range r.o.Tenants {
		names = append(names, m.Tenant)
	}
	if r.d.credit {
		names = append(names, r.o.CreditTenant)
	}
	if r.d.burst {
		for _, m := range r.o.BurstTenants {
			names = append(names, m.Tenant)
		}
	}
	for _, n := range names {
		if c := r.o.Config; c != nil {
			p, ok := c.Policy(n)
			if !ok {
				return nil, fmt.Errorf("tenant %s: not in the fleet's config", n)
			}
			out[n] = policy{floor: p.Floor, rate: int64(p.Tokens.Rate), burst: int64(p.Tokens.Burst),
				credit: int64(p.BurstCredit.Multiple * p.Tokens.Rate), weight: max(p.Weight, 1)}
			continue
		}
		ti, err := r.tenantInfo(ctx, n)
		if err != nil {
			return nil, err
		}
		out[n] = policy{floor: ti.GetFloorTokens(), rate: ti.GetTokenRate(), burst: ti.GetTokenBurst(), credit: ti.GetCredit(),
			weight: max(ti.GetWeight(), 1)}
	}
	return out, nil
}

// loadOptions is the steady load of the drill's mix.
func (r *run) loadOptions() load.Options {
	o := load.Options{Mode: load.ModeOpen, Rate: r.o.Rate, Poisson: true, Tenants: r.o.Tenants,
		Prompt: r.o.Prompt, Output: r.o.Output, Deadline: r.o.Deadline, Hold: r.o.Hold, Release: true,
		RequestIDs: true, Seed: r.o.Seed, Duration: time.Hour}
	if len(r.o.Arrivals) > 0 {
		// A segment runs the drill's phases, and a fault may outlast
		// --during by its stop's time (a departing agent's record: up to
		// 30 s): twice the phases and a minute more cover any drill.
		o.Mode, o.Arrivals = load.ModeTrace, traceFrom(r.o.Arrivals, r.o.Seed, 2*(r.o.Before+r.o.During+r.o.After)+time.Minute)
	}
	return o
}

// traceFrom returns trace's arrivals from an offset drawn by seed to its
// end, then round again from its start, as many times as it takes to
// cover cover, timed from the offset: each drill hears another stretch of
// the trace.
func traceFrom(trace []load.Arrival, seed uint64, cover time.Duration) []load.Arrival {
	span := trace[len(trace)-1].At + time.Millisecond // the last call and the first of the next lap are not at one instant
	offset := time.Duration(rand.New(rand.NewPCG(seed, 0x7ace)).Int64N(int64(span)))
	var out []load.Arrival
	for lap := time.Duration(0); lap*span-offset < cover; lap++ {
		for _, a := range trace {
			if a.At += lap*span - offset; a.At >= 0 && a.At < cover {
				out = append(out, a)
			}
		}
	}
	return out
}

// drainWait is how long a stopped segment waits for its calls and leases.
func (r *run) drainWait() time.Duration { return r.o.Deadline + r.o.Hold + 3*time.Second }

// faultDrill runs the drills that break something and mend it: before,
// the fault, during, the recovery, after.
func (r *run) faultDrill(ctx context.Context) error {
	seg := startSegment(ctx, r.rec, r.loadOptions())
	defer seg.stop(r.drainWait())
	arrivals := "(Poisson)"
	if len(r.o.Arrivals) > 0 {
		arrivals = "(a trace's arrivals and tokens)"
	}
	r.note("load: %.0f Admits/s %s over %s, deadline %v, hold %v", r.o.Rate, arrivals, mixString(r.o.Tenants), r.o.Deadline, r.o.Hold)
	if err := r.sleepUntil(ctx, r.o.Before); err != nil {
		return err
	}
	if r.target == "" && r.d.pick != nil {
		var err error
		if r.target, err = r.d.pick(r); err != nil {
			return err
		}
	}
	r.rep.Target = r.target
	if r.d.part != nil {
		r.part = r.d.part(r.target)
	}
	// The recovery action undoes the fault. Interrupted before it ran
	// (Ctrl-C), it still runs, on a context of its own: a fleet the drill
	// did not start must not be left drained or without its Redis.
	mended := false
	defer func() {
		if !mended {
			mctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := r.d.mend(r, mctx); err != nil {
				r.note("undoing the fault after the interruption failed: %v", err)
			}
		}
	}()
	r.fault = r.now()
	w, err := r.d.fault(r, ctx)
	if err != nil {
		return err
	}
	if w.wait != nil {
		defer w.wait()
	}
	// The fault is held for --during from when it took effect, however
	// long its action took (a stop that waits, a record's TTL).
	r.held = r.now()
	if err := r.sleepUntil(ctx, r.held+r.o.During); err != nil {
		return err
	}
	if w.stop != nil {
		w.stop()
	}
	r.mend = r.now()
	if err := r.d.mend(r, ctx); err != nil {
		return err // the deferred undo tries again on a context of its own
	}
	mended = true
	if r.d.afterMend != nil {
		defer r.d.afterMend(r, ctx)()
	}
	r.begun = r.now()
	if err := r.sleepUntil(ctx, r.begun+r.o.After); err != nil {
		return err
	}
	r.ended = r.now()
	r.note("load stops; waiting for the calls and leases outstanding")
	return nil
}

// stopPart stops the drill's part, noting it on the timeline.
func (r *run) stopPart(ctx context.Context) error {
	r.note("stop %s", r.part)
	if err := r.f.Faults.Stop(ctx, r.part); err != nil {
		return err
	}
	r.note("%s stopped", r.part)
	return nil
}

// startPart starts the drill's part again: the recovery action of the
// drills that stop one.
func (r *run) startPart(ctx context.Context) error {
	r.note("start %s", r.part)
	if err := r.f.Faults.Start(ctx, r.part); err != nil {
		return err
	}
	r.note("%s started", r.part)
	return nil
}

// stopFault stops the part and watches nothing.
func (r *run) stopFault(ctx context.Context) (watch, error) { return watch{}, r.stopPart(ctx) }

// drainFault drains the target domain (forbidden from its mark) and
// watches every replica apply the drain until the recovery action.
func (r *run) drainFault(ctx context.Context) (watch, error) {
	r.domain = r.target
	r.mark = r.now()
	if err := r.drain(ctx, r.target, true); err != nil {
		return watch{}, err
	}
	return watch{stop: r.watchDrainApplied(ctx, r.target)}, nil
}

// agentFault stops the target node's agent and waits for its record to
// leave etcd: from then its GPUs leave capacity, and its domain, when the
// node is the domain's only one, is forbidden.
func (r *run) agentFault(ctx context.Context) (watch, error) {
	dom, alone, err := r.nodeDomain(ctx, r.target)
	if err != nil {
		return watch{}, err
	}
	r.rep.Target = r.target + " (domain " + dom + ")"
	if alone {
		r.domain = dom
	}
	gone := r.watchAgentGone(ctx, r.target)
	if err := r.stopPart(ctx); err != nil {
		return watch{}, err
	}
	select {
	case at := <-gone:
		r.mark = at
		r.note("agent %s's record left etcd (at %.2fs): its GPUs leave capacity", r.target, secs(at))
	case <-time.After(30 * time.Second):
		return watch{}, fmt.Errorf("agent %s: its record is still in etcd 30s after the stop", r.target)
	case <-ctx.Done():
		return watch{}, ctx.Err()
	}
	return watch{}, nil
}

// replicaFault stops the target replica and watches its share of the
// domains' KV come back to the others until the drill's end.
func (r *run) replicaFault(ctx context.Context) (watch, error) {
	// What the replicas hold of each domain's KV before the kill: the
	// killed one's share must come back to the others.
	before := r.kvLimits(ctx)
	lease := r.memberLease(ctx, r.target)
	if err := r.stopPart(ctx); err != nil {
		return watch{}, err
	}
	killed := r.now()
	r.noteMemberLease(ctx, r.target, lease)
	return watch{wait: r.watchReclaim(ctx, r.target, before, killed)}, nil
}

// busiestDomain is the domain with the most placements before the fault.
func (r *run) busiestDomain() (string, error) {
	answers, _ := r.rec.snapshot()
	count := map[string]int{}
	for _, a := range answers {
		if a.admitted() && a.domain != "" {
			count[a.domain]++
		}
	}
	if len(count) == 0 {
		return "", errors.New("no placement before the fault: cannot pick a domain (give one)")
	}
	doms := slices.Sorted(maps.Keys(count))
	best := doms[0]
	for _, d := range doms {
		if count[d] > count[best] {
			best = d
		}
	}
	return best, nil
}

// drain writes (or deletes) the domain's drain mark in etcd, or without
// etcd calls every replica's Operator API.
func (r *run) drain(ctx context.Context, domain string, on bool) error {
	verb := map[bool]string{true: "drain", false: "undrain"}[on]
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if r.f.Etcd != nil {
		var err error
		if on {
			_, err = controlplane.PutDrain(cctx, r.f.Etcd, r.f.Prefix, controlplane.DrainMark{Domain: domain,
				Reason: "sluicectl drill", By: "sluicectl drill", At: time.Now().UTC()})
		} else {
			_, err = controlplane.DeleteDrain(cctx, r.f.Etcd, r.f.Prefix, domain)
		}
		if err != nil {
			return err
		}
		r.note("%s %s: mark %s in etcd", verb, domain, map[bool]string{true: "written", false: "deleted"}[on])
		return nil
	}
	for _, m := range r.f.members() {
		op, err := r.f.operator(m.Addr)
		if err != nil {
			return err
		}
		if on {
			_, err = op.DrainDomain(cctx, &admissionv1.DrainDomainRequest{Domain: domain, Reason: "sluicectl drill"})
		} else {
			_, err = op.UndrainDomain(cctx, &admissionv1.UndrainDomainRequest{Domain: domain})
		}
		if err != nil {
			return fmt.Errorf("%s %s on replica %s: %w", verb, domain, m.ID, err)
		}
	}
	r.note("%s %s: Operator API of %d replicas", verb, domain, len(r.f.members()))
	return nil
}

// watchDrainApplied polls every replica's ListDomains until each shows the
// domain draining, and notes when; the returned func stops it.
func (r *run) watchDrainApplied(ctx context.Context, domain string) func() {
	return r.watchDomain(ctx, domain, (*admissionv1.DomainInfo).GetDraining,
		func(seen map[string]*admissionv1.DomainInfo) {
			n := len(seen)
			r.note("every replica (%d) shows %s draining", n, domain)
			r.promise(Promise{Name: "drain applied within the grace", Held: r.now()-r.mark <= r.o.Grace,
				Detail: fmt.Sprintf("%d replicas draining %.0f ms after the mark (grace %v)", n, float64(r.now()-r.mark)/1e6, r.o.Grace)})
		},
		func(map[string]*admissionv1.DomainInfo) {
			r.promise(Promise{Name: "drain applied within the grace", Held: false,
				Detail: "some replica never showed the domain draining during the drain"})
		})
}

// watchWarmup polls every replica's ListDomains until each shows the
// undrained domain back, and records whether each ramps it (a warm-up
// fraction under 1, warmup.start_fraction rising to 1 over warmup.period)
// rather than giving it its whole capacity at once; with warm-up off in
// the fleet's config there is nothing to see. The returned func stops it.
func (r *run) watchWarmup(ctx context.Context, domain string) func() {
	if c := r.o.Config; c != nil && (c.Warmup.StartFraction >= 1 || (c.Warmup.Period != nil && c.Warmup.Period.Duration == 0)) {
		r.note("warm-up is off in the fleet's config: %s returns whole", domain)
		return func() {}
	}
	back := func(d *admissionv1.DomainInfo) bool { return !d.GetDraining() }
	return r.watchDomain(ctx, domain, back,
		func(seen map[string]*admissionv1.DomainInfo) {
			held, parts := true, []string{}
			for _, id := range sortedKeys(seen) {
				f := seen[id].GetWarmupFraction()
				held = held && f < 1
				parts = append(parts, fmt.Sprintf("%s %.0f%%", id, 100*f))
			}
			r.note("every replica (%d) has %s back: capacity %s", len(seen), domain, strings.Join(parts, ", "))
			r.promise(Promise{Name: "returning domain warms up", Held: held,
				Detail: fmt.Sprintf("share of its capacity when back: %s (whole would be 100%%)", strings.Join(parts, ", "))})
		},
		func(seen map[string]*admissionv1.DomainInfo) {
			r.promise(Promise{Name: "returning domain warms up", Held: false,
				Detail: fmt.Sprintf("%d of %d replicas showed %s back during the after phase", len(seen), len(r.f.members()), domain)})
		})
}

// watchDomain polls every replica's ListDomains every 50 ms until each has
// shown domain in a state shows accepts, then calls done with what each
// showed first; stopped before (the returned func), it calls never with
// those seen so far.
func (r *run) watchDomain(ctx context.Context, domain string, shows func(*admissionv1.DomainInfo) bool,
	done, never func(seen map[string]*admissionv1.DomainInfo)) func() {
	ctx, cancel := context.WithCancel(ctx)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		seen := map[string]*admissionv1.DomainInfo{}
		for ctx.Err() == nil {
			members := r.f.members()
			for _, m := range members {
				if seen[m.ID] == nil {
					if d := r.domainOn(ctx, m.Addr, domain); d != nil && shows(d) {
						seen[m.ID] = d
					}
				}
			}
			if len(members) > 0 && len(seen) == len(members) {
				done(seen)
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
		never(seen)
	}()
	return func() { cancel(); <-finished }
}

// domainOn is domain as the replica at addr lists it, or nil when it does
// not answer or list it.
func (r *run) domainOn(ctx context.Context, addr, domain string) *admissionv1.DomainInfo {
	op, err := r.f.operator(addr)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := op.ListDomains(ctx, &admissionv1.ListDomainsRequest{})
	if err != nil {
		return nil
	}
	for _, d := range resp.GetDomains() {
		if d.GetId() == domain {
			return d
		}
	}
	return nil
}

// promise adds p to the report; the watchers add theirs from their own
// goroutines.
func (r *run) promise(p Promise) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rep.Promises = append(r.rep.Promises, p)
}

// nodeDomain reads the agent's record: its domain, and whether the node is
// the domain's only one (then the domain leaves with it).
func (r *run) nodeDomain(ctx context.Context, node string) (string, bool, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := r.f.Etcd.Get(cctx, controlplane.AgentKey(r.f.Prefix, ""), clientv3.WithPrefix())
	if err != nil {
		return "", false, fmt.Errorf("read the agents' records: %w", err)
	}
	doms := map[string]string{}
	for _, kv := range resp.Kvs {
		var rec controlplane.AgentRecord
		if json.Unmarshal(kv.Value, &rec) != nil {
			continue
		}
		d := rec.Domain
		if d == "" {
			d = rec.Node
		}
		doms[rec.Node] = d
	}
	dom, ok := doms[node]
	if !ok {
		return "", false, fmt.Errorf("agent %q: no record in etcd (nodes: %v)", node, slices.Sorted(maps.Keys(doms)))
	}
	alone := true
	for n, d := range doms {
		alone = alone && (n == node || d != dom)
	}
	return dom, alone, nil
}

// watchAgentGone sends the time the node's record leaves etcd.
func (r *run) watchAgentGone(ctx context.Context, node string) <-chan time.Duration {
	out := make(chan time.Duration, 1)
	key := controlplane.AgentKey(r.f.Prefix, node)
	go func() {
		for ctx.Err() == nil {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			resp, err := r.f.Etcd.Get(cctx, key, clientv3.WithCountOnly())
			cancel()
			if err == nil && resp.Count == 0 {
				out <- r.now()
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return out
}

func mixString(m []load.Mix) string {
	s := ""
	for i, x := range m {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf("%s:%s:%.2g", x.Tenant, x.Model, x.Share)
	}
	return s
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for x := range m {
		k = append(k, x)
	}
	sort.Strings(k)
	return k
}
