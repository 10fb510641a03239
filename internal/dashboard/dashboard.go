package dashboard

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/auth"
	"github.com/sluice-sched/sluice/internal/cli"
	"github.com/sluice-sched/sluice/topology"
)

// State is what the dashboard reads beyond the Operator API; sluiced's
// server satisfies it. Its methods must be safe for concurrent use and
// quick: they are called for every snapshot.
type State interface {
	// Topology returns the cluster the engine serves now (the --topology
	// source, or what the node agents published through etcd). The caller
	// does not modify it.
	Topology() topology.Cluster
	// TenantNames returns every configured tenant, sorted. The caller does
	// not modify the slice.
	TenantNames() []string
	// TenantBudget returns the budget of the tenant name of tier tier (0:
	// no cap): its own when it overrides its tier's.
	TenantBudget(name, tier string) admission.Budget
	// QueueLen is how many requests wait in the fair queue.
	QueueLen() int
	// LeaseCount is how many leases are held.
	LeaseCount() int
}

// Defaults of Options.
const (
	DefaultEvery       = 500 * time.Millisecond
	DefaultSampleEvery = time.Second
	DefaultMaxStreams  = 32
	DefaultRows        = 50
	// MaxRows bounds the tenant table, whatever the page asks: the table
	// is for the busiest tenants and a search, not for listing 100k (the
	// paginated /api/v1/tenants is).
	MaxRows = 500
)

// Options configure a Dashboard. Operator, State and Traffic are required.
type Options struct {
	// Operator answers the reads and the actions: grpcserver.NewOperator
	// over the engine, the handlers the gRPC Operator service runs (with
	// WithConfigStatus, for the header's config).
	Operator admissionv1.OperatorServer
	State    State
	// Traffic counts answers per tenant; install it as an
	// admission.Observer of the engine, and give it the Admit latency.
	Traffic *Traffic
	// Build is what the binary was built from, for the header;
	// cli.ReadBuild() when zero.
	Build cli.Build
	// Replica returns this replica's id, for the header; nil shows none.
	// It is a function because a server knows its id (an address by
	// default) only once it has bound its listeners.
	Replica func() string
	// Auth decides who may read (viewer) and act (operator); nil or open
	// lets every caller read, and act only with Actions.
	Auth *auth.Authenticator
	// Audit records every action and every refused one; nil records none.
	Audit *auth.Auditor
	// Actions turns on drain and undrain without an auth file
	// (--dashboard-actions). With an auth file the operator role decides.
	Actions bool
	// Every is how often a stream gets a snapshot; DefaultEvery when 0.
	// An action taken through the dashboard pushes one at once.
	Every time.Duration
	// SampleEvery is how often Run turns counts into rates;
	// DefaultSampleEvery when 0.
	SampleEvery time.Duration
	// MaxStreams bounds the open event streams (each holds a connection
	// and builds a snapshot every Every); DefaultMaxStreams when 0.
	MaxStreams int
	Now        func() time.Time // default time.Now
	Logger     *slog.Logger     // nil discards
}

// Dashboard serves the page and its API.
type Dashboard struct {
	opts    Options
	streams chan struct{} // a slot per open stream

	mu struct {
		sync.Mutex
		changed chan struct{}         // closed and replaced when an action changed something
		marks   map[string]actionMark // drains made through the dashboard, by domain
	}
	done      chan struct{} // closed by Close: streams end
	closeOnce sync.Once
}

// actionMark is who drained a domain through the dashboard, and when: the
// engine keeps only the reason.
type actionMark struct {
	by     string
	at     time.Time
	reason string
}

// New returns a Dashboard; Run must run for the tenant rates to move.
func New(opts Options) (*Dashboard, error) {
	if opts.Operator == nil || opts.State == nil || opts.Traffic == nil {
		return nil, errors.New("dashboard: Operator, State and Traffic are required")
	}
	if opts.Every <= 0 {
		opts.Every = DefaultEvery
	}
	if opts.SampleEvery <= 0 {
		opts.SampleEvery = DefaultSampleEvery
	}
	if opts.MaxStreams <= 0 {
		opts.MaxStreams = DefaultMaxStreams
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Build == (cli.Build{}) {
		opts.Build = cli.ReadBuild()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	d := &Dashboard{opts: opts, streams: make(chan struct{}, opts.MaxStreams), done: make(chan struct{})}
	d.mu.changed = make(chan struct{})
	d.mu.marks = make(map[string]actionMark)
	return d, nil
}

// Run samples the tenant traffic every SampleEvery until ctx ends.
func (d *Dashboard) Run(ctx context.Context) {
	tick := time.NewTicker(d.opts.SampleEvery)
	defer tick.Stop()
	d.opts.Traffic.Sample(d.opts.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.done:
			return
		case <-tick.C:
			d.opts.Traffic.Sample(d.opts.Now())
		}
	}
}

// Close ends every open event stream (so that an HTTP server's graceful
// shutdown need not wait for them) and refuses new ones. Safe to call more
// than once.
func (d *Dashboard) Close() { d.closeOnce.Do(func() { close(d.done) }) }

// Register adds the page at "/" (exactly), its assets under /assets/, and
// the API under /api/v1/ to mux.
func (d *Dashboard) Register(mux *http.ServeMux) {
	mux.Handle("GET /{$}", http.HandlerFunc(serveIndex))
	mux.Handle("GET /assets/", assetHandler())
	view := func(h http.HandlerFunc) http.Handler {
		if d.opts.Auth == nil {
			return h
		}
		return d.opts.Auth.HTTP(auth.RoleViewer, h)
	}
	mux.Handle("GET /api/v1/domains", view(d.serveDomains))
	mux.Handle("GET /api/v1/topology", view(d.serveTopology))
	mux.Handle("GET /api/v1/tenants", view(d.serveTenants))
	mux.Handle("GET /api/v1/tenants/{name}", view(d.serveTenant))
	mux.Handle("GET /api/v1/dashboard", view(d.serveSnapshot))
	mux.Handle("GET /api/v1/events", view(d.serveEvents))
	mux.Handle("GET /api/v1/session", view(d.serveSession))
	mux.Handle("POST /api/v1/domains/{domain}/drain", d.action(actionDrain))
	mux.Handle("POST /api/v1/domains/{domain}/undrain", d.action(actionUndrain))
}

// changed returns a channel closed at the next change an action makes.
func (d *Dashboard) changedChan() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.changed
}

// notify wakes every stream to send a snapshot now.
func (d *Dashboard) notify() {
	d.mu.Lock()
	defer d.mu.Unlock()
	close(d.mu.changed)
	d.mu.changed = make(chan struct{})
}

// setMark records (or, with by empty, forgets) who drained domain here.
func (d *Dashboard) setMark(domain string, m *actionMark) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if m == nil {
		delete(d.mu.marks, domain)
		return
	}
	d.mu.marks[domain] = *m
}

// mark returns who drained domain through the dashboard with reason; false
// when it was not (or was since drained again some other way).
func (d *Dashboard) mark(domain, reason string) (actionMark, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m, ok := d.mu.marks[domain]
	return m, ok && m.reason == reason
}
