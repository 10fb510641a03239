package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/sluice-sched/sluice/internal/replay"
)

func init() {
	register(command{
		name:    "recommend",
		summary: "recommend each tenant's token rate R and burst C from a trace, with the evidence",
		run:     runRecommend,
	})
}

// runRecommend prints, per tenant of a trace, a token rate R from the
// knee of p99 wait in a capacity sweep and a burst C from the largest
// window of demand (seed 001's tuning method), with the sweep and the
// window as evidence.
func runRecommend(args []string, out, errw io.Writer) error {
	fs := flag.NewFlagSet("sluicectl recommend", flag.ContinueOnError)
	fs.SetOutput(errw)
	var tf traceFlags
	tf.register(fs)
	window := fs.Duration("window", 5*time.Second, "the burst window: C lets the largest window of demand through at R")
	outW := fs.Int64("output-token-weight", 4, "weighted tokens = prompt + this × output (as the config's output_token_weight)")
	format := fs.String("o", "table", "output format: table or json")
	if err := parseNoArgs(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *format != "table" && *format != "json" {
		return fmt.Errorf("-o %q: want table or json", *format)
	}
	if *window <= 0 {
		return fmt.Errorf("--window %v: must be positive", *window)
	}
	if *outW < 0 {
		return fmt.Errorf("--output-token-weight %d: must be ≥ 0", *outW)
	}
	rows, err := tf.load()
	if err != nil {
		return err
	}
	return replay.WriteRecommendations(out, replay.Recommend(rows, *outW, *window), *format)
}
