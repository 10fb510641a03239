// Package topologytest builds the small clusters tests run on.
package topologytest

import (
	"fmt"
	"strings"

	"github.com/sluice-sched/sluice/topology"
)

// T is what HGX and NVL72 need of *testing.T, *testing.B and *rapid.T.
type T interface {
	Helper()
	Fatalf(format string, args ...any)
}

// HGX returns n HGX H200 domains of one 8-GPU node each: d1, d2, ...
func HGX(t T, n int) topology.Cluster {
	t.Helper()
	var b strings.Builder
	b.WriteString("domains:\n")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "  - {id: d%d, kind: hgx, gpu: H200, nodes: 1, gpus_per_node: 8, node_prefix: d%d-node}\n", i, i)
	}
	c, err := topology.Parse([]byte(b.String()))
	if err != nil {
		t.Fatalf("cluster: %v", err)
	}
	return c
}

// NVL72 returns n GB200 NVL72 domains of 18 four-GPU trays each: rack-1,
// rack-2, ... (a fleet of them, as a 100k-GPU fleet has ~1,400).
func NVL72(t T, n int) topology.Cluster {
	t.Helper()
	var b strings.Builder
	b.WriteString("domains:\n")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "  - {id: rack-%d, kind: nvl72, gpu: NVIDIA GB200, nodes: 18, gpus_per_node: 4, node_prefix: rack-%d-tray}\n", i, i)
	}
	c, err := topology.Parse([]byte(b.String()))
	if err != nil {
		t.Fatalf("cluster: %v", err)
	}
	return c
}
