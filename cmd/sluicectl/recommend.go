package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-sched/sluice/internal/replay"
)

// newRecommendCmd is `sluicectl recommend`: per tenant of a trace, a token
// rate R from the knee of p99 wait in a capacity sweep and a burst C from
// the largest window of demand, with the sweep and the window as evidence.
func newRecommendCmd(g *globals) *cobra.Command {
	var (
		tf     traceFlags
		window time.Duration
		outW   int64
	)
	c := &cobra.Command{
		Use:     "recommend --trace FILE",
		Short:   "Recommend each tenant's token rate R and burst C from a trace, with the evidence",
		Example: `  sluicectl recommend --trace testdata/traces/AzureLLMInferenceTrace_code.csv --mix acme:large:0.5,globex:small:0.5`,
		Args:    noArgs,
		RunE: func(*cobra.Command, []string) error {
			if window <= 0 {
				return fmt.Errorf("--window %v: must be positive", window)
			}
			if outW < 0 {
				return fmt.Errorf("--output-token-weight %d: must be ≥ 0", outW)
			}
			rows, err := tf.load()
			if err != nil {
				return err
			}
			recs := replay.Recommend(rows, outW, window)
			return g.out().write(
				func(w io.Writer) error { return replay.WriteRecommendations(w, recs, formatJSON) },
				func(w io.Writer) error { return replay.WriteRecommendations(w, recs, formatTable) })
		},
	}
	tf.register(c)
	c.Flags().DurationVar(&window, "window", 5*time.Second, "the burst window: C lets the largest window of demand through at R")
	c.Flags().Int64Var(&outW, "output-token-weight", 4, "weighted tokens = prompt + this × output (as the config's output_token_weight)")
	return c
}
