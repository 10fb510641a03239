package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/topology/nvml"
)

func init() {
	register(command{
		name:    "topology",
		summary: "discover and print this node's topology (NVML, a file, or simulated)",
		run:     runTopology,
	})
}

// runTopology prints the cluster a --topology setting resolves to, read
// the way sluiced reads it: on a GPU node, what NVML discovery finds (the
// domains, GPUs, links and peaks sluiced would schedule onto). The auto
// fallback's log line goes to logw, so that -o json on out stays parsable.
func runTopology(args []string, out, logw io.Writer) error {
	fs := flag.NewFlagSet("sluicectl topology", flag.ContinueOnError)
	fs.SetOutput(logw)
	src := fs.String("topology", nvml.SpecAuto, `topology source: "auto" (NVML, else simulated), "auto:<file>", "nvml", "simulated" or a topology file path`)
	format := fs.String("o", topology.FormatTable, "output format: table or json")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *format != topology.FormatTable && *format != topology.FormatJSON {
		return fmt.Errorf("-o %q: want table or json", *format)
	}
	l, err := nvml.Load(*src, slog.New(slog.NewTextHandler(logw, nil)))
	if err != nil {
		return err
	}
	return topology.Write(out, l.Cluster, l.Source, *format)
}
