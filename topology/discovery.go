package topology

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// NodeDiscovery is what one node finds out about itself: its GPUs and the
// NVLink domain it belongs to. Discovery runs per node (an NVL72 compute
// tray sees its own four GPUs, never the rack), so a cluster is assembled
// from many of them by Merge: sluiced merges its own one, and the node
// agents publish theirs for the control plane to merge.
type NodeDiscovery struct {
	// Node is the node's name (its host name), unique in the cluster.
	Node string
	// Domain is the id of the multi-node NVLink clique the node's GPUs are
	// in, "<ClusterUuid>.<CliqueId>" from NVML fabric info (the
	// nvidia.com/gpu.clique label); "" when they are in none, which makes
	// the node its own domain (an HGX board's NVLink island).
	Domain string
	// GPUs are the node's GPUs as discovered. Healthy and Problem carry
	// what the node could judge alone (fabric state and health); Merge adds
	// what needs the domain's other nodes (NVLinks against the peers).
	GPUs []GPU
	// Engines are the serving engines on the node (their metrics
	// endpoints); Merge gathers them into the node's domain.
	Engines []Engine
}

// Merge assembles a cluster from per-node discoveries. Nodes with the same
// Domain form one domain of kind KindNVLinkClique; a node without one is a
// domain by itself, named as the node, of kind KindHGX when any of its GPUs
// has an active NVLink and KindPCIe otherwise. Nodes without GPUs (a CPU
// host running the agent) contribute nothing and are left out.
//
// In every domain, a GPU with fewer active NVLinks than the most any GPU of
// the same model there has is marked unhealthy, with the counts as its
// Problem: a request placed on the domain may use any of its GPUs, and one
// whose links are down slows or breaks the collectives and KV transfers
// that cross it, so its share of the domain's capacity is taken away (the
// domain's TotalPeaks and HealthyGPUCount drop, and with them the pd
// buckets). GPUs already unhealthy keep their first Problem.
//
// The result is sorted (domains by id, nodes by name, GPUs by index) so
// that the same discoveries merge to the same cluster in whatever order
// they arrive, and is validated: duplicate node names, duplicate GPU UUIDs
// and invalid peaks are errors. The input is not modified.
func Merge(nodes []NodeDiscovery) (Cluster, error) {
	byID := make(map[string]*Domain)
	var ids []string
	for _, nd := range nodes {
		if len(nd.GPUs) == 0 {
			continue
		}
		id, kind := nd.Domain, KindNVLinkClique
		if id == "" {
			id, kind = nd.Node, KindPCIe
			if slices.ContainsFunc(nd.GPUs, func(g GPU) bool { return g.ActiveNVLinks > 0 }) {
				kind = KindHGX
			}
		}
		d, ok := byID[id]
		if !ok {
			d = &Domain{ID: id, Kind: kind}
			byID[id] = d
			ids = append(ids, id)
		} else if d.Kind != kind {
			// A clique id that equals a fabric-less node's name: keep them
			// apart so that Validate reports it rather than mixing them.
			return Cluster{}, fmt.Errorf("topology: merge: node %q: domain id %q is both a clique and a node without fabric", nd.Node, id)
		}
		gpus := slices.Clone(nd.GPUs)
		slices.SortStableFunc(gpus, func(a, b GPU) int { return cmp.Compare(a.Index, b.Index) })
		d.Nodes = append(d.Nodes, Node{Name: nd.Node, GPUs: gpus})
		d.Engines = append(d.Engines, nd.Engines...)
	}
	slices.Sort(ids)
	c := Cluster{Domains: make([]Domain, 0, len(ids))}
	for _, id := range ids {
		d := byID[id]
		slices.SortStableFunc(d.Nodes, func(a, b Node) int { return cmp.Compare(a.Name, b.Name) })
		markLinkDeficits(d)
		c.Domains = append(c.Domains, *d)
	}
	if err := c.Validate(); err != nil {
		return Cluster{}, fmt.Errorf("topology: merge: %w", err)
	}
	return c, nil
}

// markLinkDeficits marks unhealthy every healthy GPU of d with fewer active
// NVLinks than the most among the domain's GPUs of its model. Models are
// compared apart because different GPUs have different port counts.
func markLinkDeficits(d *Domain) {
	most := make(map[string]int)
	for _, nd := range d.Nodes {
		for _, g := range nd.GPUs {
			m := ModelName(g.Name)
			most[m] = max(most[m], g.ActiveNVLinks)
		}
	}
	for i := range d.Nodes {
		for j := range d.Nodes[i].GPUs {
			g := &d.Nodes[i].GPUs[j]
			peers := most[ModelName(g.Name)]
			if g.Healthy && g.ActiveNVLinks < peers {
				g.Healthy = false
				g.Problem = fmt.Sprintf("%d active NVLinks, its domain peers have %d", g.ActiveNVLinks, peers)
			}
		}
	}
}

// NodeDiscovery returns what node would discover about itself in c, the
// inverse of Merge for one node: its GPUs, and its domain's id unless the
// node is a domain by itself named as the node (an HGX board's island,
// which Merge rebuilds from an empty Domain). It lets a node agent publish
// a node of a topology file or of the simulated cluster where NVML is not
// available.
func (c Cluster) NodeDiscovery(node string) (NodeDiscovery, error) {
	var names []string
	for _, d := range c.Domains {
		for _, nd := range d.Nodes {
			if nd.Name != node {
				names = append(names, nd.Name)
				continue
			}
			out := NodeDiscovery{Node: node, Domain: d.ID, GPUs: slices.Clone(nd.GPUs)}
			if len(d.Nodes) == 1 && d.ID == node {
				out.Domain = ""
			}
			return out, nil
		}
	}
	if len(names) > 8 {
		names = append(names[:8], "…")
	}
	return NodeDiscovery{}, fmt.Errorf("node %q is not in the topology (nodes: %s)", node, strings.Join(names, ", "))
}
