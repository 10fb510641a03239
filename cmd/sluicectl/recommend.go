package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-sched/sluice/internal/replay"
)

// newRecommendCmd is `sluicectl recommend`: per tenant of a trace, a token
// rate R (the knee of p99 wait in a capacity sweep, or with --target-p99
// the smallest rate whose replay meets it) and a burst C from the largest
// window of demand, checked on the cluster and config replay would use:
// each tenant alone at its proposal, the sum against soft capacity, the
// floors and weights, and every tenant together.
func newRecommendCmd(g *globals) *cobra.Command {
	var (
		tf         traceFlags
		window     time.Duration
		outW       int64
		target     time.Duration
		configPath string
		topo       string
	)
	c := &cobra.Command{
		Use:   "recommend --trace FILE",
		Short: "Recommend each tenant's token rate R and burst C from a trace, checked on the simulated cluster",
		Example: `  sluicectl recommend --trace testdata/traces/AzureLLMInferenceTrace_code.csv --mix acme:large:0.5,globex:small:0.5
  sluicectl recommend --trace trace.csv --target-p99 2s --config sluice.yaml --topology cluster.yaml`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if window <= 0 {
				return fmt.Errorf("--window %v: must be positive", window)
			}
			if target < 0 || target > 0 && target < time.Millisecond {
				return fmt.Errorf("--target-p99 %v: must be at least 1ms (the replay's tick), or 0 for the knee", target)
			}
			rows, err := tf.load()
			if err != nil {
				return err
			}
			cfg, cluster, err := replay.Setup(configPath, topo, slog.New(slog.NewTextHandler(g.stderr, nil)))
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("output-token-weight") && outW != cfg.OutputTokenWeight {
				return fmt.Errorf("--output-token-weight %d: the config's output_token_weight is %d, and quotas are in its weighted tokens; leave the flag out or give a config with %d",
					outW, cfg.OutputTokenWeight, outW)
			}
			p, err := replay.RecommendChecked(rows, replay.CheckOptions{Config: cfg, Cluster: cluster, Window: window, Target: target})
			if err != nil {
				return err
			}
			return g.out().write(p.WriteJSON, p.WriteTable)
		},
	}
	tf.register(c)
	f := c.Flags()
	f.DurationVar(&window, "window", 5*time.Second, "the burst window: C lets the largest window of demand through at R")
	f.Int64Var(&outW, "output-token-weight", 0, "weighted tokens = prompt + this × output; must equal the config's output_token_weight (default: the config's)")
	f.DurationVar(&target, "target-p99", 0, "the p99 time to admission (arrival to admission, waiting for quota tokens and in the queue) each tenant's rate is searched for; 0: the sweep's knee")
	f.StringVar(&configPath, "config", "", "config file (YAML or JSON), as sluiced's --config: the tenants' tiers, floors and weights; empty: the embedded default")
	f.StringVar(&topo, "topology", "simulated", `topology, as sluiced's --topology: "simulated" (the built-in cluster), a topology file path, "auto", "auto:<file>" or "nvml"`)
	return c
}
