package server

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/grpcserver"
	"github.com/sluice-sched/sluice/internal/cli"
	"github.com/sluice-sched/sluice/internal/dashboard"
	"github.com/sluice-sched/sluice/internal/gateway"
	"github.com/sluice-sched/sluice/internal/metrics"
	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
)

// DashboardOptions configure the rack slot dashboard (package dashboard),
// served on the HTTP listener at "/".
type DashboardOptions struct {
	// Actions turns on the page's drain and undrain without --auth
	// (--dashboard-actions); with --auth the operator role decides.
	Actions bool
	// Every and SampleEvery are dashboard.Options' (tests shorten them).
	Every, SampleEvery time.Duration
}

// observers fans the engine's answers out to every observer: the metrics
// and the dashboard's traffic counters.
type observers []admission.Observer

// ObserveDecision implements admission.Observer.
func (o observers) ObserveDecision(req admission.Request, d admission.Decision) {
	for _, x := range o {
		x.ObserveDecision(req, d)
	}
}

// ObserveRelease implements admission.Observer.
func (o observers) ObserveRelease(rel admission.Release, res admission.ReleaseResult) {
	for _, x := range o {
		x.ObserveRelease(rel, res)
	}
}

// tenantDirectory is what the server keeps of the config for pages and the
// dashboard: the tenant names sorted, and the budgets (the tiers', and those
// of the few tenants that override theirs). The engine keeps the config in a
// map and sorts its names on every Tenants call; this is built once per
// config change instead, at 16 bytes per tenant (the names' bytes are the
// config's).
type tenantDirectory struct {
	names      []string
	tierBudget map[string]admission.Budget // by tier
	ownBudget  map[string]admission.Budget // tenants that override their tier's budget
}

// newTenantDirectory indexes cfg.
func newTenantDirectory(cfg admission.Config) *tenantDirectory {
	d := &tenantDirectory{
		names:      make([]string, 0, len(cfg.Tenants)),
		tierBudget: make(map[string]admission.Budget, len(cfg.Tiers)),
		ownBudget:  make(map[string]admission.Budget),
	}
	for name, tp := range cfg.Tiers {
		d.tierBudget[name] = tp.Budget
	}
	for name, tc := range cfg.Tenants {
		d.names = append(d.names, name)
		if b := tc.Overrides().Budget; b != nil {
			d.ownBudget[name] = *b
		}
	}
	slices.Sort(d.names)
	return d
}

// serverState is the server's side of the dashboard and of ListTenants'
// pages: the cluster the engine serves and the tenant directory, both
// replaced whole when they change.
type serverState struct {
	eng     *admission.Engine
	feed    *engineFeed      // reads the engines each cluster names
	gw      *gateway.Gateway // the gateways' lifecycle: the models' served names, the domains' endpoints
	cluster atomic.Pointer[topology.Cluster]
	dir     atomic.Pointer[tenantDirectory]
}

var (
	_ dashboard.State         = (*serverState)(nil)
	_ grpcserver.TenantPager  = (*pagedEngine)(nil)
	_ admission.Observer      = observers(nil)
	_ grpcserver.Engine       = (*pagedEngine)(nil)
	_ grpcserver.CreditEngine = (*pagedEngine)(nil)
)

// configChanged indexes the tenants of cfg, the config the engine took.
func (st *serverState) configChanged(cfg admission.Config) {
	st.dir.Store(newTenantDirectory(cfg))
	models := cfg.Models
	if models == nil {
		models = pd.DefaultModels() // what the engine serves for a config naming none
	}
	if st.gw != nil {
		st.gw.SetModels(models)
	}
}

// tenantsChanged applies the engine's tenant updates to the directory: a
// copy of the names with the changed ones merged in, at the cost of a
// copy rather than of a sort of every name.
func (st *serverState) tenantsChanged(updates []admission.TenantUpdate) {
	old := st.dir.Load()
	byName := make(map[string]admission.TenantUpdate, len(updates))
	changed := make([]string, 0, len(updates))
	for _, u := range updates {
		byName[u.Name] = u
		changed = append(changed, u.Name)
	}
	slices.Sort(changed)
	d := &tenantDirectory{
		names:      make([]string, 0, len(old.names)+len(updates)),
		tierBudget: old.tierBudget,
		ownBudget:  maps.Clone(old.ownBudget),
	}
	i := 0
	for _, name := range changed {
		for ; i < len(old.names) && old.names[i] < name; i++ {
			d.names = append(d.names, old.names[i])
		}
		if i < len(old.names) && old.names[i] == name {
			i++
		}
		u := byName[name]
		delete(d.ownBudget, name)
		if u.Remove {
			continue
		}
		d.names = append(d.names, name)
		if b := u.Config.Overrides().Budget; b != nil {
			d.ownBudget[name] = *b
		}
	}
	d.names = append(d.names, old.names[i:]...)
	st.dir.Store(d)
}

// topologyChanged records the cluster the engine now serves.
func (st *serverState) topologyChanged(c topology.Cluster) {
	st.cluster.Store(&c)
	st.feed.topologyChanged(c)
	if st.gw != nil {
		st.gw.SetTopology(c)
	}
}

// Topology implements dashboard.State.
func (st *serverState) Topology() topology.Cluster {
	if c := st.cluster.Load(); c != nil {
		return *c
	}
	return topology.Cluster{}
}

// TenantNames implements dashboard.State.
func (st *serverState) TenantNames() []string { return st.dir.Load().names }

// TenantBudget implements dashboard.State.
func (st *serverState) TenantBudget(name, tier string) admission.Budget {
	d := st.dir.Load()
	if b, ok := d.ownBudget[name]; ok {
		return b
	}
	return d.tierBudget[tier]
}

// QueueLen implements dashboard.State.
func (st *serverState) QueueLen() int { return st.eng.QueueLen() }

// LeaseCount implements dashboard.State.
func (st *serverState) LeaseCount() int { return st.eng.LeaseCount() }

// pagedEngine is the engine as the gRPC services see it, with ListTenants'
// pages cut from the tenant directory: a page costs its own tenants, not a
// description of every tenant.
type pagedEngine struct {
	*metrics.Instrumented // Admit timed for the metrics
	st                    *serverState
	traffic               *dashboard.Traffic
}

// pagedEngine returns the engine as the gRPC services see it.
func (s *Server) pagedEngine() *pagedEngine {
	return &pagedEngine{Instrumented: s.metrics.Instrument(s.eng), st: s.state, traffic: s.traffic}
}

// Admit decides req as the metrics' Admit does and gives its latency to the
// dashboard's fleet strip too: the span sluice_admit_latency_seconds
// measures, with its own two clock reads (about 0.1 µs on a gRPC call of
// tens) so that the metrics package need not know the dashboard. Invalid
// requests are not timed, as there.
func (p *pagedEngine) Admit(ctx context.Context, req admission.Request) (admission.Decision, error) {
	start := time.Now()
	d, err := p.Instrumented.Admit(ctx, req)
	if err == nil {
		p.traffic.ObserveLatency(time.Since(start))
	}
	return d, err
}

// TenantsAfter implements grpcserver.TenantPager.
func (p *pagedEngine) TenantsAfter(after string, n int) ([]admission.TenantInfo, bool) {
	names := p.st.dir.Load().names
	i := sort.SearchStrings(names, after)
	if i < len(names) && names[i] == after {
		i++
	}
	out := make([]admission.TenantInfo, 0, min(n, len(names)-i))
	for ; i < len(names) && len(out) < n; i++ {
		if t, ok := p.Tenant(names[i]); ok { // a tenant a concurrent reload removed is skipped
			out = append(out, t)
		}
	}
	return out, i < len(names)
}

// trackedEngine is the engine as the control plane drives it: a config or
// topology it applies is recorded for the dashboard and the pages.
type trackedEngine struct {
	*admission.Engine
	st *serverState
}

// Apply applies cfg and, when the engine took it, indexes its tenants.
func (t *trackedEngine) Apply(cfg admission.Config) error {
	if err := t.Engine.Apply(cfg); err != nil {
		return err
	}
	t.st.configChanged(cfg)
	return nil
}

// UpdateTenants applies updates and, when the engine took them, updates
// the tenant directory.
func (t *trackedEngine) UpdateTenants(updates []admission.TenantUpdate) error {
	if err := t.Engine.UpdateTenants(updates); err != nil {
		return err
	}
	t.st.tenantsChanged(updates)
	return nil
}

// SetTopology applies c and, when the engine took it, records it.
func (t *trackedEngine) SetTopology(c topology.Cluster) error {
	if err := t.Engine.SetTopology(c); err != nil {
		return err
	}
	t.st.topologyChanged(c)
	return nil
}

// SetStartupTopology applies c without warm-up and, when the engine took
// it, records it.
func (t *trackedEngine) SetStartupTopology(c topology.Cluster) error {
	if err := t.Engine.SetStartupTopology(c); err != nil {
		return err
	}
	t.st.topologyChanged(c)
	return nil
}

// newDashboard builds the dashboard over the server's state; its Operator
// reports the config status as the gRPC one does.
func (s *Server) newDashboard(configStatus grpcserver.RegisterOption) error {
	var err error
	s.dash, err = dashboard.New(dashboard.Options{
		Operator:    grpcserver.NewOperator(s.pagedEngine(), configStatus, grpcserver.WithBacklog(s.backlog)),
		State:       s.state,
		Traffic:     s.traffic,
		Build:       cli.ReadBuild(),
		Replica:     func() string { return s.replica },
		Auth:        s.sec.auth,
		Audit:       s.sec.audit,
		Actions:     s.opts.Dashboard.Actions,
		Every:       s.opts.Dashboard.Every,
		SampleEvery: s.opts.Dashboard.SampleEvery,
		Now:         s.opts.Clock.Now,
		Logger:      s.log.With("component", "dashboard"),
	})
	return err
}

// registerDashboard adds the page and its API to mux.
func (s *Server) registerDashboard(mux *http.ServeMux) { s.dash.Register(mux) }

// Traffic returns the dashboard's per-tenant answer counters.
func (s *Server) Traffic() *dashboard.Traffic { return s.traffic }
