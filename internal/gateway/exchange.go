package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-sched/sluice/admission"
)

// Verdict is what to do with a request: forward it (Status 0) to Endpoint
// with Body, or answer the client with Status, Headers and Body.
type Verdict struct {
	Status int
	// Endpoint is the chosen engine's host:port; Fallbacks the next best
	// of the same domain, for the gateway's retries.
	Endpoint  string
	Fallbacks []string
	// Body is the body to forward (rewritten, or as received), or the
	// error to answer with (OpenAI's error shape).
	Body []byte
	// Headers are the answer's headers (content-type, retry-after).
	Headers [][2]string
	// Message says why, for the gateway's logs.
	Message string
	// Domain and Model are what Admit granted; Degraded: a lower tier
	// than the request named.
	Domain, Model string
	Degraded      bool
	// Rewritten: Body differs from what the client sent.
	Rewritten bool
}

// Forward reports whether the request goes to an endpoint.
func (v *Verdict) Forward() bool { return v.Status == 0 }

// Exchange is one request's lifecycle (see the package documentation).
// One goroutine drives it; Abort may end it at any point, and every call
// after the end does nothing.
type Exchange struct {
	g *Gateway

	api        API
	tenant     string
	priority   admission.Priority
	deadline   time.Time
	deferrable bool
	downgrade  []string
	subset     []string
	hasSubset  bool

	body     []byte
	parsed   Body
	model    string // the Sluice model requested
	estimate int64
	maxOut   int64

	lease     uint64
	held      bool
	granted   string // the Sluice model granted
	ep        *endpoint
	dropUsage bool
	start     time.Time // when the request was forwarded

	status    int
	sse       bool
	sseR      sseReader
	resp      []byte // a JSON response, kept to read its usage
	respLong  bool   // the JSON response was past the bound
	firstByte time.Time

	ended   atomic.Bool
	outcome Outcome
	result  admission.ReleaseResult
	relErr  error
}

// RequestHeaders reads the request's method and path and its headers
// (get takes a lower-case name and returns "" for a header not sent). A
// refusal (400 naming the header) is returned at once; nil: go on.
func (x *Exchange) RequestHeaders(path string, get func(name string) string) *Verdict {
	o := &x.g.o
	x.api = apiForPath(path)
	x.tenant = get(o.TenantHeader)
	if x.tenant == "" {
		x.tenant = o.DefaultTenant
	}
	switch p := strings.ToLower(get(o.PriorityHeader)); p {
	case "", "normal":
		x.priority = admission.PriorityNormal
	case "critical":
		x.priority = admission.PriorityCritical
	default:
		return x.refuse(OutcomeInvalid, 400, o.PriorityHeader+": want normal or critical, got "+clip(p), "invalid_request_error", o.PriorityHeader, "invalid_header")
	}
	if v := get(o.DeadlineHeader); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || ms > int64(24*time.Hour/time.Millisecond) {
			return x.refuse(OutcomeInvalid, 400, o.DeadlineHeader+": want milliseconds in 1..86400000, got "+clip(v), "invalid_request_error", o.DeadlineHeader, "invalid_header")
		}
		x.deadline = x.g.clk.Now().Add(time.Duration(ms) * time.Millisecond)
	}
	switch v := strings.ToLower(get(o.DeferrableHeader)); v {
	case "", "false", "0":
	case "true", "1":
		x.deferrable = true
	default:
		return x.refuse(OutcomeInvalid, 400, o.DeferrableHeader+": want true or false, got "+clip(v), "invalid_request_error", o.DeferrableHeader, "invalid_header")
	}
	if v := get(o.DowngradeHeader); v != "" {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				x.downgrade = append(x.downgrade, name)
			}
		}
	}
	return nil
}

// SetSubset limits the endpoints to those in subset (host:port): the
// gateway's subset hint. Without a call every endpoint of the granted
// domain may be chosen; with an empty subset none may.
func (x *Exchange) SetSubset(subset []string) { x.subset, x.hasSubset = subset, true }

// AppendBody takes the next chunk of the request body; a body past the
// bound is refused (413). The first chunk is kept, not copied (a body in
// one chunk is the common case): the caller must not change it after.
func (x *Exchange) AppendBody(chunk []byte) *Verdict {
	if len(x.body)+len(chunk) > x.g.o.MaxBody {
		x.body = nil
		return x.refuse(OutcomeTooLarge, 413, "the request body is larger than "+strconv.Itoa(x.g.o.MaxBody)+" bytes", "invalid_request_error", "", "request_too_large")
	}
	if x.body == nil && len(chunk) > 0 {
		x.body = chunk[:len(chunk):len(chunk)] // full: the next append copies
		return nil
	}
	x.body = append(x.body, chunk...)
	return nil
}

// Decide decides the request whose headers and body have been given:
// Admit through the engine, waiting in its fair queue until ctx ends or
// the request's deadline passes; on a grant it chooses the endpoint and
// rewrites the body. A request without a body (a model list) is not
// admitted: it goes to the least loaded endpoint.
func (x *Exchange) Decide(ctx context.Context) Verdict {
	if x.ended.Load() {
		return Verdict{Status: 500, Message: "the exchange has ended"}
	}
	subset := x.subsetOrNil()
	if len(x.body) == 0 {
		ep := x.g.picker.any(subset, x.g.o.Loads)
		if ep == nil {
			return *x.refuse(OutcomeNoEndpoint, 503, "no endpoint serves requests", "server_error", "", "no_endpoint")
		}
		x.finish(OutcomeUnrouted)
		return Verdict{Endpoint: ep.address}
	}
	if x.tenant == "" {
		return *x.refuse(OutcomeInvalid, 400, x.g.o.TenantHeader+": missing (the gateway sets it for an authenticated caller)", "invalid_request_error", x.g.o.TenantHeader, "missing_tenant")
	}
	var err error
	if x.parsed, err = ParseBody(x.api, x.body); err != nil {
		var be *BodyError
		errors.As(err, &be)
		return *x.refuse(OutcomeInvalid, 400, err.Error(), "invalid_request_error", be.Field, "invalid_body")
	}
	cat := x.g.catalog.Load()
	model, ok := cat.byServed[x.parsed.Model]
	if !ok {
		return *x.refuse(OutcomeInvalid, 400, "model: "+quote(clip(x.parsed.Model))+" is not a model Sluice places", "invalid_request_error", "model", "model_not_found")
	}
	x.model = model
	var accept []string
	for _, n := range x.downgrade {
		m, ok := cat.byServed[n]
		if !ok {
			return *x.refuse(OutcomeInvalid, 400, x.g.o.DowngradeHeader+": "+quote(clip(n))+" is not a model Sluice places", "invalid_request_error", x.g.o.DowngradeHeader, "model_not_found")
		}
		accept = append(accept, m)
	}
	if x.g.picker.pick1(cat, model, accept, subset) == 0 {
		// Nothing could serve it wherever it is placed: say so before
		// anything is charged.
		return *x.refuse(OutcomeNoEndpoint, 503, "no endpoint serves model "+quote(clip(x.parsed.Model))+" (or a tier it accepts)"+x.subsetText(), "server_error", "", "no_endpoint")
	}
	x.estimate = x.g.estimate.Estimate(model, x.parsed.PromptBytes)
	x.maxOut = x.parsed.MaxTokens
	if x.maxOut == 0 {
		x.maxOut = x.g.o.DefaultMaxOutputTokens
	}
	req := admission.Request{
		Tenant: x.tenant, Model: model, PromptTokens: x.estimate, MaxOutputTokens: x.maxOut,
		Priority: x.priority, AcceptDowngrade: accept, Deadline: x.deadline, Deferrable: x.deferrable,
	}
	d, err := x.g.eng.Admit(ctx, req)
	if err != nil {
		var ie *admission.InvalidArgumentError
		switch {
		case errors.As(err, &ie):
			return *x.refuse(OutcomeInvalid, 400, x.invalidField(ie)+": "+ie.Reason, "invalid_request_error", x.invalidField(ie), "invalid_value")
		case ctx.Err() != nil:
			x.finish(OutcomeClientCancel)
			return Verdict{Status: 499, Message: "the stream ended while the request waited"}
		}
		return *x.refuse(OutcomeRefused, 503, "admission failed: "+err.Error(), "server_error", "", "admission_failed")
	}
	switch d.Outcome {
	case admission.Admitted, admission.Degraded:
	case admission.Deferred:
		return *x.refuseDecision(&d, "deferred: it runs only on capacity interactive requests leave")
	default:
		return *x.refuseDecision(&d, "")
	}
	x.lease, x.held, x.granted = d.LeaseID, true, d.Model
	if ctx.Err() != nil { // admitted as the stream ended: nobody to send it
		x.finish(OutcomeClientCancel)
		return Verdict{Status: 499, Message: "the stream ended as the request was admitted"}
	}
	eps := x.g.picker.pick(d.Domain, cat.served[d.Model], subset, x.g.o.Loads, 1+Fallbacks)
	if len(eps) == 0 {
		v := x.refuse(OutcomeNoEndpoint, 503, "no endpoint of domain "+d.Domain+" serves model "+d.Model+x.subsetText(), "server_error", "", "no_endpoint")
		return *v
	}
	x.ep = eps[0]
	x.ep.inFlight.Add(1)
	v := Verdict{Endpoint: x.ep.address, Domain: d.Domain, Model: d.Model, Degraded: d.Model != model, Body: x.body}
	for _, e := range eps[1:] {
		v.Fallbacks = append(v.Fallbacks, e.address)
	}
	rename := ""
	if v.Degraded {
		rename = cat.served[d.Model][0]
	}
	x.dropUsage = x.parsed.Stream && !x.parsed.IncludeUsage && x.parsed.API != APIResponses
	if rename != "" || x.dropUsage {
		v.Body, v.Rewritten = Rewrite(x.body, &x.parsed, rename, x.dropUsage), true
	}
	x.body = nil // forwarded: not kept
	x.start = x.g.clk.Now()
	return v
}

// subsetOrNil is the subset hint, nil without one.
func (x *Exchange) subsetOrNil() []string {
	if !x.hasSubset {
		return nil
	}
	if x.subset == nil {
		return []string{}
	}
	return x.subset
}

func (x *Exchange) subsetText() string {
	if !x.hasSubset {
		return ""
	}
	return " among the gateway's subset " + clip(strings.Join(x.subset, ","))
}

// pick1 counts the endpoints of any domain that serve model or a tier in
// accept, within subset.
func (p *picker) pick1(cat *catalog, model string, accept []string, subset []string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, eps := range p.byDomain {
		for _, e := range eps {
			if subset != nil && !contains(subset, e.address) {
				continue
			}
			if e.serves(cat.served[model]) {
				n++
				continue
			}
			for _, m := range accept {
				if e.serves(cat.served[m]) {
					n++
					break
				}
			}
		}
	}
	return n
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// refuseDecision answers a decision that admits nothing: 429 with
// retry-after for what waiting mends, another status for what it cannot.
func (x *Exchange) refuseDecision(d *admission.Decision, why string) *Verdict {
	reason := d.Reason.String()
	msg := "not admitted: " + reason
	if why != "" {
		msg += " (" + why + ")"
	}
	switch d.Reason {
	case admission.ReasonUnknownTenant:
		return x.refuse(OutcomeRefused, 403, "tenant "+quote(clip(x.tenant))+" is not configured", "permission_error", x.g.o.TenantHeader, strings.ToLower(reason))
	case admission.ReasonRequestTooLarge:
		return x.refuse(OutcomeRefused, 400, msg+": more tokens than the tenant's quota ever holds", "invalid_request_error", x.invalidField(&admission.InvalidArgumentError{Field: "max_output_tokens"}), strings.ToLower(reason))
	case admission.ReasonShuttingDown:
		return x.refuse(OutcomeRefused, 503, msg, "server_error", "", strings.ToLower(reason))
	}
	v := x.refuse(OutcomeRefused, 429, msg, "rate_limit_exceeded", "", strings.ToLower(reason))
	secs := int64(math.Ceil(d.RetryAfter.Seconds()))
	v.Headers = append(v.Headers, [2]string{"retry-after", strconv.FormatInt(max(secs, 1), 10)})
	if d.RetryAfter > 0 {
		v.Headers = append(v.Headers, [2]string{"x-sluice-retry-after-ms", strconv.FormatInt(d.RetryAfter.Milliseconds(), 10)})
	}
	v.Headers = append(v.Headers, [2]string{"x-sluice-reason", reason})
	return v
}

// refuse ends the exchange with an answer to the client in OpenAI's error
// shape; a lease granted before is released unused.
func (x *Exchange) refuse(o Outcome, status int, message, typ, param, code string) *Verdict {
	x.finish(o)
	return &Verdict{Status: status, Message: message, Body: ErrorBody(message, typ, param, code),
		Headers: [][2]string{{"content-type", "application/json"}}}
}

// ResponseHeaders takes the upstream's status and content type.
func (x *Exchange) ResponseHeaders(status int, contentType string) {
	x.status = status
	x.sse = strings.HasPrefix(strings.ToLower(strings.TrimSpace(contentType)), "text/event-stream")
	x.sseR.drop = x.sse && x.dropUsage
}

// ResponseBody takes the next chunk of the response and returns the bytes
// to pass to the client: the chunk, less the usage event Sluice asked for
// and the client did not. The first chunk is the time to first token;
// end ends the exchange (Done).
func (x *Exchange) ResponseBody(chunk []byte, end bool) []byte {
	if x.ended.Load() {
		return chunk
	}
	if x.firstByte.IsZero() && len(chunk) > 0 {
		x.firstByte = x.g.clk.Now()
	}
	out := chunk
	switch {
	case x.sse:
		out = x.sseR.feed(chunk)
		if end {
			if rest := x.sseR.flush(); len(rest) > 0 {
				out = append(out[:len(out):len(out)], rest...)
			}
		}
	case !x.respLong:
		if len(x.resp)+len(chunk) > x.g.o.MaxResponseBody {
			x.resp, x.respLong = nil, true
		} else {
			x.resp = append(x.resp, chunk...)
		}
	}
	if end {
		x.Done()
	}
	return out
}

// Done ends the exchange: the response is whole (a 5xx is the upstream's
// error).
func (x *Exchange) Done() {
	if x.status >= 500 {
		x.finish(OutcomeUpstreamError)
		return
	}
	x.finish(OutcomeOK)
}

// Abort ends the exchange early: o is OutcomeClientCancel (the stream
// ended) or OutcomeUpstreamError (the upstream broke). After an end it does
// nothing, so an adapter defers it on every stream.
func (x *Exchange) Abort(o Outcome) { x.finish(o) }

// Outcome returns how the exchange ended (OutcomeNone: not yet).
func (x *Exchange) Outcome() Outcome {
	if !x.ended.Load() {
		return OutcomeNone
	}
	return x.outcome
}

// Released returns what the Release at the end did, and its error; zero
// when the exchange held no lease.
func (x *Exchange) Released() (admission.ReleaseResult, error) { return x.result, x.relErr }

// finish ends the exchange once: counts the outcome and releases the
// lease, if one is held, with what the response reported.
func (x *Exchange) finish(o Outcome) {
	if !x.ended.CompareAndSwap(false, true) {
		return
	}
	x.outcome = o
	if o > OutcomeNone && o < numOutcomes {
		x.g.byOutcome[o].Inc()
	} else {
		x.g.outcomes.WithLabelValues(o.String()).Inc()
	}
	if !x.held {
		return
	}
	x.held = false
	if x.ep != nil {
		x.ep.inFlight.Add(-1)
	}
	rel := admission.Release{LeaseID: x.lease, PromptTokens: x.estimate}
	usage, reported := x.usage()
	switch {
	case reported:
		rel.PromptTokens = max(usage.PromptTokens, 1)
		rel.CachedPromptTokens = usage.CachedTokens
		rel.OutputTokens = usage.OutputTokens
		if usage.PromptTokens > 0 {
			est := x.estimate
			if x.granted != x.model {
				est = x.g.estimate.Estimate(x.granted, x.parsed.PromptBytes)
			}
			x.g.estimate.Observe(x.granted, x.parsed.PromptBytes, est, usage.PromptTokens)
		}
	case x.sse:
		rel.OutputTokens = x.sseR.outputs // an event carries a token at least
	case o == OutcomeOK && x.status < 400:
		rel.OutputTokens = x.maxOut // a whole answer whose usage is unknown: as admitted
	}
	switch {
	case o == OutcomeUpstreamError:
		rel.Outcome = admission.ReleaseError
	case x.status == 0:
		// No response was seen: whether the engine ran it, and how it
		// went, nobody knows; the domain's health takes no sample.
		rel.Outcome = admission.ReleaseUnobserved
	default:
		rel.Outcome = admission.ReleaseOK
	}
	if !x.start.IsZero() {
		now := x.g.clk.Now()
		rel.Duration = now.Sub(x.start)
		if !x.firstByte.IsZero() {
			rel.TTFT = x.firstByte.Sub(x.start)
		}
	}
	x.result, x.relErr = x.g.eng.Release(context.WithoutCancel(context.Background()), rel)
}

// usage is what the response reported, if it did.
func (x *Exchange) usage() (Usage, bool) {
	if x.sse {
		return x.sseR.usage, x.sseR.hasUsage
	}
	if x.respLong {
		return Usage{}, false
	}
	return jsonUsage(x.resp)
}

// clip bounds a client's text quoted back in an answer.
func clip(s string) string {
	if len(s) > 128 {
		return s[:128] + "…"
	}
	return s
}

// quote is s as a JSON string.
func quote(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}
