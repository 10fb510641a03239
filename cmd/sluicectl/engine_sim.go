package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sluice-sched/sluice/internal/enginesim"
	"github.com/sluice-sched/sluice/internal/replay"
	"github.com/sluice-sched/sluice/topology"
)

// newEngineSimCmd is `sluicectl engine-sim`: simulated serving engines
// behind OpenAI-compatible endpoints, one per engine of a topology.
func newEngineSimCmd(g *globals) *cobra.Command {
	var (
		configPath, topo, writeTopology string
		o                               enginesim.PlanOptions
		seed                            uint64
	)
	c := &cobra.Command{
		Use:   "engine-sim [--topology FILE] [--per-domain N] [--capacity C] [--seed K] [--listen HOST:PORT] [--write-topology FILE]",
		Short: "Serve simulated LLM engines on OpenAI-compatible endpoints, with vLLM metrics",
		Long: `Serve one simulated serving engine per engine of the topology's domains (or
--per-domain per domain that names none), each on its own port from --listen:
/v1/chat/completions and /v1/completions, streamed (SSE) or not, with usage
(and the usage chunk when stream_options.include_usage is true), /v1/models,
and vLLM's Prometheus gauges on /metrics (waiting, running, KV-cache use)
that follow the engine's own state.

Each engine takes time as the replay's continuous-batching engine does:
prefills share its prefill FLOP/s and decodes its decode bytes/s, a waiting
queue in front of a batch bounded by --max-batch and the KV cache, at
--capacity × the rates the domain's peaks and the model catalog give (as
the replay's --engine-capacity). Prompts count 4 bytes a token; answers are
words, one a token, drawn from --seed and the request: one seed, one answer.

On start it prints the topology with each domain's engines (address, served
models, metrics URL, kind vllm) on stdout, or writes it to --write-topology,
for sluiced --topology. It serves until interrupted. See docs/engine-sim.md.`,
		Example: `  sluicectl engine-sim --write-topology /tmp/sim-topology.yaml
  sluicectl engine-sim --per-domain 2 --capacity 0.6 --listen 127.0.0.1:9100`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(g.stderr, nil))
			cfg, cluster, err := replay.Setup(configPath, topo, log)
			if err != nil {
				return err
			}
			plan, err := enginesim.Plan(cluster, cfg.Models, cfg.Capacity, o)
			if err != nil {
				return usagef("%v", err)
			}
			sim, err := enginesim.Start(plan, cluster, seed, log)
			if err != nil {
				return err
			}
			defer sim.Close()
			y, err := topology.EncodeYAML(sim.Topology())
			if err != nil {
				return err
			}
			for i, e := range sim.Endpoints() {
				s := plan[i].Spec
				fmt.Fprintf(g.stderr, "engine-sim: %s engine %d on %s: %.3g FLOP/s prefill, %.3g B/s decode, %.3g B of KV\n",
					e.Domain, e.Index, e.Address, s.PrefillRate, s.DecodeRate, float64(s.KVBytes))
			}
			if writeTopology == "" {
				if _, err := g.stdout.Write(y); err != nil {
					return err
				}
			} else {
				if err := writeAtomic(writeTopology, y); err != nil {
					return fmt.Errorf("--write-topology: %w", err)
				}
				fmt.Fprintf(g.stderr, "engine-sim: topology in %s: sluiced --topology %s\n", writeTopology, writeTopology)
			}
			ctx, stop := signal.NotifyContext(c.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			<-ctx.Done()
			return nil
		},
	}
	fs := c.Flags()
	fs.StringVar(&configPath, "config", "", "config file, as sluiced's --config, for the model catalog and soft_fraction; empty: the embedded default")
	fs.StringVar(&topo, "topology", "simulated", `topology, as sluiced's --topology: "simulated" (the built-in cluster), a topology file path, "auto", "auto:<file>" or "nvml"`)
	fs.IntVar(&o.PerDomain, "per-domain", 1, "engines per domain whose topology names none; they split its rates and KV")
	fs.Float64Var(&o.Capacity, "capacity", 1, "what each engine sustains relative to the model (0.6: 0.6× the rates the domain's GPUs give)")
	fs.Uint64Var(&seed, "seed", 1, "the answers' seed")
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:8100", "HOST:PORT of the first engine, each next one on the next port (HOST:0: free ports), or HOST:FIRST-LAST")
	fs.StringVar(&writeTopology, "write-topology", "", "write the topology naming the engines to this file instead of stdout")
	fs.IntVar(&o.MaxBatch, "max-batch", replay.DefaultMaxBatch, "requests each engine runs at once (vLLM's max_num_seqs)")
	fs.Int64Var(&o.PrefillTokens, "prefill-tokens", replay.DefaultPrefillTokens, "prompt tokens each engine prefills at once (vLLM's max_num_batched_tokens)")
	return c
}

// writeAtomic writes data to path through a file beside it renamed over
// it, so that a reader never sees half of it.
func writeAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}
