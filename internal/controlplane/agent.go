package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

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
}

// AgentPeaks are a GPU's peaks as the agent found them.
type AgentPeaks struct {
	SMs          int     `json:"sms"`
	FLOPS        float64 `json:"flops"`
	HBMBandwidth float64 `json:"hbm_bandwidth"`
	HBMBytes     int64   `json:"hbm_bytes"`
	Source       string  `json:"source,omitempty"`
}

// RecordOf renders a node's discovery for publishing.
func RecordOf(nd topology.NodeDiscovery) AgentRecord {
	r := AgentRecord{Node: nd.Node, Domain: nd.Domain, GPUs: make([]AgentGPU, len(nd.GPUs))}
	for i, g := range nd.GPUs {
		r.GPUs[i] = AgentGPU{
			Index: g.Index, UUID: g.UUID, Name: g.Name, PCIBusID: g.PCIBusID,
			ActiveNVLinks: g.ActiveNVLinks, Healthy: g.Healthy, Problem: g.Problem,
			Peaks: AgentPeaks{SMs: g.Peaks.SMs, FLOPS: g.Peaks.FLOPS, HBMBandwidth: g.Peaks.HBMBandwidth,
				HBMBytes: g.Peaks.HBMBytes, Source: g.Peaks.Source},
		}
	}
	return r
}

// Discovery returns the record as a topology.NodeDiscovery.
func (r AgentRecord) Discovery() topology.NodeDiscovery {
	nd := topology.NodeDiscovery{Node: r.Node, Domain: r.Domain, GPUs: make([]topology.GPU, len(r.GPUs))}
	for i, g := range r.GPUs {
		nd.GPUs[i] = topology.GPU{
			Index: g.Index, UUID: g.UUID, Name: g.Name, PCIBusID: g.PCIBusID,
			ActiveNVLinks: g.ActiveNVLinks, Healthy: g.Healthy, Problem: g.Problem,
			Peaks: topology.Peaks{SMs: g.Peaks.SMs, FLOPS: g.Peaks.FLOPS, HBMBandwidth: g.Peaks.HBMBandwidth,
				HBMBytes: g.Peaks.HBMBytes, Source: g.Peaks.Source},
		}
	}
	return nd
}

// maxAgentGPUs bounds one node's GPUs, as NVML discovery does, so that a
// corrupt record cannot make every replica build a huge cluster.
const maxAgentGPUs = 1024

// decodeAgent reads the record under node's agent key and checks it alone:
// strict JSON, the node it names is the key's, it has GPUs, and it merges into
// a valid cluster by itself (peaks positive and finite, indexes unique).
func decodeAgent(node string, value []byte) (AgentRecord, error) {
	var r AgentRecord
	dec := json.NewDecoder(strings.NewReader(string(value)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return AgentRecord{}, err
	}
	switch {
	case r.Node != node:
		return AgentRecord{}, fmt.Errorf("names node %q", r.Node)
	case len(r.GPUs) == 0:
		return AgentRecord{}, errors.New("no GPUs")
	case len(r.GPUs) > maxAgentGPUs:
		return AgentRecord{}, fmt.Errorf("%d GPUs, more than the %d a node may have", len(r.GPUs), maxAgentGPUs)
	}
	if _, err := topology.Merge([]topology.NodeDiscovery{r.Discovery()}); err != nil {
		return AgentRecord{}, err
	}
	return r, nil
}

// AgentOptions configure RunAgent.
type AgentOptions struct {
	Client *clientv3.Client
	Prefix string        // NormalizePrefix applies; "" is DefaultPrefix
	TTL    time.Duration // lease TTL; default 10 s. A dead agent's GPUs leave capacity this long after its last keepalive.
	Logger *slog.Logger  // nil discards
	// Discover returns the node's GPUs; RunAgent calls it before each
	// publication (at start and after a lost lease), so that a changed node
	// is published as it is now.
	Discover func(ctx context.Context) (topology.NodeDiscovery, error)
}

// RunAgent publishes the node's record under its agent key with a lease and
// keeps the lease alive until ctx ends; then it revokes the lease, so that
// replicas take the node's GPUs out of capacity at once. When the lease is
// lost (etcd unreachable for longer than the TTL, or revoked) it discovers
// and publishes again as soon as etcd answers. It returns nil when ctx ends,
// or the error of a discovery that fails before anything was published.
func RunAgent(ctx context.Context, opts AgentOptions) error {
	if opts.TTL <= 0 {
		opts.TTL = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	prefix := NormalizePrefix(opts.Prefix)
	published := false
	for ctx.Err() == nil {
		nd, err := opts.Discover(ctx)
		if err != nil {
			if !published {
				return fmt.Errorf("discover: %w", err)
			}
			opts.Logger.Error("discovery failed; retrying", "err", err)
			sleepCtx(ctx, time.Second)
			continue
		}
		b, err := json.Marshal(RecordOf(nd))
		if err != nil {
			return fmt.Errorf("encode node %s: %w", nd.Node, err)
		}
		key := AgentKey(prefix, nd.Node)
		err = keepPublished(ctx, opts.Client, key, b, opts.TTL, func() {
			published = true
			opts.Logger.Info("published node", "key", key, "domain", nd.Domain, "gpus", len(nd.GPUs))
		})
		if ctx.Err() == nil {
			opts.Logger.Warn("lost the node's lease; publishing again", "key", key, "err", err)
			sleepCtx(ctx, time.Second)
		}
	}
	return nil
}

// keepPublished puts value under key with a new lease of ttl and keeps the
// lease alive until ctx ends (then revokes it) or the lease is lost. It calls
// onPut once the value is written.
func keepPublished(ctx context.Context, cli *clientv3.Client, key string, value []byte, ttl time.Duration, onPut func()) error {
	secs := int64((ttl + time.Second - 1) / time.Second)
	lease, err := cli.Grant(ctx, secs)
	if err != nil {
		return fmt.Errorf("grant a %ds lease: %w", secs, err)
	}
	defer revoke(cli, lease.ID)
	if _, err := cli.Put(ctx, key, string(value), clientv3.WithLease(lease.ID)); err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	onPut()
	ka, err := cli.KeepAlive(ctx, lease.ID)
	if err != nil {
		return fmt.Errorf("keep lease %x alive: %w", lease.ID, err)
	}
	for range ka { // drained until the lease is lost or ctx ends
	}
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("lease %x expired or was revoked", lease.ID)
}

// revoke ends a lease so that its keys go at once, not a TTL later. The
// attempt is bounded: with etcd gone the lease simply expires.
func revoke(cli *clientv3.Client, id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = cli.Revoke(ctx, id)
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// NodeFromCluster returns what node would discover about itself in cluster
// c: its GPUs, and its domain's id unless the node is a domain by itself
// named as the node (an HGX board's island, which topology.Merge rebuilds
// from an empty Domain). It lets an agent publish a node of a topology file
// or of the simulated cluster where NVML is not available.
func NodeFromCluster(c topology.Cluster, node string) (topology.NodeDiscovery, error) {
	var names []string
	for _, d := range c.Domains {
		for _, nd := range d.Nodes {
			if nd.Name != node {
				names = append(names, nd.Name)
				continue
			}
			out := topology.NodeDiscovery{Node: node, Domain: d.ID, GPUs: slices.Clone(nd.GPUs)}
			if len(d.Nodes) == 1 && d.ID == node {
				out.Domain = ""
			}
			return out, nil
		}
	}
	if len(names) > 8 {
		names = append(names[:8], "…")
	}
	return topology.NodeDiscovery{}, fmt.Errorf("node %q is not in the topology (nodes: %s)", node, strings.Join(names, ", "))
}
