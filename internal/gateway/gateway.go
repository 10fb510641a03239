package gateway

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
)

// Engine is the port the gateway decides through (the admission engine
// has it): the same Admit and Release the gRPC API serves.
type Engine interface {
	Admit(ctx context.Context, req admission.Request) (admission.Decision, error)
	Release(ctx context.Context, rel admission.Release) (admission.ReleaseResult, error)
}

// The request headers read by default.
const (
	// DefaultTenantHeader is the header the Gateway API Inference
	// Extension names for the fairness id; the gateway sets it after it
	// authenticates the caller.
	DefaultTenantHeader     = "x-llm-d-inference-fairness-id"
	DefaultPriorityHeader   = "x-sluice-priority"    // normal (default) or critical
	DefaultDeadlineHeader   = "x-sluice-deadline-ms" // how long the request may wait to be admitted, in ms
	DefaultDeferrableHeader = "x-sluice-deferrable"  // true: run only on capacity interactive traffic leaves
	DefaultDowngradeHeader  = "x-sluice-accept-downgrade"
)

// Bounds and defaults.
const (
	// DefaultMaxBody bounds a request body: a long-context prompt of a
	// million tokens is about 4 MB of text, escapes included; more is 413.
	DefaultMaxBody = 8 << 20
	// DefaultMaxResponseBody bounds what is kept of a JSON response to
	// read its usage; a longer response is charged its admitted output.
	DefaultMaxResponseBody = 8 << 20
	// DefaultMaxOutputTokens is the output admitted for a request that
	// names no max_tokens: engines' own default cap is of this order.
	DefaultMaxOutputTokens = 1024
	// Fallbacks is how many endpoints of the granted domain follow the
	// chosen one in the destination, for the gateway to retry on.
	Fallbacks = 2
)

// Options configure a Gateway. The zero value reads the default headers
// with the default bounds on the real clock.
type Options struct {
	TenantHeader, PriorityHeader, DeadlineHeader, DeferrableHeader, DowngradeHeader string
	// DefaultTenant is the tenant of a request without the tenant header;
	// empty: such a request is refused (400).
	DefaultTenant   string
	MaxBody         int
	MaxResponseBody int
	// DefaultMaxOutputTokens is admitted for a body naming no max tokens.
	DefaultMaxOutputTokens int64
	// Loads reads the engines' waiting queues; nil: only this gateway's
	// own requests in flight weigh on the choice.
	Loads      Loads
	Clock      clock.Clock
	Registerer prometheus.Registerer // nil: the metrics are not registered
}

// Gateway runs Exchanges over an engine: the models' served names, the
// endpoints of each domain, the token estimate and the outcome counts.
// Safe for concurrent use.
type Gateway struct {
	eng      Engine
	o        Options
	clk      clock.Clock
	estimate *Estimator
	picker   picker
	catalog  atomic.Pointer[catalog]
	outcomes *prometheus.CounterVec
	// byOutcome holds outcomes' counters, looked up once: an exchange's
	// end then hashes no label.
	byOutcome [numOutcomes]prometheus.Counter
}

// New returns a Gateway deciding through eng; call SetModels and
// SetTopology before the first Exchange, and again on every change.
func New(eng Engine, o Options) *Gateway {
	o.TenantHeader = lowerOr(o.TenantHeader, DefaultTenantHeader)
	o.PriorityHeader = lowerOr(o.PriorityHeader, DefaultPriorityHeader)
	o.DeadlineHeader = lowerOr(o.DeadlineHeader, DefaultDeadlineHeader)
	o.DeferrableHeader = lowerOr(o.DeferrableHeader, DefaultDeferrableHeader)
	o.DowngradeHeader = lowerOr(o.DowngradeHeader, DefaultDowngradeHeader)
	if o.MaxBody <= 0 {
		o.MaxBody = DefaultMaxBody
	}
	if o.MaxResponseBody <= 0 {
		o.MaxResponseBody = DefaultMaxResponseBody
	}
	if o.DefaultMaxOutputTokens <= 0 {
		o.DefaultMaxOutputTokens = DefaultMaxOutputTokens
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	g := &Gateway{eng: eng, o: o, clk: o.Clock, estimate: NewEstimator(0, 0, o.Registerer),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gateway_requests_total",
			Help: "Requests the gateway lifecycle ended, by outcome: ok, upstream_error (a 5xx or a reset from the engine), client_cancel (the stream ended before the response did), refused (429), invalid (400), too_large (413), no_endpoint (503), unrouted (no body: sent without admission).",
		}, []string{"outcome"})}
	for o := range Outcome(numOutcomes) {
		if o != OutcomeNone {
			g.byOutcome[o] = g.outcomes.WithLabelValues(o.String())
		}
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(g.outcomes)
	}
	g.catalog.Store(newCatalog(nil))
	return g
}

func lowerOr(s, def string) string {
	if s == "" {
		return def
	}
	return strings.ToLower(s)
}

// Options returns the options in force, defaults filled in.
func (g *Gateway) Options() Options { return g.o }

// Estimator returns the prompt-token estimator.
func (g *Gateway) Estimator() *Estimator { return g.estimate }

// SetModels takes the catalog's models: their served names map a request's
// model to Sluice's, and back for a degraded one.
func (g *Gateway) SetModels(models []pd.Model) {
	c := newCatalog(models)
	g.catalog.Store(c)
	g.estimate.Forget(func(m string) bool { _, ok := c.served[m]; return ok })
}

// SetTopology takes the endpoints the cluster's domains name.
func (g *Gateway) SetTopology(c topology.Cluster) { g.picker.setTopology(c) }

// Outcome is how an Exchange ended.
type Outcome int

// Outcomes.
const (
	OutcomeNone          Outcome = iota // not ended
	OutcomeOK                           // the response ended whole
	OutcomeUpstreamError                // the engine answered 5xx, or its stream broke
	OutcomeClientCancel                 // the stream ended before the response did
	OutcomeRefused                      // 429: not admitted
	OutcomeInvalid                      // 400: a bad header or body
	OutcomeTooLarge                     // 413: the body is past the bound
	OutcomeNoEndpoint                   // 503: admitted, but no endpoint of the domain fits
	OutcomeUnrouted                     // no body: sent to an endpoint without admission
	numOutcomes
)

var outcomeNames = [...]string{"", "ok", "upstream_error", "client_cancel", "refused", "invalid", "too_large", "no_endpoint", "unrouted"}

// String names the outcome as the metric labels it.
func (o Outcome) String() string {
	if o >= 0 && o < numOutcomes {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Start begins an Exchange.
func (g *Gateway) Start() *Exchange { return &Exchange{g: g} }

// ServedModel is a name a request's model may take, and the catalog's
// model it names.
type ServedModel struct {
	Name, Model string
}

// ServedModels lists the names requests may name, each model's preferred
// first, the models in the catalog's order: what a model list answers.
func (g *Gateway) ServedModels() []ServedModel {
	c := g.catalog.Load()
	out := make([]ServedModel, 0, len(c.byServed))
	for _, m := range c.order {
		for _, n := range c.served[m] {
			out = append(out, ServedModel{Name: n, Model: m})
		}
	}
	return out
}

// ErrorBody is an error answer in OpenAI's shape
// ({"error":{"message","type","param","code"}}; an empty param is null),
// for the refusals here and a front that answers the client itself.
func ErrorBody(message, typ, param, code string) []byte {
	var b strings.Builder
	b.WriteString(`{"error":{"message":`)
	b.WriteString(quote(message))
	b.WriteString(`,"type":`)
	b.WriteString(quote(typ))
	b.WriteString(`,"param":`)
	if param == "" {
		b.WriteString("null")
	} else {
		b.WriteString(quote(param))
	}
	b.WriteString(`,"code":`)
	b.WriteString(quote(code))
	b.WriteString("}}")
	return []byte(b.String())
}

// invalidField is the parameter a client wrote for an engine field.
func (x *Exchange) invalidField(ie *admission.InvalidArgumentError) string {
	switch ie.Field {
	case "prompt_tokens", "expected_cached_tokens":
		return apiKey(x.parsed.API)
	case "max_output_tokens":
		if x.parsed.MaxTokensField != "" {
			return x.parsed.MaxTokensField
		}
		return "max_tokens"
	case "tenant":
		return x.g.o.TenantHeader
	case "model":
		return "model"
	case "accept_downgrade":
		return x.g.o.DowngradeHeader
	case "deadline":
		return x.g.o.DeadlineHeader
	case "defer_within":
		return x.g.o.DeferrableHeader
	}
	return ie.Field
}
