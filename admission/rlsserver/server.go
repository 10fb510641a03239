package rlsserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/clock"
)

// ServiceName is the RLS service's gRPC name, under which the health
// service reports it.
var ServiceName = rlsv3.RateLimitService_ServiceDesc.ServiceName

// Engine is the port the RLS handler drives; the admission engine satisfies
// it. Its methods must be safe for concurrent use.
type Engine interface {
	// Admit decides one request.
	Admit(ctx context.Context, req admission.Request) (admission.Decision, error)
	// Release ends a lease; the handler releases every admission at once.
	Release(ctx context.Context, rel admission.Release) (admission.ReleaseResult, error)
	// Tenant describes a tenant (its token limit, for the RateLimit-Policy
	// header); false if it is not configured.
	Tenant(name string) (admission.TenantInfo, bool)
	// Explain answers what Admit would do, charging nothing: a check.
	Explain(ctx context.Context, req admission.Request) (admission.Explanation, error)
	// ChargeUsage charges tokens already used to a tenant, never refused.
	ChargeUsage(u admission.Usage) (admission.UsageResult, error)
}

// TenantGuard decides whether the caller in ctx may act for tenant: nil to
// go on, or a status error (PERMISSION_DENIED) to refuse. The auth
// interceptor cannot see the tenants inside descriptors, so the handler asks
// the guard (in sluiced, auth.CheckTenant) for each one.
type TenantGuard func(ctx context.Context, tenant string) error

// Options configure the RLS service. The zero value accepts any domain, reads
// the default descriptor keys, never queues, and checks no tenant binding.
type Options struct {
	// Domain, when set, is the only RLS domain accepted; any other is
	// INVALID_ARGUMENT. Empty accepts whatever the request names.
	Domain string
	// Descriptor entry keys: tenant (default "tenant"), model ("model"),
	// prompt tokens ("prompt_tokens"), max output tokens
	// ("max_output_tokens"), accepted lower tiers ("accept_downgrade",
	// comma separated) and usage ("usage": its value, "prompt" or
	// "output", marks a descriptor that settles tokens used, counted by
	// hits_addend; see doc.go).
	TenantKey, ModelKey, PromptKey, OutputKey, DowngradeKey, UsageKey string
	// DefaultModel is the model of a descriptor without a model entry;
	// empty makes such a descriptor INVALID_ARGUMENT.
	DefaultModel string
	// MaxWait is how long a request may wait in the fair queue (never past
	// the call's deadline); 0 answers at once.
	MaxWait time.Duration
	// OutputTokenWeight is the config's output_token_weight to start from
	// (default 4); the handler follows the engine's if a reload changes it.
	OutputTokenWeight int64
	// Guard checks each descriptor's tenant against the caller; nil: no check.
	Guard TenantGuard
	// Clock must be the engine's clock (deadlines are compared with it);
	// default real.
	Clock clock.Clock
	// Logger receives failed releases; default slog.Default().
	Logger *slog.Logger
}

// Default descriptor keys.
const (
	DefaultTenantKey    = "tenant"
	DefaultModelKey     = "model"
	DefaultPromptKey    = "prompt_tokens"
	DefaultOutputKey    = "max_output_tokens"
	DefaultDowngradeKey = "accept_downgrade"
	DefaultUsageKey     = "usage"
)

// Values of the usage entry: what its descriptor's hits_addend counts.
const (
	UsagePrompt = "prompt"
	UsageOutput = "output"
)

const (
	// maxDescriptors and maxEntries bound what one call may ask: Envoy
	// sends a handful, and errors echo positions.
	maxDescriptors = 64
	maxEntries     = 64
	// maxTokens bounds token counts before any arithmetic; the engine's
	// own limits (max_prompt_tokens, max_output_tokens) are far below.
	maxTokens = 1 << 40
	// policyTTL is how long a tenant's limit is cached for its headers: a
	// reload shows in the headers within this time.
	policyTTL = time.Second
)

// Server implements Envoy's RateLimitService over an Engine.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	eng    Engine
	opts   Options
	weight atomic.Int64 // the engine's output_token_weight, as last seen
	// policies caches each known tenant's token limit (*policy) for the
	// RateLimit-Policy header, so that an answer takes the engine's lock
	// once, for the decision.
	policies sync.Map
}

// New returns the RLS handler over eng. Options with two keys the same are
// an error.
func New(eng Engine, opts Options) (*Server, error) {
	for _, k := range []struct {
		p   *string
		def string
	}{
		{&opts.TenantKey, DefaultTenantKey}, {&opts.ModelKey, DefaultModelKey}, {&opts.PromptKey, DefaultPromptKey},
		{&opts.OutputKey, DefaultOutputKey}, {&opts.DowngradeKey, DefaultDowngradeKey}, {&opts.UsageKey, DefaultUsageKey},
	} {
		if *k.p == "" {
			*k.p = k.def
		}
	}
	keys := []string{opts.TenantKey, opts.ModelKey, opts.PromptKey, opts.OutputKey, opts.DowngradeKey, opts.UsageKey}
	for i, a := range keys {
		for _, b := range keys[i+1:] {
			if a == b {
				return nil, fmt.Errorf("rls: descriptor key %q is used for two entries", a)
			}
		}
	}
	if opts.MaxWait < 0 {
		return nil, fmt.Errorf("rls: max wait %v is negative", opts.MaxWait)
	}
	if opts.OutputTokenWeight <= 0 {
		opts.OutputTokenWeight = 4
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{eng: eng, opts: opts}
	s.weight.Store(opts.OutputTokenWeight)
	return s, nil
}

// Register serves the RLS handler over eng on s (see New).
func Register(s grpc.ServiceRegistrar, eng Engine, opts Options) (*Server, error) {
	srv, err := New(eng, opts)
	if err != nil {
		return nil, err
	}
	rlsv3.RegisterRateLimitServiceServer(s, srv)
	return srv, nil
}

// item is one descriptor turned into an admission request.
type item struct {
	req       admission.Request
	kind      itemKind
	hasTenant bool
	fromHits  bool   // the prompt count came from hits_addend (errors name it)
	hits      uint64 // hits_addend as sent, when fromHits
	weight    int64  // the output weight the prompt count was derived with, when fromHits
	used      int64  // settling: the tokens used, prompt or output by usedOutput
	// usedOutput: settling, the tokens used are output tokens.
	usedOutput bool
}

// itemKind is what a descriptor asks (doc.go).
type itemKind uint8

const (
	// deciding: an Admit, settled at once at its admitted cost.
	deciding itemKind = iota
	// checking: a descriptor whose own hits_addend is 0: what Admit would
	// answer, with nothing charged.
	checking
	// settling: a descriptor with the usage entry: tokens already used,
	// charged to the tenant and never refused.
	settling
)

// ShouldRateLimit implements rlsv3.RateLimitServiceServer: every descriptor
// with a tenant is decided by the engine and settled at once (doc.go).
func (s *Server) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if s.opts.Domain != "" && in.GetDomain() != s.opts.Domain {
		return nil, invalidArgument("domain", fmt.Sprintf("this server answers domain %q only", s.opts.Domain))
	}
	descs := in.GetDescriptors()
	switch {
	case len(descs) == 0:
		return nil, invalidArgument("descriptors", "must not be empty")
	case len(descs) > maxDescriptors:
		return nil, invalidArgument("descriptors", fmt.Sprintf("at most %d", maxDescriptors))
	}
	// Every descriptor is parsed and its tenant checked before any is
	// decided, so that a refused call charges nothing. The items and the
	// decisions live in the answer, on the heap: the handler's frames stay
	// small, so that the engine's deep call fits the goroutine's stack
	// without growing it (a copy on every call, gRPC serving each on a new
	// goroutine).
	a := newAnswer(len(descs))
	items := a.items[:0]
	if len(descs) > 1 {
		items = make([]item, 0, len(descs))
	}
	w := s.weight.Load()
	for i, d := range descs {
		items = append(items, item{})
		it := &items[i]
		if err := s.parse(i, d, in.GetHitsAddend(), w, it); err != nil {
			return nil, err
		}
		if it.hasTenant && s.opts.Guard != nil {
			if err := s.opts.Guard(ctx, it.req.Tenant); err != nil {
				return nil, err
			}
		}
	}
	if err := s.decideAll(ctx, a, items); err != nil {
		return nil, err
	}
	return &a.resp, nil
}

// decideAll decides every item into a: the statuses, the overall code and
// the headers of the deciding descriptor (the first OVER_LIMIT one, else the
// first with a tenant). Checks and settlements place nothing, so their
// answers name no domain.
func (s *Server) decideAll(ctx context.Context, a *answer, items []item) error {
	now := s.opts.Clock.Now()
	deadline := now.Add(s.opts.MaxWait)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	decider := -1
	var decidedPolicy *policy
	decidedPlaced := false
	d := &a.cur
	for i := range items {
		it := &items[i]
		st := a.resp.Statuses[i]
		if !it.hasTenant {
			st.Code = rlsv3.RateLimitResponse_UNKNOWN
			continue
		}
		var err error
		switch {
		case it.req.Tenant == "": // an empty header names nobody
			*d = admission.Decision{Outcome: admission.Rejected, Reason: admission.ReasonUnknownTenant}
		case it.kind == settling:
			err = s.settleUsage(it, d)
		case it.kind == checking:
			it.req.Deadline = now // nothing is held for a check to wait for
			err = s.check(ctx, it, d)
		default:
			it.req.Deadline = deadline
			err = s.decide(ctx, it, d)
		}
		if err != nil {
			return s.statusFromError(i, it, err)
		}
		var pol *policy
		if d.Reason != admission.ReasonUnknownTenant {
			pol = s.policy(it.req.Tenant, now)
		}
		a.fillStatus(i, d, pol)
		over := st.Code == rlsv3.RateLimitResponse_OVER_LIMIT
		if decider < 0 || (over && a.resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT) {
			decider, decidedPolicy, decidedPlaced = i, pol, it.kind == deciding
			if len(items) > 1 {
				if a.decided == nil {
					a.decided = new(admission.Decision)
				}
				*a.decided = *d
			}
		}
		if over {
			a.resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	if a.resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		a.resp.OverallCode = rlsv3.RateLimitResponse_OK
	}
	if decider >= 0 {
		if len(items) > 1 {
			d = a.decided
		}
		a.headers(d, decidedPolicy, decidedPlaced)
	}
	return nil
}

// parse reads descriptor i. A descriptor without a tenant entry is returned
// with hasTenant false and nothing else checked.
func (s *Server) parse(i int, d *ratelimitv3.RateLimitDescriptor, reqHits uint32, w int64, it *item) error {
	entries := d.GetEntries()
	if len(entries) > maxEntries {
		return invalidArgument(fmt.Sprintf("descriptors[%d].entries", i), fmt.Sprintf("at most %d", maxEntries))
	}
	var prompt, output, accept, usage string
	var havePrompt, haveOutput, haveModel, haveUsage bool
	o := &s.opts
	// The first entry of each key counts, as the most general level of
	// Envoy's hierarchical descriptors comes first.
	for _, e := range entries {
		switch k := e.GetKey(); {
		case k == o.TenantKey && !it.hasTenant:
			it.hasTenant, it.req.Tenant = true, e.GetValue()
		case k == o.ModelKey && !haveModel:
			haveModel, it.req.Model = true, e.GetValue()
		case k == o.PromptKey && !havePrompt:
			havePrompt, prompt = true, e.GetValue()
		case k == o.OutputKey && !haveOutput:
			haveOutput, output = true, e.GetValue()
		case k == o.DowngradeKey && accept == "":
			accept = e.GetValue()
		case k == o.UsageKey && !haveUsage:
			haveUsage, usage = true, e.GetValue()
		}
	}
	if !it.hasTenant {
		return nil
	}
	if d.GetIsNegativeHits() {
		return invalidArgument(fmt.Sprintf("descriptors[%d].is_negative_hits", i), "refunds are not supported: an RLS admission is settled when it is answered")
	}
	if !haveModel {
		if o.DefaultModel == "" {
			return invalidArgument(fmt.Sprintf("descriptors[%d].%s", i, o.ModelKey), "no entry, and no default model is configured")
		}
		it.req.Model = o.DefaultModel
	}
	sent := uint64(reqHits)
	if h := d.GetHitsAddend(); h != nil {
		sent = h.GetValue()
	}
	if haveUsage {
		return s.parseUsage(i, usage, sent, it)
	}
	if h := d.GetHitsAddend(); h != nil && h.GetValue() == 0 {
		// Envoy's request-level hits_addend is 0 when unset; only the
		// descriptor's own, set to 0, asks to charge nothing.
		it.kind = checking
	}
	hits := min(max(sent, 1), maxTokens)
	it.req.MaxOutputTokens = 1
	if haveOutput {
		n, err := parseTokens(i, o.OutputKey, output)
		if err != nil {
			return err
		}
		it.req.MaxOutputTokens = n
	}
	if havePrompt {
		n, err := parseTokens(i, o.PromptKey, prompt)
		if err != nil {
			return err
		}
		it.req.PromptTokens = n
	} else {
		it.fromHits, it.hits, it.weight = true, sent, w
		it.req.PromptTokens = max(1, int64(hits)-w*it.req.MaxOutputTokens)
	}
	if accept != "" {
		it.req.AcceptDowngrade = strings.Split(accept, ",")
		for j, m := range it.req.AcceptDowngrade {
			it.req.AcceptDowngrade[j] = strings.TrimSpace(m)
		}
	}
	return nil
}

// parseUsage reads a settling descriptor i: value is its usage entry's
// (what the hits count), hits its hits_addend (the descriptor's, else the
// request's; 0 charges nothing).
func (s *Server) parseUsage(i int, value string, hits uint64, it *item) error {
	switch value {
	case UsagePrompt:
	case UsageOutput:
		it.usedOutput = true
	default:
		return invalidArgument(fmt.Sprintf("descriptors[%d].%s", i, s.opts.UsageKey),
			fmt.Sprintf("must be %q or %q (what hits_addend counts), got %q", UsagePrompt, UsageOutput, clip(value)))
	}
	it.kind, it.used = settling, int64(min(hits, maxTokens))
	return nil
}

// parseTokens reads a token count entry: a decimal integer in [1, 2^40].
func parseTokens(i int, key, v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 || n > maxTokens {
		return 0, invalidArgument(fmt.Sprintf("descriptors[%d].%s", i, key), fmt.Sprintf("must be a whole number of tokens in [1, %d], got %q", int64(maxTokens), clip(v)))
	}
	return n, nil
}

// decide admits one request into d and settles an admission at once, at
// its admitted cost.
func (s *Server) decide(ctx context.Context, it *item, d *admission.Decision) error {
	var err error
	if *d, err = s.eng.Admit(ctx, it.req); err != nil {
		return err
	}
	s.learnWeight(it, d)
	if d.Outcome == admission.Rejected {
		return nil
	}
	s.settle(ctx, it, d.LeaseID)
	return nil
}

// check answers a checking item into d from Explain: what Admit would
// answer now, with nothing charged; a request that would wait is
// DEADLINE_UNMEETABLE with the wait Explain estimates, as Admit answers
// a request without time to wait. The quota shown is the tenant's as it
// stands.
func (s *Server) check(ctx context.Context, it *item, d *admission.Decision) error {
	x, err := s.eng.Explain(ctx, it.req)
	if err != nil {
		return err
	}
	*d = admission.Decision{Domain: x.Domain, Model: x.Model}
	switch x.Outcome {
	case admission.Admitted.String():
		d.Outcome = admission.Admitted
	case admission.Degraded.String():
		d.Outcome = admission.Degraded
	case "QUEUED":
		d.Outcome, d.Reason, d.RetryAfter = admission.Rejected, admission.ReasonDeadlineUnmeetable, x.EstimatedWait
	default:
		d.Outcome, d.Reason, d.RetryAfter = admission.Rejected, x.Reason, x.RetryAfter
	}
	for _, g := range x.Gates {
		if g.Gate == "tokens" && g.Reached {
			d.Trace.QuotaAfter = g.Before
		}
	}
	return nil
}

// settleUsage charges a settling item's tokens to its tenant and answers
// OK with what remains: the request ran, so nothing is refused. Only a
// tenant that is not configured is OVER_LIMIT (UNKNOWN_TENANT), as in a
// decision.
func (s *Server) settleUsage(it *item, d *admission.Decision) error {
	u := admission.Usage{Tenant: it.req.Tenant, Model: it.req.Model}
	if it.usedOutput {
		u.OutputTokens = it.used
	} else {
		u.PromptTokens = it.used
	}
	res, err := s.eng.ChargeUsage(u)
	switch {
	case errors.Is(err, admission.ErrUnknownTenant):
		*d = admission.Decision{Outcome: admission.Rejected, Reason: admission.ReasonUnknownTenant}
		return nil
	case err != nil:
		return err
	}
	*d = admission.Decision{Outcome: admission.Admitted, Model: it.req.Model}
	d.Trace.QuotaAfter = res.QuotaAfter
	return nil
}

// settle releases an admission with the counts it was admitted with: the
// tenant and the domain keep exactly the admitted charge; the lease and its
// KV go. It runs on a context of its own, since the caller's cancellation
// must not stop it (the engine bounds a shared store's call itself).
func (s *Server) settle(ctx context.Context, it *item, lease uint64) {
	_, err := s.eng.Release(context.Background(), admission.Release{
		LeaseID:      lease,
		PromptTokens: it.req.PromptTokens,
		OutputTokens: it.req.MaxOutputTokens,
		Outcome:      admission.ReleaseUnobserved,
	})
	if err != nil {
		// The lease then expires at its TTL as if fully used: the same
		// charge, only held longer. The answer stands.
		s.opts.Logger.ErrorContext(ctx, "rls: releasing an admission failed; it will expire at its TTL",
			"tenant", it.req.Tenant, "lease", lease, "err", err)
	}
}

// learnWeight follows the engine's output_token_weight, which a reload may
// change: the trace's weighted tokens are prompt + w·output.
func (s *Server) learnWeight(it *item, d *admission.Decision) {
	wt := d.Trace.WeightedTokens
	if wt <= 0 || !it.fromHits {
		return
	}
	if w := (wt - it.req.PromptTokens) / it.req.MaxOutputTokens; w >= 1 && w != s.weight.Load() {
		s.weight.Store(w)
	}
}

// statusFromError maps an engine error for descriptor i to a gRPC status,
// naming the descriptor's entry instead of Admit's field.
func (s *Server) statusFromError(i int, it *item, err error) error {
	var ia *admission.InvalidArgumentError
	switch {
	case errors.As(err, &ia) && ia != nil:
		field, reason := ia.Field, ia.Reason
		switch {
		case field == "tenant":
			field = s.opts.TenantKey
		case field == "model":
			field = s.opts.ModelKey
		case field == "prompt_tokens" && it.fromHits:
			field, reason = "hits_addend", hitsReason(it, ia)
		case field == "prompt_tokens":
			field = s.opts.PromptKey
		case field == "max_output_tokens":
			field = s.opts.OutputKey
		case strings.HasPrefix(field, "accept_downgrade"):
			field = s.opts.DowngradeKey
		}
		return invalidArgument(fmt.Sprintf("descriptors[%d].%s", i, field), reason)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	s.opts.Logger.Error("rls: admission engine failed", "err", fmt.Sprint(err))
	return status.Error(codes.Internal, "internal error: "+fmt.Sprint(err))
}

// hitsReason restates the engine's refusal of a prompt count derived from
// hits_addend (hits − weight × output tokens) in hits_addend's terms: the
// number the caller sent, and the most hits_addend may be.
func hitsReason(it *item, ia *admission.InvalidArgumentError) string {
	if ia.Limit <= 0 {
		return ia.Reason
	}
	out := it.req.MaxOutputTokens
	return fmt.Sprintf("%d exceeds the limit of %d (limits.max_prompt_tokens %d + %d × %d output tokens)",
		it.hits, ia.Limit+it.weight*out, ia.Limit, it.weight, out)
}

// invalidArgument returns an INVALID_ARGUMENT status whose
// google.rpc.BadRequest detail names the field, as Admit's errors do.
func invalidArgument(field, reason string) error {
	st := status.New(codes.InvalidArgument, "invalid "+field+": "+reason)
	withDetail, err := st.WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: reason}},
	})
	if err != nil {
		// Only a detail that cannot be marshalled (invalid UTF-8) gets here.
		return st.Err()
	}
	return withDetail.Err()
}

// clip bounds an echoed value.
func clip(v string) string {
	const n = 64
	if len(v) <= n {
		return v
	}
	return v[:n] + "…"
}
