package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/topology"
)

// marshalOpts writes the gRPC messages' JSON: lowerCamelCase names, as
// grpcurl and any gRPC-JSON gateway print them, with zero fields included
// so that the page need not know the defaults.
var marshalOpts = protojson.MarshalOptions{EmitUnpopulated: true}

// protoJSON renders m, compacted: protojson varies its spacing on purpose
// (so that nobody compares its bytes), and the API's answers should not.
func protoJSON(m proto.Message) json.RawMessage {
	b, err := marshalOpts.Marshal(m)
	if err != nil { // only invalid UTF-8 fails, which the engine's names exclude
		return json.RawMessage("null")
	}
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return b
	}
	return out.Bytes()
}

// Snapshot is what the page draws, sent every Every on the event stream.
type Snapshot struct {
	At          time.Time      `json:"at"`
	Domains     []DomainView   `json:"domains"`
	Tenants     TenantTable    `json:"tenants"`
	QueueLength int            `json:"queueLength"`
	Leases      int            `json:"leases"`
	Topology    string         `json:"topologyVersion"` // changes when the topology does
	Session     SessionView    `json:"session"`
	Totals      map[string]int `json:"totals"` // "domains", "draining", "warming"
	// Answers is this replica's answers per second over the last few
	// seconds, every tenant's together: the page's fleet strip, with the
	// Admit latency and the commonest refusal reasons over the same window.
	Answers        AnswerRates  `json:"answers"`
	AdmitLatency   LatencyView  `json:"admitLatency"`
	RefusalReasons []ReasonView `json:"refusalReasons"` // at most 3, the commonest first
	// Server is what this replica runs: its build, its config, its name.
	Server ServerView `json:"server"`
	// CreditFreeze is the operator's freeze of burst credit in force
	// (admission.v1.CreditFreeze); absent when none.
	CreditFreeze json.RawMessage `json:"creditFreeze,omitempty"`
	// Backlog is the deferred backlog this replica holds; absent on a
	// server without one.
	Backlog *BacklogView `json:"backlog,omitempty"`
}

// BacklogView is the deferred backlog: tickets pending and claimed, and
// the largest backlogs by tenant.
type BacklogView struct {
	Pending int64 `json:"pending"`
	Claimed int64 `json:"claimed"`
	// OldestSeconds is the age of the oldest pending ticket of any tenant.
	OldestSeconds float64 `json:"oldestSeconds"`
	// Tenants are the largest backlogs, at most backlogTenants.
	Tenants []BacklogTenant `json:"tenants"`
}

// BacklogTenant is one tenant's deferred backlog.
type BacklogTenant struct {
	Tenant        string  `json:"tenant"`
	Pending       int64   `json:"pending"`
	Claimed       int64   `json:"claimed"`
	OldestSeconds float64 `json:"oldestSeconds"`
}

// backlogTenants is how many tenants' backlogs the strip names.
const backlogTenants = 3

// backlogView reads the deferred backlog; nil on a server without one
// (UNIMPLEMENTED).
func (d *Dashboard) backlogView(ctx context.Context) *BacklogView {
	bl, err := d.opts.Operator.ListBacklog(ctx, &admissionv1.ListBacklogRequest{})
	if err != nil {
		return nil
	}
	v := &BacklogView{Pending: bl.GetPending(), Claimed: bl.GetClaimed(), Tenants: []BacklogTenant{}}
	for i, t := range bl.GetTenants() {
		age := t.GetOldestAge().AsDuration().Seconds()
		v.OldestSeconds = max(v.OldestSeconds, age)
		if i < backlogTenants {
			v.Tenants = append(v.Tenants, BacklogTenant{Tenant: t.GetTenant(), Pending: t.GetPending(), Claimed: t.GetClaimed(), OldestSeconds: age})
		}
	}
	return v
}

// AnswerRates are answers per second by outcome, and the weighted tokens
// per second admitted.
type AnswerRates struct {
	Admitted float64 `json:"admitted"`
	Degraded float64 `json:"degraded"`
	Refused  float64 `json:"refused"`
	Tokens   float64 `json:"tokens"`
}

// LatencyView is the latency of the Admission service's Admit calls (the
// engine's decision and any wait in the fair queue, as
// sluice_admit_latency_seconds measures it) over the fleet strip's window.
type LatencyView struct {
	P99Seconds float64 `json:"p99Seconds"` // 0 when count is
	Count      int64   `json:"count"`      // calls timed in the window
}

// ReasonView is a refusal reason, by its API name (as in an Admit answer
// and sluice_decisions_total's reason label), and its refusals per second.
type ReasonView struct {
	Reason    string  `json:"reason"`
	PerSecond float64 `json:"perSecond"`
}

// reasonViews renders rs.
func reasonViews(rs []ReasonRate) []ReasonView {
	out := make([]ReasonView, len(rs))
	for i, r := range rs {
		out[i] = ReasonView{Reason: r.Reason.String(), PerSecond: r.PerSecond}
	}
	return out
}

// ServerView names what answers: the binary's build (as sluice_build_info
// labels it), the config it serves (as GetConfigStatus reports it) and
// the replica's id.
type ServerView struct {
	Version  string      `json:"version"`
	Revision string      `json:"revision"` // the VCS revision, "-modified" appended for a modified tree; "unknown" without one
	Replica  string      `json:"replica"`
	Config   *ConfigView `json:"config"` // null when the server does not report its config status
}

// ConfigView is the serving config's origin.
type ConfigView struct {
	Source    string     `json:"source"`   // "embedded", a file path, or "etcd"
	Revision  int64      `json:"revision"` // etcd's revision of it; 0 when not from etcd
	AppliedAt *time.Time `json:"appliedAt,omitempty"`
}

// DomainView is one domain: the Operator's DomainInfo and what the page
// derives from it.
type DomainView struct {
	Domain json.RawMessage `json:"domain"` // admission.v1.DomainInfo
	// Use of soft capacity: the share of each bucket's burst taken, and of
	// the KV gauge's limit held.
	PrefillUse float64 `json:"prefillUse"`
	DecodeUse  float64 `json:"decodeUse"`
	KVUse      float64 `json:"kvUse"`
	// Who drained the domain and when, where known: a drain made through
	// the dashboard names its principal here; a drain through etcd carries
	// "by … at …" in the domain's drainReason; a gRPC DrainDomain's
	// principal is in the audit log only.
	DrainedBy string     `json:"drainedBy,omitempty"`
	DrainedAt *time.Time `json:"drainedAt,omitempty"`
	// Warmup is the domain's warm-up ramp after a return (undrained, GPUs
	// back, new after start-up); null when the domain is whole.
	Warmup *WarmupView `json:"warmup"`
}

// WarmupView is a domain's warm-up ramp: the share of its shared capacity
// it has, rising linearly to 1, and the seconds until it is whole.
type WarmupView struct {
	Fraction    float64 `json:"fraction"`
	LeftSeconds float64 `json:"leftSeconds"`
}

// TenantTable is the tenant table: at most n rows of the tenants matching
// the search.
type TenantTable struct {
	Total   int         `json:"total"`   // configured tenants
	Matched int         `json:"matched"` // of them, matching the search
	Active  int         `json:"active"`  // with answers in the last sample
	Sort    string      `json:"sort"`
	Rows    []TenantRow `json:"rows"`
}

// TenantRow is one tenant: the Operator's TenantInfo and its rates.
type TenantRow struct {
	Tenant            json.RawMessage `json:"tenant"` // admission.v1.TenantInfo
	AdmittedPerSecond float64         `json:"admittedPerSecond"`
	DegradedPerSecond float64         `json:"degradedPerSecond"`
	RefusedPerSecond  float64         `json:"refusedPerSecond"`
	// RefusalReasons are the tenant's commonest (at most 2), by API name.
	RefusalReasons     []ReasonView `json:"refusalReasons"`
	AchievedTokensRate float64      `json:"achievedTokensPerSecond"` // weighted tokens admitted per second
	// Budget in micro-USD (0: no cap) and what is left of the tighter one;
	// absent when neither is capped.
	BudgetDailyMicros   int64  `json:"budgetDailyMicros"`
	BudgetMonthlyMicros int64  `json:"budgetMonthlyMicros"`
	BudgetLeftMicros    *int64 `json:"budgetLeftMicros,omitempty"`
}

// SessionView says who is calling and whether the page may offer actions.
type SessionView struct {
	Principal string `json:"principal"` // "anonymous" without an auth file
	CanAct    bool   `json:"canAct"`
	AuthOn    bool   `json:"authOn"`
}

// TopologyView is the cluster the engine serves, GPU by GPU.
type TopologyView struct {
	Domains []TopoDomain `json:"domains"`
}

// TopoDomain is one NVLink domain. Shape says how the page draws it:
// "rack" (an NVL72: one row per tray) or "board" (one node's GPUs).
type TopoDomain struct {
	ID       string     `json:"id"`
	Kind     string     `json:"kind"`
	GPUModel string     `json:"gpuModel"`
	Shape    string     `json:"shape"`
	NVLinks  int        `json:"nvlinks"` // the active NVLinks a healthy GPU of the domain has (the most any has)
	Nodes    []TopoNode `json:"nodes"`
}

// TopoNode is one machine: an NVL72 compute tray, an HGX server.
type TopoNode struct {
	Name string    `json:"name"`
	GPUs []TopoGPU `json:"gpus"`
}

// TopoGPU is one GPU slot. Slot is "<domain>/<node>/<index>", the page's
// data-gpu attribute.
type TopoGPU struct {
	Slot          string `json:"slot"`
	Index         int    `json:"index"`
	UUID          string `json:"uuid,omitempty"`
	Name          string `json:"name,omitempty"`
	Healthy       bool   `json:"healthy"`
	Problem       string `json:"problem,omitempty"`
	ActiveNVLinks int    `json:"activeNvlinks"`
	// NVLinkState: "up" (as many links as the domain's best), "degraded"
	// (fewer), "down" (none where the domain has some), "none" (a domain
	// without NVLink).
	NVLinkState string `json:"nvlinkState"`
}

// topologyView renders c.
func topologyView(c topology.Cluster) TopologyView {
	out := TopologyView{Domains: make([]TopoDomain, 0, len(c.Domains))}
	for _, d := range c.Domains {
		td := TopoDomain{ID: d.ID, Kind: d.Kind, GPUModel: d.GPUModel(), Shape: "board", Nodes: make([]TopoNode, 0, len(d.Nodes))}
		if len(d.Nodes) > 1 {
			td.Shape = "rack"
		}
		for _, n := range d.Nodes {
			for _, g := range n.GPUs {
				td.NVLinks = max(td.NVLinks, g.ActiveNVLinks)
			}
		}
		for _, n := range d.Nodes {
			tn := TopoNode{Name: n.Name, GPUs: make([]TopoGPU, 0, len(n.GPUs))}
			for _, g := range n.GPUs {
				tn.GPUs = append(tn.GPUs, TopoGPU{
					Slot: fmt.Sprintf("%s/%s/%d", d.ID, n.Name, g.Index), Index: g.Index, UUID: g.UUID, Name: g.Name,
					Healthy: g.Healthy, Problem: g.Problem, ActiveNVLinks: g.ActiveNVLinks,
					NVLinkState: nvlinkState(g.ActiveNVLinks, td.NVLinks),
				})
			}
			td.Nodes = append(td.Nodes, tn)
		}
		out.Domains = append(out.Domains, td)
	}
	return out
}

// nvlinkState names a GPU's links against its domain's best.
func nvlinkState(active, best int) string {
	switch {
	case best == 0:
		return "none"
	case active >= best:
		return "up"
	case active == 0:
		return "down"
	}
	return "degraded"
}

// topologyVersion identifies a topology view, so that a stream resends it
// only when it changed.
func topologyVersion(b []byte) string {
	var h uint64 = 14695981039346656037 // FNV-1a
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return fmt.Sprintf("%016x", h)
}

// tableQuery is what the page asks of the tenant table.
type tableQuery struct {
	q    string // substring of the name; "" matches all
	sort string // "traffic" (default) or "name"
	n    int
}

// snapshot builds what the page draws now.
func (d *Dashboard) snapshot(ctx context.Context, q tableQuery, sess SessionView, topoVersion string) (Snapshot, error) {
	ld, err := d.opts.Operator.ListDomains(ctx, &admissionv1.ListDomainsRequest{})
	if err != nil {
		return Snapshot{}, fmt.Errorf("list domains: %w", err)
	}
	s := Snapshot{
		At:          d.opts.Now().UTC(),
		Domains:     make([]DomainView, 0, len(ld.GetDomains())),
		QueueLength: d.opts.State.QueueLen(),
		Leases:      d.opts.State.LeaseCount(),
		Topology:    topoVersion,
		Session:     sess,
		Totals:      map[string]int{"domains": len(ld.GetDomains())},
	}
	tr := d.opts.Traffic
	s.Answers = AnswerRates(tr.Total())
	lat := tr.AdmitLatency()
	s.AdmitLatency = LatencyView{P99Seconds: lat.P99.Seconds(), Count: lat.Count}
	s.RefusalReasons = reasonViews(tr.TopRefusals())
	s.Server = d.serverView(ctx)
	for _, di := range ld.GetDomains() {
		v := DomainView{
			Domain:     protoJSON(di),
			PrefillUse: use(di.GetPrefillLevel(), di.GetPrefillBurst()),
			DecodeUse:  use(di.GetDecodeLevel(), di.GetDecodeBurst()),
			KVUse:      share(di.GetKvInUse(), di.GetKvLimit()),
		}
		if left := di.GetWarmupLeft(); left != nil {
			v.Warmup = &WarmupView{Fraction: di.GetWarmupFraction(), LeftSeconds: left.AsDuration().Seconds()}
			s.Totals["warming"]++
		}
		if di.GetDraining() {
			s.Totals["draining"]++
			if m, ok := d.mark(di.GetId(), di.GetDrainReason()); ok {
				at := m.at.UTC()
				v.DrainedBy, v.DrainedAt = m.by, &at
			}
		}
		s.Domains = append(s.Domains, v)
	}
	if f := ld.GetCreditFreeze(); f != nil {
		s.CreditFreeze = protoJSON(f)
	}
	s.Backlog = d.backlogView(ctx)
	s.Tenants, err = d.tenantTable(ctx, q)
	return s, err
}

// serverView describes this replica. The config status is asked for at each
// snapshot, as it changes with every reload and etcd update; a server that
// does not report it (UNIMPLEMENTED) has none.
func (d *Dashboard) serverView(ctx context.Context) ServerView {
	v := ServerView{Version: d.opts.Build.Version, Revision: d.opts.Build.Revision}
	if d.opts.Replica != nil {
		v.Replica = d.opts.Replica()
	}
	cs, err := d.opts.Operator.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
	if err != nil {
		return v
	}
	v.Config = &ConfigView{Source: cs.GetSource(), Revision: cs.GetRevision()}
	if cs.GetAppliedAt() != nil {
		at := cs.GetAppliedAt().AsTime().UTC()
		v.Config.AppliedAt = &at
	}
	return v
}

// use is the share of a bucket's burst taken: 1 − level/burst, in [0, 1]
// (a bucket in debt counts as fully used).
func use(level, burst int64) float64 {
	if burst <= 0 {
		return 0
	}
	return min(max(1-float64(level)/float64(burst), 0), 1)
}

// share is used/limit in [0, 1].
func share(used, limit int64) float64 {
	if limit <= 0 {
		return 0
	}
	return min(max(float64(used)/float64(limit), 0), 1)
}

// tenantTable picks the rows: with sort "name", the first n matching names;
// otherwise the busiest matching tenants (by answers per second), then the
// rest of the matching names in order, n in all.
func (d *Dashboard) tenantTable(ctx context.Context, q tableQuery) (TenantTable, error) {
	names := d.opts.State.TenantNames()
	rt := d.opts.Traffic.table()
	tt := TenantTable{Total: len(names), Sort: q.sort}
	match := func(name string) bool { return q.q == "" || strings.Contains(name, q.q) }
	picked := make([]string, 0, q.n)
	seen := make(map[string]bool, q.n)
	for _, r := range rt.busiestFirst() {
		if r.rates.total() <= 0 {
			break // the rest have no traffic: they come in name order below
		}
		tt.Active++
		if q.sort != "name" && len(picked) < q.n && match(r.name) {
			if _, ok := slices.BinarySearch(names, r.name); ok { // still configured
				picked = append(picked, r.name)
				seen[r.name] = true
			}
		}
	}
	for _, n := range names {
		if !match(n) {
			continue
		}
		tt.Matched++
		if len(picked) < q.n && !seen[n] {
			picked = append(picked, n)
		}
	}
	tt.Rows = make([]TenantRow, 0, len(picked))
	rates := rt.ratesOf(picked)
	for _, name := range picked {
		gt, err := d.opts.Operator.GetTenant(ctx, &admissionv1.GetTenantRequest{Name: name})
		if err != nil {
			continue // left the config since the names were read
		}
		ti := gt.GetTenant()
		r := rates[name]
		row := TenantRow{
			Tenant: protoJSON(ti), AdmittedPerSecond: r.rates.Admitted, DegradedPerSecond: r.rates.Degraded,
			RefusedPerSecond: r.rates.Refused, AchievedTokensRate: r.rates.Tokens,
			RefusalReasons: reasonViews(ranked(r.reasons[:])),
		}
		b := d.opts.State.TenantBudget(name, ti.GetTier())
		row.BudgetDailyMicros, row.BudgetMonthlyMicros = micros(b.DailyUSD), micros(b.MonthlyUSD)
		row.BudgetLeftMicros = budgetLeft(row.BudgetDailyMicros, ti.GetSpentTodayMicros(), row.BudgetMonthlyMicros, ti.GetSpentMonthMicros())
		tt.Rows = append(tt.Rows, row)
	}
	return tt, nil
}

// micros converts USD to micro-USD, as the engine counts spend.
func micros(usd float64) int64 { return int64(usd * 1e6) }

// budgetLeft is what is left of the tighter capped budget; nil when
// neither is capped.
func budgetLeft(day, spentDay, month, spentMonth int64) *int64 {
	var left *int64
	for _, b := range [][2]int64{{day, spentDay}, {month, spentMonth}} {
		if b[0] <= 0 {
			continue
		}
		l := max(b[0]-b[1], 0)
		if left == nil || l < *left {
			left = &l
		}
	}
	return left
}
