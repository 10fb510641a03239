package replay

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/topology/nvml"
)

// Setup reads the config and the cluster as sluiced does: configPath ""
// is the embedded default, topologySpec is a --topology value (resolved by
// topology/nvml, as sluiced's is; "simulated" is the built-in cluster).
// It builds an engine once, so that a config that does not fit the
// cluster (floors beyond soft capacity) is refused here, naming the file
// and key, before any replay runs.
func Setup(configPath, topologySpec string, log *slog.Logger) (admission.Config, topology.Cluster, error) {
	var cfg admission.Config
	var err error
	name := configPath
	if configPath == "" {
		name = config.DefaultName
		cfg, err = config.Default()
	} else {
		cfg, err = config.Load(configPath)
	}
	if err != nil {
		return cfg, topology.Cluster{}, err // config's errors name the file and key
	}
	l, err := nvml.Load(topologySpec, log)
	if err != nil {
		return cfg, topology.Cluster{}, err // Load's errors name the setting or file
	}
	eng, err := admission.New(cfg, l.Cluster, admission.WithClock(clock.NewManual(epoch)))
	var ce *admission.ConfigError
	switch {
	case errors.As(err, &ce):
		return cfg, l.Cluster, fmt.Errorf("%w (on topology %s)", config.Wrap(name, err), l.Source)
	case err != nil:
		return cfg, l.Cluster, fmt.Errorf("topology %s: %w", topologySpec, err)
	}
	eng.Close()
	return cfg, l.Cluster, nil
}
