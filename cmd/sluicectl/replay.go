package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/sluice-sched/sluice/internal/replay"
)

func init() {
	register(command{
		name:    "replay",
		summary: "replay a trace through a simulated cluster: sluice against fifo and bucket baselines",
		run:     runReplay,
	})
}

// burstFlags collects repeated --burst values.
type burstFlags []replay.Burst

func (b *burstFlags) String() string { return fmt.Sprint(len(*b), " bursts") }

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

func (f *traceFlags) register(fs *flag.FlagSet) {
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

// runReplay replays a trace under each --policy on the cluster and config
// sluiced would serve with the same --config and --topology, and prints
// the comparison. --html writes the HTML report beside the table.
func runReplay(args []string, out, errw io.Writer) error {
	fs := flag.NewFlagSet("sluicectl replay", flag.ContinueOnError)
	fs.SetOutput(errw)
	var tf traceFlags
	tf.register(fs)
	configPath := fs.String("config", "", "config file (YAML or JSON), as sluiced's --config; empty: the embedded default")
	topo := fs.String("topology", "simulated", `topology, as sluiced's --topology: "simulated" (the built-in cluster), a topology file path, "auto", "auto:<file>" or "nvml"`)
	policies := fs.String("policy", "sluice,fifo", "policies to compare, comma-separated: sluice, fifo, global-bucket, tenant-buckets, or all")
	deadline := fs.Duration("deadline", 0, "each request's deadline after its arrival (0: the config's queue.default_wait)")
	downgrade := fs.Bool("downgrade", false, "requests accept their model's lower tiers (sluice degrades; the baselines do not)")
	format := fs.String("o", "table", "output format: table, json or html")
	htmlPath := fs.String("html", "", "also write the HTML report (inline SVG plots, self-contained) to this file")
	svgDir := fs.String("svg", "", "also write each of the HTML report's plots as its own SVG file in this directory")
	if err := parseNoArgs(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *format != "table" && *format != "json" && *format != "html" {
		return fmt.Errorf("-o %q: want table, json or html", *format)
	}
	if *deadline < 0 {
		return fmt.Errorf("--deadline %v: must be ≥ 0", *deadline)
	}
	pols, err := replay.ParsePolicies(*policies)
	if err != nil {
		return err
	}
	rows, err := tf.load()
	if err != nil {
		return err
	}
	cfg, cluster, err := replay.Setup(*configPath, *topo, slog.New(slog.NewTextHandler(errw, nil)))
	if err != nil {
		return err
	}
	c, err := replay.Compare(filepath.Base(tf.path), tf.seed, rows,
		replay.Options{Config: cfg, Cluster: cluster, Deadline: *deadline, Downgrade: *downgrade}, pols)
	if err != nil {
		return err
	}
	if *htmlPath != "" {
		if err := writeFile(*htmlPath, c.WriteHTML); err != nil {
			return err
		}
	}
	if *svgDir != "" {
		if _, err := c.WriteSVGs(*svgDir); err != nil {
			return err
		}
	}
	switch *format {
	case "json":
		return c.WriteJSON(out)
	case "html":
		return c.WriteHTML(out)
	}
	return c.WriteTable(out)
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
