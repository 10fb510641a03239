package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-sched/sluice/internal/replay"
)

// burstFlags collects repeated --burst values.
type burstFlags []replay.Burst

func (b *burstFlags) String() string { return fmt.Sprint(len(*b), " bursts") }

// Type names the value in help.
func (b *burstFlags) Type() string { return "burst" }

func (b *burstFlags) Set(s string) error {
	v, err := replay.ParseBurst(s)
	if err != nil {
		return err
	}
	*b = append(*b, v)
	return nil
}

// traceFlags are how replay and recommend read a trace.
type traceFlags struct {
	path   string
	format string
	mix    string
	seed   uint64
	speed  float64
	from   time.Duration
	to     time.Duration
	bursts burstFlags
}

// register adds the flags to c.
func (f *traceFlags) register(c *cobra.Command) {
	fs := c.Flags()
	fs.StringVar(&f.path, "trace", "", "trace file (required): azure (TIMESTAMP,ContextTokens,GeneratedTokens), csv (at,tenant,model,prompt_tokens,output_tokens) or jsonl")
	fs.StringVar(&f.format, "format", "", `trace format: azure, csv or jsonl (default: by the file's extension and header)`)
	fs.StringVar(&f.mix, "mix", "", "an azure trace's tenants and models, tenant:model:share,… (e.g. acme:large:0.5,initech:small:0.3); each row drawn by --seed")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the mix and the bursts: the same seed and input give the same report")
	fs.Float64Var(&f.speed, "speed", 1, "replay speed: arrival times are divided by it (2: twice the rate)")
	fs.DurationVar(&f.from, "from", 0, "replay from this offset into the trace (from its first row)")
	fs.DurationVar(&f.to, "to", 0, "replay up to this offset into the trace (0: to the end)")
	fs.Var(&f.bursts, "burst", "tenant:FACTORx:FROM-TO, e.g. acme:15x:120s-180s: the tenant's arrivals multiplied in that window of trace time (repeatable)")
}

func (f *traceFlags) load() ([]replay.Row, error) {
	if f.path == "" {
		return nil, errors.New("--trace is required")
	}
	if !(f.speed > 0) {
		return nil, fmt.Errorf("--speed %g: must be a positive number", f.speed)
	}
	var mix []replay.MixEntry
	if f.mix != "" {
		m, err := replay.ParseMix(f.mix)
		if err != nil {
			return nil, err
		}
		mix = m
	}
	return replay.LoadTrace(f.path, replay.TraceOptions{
		Format: f.format, Mix: mix, Seed: f.seed, From: f.from, To: f.to, Speed: f.speed, Bursts: f.bursts,
	})
}

// newReplayCmd is `sluicectl replay`: a trace under each --policy on the
// cluster and config sluiced would serve with the same --config and
// --topology, and the comparison. --html writes the HTML report beside the
// table.
func newReplayCmd(g *globals) *cobra.Command {
	var (
		tf                         traceFlags
		configPath, topo, policies string
		deadline                   time.Duration
		downgrade                  bool
		htmlPath, svgDir           string
	)
	c := &cobra.Command{
		Use:   "replay --trace FILE",
		Short: "Replay a trace through a simulated cluster: sluice against fifo and bucket baselines",
		Example: `  sluicectl replay --trace testdata/traces/AzureLLMInferenceTrace_code.csv --mix acme:large:0.5,globex:small:0.5 --to 5m
  sluicectl replay --trace trace.csv --policy all --html report.html`,
		Annotations: map[string]string{formatsAnnotation: formatHTML},
		Args:        noArgs,
		RunE: func(*cobra.Command, []string) error {
			return runReplay(g, &tf, replayOptions{configPath, topo, policies, deadline, downgrade, htmlPath, svgDir})
		},
	}
	tf.register(c)
	f := c.Flags()
	f.StringVar(&configPath, "config", "", "config file (YAML or JSON), as sluiced's --config; empty: the embedded default")
	f.StringVar(&topo, "topology", "simulated", `topology, as sluiced's --topology: "simulated" (the built-in cluster), a topology file path, "auto", "auto:<file>" or "nvml"`)
	f.StringVar(&policies, "policy", "sluice,fifo", "policies to compare, comma-separated: sluice, fifo, global-bucket, tenant-buckets, or all")
	f.DurationVar(&deadline, "deadline", 0, "each request's deadline after its arrival (0: the config's queue.default_wait)")
	f.BoolVar(&downgrade, "downgrade", false, "requests accept their model's lower tiers (sluice degrades; the baselines do not)")
	f.StringVar(&htmlPath, "html", "", "also write the HTML report (inline SVG plots, self-contained) to this file")
	f.StringVar(&svgDir, "svg", "", "also write each of the HTML report's plots as its own SVG file in this directory")
	return c
}

// replayOptions are replay's flags beyond the trace's.
type replayOptions struct {
	configPath, topo, policies string
	deadline                   time.Duration
	downgrade                  bool
	htmlPath, svgDir           string
}

// runReplay runs replay.
func runReplay(g *globals, tf *traceFlags, o replayOptions) error {
	if o.deadline < 0 {
		return fmt.Errorf("--deadline %v: must be ≥ 0", o.deadline)
	}
	pols, err := replay.ParsePolicies(o.policies)
	if err != nil {
		return err
	}
	rows, err := tf.load()
	if err != nil {
		return err
	}
	cfg, cluster, err := replay.Setup(o.configPath, o.topo, slog.New(slog.NewTextHandler(g.stderr, nil)))
	if err != nil {
		return err
	}
	c, err := replay.Compare(filepath.Base(tf.path), tf.seed, rows,
		replay.Options{Config: cfg, Cluster: cluster, Deadline: o.deadline, Downgrade: o.downgrade}, pols)
	if err != nil {
		return err
	}
	if o.htmlPath != "" {
		if err := writeFile(o.htmlPath, c.WriteHTML); err != nil {
			return err
		}
	}
	if o.svgDir != "" {
		if _, err := c.WriteSVGs(o.svgDir); err != nil {
			return err
		}
	}
	if g.format == formatHTML {
		return c.WriteHTML(g.stdout)
	}
	return g.out().write(c.WriteJSON, c.WriteTable)
}

// writeFile writes a report to path through write.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--html: %w", err)
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--html: %w", err)
	}
	return nil
}
