package main

import (
	"io"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/topology/nvml"
)

// newTopologyCmd is `sluicectl topology`: the cluster a --topology setting
// resolves to, read the way sluiced reads it: on a GPU node, what NVML
// discovery finds (the domains, GPUs, links and peaks sluiced would
// schedule onto). The auto fallback's log line goes to stderr, so that
// -o json on stdout stays parsable.
func newTopologyCmd(g *globals) *cobra.Command {
	var src string
	c := &cobra.Command{
		Use:   "topology",
		Short: "Discover and print this node's topology (NVML, a file, or simulated)",
		Example: `  sluicectl topology
  sluicectl topology --topology=nvml -o json`,
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			l, err := nvml.Load(src, slog.New(slog.NewTextHandler(g.stderr, nil)))
			if err != nil {
				return err
			}
			return g.out().write(
				func(w io.Writer) error { return topology.Write(w, l.Cluster, l.Source, topology.FormatJSON) },
				func(w io.Writer) error { return topology.Write(w, l.Cluster, l.Source, topology.FormatTable) })
		},
	}
	c.Flags().StringVar(&src, "topology", nvml.SpecAuto, `topology source: "auto" (NVML, else simulated), "auto:<file>", "nvml", "simulated" or a topology file path`)
	return c
}
