package server

import (
	"log/slog"

	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/topology/nvml"
)

// loadTopology resolves Options.Topology: "auto" (NVML, else the simulated
// cluster), "auto:<file>" (NVML, else the file), "nvml" (NVML or an error),
// "simulated", or a cluster file path. The resolution lives in
// topology/nvml, so that sluicectl and sluice-agent read --topology exactly
// as sluiced does; an auto fallback is logged there, in one line on log.
// It also reports whether the cluster was discovered through NVML.
func loadTopology(src string, log *slog.Logger) (c topology.Cluster, discovered bool, err error) {
	l, err := nvml.Load(src, log)
	if err != nil {
		return topology.Cluster{}, false, err // Load's errors name the setting or file
	}
	return l.Cluster, l.Discovered, nil
}
