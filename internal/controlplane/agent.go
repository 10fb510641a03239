package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/topology"
)

// AgentRecord is what a node agent publishes under its node's key: the
// node's GPUs and the NVLink domain they are in (topology.NodeDiscovery on
// the wire). Replicas merge every record with topology.Merge.
type AgentRecord struct {
	Node string `json:"node"`
	// Domain is the multi-node NVLink clique id; "" makes the node its own
	// domain (an HGX board's NVLink island).
	Domain string     `json:"domain,omitempty"`
	GPUs   []AgentGPU `json:"gpus"`
	// Engines are the node's serving engines, whose metrics the replicas
	// read to correct their domain's capacity.
	Engines []AgentEngine `json:"engines,omitempty"`
}

// AgentEngine is one serving engine of an AgentRecord.
type AgentEngine struct {
	Metrics string   `json:"metrics"`
	Kind    string   `json:"kind"`
	Address string   `json:"address,omitempty"` // where a gateway routes requests; empty: metrics only
	Models  []string `json:"models,omitempty"`  // the model names it serves; empty: every model
}

// AgentGPU is one GPU of an AgentRecord.
type AgentGPU struct {
	Index         int        `json:"index"`
	UUID          string     `json:"uuid,omitempty"`
	Name          string     `json:"name"`
	PCIBusID      string     `json:"pci_bus_id,omitempty"`
	ActiveNVLinks int        `json:"active_nvlinks"`
	Healthy       bool       `json:"healthy"`
	Problem       string     `json:"problem,omitempty"`
	Peaks         AgentPeaks `json:"peaks"`
	// NVML's raw readings (zero where not read), so that sluicectl
	// topology on any replica shows what the node's driver reported.
	MemoryBytes        int64 `json:"memory_bytes,omitempty"`
	MaxSMClockMHz      int   `json:"max_sm_clock_mhz,omitempty"`
	MaxMemClockMHz     int   `json:"max_mem_clock_mhz,omitempty"`
	MemoryBusWidthBits int   `json:"memory_bus_width_bits,omitempty"`
}

// AgentPeaks are a GPU's peaks as the agent found them.
type AgentPeaks struct {
	SMs          int     `json:"sms"`
	FLOPS        float64 `json:"flops"`
	HBMBandwidth float64 `json:"hbm_bandwidth"`
	HBMBytes     int64   `json:"hbm_bytes"`
	Source       string  `json:"source,omitempty"`
	// Figures says where each figure came from where it differs from
	// Source (an NVML estimate mixes readings and derivations).
	Figures *topology.PeakSources `json:"figures,omitempty"`
}

// RecordOf renders a node's discovery for publishing.
func RecordOf(nd topology.NodeDiscovery) AgentRecord {
	r := AgentRecord{Node: nd.Node, Domain: nd.Domain, GPUs: make([]AgentGPU, len(nd.GPUs))}
	for _, e := range nd.Engines {
		r.Engines = append(r.Engines, AgentEngine(e))
	}
	for i, g := range nd.GPUs {
		r.GPUs[i] = AgentGPU{
			Index: g.Index, UUID: g.UUID, Name: g.Name, PCIBusID: g.PCIBusID,
			ActiveNVLinks: g.ActiveNVLinks, Healthy: g.Healthy, Problem: g.Problem,
			Peaks: AgentPeaks{SMs: g.Peaks.SMs, FLOPS: g.Peaks.FLOPS, HBMBandwidth: g.Peaks.HBMBandwidth,
				HBMBytes: g.Peaks.HBMBytes, Source: g.Peaks.Source},
			MemoryBytes: g.MemoryBytes, MaxSMClockMHz: g.MaxSMClockMHz, MaxMemClockMHz: g.MaxMemClockMHz,
			MemoryBusWidthBits: g.MemoryBusWidthBits,
		}
		if g.Peaks.Figures != (topology.PeakSources{}) {
			f := g.Peaks.Figures
			r.GPUs[i].Peaks.Figures = &f
		}
	}
	return r
}

// Discovery returns the record as a topology.NodeDiscovery.
func (r AgentRecord) Discovery() topology.NodeDiscovery {
	nd := topology.NodeDiscovery{Node: r.Node, Domain: r.Domain, GPUs: make([]topology.GPU, len(r.GPUs))}
	for _, e := range r.Engines {
		nd.Engines = append(nd.Engines, topology.Engine(e))
	}
	for i, g := range r.GPUs {
		nd.GPUs[i] = topology.GPU{
			Index: g.Index, UUID: g.UUID, Name: g.Name, PCIBusID: g.PCIBusID,
			ActiveNVLinks: g.ActiveNVLinks, Healthy: g.Healthy, Problem: g.Problem,
			Peaks: topology.Peaks{SMs: g.Peaks.SMs, FLOPS: g.Peaks.FLOPS, HBMBandwidth: g.Peaks.HBMBandwidth,
				HBMBytes: g.Peaks.HBMBytes, Source: g.Peaks.Source},
			MemoryBytes: g.MemoryBytes, MaxSMClockMHz: g.MaxSMClockMHz, MaxMemClockMHz: g.MaxMemClockMHz,
			MemoryBusWidthBits: g.MemoryBusWidthBits,
		}
		if g.Peaks.Figures != nil {
			nd.GPUs[i].Peaks.Figures = *g.Peaks.Figures
		}
	}
	return nd
}

// maxAgentGPUs bounds one node's GPUs, as NVML discovery does, so that a
// corrupt record cannot make every replica build a huge cluster.
const maxAgentGPUs = 1024

// maxAgentEngines bounds one node's serving engines likewise.
const maxAgentEngines = 64

// decodeAgent reads the record under node's agent key and checks it alone:
// strict JSON (one value, nothing after it), the node it names is the key's, it has GPUs, and it merges into
// a valid cluster by itself (peaks positive and finite, indexes unique).
func decodeAgent(node string, value []byte) (AgentRecord, error) {
	var r AgentRecord
	dec := json.NewDecoder(strings.NewReader(string(value)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return AgentRecord{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return AgentRecord{}, errors.New("trailing data after the record")
	}
	switch {
	case r.Node != node:
		return AgentRecord{}, fmt.Errorf("names node %q", r.Node)
	case len(r.GPUs) == 0:
		return AgentRecord{}, errors.New("no GPUs")
	case len(r.GPUs) > maxAgentGPUs:
		return AgentRecord{}, fmt.Errorf("%d GPUs, more than the %d a node may have", len(r.GPUs), maxAgentGPUs)
	case len(r.Engines) > maxAgentEngines:
		return AgentRecord{}, fmt.Errorf("%d engines, more than the %d a node may have", len(r.Engines), maxAgentEngines)
	}
	if _, err := topology.Merge([]topology.NodeDiscovery{r.Discovery()}); err != nil {
		return AgentRecord{}, err
	}
	return r, nil
}

// AgentDomains returns the ids of the domains the node agents' records under
// prefix make (sorted): a record's Domain, or its node's name for a node
// that is a domain by itself, as topology.Merge builds them. Records that do
// not decode are skipped.
func AgentDomains(ctx context.Context, cli *clientv3.Client, prefix string) ([]string, error) {
	prefix = NormalizePrefix(prefix)
	resp, err := cli.Get(ctx, prefix+agentsDir, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", prefix+agentsDir, err)
	}
	seen := make(map[string]bool)
	for _, kv := range resp.Kvs {
		_, node := classify(prefix, string(kv.Key))
		r, err := decodeAgent(node, kv.Value)
		if err != nil {
			continue
		}
		id := r.Domain
		if id == "" {
			id = r.Node
		}
		seen[id] = true
	}
	return slices.Sorted(maps.Keys(seen)), nil
}

// AgentOptions configure RunAgent.
type AgentOptions struct {
	Client *clientv3.Client
	Prefix string        // NormalizePrefix applies; "" is DefaultPrefix
	TTL    time.Duration // lease TTL; default 10 s. A dead agent's GPUs leave capacity this long after its last keepalive.
	Logger *slog.Logger  // nil discards
	// Discover returns the node's GPUs; RunAgent calls it before each
	// publication (at start and after a lost lease) and every
	// RediscoverEvery, so that a changed node (a GPU that became unhealthy)
	// is published as it is now.
	Discover func(ctx context.Context) (topology.NodeDiscovery, error)
	// RediscoverEvery is how often the node is discovered again while
	// published; the record is rewritten (under the same lease) when it
	// changed. 0 is the default, 30 s; negative never rediscovers.
	RediscoverEvery time.Duration
}

// heldError is a node key that another lease (another agent) holds.
type heldError struct {
	key   string
	lease clientv3.LeaseID // 0: the key has no lease
}

func (e *heldError) Error() string {
	if e.lease == 0 {
		return fmt.Sprintf("%s exists without a lease (not an agent's record)", e.key)
	}
	return fmt.Sprintf("%s is held by another agent's lease %x", e.key, e.lease)
}

// RunAgent publishes the node's record under its agent key with a lease and
// keeps the lease alive until ctx ends; then it revokes the lease, so that
// replicas take the node's GPUs out of capacity at once. While published it
// discovers the node again every RediscoverEvery and rewrites a record that
// changed. When the lease is lost (etcd unreachable for longer than the
// TTL, or revoked) it discovers and publishes again as soon as etcd answers.
//
// The key is created only if absent: a key held by another lease is another
// agent with the same node name, or this agent's previous run whose lease
// has not expired yet. RunAgent waits for that lease to expire; if it is
// still kept alive a TTL later (a live duplicate), RunAgent returns an error
// naming the key. It also returns nil when ctx ends, or the error of a
// discovery that fails before anything was published.
func RunAgent(ctx context.Context, opts AgentOptions) error {
	if opts.TTL <= 0 {
		opts.TTL = 10 * time.Second
	}
	if opts.RediscoverEvery == 0 {
		opts.RediscoverEvery = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	prefix := NormalizePrefix(opts.Prefix)
	published := false
	var lost clientv3.LeaseID // a lease given up, revoked once the key has left it
	defer func() {
		if lost != 0 {
			revoke(opts.Client, lost)
		}
	}()
	var held struct {
		lease    clientv3.LeaseID
		deadline time.Time // a lease still holding the key then is kept alive
	}
	for ctx.Err() == nil {
		nd, err := opts.Discover(ctx)
		if err != nil {
			if !published {
				return fmt.Errorf("discover: %w", err)
			}
			opts.Logger.Error("discovery failed; retrying", "err", err)
			_ = clock.Sleep(ctx, time.Second)
			continue
		}
		key := AgentKey(prefix, nd.Node)
		lost, err = publish(ctx, opts, key, nd, lost, func() {
			published = true
			held.lease = 0
		})
		if ctx.Err() != nil {
			break
		}
		var he *heldError
		if errors.As(err, &he) {
			if he.lease == 0 {
				return fmt.Errorf("node %s: %w; delete it or give this agent another --node", nd.Node, err)
			}
			now := time.Now()
			if he.lease != held.lease {
				held.lease, held.deadline = he.lease, now.Add(leaseTTL(ctx, opts.Client, he.lease, opts.TTL)+2*time.Second)
			} else if now.After(held.deadline) {
				return fmt.Errorf("node %s: %w, kept alive past its TTL: is another agent running with the same --node name?", nd.Node, err)
			}
			opts.Logger.Warn("the node's key is held by another lease; waiting for it to expire (this agent's previous run?)",
				"key", key, "lease", fmt.Sprintf("%x", he.lease))
			_ = clock.Sleep(ctx, time.Second)
			continue
		}
		opts.Logger.Warn("lost the node's lease; publishing again", "key", key, "err", err)
		_ = clock.Sleep(ctx, time.Second)
	}
	return nil
}

// leaseTTL returns the TTL lease was granted with, or def when etcd does not
// say.
func leaseTTL(ctx context.Context, cli *clientv3.Client, lease clientv3.LeaseID, def time.Duration) time.Duration {
	resp, err := cli.TimeToLive(ctx, lease)
	if err != nil || resp.GrantedTTL <= 0 {
		return def
	}
	return time.Duration(resp.GrantedTTL) * time.Second
}

// publish creates key with nd's record under a new lease of opts.TTL, if no
// other lease holds it (a *heldError) or the one that holds it is previous
// (this agent's lease, given up), and keeps the lease alive until ctx ends
// (then revokes it) or the lease is lost. Every opts.RediscoverEvery it
// discovers the node again and rewrites the record if it changed, on
// condition that the key is still this lease's. It calls onPut once the
// record is written.
//
// A lost lease is not revoked at once: the client gives a lease up when
// etcd has not answered for a TTL, and etcd, back from an outage, may still
// hold it and the record with it. The next publish moves the record to its
// own lease and then revokes previous, so that the node's capacity never
// leaves the replicas for an outage it outlived. publish returns the lease
// left to revoke: the lost one, or previous when no new lease took the key.
func publish(ctx context.Context, opts AgentOptions, key string, nd topology.NodeDiscovery, previous clientv3.LeaseID,
	onPut func()) (clientv3.LeaseID, error) {
	cli := opts.Client
	value, err := json.Marshal(RecordOf(nd))
	if err != nil {
		return previous, fmt.Errorf("encode node %s: %w", nd.Node, err)
	}
	secs := int64((opts.TTL + time.Second - 1) / time.Second)
	lease, err := cli.Grant(ctx, secs)
	if err != nil {
		return previous, fmt.Errorf("grant a %ds lease: %w", secs, err)
	}
	given := false // the lease was lost: left for the next publish to revoke
	defer func() {
		if !given {
			revoke(cli, lease.ID)
		}
	}()
	if err := claim(ctx, cli, key, clientv3.OpPut(key, string(value), clientv3.WithLease(lease.ID)), previous); err != nil {
		return previous, err
	}
	if previous != 0 {
		revoke(cli, previous)
	}
	onPut()
	opts.Logger.Info("published node", "key", key, "domain", nd.Domain, "gpus", len(nd.GPUs))
	// The keepalive ends with publish, whichever way it returns: a lease
	// this agent no longer uses is not kept alive while ctx lives.
	kaCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	ka, err := cli.KeepAlive(kaCtx, lease.ID)
	if err != nil {
		return 0, fmt.Errorf("keep lease %x alive: %w", lease.ID, err)
	}
	var tick <-chan time.Time
	if opts.RediscoverEvery > 0 {
		t := time.NewTicker(opts.RediscoverEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case _, ok := <-ka:
			if ok {
				continue
			}
			if ctx.Err() != nil {
				return 0, nil
			}
			given = true
			return lease.ID, fmt.Errorf("lease %x expired or was revoked", lease.ID)
		case <-tick:
			now, err := opts.Discover(ctx)
			if err != nil {
				opts.Logger.Error("rediscovery failed; the published record stays", "key", key, "err", err)
				continue
			}
			if now.Node != nd.Node {
				opts.Logger.Error("rediscovery names another node; the published record stays", "key", key, "node", now.Node)
				continue
			}
			b, err := json.Marshal(RecordOf(now))
			if err != nil || bytes.Equal(b, value) {
				continue
			}
			resp, err := cli.Txn(ctx).
				If(clientv3.Compare(clientv3.LeaseValue(key), "=", lease.ID)).
				Then(clientv3.OpPut(key, string(b), clientv3.WithLease(lease.ID))).Commit()
			if err != nil {
				opts.Logger.Warn("could not republish the changed node; retrying at the next rediscovery", "key", key, "err", err)
				continue
			}
			if !resp.Succeeded {
				return 0, fmt.Errorf("%s is no longer under lease %x", key, lease.ID)
			}
			value = b
			opts.Logger.Info("republished the changed node", "key", key, "gpus", len(now.GPUs), "healthy", healthyCount(now))
		}
	}
}

// claim writes put to key if no lease holds the key or previous does (a
// lease this agent gave up); otherwise it returns a *heldError naming the
// lease that holds it.
func claim(ctx context.Context, cli *clientv3.Client, key string, put clientv3.Op, previous clientv3.LeaseID) error {
	if previous != 0 {
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(key), "=", previous)).Then(put).Commit()
		if err != nil {
			return fmt.Errorf("write %s: %w", key, err)
		}
		if resp.Succeeded {
			return nil
		}
	}
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(put).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	if !resp.Succeeded {
		he := &heldError{key: key}
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
			he.lease = clientv3.LeaseID(kvs[0].Lease)
		}
		return he
	}
	return nil
}

// healthyCount returns how many of nd's GPUs are healthy.
func healthyCount(nd topology.NodeDiscovery) int {
	n := 0
	for _, g := range nd.GPUs {
		if g.Healthy {
			n++
		}
	}
	return n
}

// revoke ends a lease so that its keys go at once, not a TTL later. The
// attempt is bounded: with etcd gone the lease simply expires.
func revoke(cli *clientv3.Client, id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = cli.Revoke(ctx, id)
}
