package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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

// changeFlags collects repeated --engine-change values.
type changeFlags []replay.EngineChange

func (c *changeFlags) String() string { return fmt.Sprint(len(*c), " changes") }

// Type names the value in help.
func (c *changeFlags) Type() string { return "change" }

func (c *changeFlags) Set(s string) error {
	v, err := replay.ParseEngineChange(s)
	if err != nil {
		return err
	}
	*c = append(*c, v)
	return nil
}

// engineFlags are the simulated serving engines' knobs, for replay and
// replay feedback.
type engineFlags struct {
	batch         int
	prefillTokens int64
	report        time.Duration
	slo           time.Duration
}

func (f *engineFlags) register(c *cobra.Command) {
	fs := c.Flags()
	fs.IntVar(&f.batch, "engine-batch", replay.DefaultMaxBatch, "requests an engine runs at once (vLLM's max_num_seqs)")
	fs.Int64Var(&f.prefillTokens, "engine-prefill-tokens", replay.DefaultPrefillTokens, "prompt tokens an engine prefills at once (vLLM's max_num_batched_tokens)")
	fs.DurationVar(&f.report, "engine-report", replay.DefaultReport, "how often the engines' signals are read and given to the policy")
	fs.DurationVar(&f.slo, "slo", replay.DefaultSLO, "the time-to-first-token objective the engines' report measures against")
}

// options returns the engines at capacity.
func (f *engineFlags) options(capacity float64) (replay.EngineOptions, error) {
	switch {
	case f.batch <= 0:
		return replay.EngineOptions{}, fmt.Errorf("--engine-batch %d: must be positive", f.batch)
	case f.prefillTokens <= 0:
		return replay.EngineOptions{}, fmt.Errorf("--engine-prefill-tokens %d: must be positive", f.prefillTokens)
	case f.report < time.Millisecond:
		return replay.EngineOptions{}, fmt.Errorf("--engine-report %v: must be at least 1ms", f.report)
	case f.slo <= 0:
		return replay.EngineOptions{}, fmt.Errorf("--slo %v: must be positive", f.slo)
	}
	return replay.EngineOptions{Capacity: capacity, MaxBatch: f.batch, PrefillTokens: f.prefillTokens, Report: f.report, SLO: f.slo}, nil
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
	// deferrable is replay's --deferrable-share (recommend has none).
	deferrable float64
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
		DeferrableShare: f.deferrable,
	})
}

// newReplayCmd is `sluicectl replay`: a trace under each --policy on the
// cluster and config sluiced would serve with the same --config and
// --topology, and the comparison. --html writes the HTML report beside the
// table.
func newReplayCmd(g *globals) *cobra.Command {
	var (
		tf traceFlags
		ef engineFlags
		o  replayOptions
	)
	c := &cobra.Command{
		Use:   "replay --trace FILE",
		Short: "Replay a trace through a simulated cluster: sluice against fifo and bucket baselines",
		Example: `  sluicectl replay --trace testdata/traces/AzureLLMInferenceTrace_code.csv --mix acme:large:0.5,globex:small:0.5 --to 5m
  sluicectl replay --trace trace.csv --policy all --html report.html
  sluicectl replay --trace trace.csv --speed 10 --engine-capacity 0.6 --policy sluice,threshold
  sluicectl replay --trace trace.csv --mix acme:large:1 --burst acme:15x:300s-330s --deferrable-share 0.5`,
		Annotations: map[string]string{formatsAnnotation: formatHTML},
		Args:        noArgs,
		RunE: func(*cobra.Command, []string) error {
			return runReplay(g, &tf, &ef, o)
		},
	}
	tf.register(c)
	f := c.Flags()
	f.StringVar(&o.configPath, "config", "", "config file (YAML or JSON), as sluiced's --config; empty: the embedded default")
	f.StringVar(&o.topo, "topology", "simulated", `topology, as sluiced's --topology: "simulated" (the built-in cluster), a topology file path, "auto", "auto:<file>" or "nvml"`)
	f.StringVar(&o.policies, "policy", "sluice,fifo", "policies to compare, comma-separated: sluice, fifo, global-bucket, tenant-buckets, threshold or clairvoyant (each needs --engine-capacity), or all")
	f.DurationVar(&o.deadline, "deadline", 0, "each request's deadline after its arrival (0: the config's queue.default_wait)")
	f.BoolVar(&o.downgrade, "downgrade", false, "requests accept their model's lower tiers (sluice degrades; the baselines do not)")
	f.StringVar(&o.htmlPath, "html", "", "also write the HTML report (inline SVG plots, self-contained) to this file")
	f.StringVar(&o.svgDir, "svg", "", "also write each of the HTML report's plots as its own SVG file in this directory")
	f.Float64Var(&o.engineCapacity, "engine-capacity", 0, "simulate a serving engine per domain that sustains this many times the model's peak-derived rates (0: no engines, the model's processor-shared service)")
	f.Var(&o.changes, "engine-change", "DOMAIN@TIME=CAPACITY, e.g. hgx-1@120s=0.5: that domain's engine capacity from that replay time on (repeatable; needs --engine-capacity)")
	f.BoolVar(&o.openLoop, "open-loop", false, "keep sluice's capacity loop open: no engine signals, releases without measured times")
	f.DurationVar(&o.budget, "clairvoyant-budget", 0, "the clairvoyant dispatcher sends a request once its prefill, with the work ahead of it on an engine, takes at most this (0: --slo)")
	f.Float64Var(&tf.deferrable, "deferrable-share", 0, "share of the bursts' requests (each row of a --burst tenant in its window) marked deferrable, drawn by --seed: sluice defers them to its backlog, the baselines treat them as any other")
	f.DurationVar(&o.deferWithin, "defer-within", 0, "how long a deferrable request may wait in sluice's backlog (0: the config's deferral.default_within); the replay runs until the backlog is empty")
	ef.register(c)
	c.AddCommand(newReplayFeedbackCmd(g))
	return c
}

// replayOptions are replay's flags beyond the trace's.
type replayOptions struct {
	configPath, topo, policies string
	deadline                   time.Duration
	downgrade                  bool
	htmlPath, svgDir           string
	engineCapacity             float64
	changes                    changeFlags
	openLoop                   bool
	budget                     time.Duration
	deferWithin                time.Duration
}

// runReplay runs replay.
func runReplay(g *globals, tf *traceFlags, ef *engineFlags, o replayOptions) error {
	if o.deadline < 0 {
		return fmt.Errorf("--deadline %v: must be ≥ 0", o.deadline)
	}
	if o.engineCapacity < 0 {
		return fmt.Errorf("--engine-capacity %g: must be ≥ 0", o.engineCapacity)
	}
	if o.deferWithin < 0 {
		return fmt.Errorf("--defer-within %v: must be ≥ 0", o.deferWithin)
	}
	if o.budget < 0 {
		return fmt.Errorf("--clairvoyant-budget %v: must be ≥ 0", o.budget)
	}
	eng, err := ef.options(o.engineCapacity)
	if err != nil {
		return err
	}
	eng.Changes, eng.OpenLoop, eng.Budget = o.changes, o.openLoop, o.budget
	pols, err := replay.ParsePolicies(o.policies)
	if err != nil {
		return err
	}
	if o.policies == "all" && eng.On() {
		pols = append(pols, replay.PolicyThreshold, replay.PolicyClairvoyant)
	}
	if o.budget > 0 && !slices.Contains(pols, replay.PolicyClairvoyant) {
		return fmt.Errorf("--clairvoyant-budget %v: only the clairvoyant policy has a budget", o.budget)
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
		replay.Options{Config: cfg, Cluster: cluster, Deadline: o.deadline, Downgrade: o.downgrade, Engine: eng, DeferWithin: o.deferWithin}, pols)
	if err != nil {
		return err
	}
	for _, b := range tf.bursts {
		c.Bursts = append(c.Bursts, b.InReplay(tf.from, tf.speed))
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

// newReplayFeedbackCmd is `sluicectl replay feedback`: the capacity loop's
// target table, from replays of one trace on simulated engines that
// sustain less and more than the model says, a mid-run halving, and a
// spread trace.
func newReplayFeedbackCmd(g *globals) *cobra.Command {
	var (
		tf               traceFlags
		ef               engineFlags
		configPath, topo string
		deadline         time.Duration
		low, high        float64
		change           string
		spreadTrace      string
		spreadSpeed      float64
		spreadMix        string
		spreadConfig     string
		seeds            string
		runFeedback      func(replay.EngineOptions) error
	)
	c := &cobra.Command{
		Use:   "feedback --trace FILE",
		Short: "The capacity loop against its targets: engines slower and faster than the model, a mid-run halving, sluice's loop closed and open, the threshold rule",
		Example: `  sluicectl replay feedback --trace testdata/traces/AzureLLMInferenceTrace_code.csv \
    --mix acme:large:0.4,globex:medium:0.3,initech:small:0.2,hooli:small:0.1 \
    --config testdata/replay/config.yaml --topology testdata/replay/cluster.yaml`,
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			if deadline < 0 {
				return fmt.Errorf("--deadline %v: must be ≥ 0", deadline)
			}
			if !(low > 0) || !(high > 0) {
				return fmt.Errorf("--engine-low %g, --engine-high %g: must be positive", low, high)
			}
			if !(spreadSpeed > 0) {
				return fmt.Errorf("--spread-speed %g: must be a positive number", spreadSpeed)
			}
			eng, err := ef.options(1)
			if err != nil {
				return err
			}
			runSeeds := []uint64{tf.seed}
			if seeds != "" {
				if runSeeds, err = parseSeeds(seeds); err != nil {
					return err
				}
			}
			for i, seed := range runSeeds {
				if i > 0 {
					fmt.Fprintln(g.stdout)
				}
				tf.seed = seed
				if err := runFeedback(eng); err != nil {
					return fmt.Errorf("seed %d: %w", seed, err)
				}
			}
			return nil
		},
	}
	runFeedback = func(eng replay.EngineOptions) error {
		var err error
		o := replay.FeedbackOptions{Trace: filepath.Base(tf.path), Seed: tf.seed, Speed: tf.speed, Deadline: deadline, Engine: eng, Low: low, High: high}
		if change != "" {
			if o.Change, err = replay.ParseEngineChange(change); err != nil {
				return err
			}
		}
		if o.Rows, err = tf.load(); err != nil {
			return err
		}
		spread := tf
		spread.speed = spreadSpeed
		if spreadTrace != "" {
			spread.path = spreadTrace
		}
		o.SpreadTrace, o.SpreadSpeed = filepath.Base(spread.path), spreadSpeed
		if o.SpreadRows, err = spread.load(); err != nil {
			return err
		}
		log := slog.New(slog.NewTextHandler(g.stderr, nil))
		if o.Config, o.Cluster, err = replay.Setup(configPath, topo, log); err != nil {
			return err
		}
		if spreadMix != "" {
			many := spread
			many.mix = spreadMix
			o.Many = &replay.SpreadMix{}
			if o.Many.Rows, err = many.load(); err != nil {
				return fmt.Errorf("--spread-mix: %w", err)
			}
			tenants := map[string]bool{}
			for _, r := range o.Many.Rows {
				tenants[r.Tenant] = true
			}
			o.Many.Name = fmt.Sprintf("%d tenants", len(tenants))
			if spreadConfig == "" {
				spreadConfig = configPath
			}
			if o.Many.Config, _, err = replay.Setup(spreadConfig, topo, log); err != nil {
				return fmt.Errorf("--spread-config: %w", err)
			}
		} else if spreadConfig != "" {
			return errors.New("--spread-config needs --spread-mix")
		}
		t, err := replay.RunFeedbackTable(o)
		if err != nil {
			return err
		}
		return g.out().write(t.WriteJSON, t.WriteTable)
	}
	tf.register(c)
	f := c.Flags()
	tf.speed = 10
	f.Lookup("speed").DefValue = "10"
	f.Lookup("speed").Usage = "replay speed of the saturated rows: arrival times are divided by it"
	f.StringVar(&configPath, "config", "", "config file (YAML or JSON), as sluiced's --config; empty: the embedded default")
	f.StringVar(&topo, "topology", "simulated", `topology, as sluiced's --topology: "simulated" (the built-in cluster), a topology file path, "auto", "auto:<file>" or "nvml"`)
	f.DurationVar(&deadline, "deadline", 2*time.Second, "each request's deadline after its arrival (0: the config's queue.default_wait)")
	f.Float64Var(&low, "engine-low", 0.6, "the slow engines' capacity, relative to the model's peak-derived rates")
	f.Float64Var(&high, "engine-high", 1.5, "the fast engines' capacity, relative to the model's peak-derived rates")
	f.StringVar(&change, "engine-change", "", "the mid-run change on engines at 1×, DOMAIN@TIME=CAPACITY (default: the first domain, halfway through the replay, to 0.5)")
	f.StringVar(&spreadTrace, "spread-trace", "", "the trace of the spread rows, with the same --mix and --seed (default: --trace)")
	f.Float64Var(&spreadSpeed, "spread-speed", 1, "replay speed of the spread rows")
	f.StringVar(&spreadMix, "spread-mix", "", "the spread rows again with this mix, tenant:model:share,… (many tenants spread further than a few)")
	f.StringVar(&spreadConfig, "spread-config", "", "config of the --spread-mix rows, whose tenants it names (default: --config)")
	f.StringVar(&seeds, "seeds", "", "print the table once for each of these seeds, comma-separated (e.g. 1,2,3,4), in place of --seed's")
	ef.register(c)
	return c
}

// parseSeeds reads --seeds: distinct seeds, comma-separated.
func parseSeeds(s string) ([]uint64, error) {
	var out []uint64
	seen := map[uint64]bool{}
	for _, part := range strings.Split(s, ",") {
		v, err := strconv.ParseUint(strings.TrimSpace(part), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("--seeds %q: %q is not a seed (a whole number ≥ 0)", s, part)
		}
		if seen[v] {
			return nil, fmt.Errorf("--seeds %q: seed %d twice", s, v)
		}
		seen[v] = true
		out = append(out, v)
	}
	return out, nil
}
