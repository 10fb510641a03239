//go:build !cgo

package nvml

import "github.com/sluice-sched/sluice/topology"

// Discover reports ErrUnavailable: go-nvml loads libnvidia-ml through cgo,
// and this binary was built without it (CGO_ENABLED=0). Such a build still
// runs on a topology file or the simulated cluster.
func Discover(string) (topology.NodeDiscovery, error) {
	return topology.NodeDiscovery{}, &unavailableError{
		reason:   "built without cgo (CGO_ENABLED=0); rebuild with cgo to read GPUs through NVML",
		expected: true,
	}
}
