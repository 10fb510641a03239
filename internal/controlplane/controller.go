package controlplane

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/client"
	"github.com/sluice-sched/sluice/admission/client/etcdmembers"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/topology"
)

// Engine is the port the controller drives; *admission.Engine satisfies it.
type Engine interface {
	// Apply validates cfg (against the cluster too) and swaps it in,
	// keeping leases and queued work; a refusal leaves the old one serving.
	Apply(cfg admission.Config) error
	// UpdateTenants changes the named tenants of the config in force
	// alone, as Apply of it with those changes would; a refusal changes
	// nothing.
	UpdateTenants(updates []admission.TenantUpdate) error
	// SetTopology replaces the cluster; leases on domains that leave finish.
	// Only an invalid cluster is refused, not one short of the floors.
	SetTopology(c topology.Cluster) error
	// DrainAhead stops new placements on a domain now if the engine has it,
	// or from the moment it appears; a domain that leaves while drained
	// comes back drained.
	DrainAhead(domain, reason string)
	// Undrain lets a domain take placements again, or clears a pending
	// DrainAhead of an absent domain; a domain neither present nor pending
	// is an error wrapping admission.ErrUnknownDomain.
	Undrain(domain string) error
	// Domains describes the domains the engine has.
	Domains() []admission.DomainInfo
	// SetStartupTopology is SetTopology without warm-up: the agents' first
	// cluster, read at start-up, is as present from the start as the local
	// one it replaces.
	SetStartupTopology(c topology.Cluster) error
	// FreezeCredit freezes every tenant's burst credit until until (an
	// absolute time every replica shares); one already past thaws.
	FreezeCredit(until time.Time, reason string)
	// ThawCredit ends a credit freeze; it reports whether one was in force.
	ThawCredit() bool
}

// Options configure a Controller.
type Options struct {
	Client *clientv3.Client
	Prefix string // NormalizePrefix applies; "" is DefaultPrefix
	Engine Engine
	// Status receives config applications and refusals and the connected
	// state; nil makes a private one (see Controller.Status).
	Status *Status
	// Self is this replica, registered under a lease; an empty ID registers
	// nothing (a replica routers do not reach through the control plane).
	Self client.Member
	// LeaseTTL is the membership lease's TTL; default 10 s. etcd raises a
	// TTL below its minimum (about 2 s with default election settings).
	LeaseTTL time.Duration
	// OnReplicas is called with the number of live replicas (this one
	// included) whenever it changes, from the controller's goroutine.
	OnReplicas func(n int)
	// OnMembers is called with the live replicas' ids (this one included,
	// sorted) whenever the set changes, from the controller's goroutine.
	OnMembers func(ids []string)
	// OnConnected is called when etcd's reachability changes (sluiced
	// turns it into a gRPC health status).
	OnConnected func(ok bool)
	// ProbeEvery is how often etcd's reachability is checked; default 2 s.
	ProbeEvery time.Duration
	// RetryEvery is the pause before a broken watch or registration is
	// tried again; default 500 ms.
	RetryEvery time.Duration
	Logger     *slog.Logger // nil discards
	Metrics    *Metrics     // nil records nothing
	// Now is the clock for the times Status records; default time.Now.
	Now func() time.Time
}

// Controller follows the control-plane keys and applies them to an engine:
// config, topology from node agents, drains, and the replica count. It also
// registers its replica and probes etcd. Run does all of it; Sync does one
// full read, which sluiced calls at start so that it serves etcd's config
// from its first request when etcd is up.
type Controller struct {
	opts   Options
	prefix string

	// syncMu serializes Sync and the watch loop: one goroutine at a time
	// owns st and calls the engine.
	syncMu sync.Mutex
	st     state

	// memberExpiry is when this replica's member lease expires unless
	// renewed, as of its last grant or keepalive (unix nanoseconds; 0:
	// not registered yet, or left). A lease the client gave up keeps its
	// expiry until the next registration. Atomic: the engine reads it
	// under its own lock.
	memberExpiry atomic.Int64

	mu struct {
		sync.Mutex
		rev      int64 // the revision the engine reflects
		replicas int
		lease    clientv3.LeaseID
		synced   bool
	}
}

// state is the controller's copy of the keys, and what each of its
// reconcilers (config, topology, drains, members; the credit freeze keeps
// nothing) last applied, each in its own part; only the holder of syncMu
// touches it.
type state struct {
	kvs    keys
	rev    int64
	synced bool
	// started is set after the first full read: until then an agents'
	// cluster is the start-up one and does not warm up.
	started bool
	badKeys keyWarnings

	config   configApplied
	topology topologyApplied
	drains   drainsApplied
	members  membersApplied
}

// configApplied is what the config reconciler last did.
type configApplied struct {
	// deleteRev is the revision of the latest deletion of a config key;
	// with the documents' own revisions it makes the config's fingerprint.
	deleteRev int64
	seen      int64 // config fingerprint last applied or refused
	// refusal is the engine's refusal of the last config (floors too
	// large for the cluster, say), "" when the last config was applied or
	// refused before the engine saw it: a topology change retries only an
	// engine refusal, and a retry refused for the same reason is not
	// recorded again.
	refusal string
	// current is set while the engine holds the config of the documents
	// as of seen: a change of tenant documents alone is then applied to
	// those tenants alone. inline is set when the policy document holds
	// tenants of its own (a tenant document must then be checked against
	// them: such changes take the whole path).
	current, inline bool
}

// topologyApplied is what the topology reconciler last did with the node
// agents' records.
type topologyApplied struct {
	agentsSeen bool                   // some agent has published since start
	agentsGone bool                   // every agent left; the serving cluster is cluster, all unhealthy
	refused    bool                   // the last agent topology was refused; retry after a config change
	agents     map[string]AgentRecord // the records of the serving topology
	cluster    topology.Cluster       // the last cluster the agents built
}

// drainsApplied is what the drain reconciler applied.
type drainsApplied struct {
	// marks holds the marks this controller applied (drained now or from
	// the moment the domain appears), by domain; when a mark goes, its
	// domain is undrained only if the mark's drain was the first.
	marks   map[string]markDrain
	unknown map[string]bool // marks for domains the engine lacks, logged once
}

// membersApplied is what the member reconciler last reported.
type membersApplied struct {
	replicas int      // last count passed to OnReplicas
	ids      []string // last set passed to OnMembers
}

// keyWarnings remembers, by key, why a key was skipped, to log each problem
// once.
type keyWarnings map[string]string

// warnOnce logs a skipped key once per distinct problem.
func (w keyWarnings) warnOnce(log *slog.Logger, key, msg string, err error) {
	if w[key] == err.Error() {
		return
	}
	w[key] = err.Error()
	log.Error(msg, "key", key, "err", err)
}

// markDrain is a drain mark the controller applied.
type markDrain struct {
	reason string // the mark's Describe, as last applied
	// before is set when the engine already drained the domain when the
	// mark first came (the Operator RPC did): the mark does not own the
	// drain, and its removal gives the domain back its earlier reason
	// instead of undraining it. priorReason is that reason.
	before      bool
	priorReason string
}

// entry is one key's value, the revision that wrote it, and the name after
// its directory (tenant, domain, node or member id).
type entry struct {
	value  []byte
	modRev int64
	name   string
}

// keys holds the keys under the prefix by kind, so that reconciling one
// kind (a drain among 100k tenant documents) touches only its own keys.
type keys map[kind]map[string]entry

// put stores e under key, of kind k with name; keys of no kind the
// controller reads are not kept.
func (ks keys) put(k kind, key, name string, e entry) {
	if k == kindOther {
		return
	}
	m := ks[k]
	if m == nil {
		m = make(map[string]entry)
		ks[k] = m
	}
	e.name = name
	ks[k][key] = e
}

// New returns a Controller; nothing happens until Sync or Run.
func New(opts Options) (*Controller, error) {
	if opts.Client == nil || opts.Engine == nil {
		return nil, errors.New("controlplane: Client and Engine are required")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Status == nil {
		opts.Status = NewStatus(SourceEmbedded, opts.Now(), opts.Metrics)
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = 10 * time.Second
	}
	if opts.ProbeEvery <= 0 {
		opts.ProbeEvery = 2 * time.Second
	}
	if opts.RetryEvery <= 0 {
		opts.RetryEvery = 500 * time.Millisecond
	}
	if opts.Self.ID != "" {
		if _, err := etcdmembers.Encode(opts.Self); err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
	}
	c := &Controller{opts: opts, prefix: NormalizePrefix(opts.Prefix)}
	c.st = state{kvs: keys{}, badKeys: keyWarnings{},
		drains: drainsApplied{marks: map[string]markDrain{}, unknown: map[string]bool{}}}
	return c, nil
}

// Status returns the Status the controller feeds.
func (c *Controller) Status() *Status { return c.opts.Status }

// Prefix returns the normalized key prefix.
func (c *Controller) Prefix() string { return c.prefix }

// Revision returns the etcd revision whose state the engine reflects: every
// write at or before it has been applied (or refused).
func (c *Controller) Revision() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.rev
}

// Replicas returns the live replica count last computed (at least 1).
func (c *Controller) Replicas() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return max(c.mu.replicas, 1)
}

// LeaseID returns the lease this replica's member key is attached to; 0
// when not registered.
func (c *Controller) LeaseID() clientv3.LeaseID {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.lease
}

// MemberExpiry returns when this replica's member lease expires unless
// it is renewed again: the last grant or keepalive answered plus the
// lease's TTL, which is when the other replicas and the routers see it
// gone if it dies now. Zero before it registers and once it has left.
func (c *Controller) MemberExpiry() time.Time {
	if ns := c.memberExpiry.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// renewedFor records that the member lease has ttl seconds left now.
func (c *Controller) renewedFor(ttl int64) {
	c.memberExpiry.Store(c.opts.Now().Add(time.Duration(ttl) * time.Second).UnixNano())
}

// Synced reports whether a full read has succeeded.
func (c *Controller) Synced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.synced
}

// Sync reads every key under the prefix and applies them: config, topology,
// drains, replica count. It marks etcd connected on success.
func (c *Controller) Sync(ctx context.Context) error {
	c.syncMu.Lock()
	defer c.syncMu.Unlock()
	return c.syncLocked(ctx)
}

// syncLocked is Sync with syncMu held.
func (c *Controller) syncLocked(ctx context.Context) error {
	resp, err := c.opts.Client.Get(ctx, c.prefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("read %s: %w", c.prefix, err)
	}
	c.opts.Metrics.resynced()
	old := c.st.kvs
	c.st.kvs = keys{}
	for _, kv := range resp.Kvs {
		k, name := classify(c.prefix, string(kv.Key))
		c.st.kvs.put(k, string(kv.Key), name, entry{value: kv.Value, modRev: kv.ModRevision})
	}
	// A config key that vanished while we were not watching counts as a
	// deletion at this revision, so that the fingerprint changes.
	for _, k := range []kind{kindConfig, kindTenant} {
		for key := range old[k] {
			if _, still := c.st.kvs[k][key]; !still {
				c.st.config.deleteRev = resp.Header.Revision
			}
		}
	}
	c.st.synced = true
	c.reconcile(resp.Header.Revision, touched{config: true, whole: true, agents: true, drains: true, members: true, freeze: true})
	c.st.started = true
	c.mu.Lock()
	c.mu.synced = true
	c.mu.Unlock()
	if c.setConnected(true) {
		c.opts.Logger.Info("control plane reachable; following etcd", "revision", resp.Header.Revision)
	}
	return nil
}

// touched says which kinds of key an update changed. A config change is
// whole (the policy document changed, or everything was read) or only of
// the tenant documents named in tenants.
type touched struct {
	config, agents, drains, members, freeze bool
	whole                                   bool
	tenants                                 []string
}

func (t *touched) add(k kind, name string) {
	switch k {
	case kindConfig:
		t.config, t.whole = true, true
	case kindTenant:
		t.config = true
		t.tenants = append(t.tenants, name)
	case kindAgent:
		t.agents = true
	case kindDrain:
		t.drains = true
	case kindMember:
		t.members = true
	case kindFreeze:
		t.freeze = true
	}
}

// Run follows etcd until ctx ends: it syncs (retrying while etcd is down),
// watches from the synced revision, registers this replica under a lease and
// probes reachability. On return the replica's lease is revoked, so that
// routers and the other replicas see it leave at once.
func (c *Controller) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { c.probe(ctx) })
	if c.opts.Self.ID != "" {
		wg.Go(func() { c.register(ctx) })
	}
	c.follow(ctx)
	wg.Wait()
}

// errCompacted is a watch whose next revision was compacted away.
var errCompacted = errors.New("watch revision compacted")

// follow is the watch loop: sync when not synced, then watch from the last
// applied revision; a broken watch is resumed from that revision, and a
// compacted one answered by a full read.
func (c *Controller) follow(ctx context.Context) {
	for ctx.Err() == nil {
		c.syncMu.Lock()
		var err error
		if !c.st.synced {
			err = c.syncLocked(ctx)
		}
		rev := c.st.rev
		c.syncMu.Unlock()
		if err == nil {
			err = c.watch(ctx, rev)
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errCompacted) {
			c.opts.Logger.Warn("watch revision compacted; reading everything again", "from", rev+1)
			c.syncMu.Lock()
			c.st.synced = false
			c.syncMu.Unlock()
			continue
		}
		c.opts.Logger.Debug("watch broke; resuming", "from", rev+1, "err", err)
		_ = clock.Sleep(ctx, c.opts.RetryEvery)
	}
}

// watch applies the changes after rev until the watch breaks.
func (c *Controller) watch(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := c.opts.Client.Watch(wctx, c.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for wr := range wch {
		if wr.CompactRevision != 0 || errors.Is(wr.Err(), rpctypes.ErrCompacted) {
			return errCompacted
		}
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch %s from %d: %w", c.prefix, rev+1, err)
		}
		if len(wr.Events) == 0 {
			continue // progress notification
		}
		c.syncMu.Lock()
		var t touched
		for _, ev := range wr.Events {
			key := string(ev.Kv.Key)
			k, name := classify(c.prefix, key)
			t.add(k, name)
			if ev.Type == clientv3.EventTypeDelete {
				delete(c.st.kvs[k], key)
				if k == kindConfig || k == kindTenant {
					c.st.config.deleteRev = ev.Kv.ModRevision
				}
				continue
			}
			c.st.kvs.put(k, key, name, entry{value: ev.Kv.Value, modRev: ev.Kv.ModRevision})
		}
		c.reconcile(wr.Header.Revision, t)
		c.syncMu.Unlock()
	}
	if ctx.Err() != nil {
		return nil
	}
	return errors.New("watch channel closed")
}

// reconcile applies the kinds of key t names to the engine, then records rev
// as applied. Drains go first: a mark of an absent domain is pending in the
// engine before the topology that brings the domain back, so that it never
// takes a placement. Then the topology (a config may need the new capacity;
// a config the engine refused is retried after it changes), then the config
// (a new one may let a refused topology through).
func (c *Controller) reconcile(rev int64, t touched) {
	if t.drains {
		c.reconcileDrains()
	}
	topoChanged := false
	if t.agents {
		topoChanged = c.reconcileTopology()
	}
	retry := topoChanged && c.st.config.refusal != ""
	if t.config || retry {
		applied := false
		if !t.whole && !retry && c.st.config.current && !c.st.config.inline {
			applied = c.reconcileTenants(t.tenants)
		} else {
			applied = c.reconcileConfig(retry)
		}
		if applied && c.st.topology.refused {
			// The new config may fit the cluster the old one did not.
			topoChanged = c.reconcileTopology() || topoChanged
		}
	}
	if t.drains || topoChanged {
		c.noteUnknownMarks()
	}
	if t.members {
		c.reconcileMembers()
	}
	if t.freeze {
		c.reconcileFreeze()
	}
	c.st.rev = rev
	c.opts.Metrics.gauges(max(c.st.members.replicas, 1), len(c.st.topology.agents), len(c.st.kvs[kindDrain]))
	c.mu.Lock()
	c.mu.rev = rev
	c.mu.Unlock()
}

// reconcileConfig builds the config from the documents and applies it when
// it changed since the last attempt, or when retry is set (the topology
// changed after the engine refused it). A retry the engine refuses for the
// reason it gave last time is logged at debug level only: the refusal was
// recorded and counted once. It reports whether a config was applied.
func (c *Controller) reconcileConfig(retry bool) bool {
	base, hasBase := c.st.kvs[kindConfig][ConfigKey(c.prefix)]
	tenants := make(map[string][]byte, len(c.st.kvs[kindTenant]))
	fp := max(base.modRev, c.st.config.deleteRev)
	for _, e := range c.st.kvs[kindTenant] {
		tenants[e.name] = e.value
		fp = max(fp, e.modRev)
	}
	retry = retry && fp == c.st.config.seen
	if fp == c.st.config.seen && !retry {
		return false
	}
	lastRefusal := c.st.config.refusal
	c.st.config.seen, c.st.config.refusal = fp, "" // only an engine refusal below sets it again
	c.st.config.current = false                    // only an application below sets it again
	if !hasBase {
		if fp == 0 {
			return false // etcd holds no config: the local one serves
		}
		c.refuse(fp, &config.Error{File: ConfigKey(c.prefix),
			Reason: "no policy document (tiers, models, knobs); the tenant documents cannot serve alone"})
		return false
	}
	cfg, err := ParseDocuments(c.prefix, base.value, tenants)
	if err != nil {
		c.refuse(fp, err)
		return false
	}
	if err := c.opts.Engine.Apply(cfg); err != nil {
		err = c.engineRefused(maps.Keys(tenants), err)
		if retry && c.st.config.refusal == lastRefusal {
			c.opts.Logger.Debug("config in etcd retried after a topology change; still refused for the same reason",
				"key", ConfigKey(c.prefix), "revision", fp, "err", err)
			return false
		}
		c.refuse(fp, err)
		return false
	}
	c.opts.Status.Applied(SourceEtcd, fp, c.opts.Now())
	c.opts.Logger.Info("config applied from etcd", "key", ConfigKey(c.prefix), "revision", fp,
		"tenants", len(cfg.Tenants), "tenant_documents", len(tenants))
	c.st.config.current, c.st.config.inline = true, len(cfg.Tenants) != len(tenants)
	return true
}

// reconcileTenants applies a change of the named tenant documents alone
// (written or deleted) to the engine, which holds the config of the other
// documents: its cost is the change's, not every tenant's. A refusal
// (a document that does not decode, an engine refusal) is recorded as a
// whole config's is, and the next change reads every document again.
func (c *Controller) reconcileTenants(names []string) bool {
	slices.Sort(names)
	names = slices.Compact(names)
	fp := max(c.st.config.seen, c.st.config.deleteRev)
	updates := make([]admission.TenantUpdate, 0, len(names))
	var bad error
	for _, name := range names {
		e, ok := c.st.kvs[kindTenant][TenantKey(c.prefix, name)]
		if !ok {
			updates = append(updates, admission.TenantUpdate{Name: name, Remove: true})
			continue
		}
		fp = max(fp, e.modRev)
		tc, err := parseTenantDocument(c.prefix, name, e.value)
		if err != nil && bad == nil {
			bad = err
		}
		updates = append(updates, admission.TenantUpdate{Name: name, Config: tc})
	}
	c.st.config.seen, c.st.config.refusal, c.st.config.current = fp, "", false
	if bad != nil {
		c.refuse(fp, bad)
		return false
	}
	if err := c.opts.Engine.UpdateTenants(updates); err != nil {
		err = c.engineRefused(slices.Values(names), err)
		c.refuse(fp, err)
		return false
	}
	c.st.config.current = true
	c.opts.Status.Applied(SourceEtcd, fp, c.opts.Now())
	c.opts.Logger.Info("tenant documents applied from etcd", "key", ConfigKey(c.prefix), "revision", fp, "tenants_changed", len(names))
	return true
}

// engineRefused names the file of an engine's refusal (the tenant document
// among names it points into, else the policy document) and remembers it:
// a topology change retries only an engine refusal.
func (c *Controller) engineRefused(names iter.Seq[string], err error) error {
	err = attribute(c.prefix, names, config.Wrap(ConfigKey(c.prefix), err))
	c.st.config.refusal = err.Error()
	return err
}

// refuse records and logs a refused config.
func (c *Controller) refuse(rev int64, err error) {
	r := RefusalOf(ConfigKey(c.prefix), rev, c.opts.Now(), err)
	c.opts.Status.Refused(r)
	c.opts.Logger.Error("config in etcd refused; the last good config keeps serving",
		"source", r.Source, "key", r.Key, "reason", r.Reason, "revision", rev)
}

// goneProblem is the Problem of the GPUs of a cluster whose agents all left.
const goneProblem = "node agent gone"

// reconcileTopology merges the agents' records into a cluster and sets it.
// Records that do not decode are skipped (and logged once). When every agent
// that had published is gone, the last cluster they built stays, with every
// GPU unhealthy: no new placement anywhere until an agent returns, while the
// leases there finish. It reports whether the engine's cluster changed.
func (c *Controller) reconcileTopology() bool {
	agents := make(map[string]AgentRecord)
	for k, e := range c.st.kvs[kindAgent] {
		node := e.name
		r, err := decodeAgent(node, e.value)
		if err != nil {
			c.st.badKeys.warnOnce(c.opts.Logger, k, "skipping a node agent's record", err)
			continue
		}
		delete(c.st.badKeys, k)
		agents[node] = r
	}
	if len(agents) == 0 {
		c.st.topology.agents = nil
		if !c.st.topology.agentsSeen || c.st.topology.agentsGone {
			return false // none yet: the local topology serves; or already handled
		}
		gone := unhealthyCluster(c.st.topology.cluster, goneProblem)
		if err := c.opts.Engine.SetTopology(gone); err != nil {
			c.opts.Logger.Error("every node agent is gone, and the engine refused their cluster marked unhealthy; the last topology keeps serving",
				"err", err)
			return false
		}
		c.st.topology.agentsGone = true
		c.opts.Logger.Error("every node agent is gone; their GPUs are marked unhealthy: nothing new is placed until an agent publishes again (leases finish)",
			"domains", len(gone.Domains), "gpus", gone.GPUCount())
		return true
	}
	if maps.EqualFunc(agents, c.st.topology.agents, recordsEqual) && !c.st.topology.refused && !c.st.topology.agentsGone {
		return false
	}
	nodes := make([]topology.NodeDiscovery, 0, len(agents))
	for _, n := range slices.Sorted(maps.Keys(agents)) {
		nodes = append(nodes, agents[n].Discovery())
	}
	cluster, err := topology.Merge(nodes)
	switch {
	case err != nil:
	case !c.st.started:
		// Read at start-up: the fleet's domains, present from the start,
		// start whole. Agents that return later warm their domains up.
		err = c.opts.Engine.SetStartupTopology(cluster)
	default:
		err = c.opts.Engine.SetTopology(cluster)
	}
	if err != nil {
		c.st.topology.refused = true
		c.opts.Logger.Error("topology from the node agents refused; the last topology keeps serving",
			"nodes", len(agents), "err", err)
		return false
	}
	if c.st.topology.agentsGone {
		c.opts.Logger.Info("node agents are back; their GPUs serve again", "nodes", len(agents))
	}
	c.st.topology.refused, c.st.topology.agentsGone, c.st.topology.agentsSeen = false, false, true
	c.st.topology.agents, c.st.topology.cluster = agents, cluster
	c.opts.Logger.Info("topology from the node agents", "nodes", len(agents), "domains", len(cluster.Domains), "gpus", cluster.GPUCount())
	return true
}

// unhealthyCluster returns a deep copy of c with every GPU unhealthy, its
// problem set to problem.
func unhealthyCluster(c topology.Cluster, problem string) topology.Cluster {
	out := topology.Cluster{Domains: make([]topology.Domain, len(c.Domains))}
	for i, d := range c.Domains {
		d.Nodes = slices.Clone(d.Nodes)
		for j := range d.Nodes {
			gpus := slices.Clone(d.Nodes[j].GPUs)
			for k := range gpus {
				gpus[k].Healthy, gpus[k].Problem = false, problem
			}
			d.Nodes[j].GPUs = gpus
		}
		out.Domains[i] = d
	}
	return out
}

// recordsEqual compares two agent records.
func recordsEqual(a, b AgentRecord) bool {
	return a.Node == b.Node && a.Domain == b.Domain && slices.Equal(a.GPUs, b.GPUs) && slices.EqualFunc(a.Engines, b.Engines, func(x, y AgentEngine) bool { return topology.Engine(x).Equal(topology.Engine(y)) })
}

// reconcileDrains applies the drain marks with the engine's DrainAhead: a
// marked domain is drained now if the engine has it, or from the moment it
// appears. Marks are authoritative for the domains they name: every mark is
// applied again at each reconcile of the drains (DrainAhead is idempotent),
// so that an Operator RPC undrain of a marked domain lasts only until the
// next change to the marks. When a mark goes, its domain is undrained
// unless the engine had it drained before the mark came (an Operator RPC
// drain): that domain keeps its drain, with its earlier reason. Domains no
// mark names are left alone.
func (c *Controller) reconcileDrains() {
	want := make(map[string]string)
	for k, e := range c.st.kvs[kindDrain] {
		domain := e.name
		m, err := decodeDrain(domain, e.value)
		if err != nil {
			c.st.badKeys.warnOnce(c.opts.Logger, k, "drain mark unreadable; draining anyway", err)
		} else {
			delete(c.st.badKeys, k)
		}
		want[domain] = m.Describe()
	}
	var engine map[string]admission.DomainInfo // read once, when a mark comes or goes
	engineDomains := func() map[string]admission.DomainInfo {
		if engine == nil {
			engine = make(map[string]admission.DomainInfo)
			for _, d := range c.opts.Engine.Domains() {
				engine[d.ID] = d
			}
		}
		return engine
	}
	for _, d := range slices.Sorted(maps.Keys(want)) {
		md, ok := c.st.drains.marks[d]
		if !ok {
			if info, has := engineDomains()[d]; has && info.Draining {
				md.before, md.priorReason = true, info.DrainReason
			}
		}
		c.opts.Engine.DrainAhead(d, want[d])
		if !ok || md.reason != want[d] {
			c.opts.Logger.Info("drain mark applied", "domain", d, "reason", want[d], "drained_before", md.before)
		}
		md.reason = want[d]
		c.st.drains.marks[d] = md
	}
	for _, d := range slices.Sorted(maps.Keys(c.st.drains.marks)) {
		if _, ok := want[d]; ok {
			continue
		}
		md := c.st.drains.marks[d]
		if md.before {
			// Give it back the drain it had before the mark, unless the
			// Operator RPC undrained it since. (An absent domain's drain
			// is pending: the mark's, re-applied at every reconcile.)
			if info, has := engineDomains()[d]; !has || info.Draining {
				c.opts.Engine.DrainAhead(d, md.priorReason)
			}
			delete(c.st.drains.marks, d)
			c.opts.Logger.Info("drain mark removed; the domain stays drained, as it was before the mark", "domain", d, "reason", md.priorReason)
			continue
		}
		if err := c.opts.Engine.Undrain(d); err != nil && !errors.Is(err, admission.ErrUnknownDomain) {
			c.opts.Logger.Error("undrain failed", "domain", d, "err", err)
			continue
		}
		delete(c.st.drains.marks, d)
		c.opts.Logger.Info("domain undrained", "domain", d)
	}
}

// noteUnknownMarks logs, once per domain, a drain mark for a domain the
// engine does not have: a typo, or a domain whose agents have not published
// (the mark holds from the moment it appears).
func (c *Controller) noteUnknownMarks() {
	have := make(map[string]bool)
	for _, d := range c.opts.Engine.Domains() {
		have[d.ID] = true
	}
	for _, e := range c.st.kvs[kindDrain] {
		switch d := e.name; {
		case have[d]:
			delete(c.st.drains.unknown, d)
		case !c.st.drains.unknown[d]:
			c.st.drains.unknown[d] = true
			c.opts.Logger.Warn("drain mark for a domain this replica does not have; it applies if the domain appears",
				"domain", d, "key", DrainKey(c.prefix, d))
		}
	}
	for d := range c.st.drains.unknown {
		if _, ok := c.st.kvs[kindDrain][DrainKey(c.prefix, d)]; !ok {
			delete(c.st.drains.unknown, d)
		}
	}
}

// reconcileMembers counts the live replicas and reports a change of their
// set and of their count.
func (c *Controller) reconcileMembers() {
	members := make(map[string]bool)
	for k, e := range c.st.kvs[kindMember] {
		m, err := etcdmembers.Decode(c.prefix, k, e.value)
		if err != nil {
			c.st.badKeys.warnOnce(c.opts.Logger, k, "skipping a member entry", err)
			continue
		}
		members[m.ID] = true
	}
	if c.opts.Self.ID != "" {
		members[c.opts.Self.ID] = true // we are live, registered or not (yet)
	}
	if ids := slices.Sorted(maps.Keys(members)); !slices.Equal(ids, c.st.members.ids) {
		c.st.members.ids = ids
		if c.opts.OnMembers != nil {
			c.opts.OnMembers(ids)
		}
	}
	n := max(len(members), 1)
	if n == c.st.members.replicas {
		return
	}
	c.opts.Logger.Info("replica count", "replicas", n, "was", c.st.members.replicas)
	c.st.members.replicas = n
	c.mu.Lock()
	c.mu.replicas = n
	c.mu.Unlock()
	if c.opts.OnReplicas != nil {
		c.opts.OnReplicas(n)
	}
}

// setConnected records etcd's reachability and reports whether it changed.
func (c *Controller) setConnected(ok bool) bool {
	if !c.opts.Status.SetConnected(ok, c.opts.Now()) {
		return false
	}
	if c.opts.OnConnected != nil {
		c.opts.OnConnected(ok)
	}
	return true
}

// probe checks etcd's reachability every ProbeEvery and records transitions.
func (c *Controller) probe(ctx context.Context) {
	t := time.NewTicker(c.opts.ProbeEvery)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, c.opts.ProbeEvery)
		// A linearizable read: it fails without a quorum, as writes would.
		_, err := c.opts.Client.Get(pctx, ConfigKey(c.prefix), clientv3.WithCountOnly())
		cancel()
		if ctx.Err() != nil {
			return
		}
		if c.setConnected(err == nil) {
			if err != nil {
				c.opts.Logger.Error("control plane unreachable; serving the last good config, topology and drains",
					"prefix", c.prefix, "err", err)
			} else {
				c.opts.Logger.Info("control plane reachable again", "prefix", c.prefix)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// register keeps this replica's member key under a lease until ctx ends,
// registering again whenever the lease is lost; on return it revokes it.
// A lost lease is revoked only once the key is under its successor: the
// client gives a lease up when etcd has not answered for a TTL, and etcd,
// back from an outage, may still hold it; revoking it first would delete
// the key and leave routers that watch the members without this replica
// until the new one is written.
func (c *Controller) register(ctx context.Context) {
	key := etcdmembers.Key(c.prefix, c.opts.Self.ID)
	value, _ := etcdmembers.Encode(c.opts.Self) // checked in New
	var lost clientv3.LeaseID
	defer func() {
		if lost != 0 {
			revoke(c.opts.Client, lost)
		}
		c.memberExpiry.Store(0) // left
	}()
	for ctx.Err() == nil {
		var err error
		lost, err = c.registerOnce(ctx, key, value, lost)
		if ctx.Err() != nil {
			return
		}
		c.opts.Logger.Warn("replica registration lost; registering again", "key", key, "err", err)
		_ = clock.Sleep(ctx, c.opts.RetryEvery)
	}
}

// registerOnce writes the member key under a new lease, revokes the lease
// it held before (previous, 0 for none) once the key has moved off it, and
// keeps the new lease alive until it is lost or ctx ends. It returns the
// lease left to revoke: the lost one, or previous when no new one took the
// key; when ctx ends it revokes its lease itself and returns 0.
func (c *Controller) registerOnce(ctx context.Context, key string, value []byte, previous clientv3.LeaseID) (clientv3.LeaseID, error) {
	secs := int64((c.opts.LeaseTTL + time.Second - 1) / time.Second)
	lease, err := c.opts.Client.Grant(ctx, secs)
	if err != nil {
		return previous, fmt.Errorf("grant a %ds lease: %w", secs, err)
	}
	if _, err := c.opts.Client.Put(ctx, key, string(value), clientv3.WithLease(lease.ID)); err != nil {
		revoke(c.opts.Client, lease.ID)
		return previous, fmt.Errorf("write %s: %w", key, err)
	}
	if previous != 0 {
		revoke(c.opts.Client, previous)
	}
	c.mu.Lock()
	c.mu.lease = lease.ID
	c.mu.Unlock()
	c.renewedFor(lease.TTL)
	// A lost lease keeps its expiry: etcd may hold the key under it until
	// then, and the next registration moves the key and the expiry on.
	defer func() {
		c.mu.Lock()
		c.mu.lease = 0
		c.mu.Unlock()
	}()
	c.opts.Logger.Info("replica registered", "key", key, "addr", c.opts.Self.Addr, "ttl", secs)
	ka, err := c.opts.Client.KeepAlive(ctx, lease.ID)
	if err != nil {
		if ctx.Err() != nil {
			revoke(c.opts.Client, lease.ID)
			return 0, nil
		}
		return lease.ID, fmt.Errorf("keep lease %x alive: %w", lease.ID, err)
	}
	for resp := range ka {
		c.renewedFor(resp.TTL)
	}
	if ctx.Err() != nil {
		revoke(c.opts.Client, lease.ID)
		return 0, nil
	}
	return lease.ID, fmt.Errorf("lease %x expired or was revoked", lease.ID)
}
