package main

import (
	"fmt"
	"runtime"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-sched/sluice/internal/fleetsim"
)

// newFleetSimCmd is `sluicectl fleet-sim`: batched shared state at fleet
// scale, simulated in virtual time with the real strategy and stores.
func newFleetSimCmd(g *globals) *cobra.Command {
	var (
		cfg     fleetsim.Config
		seconds float64
	)
	d := fleetsim.DefaultConfig()
	c := &cobra.Command{
		Use:   "fleet-sim [--replicas N] [--tenants T] [--domains D] [--shards S] [--seconds X] [--seed K] [--rate R]",
		Short: "Simulate a fleet of replicas sharing batched state over S shards, in virtual time",
		Long: `Simulate N sluiced replicas sharing state in batched mode through a store of
S shards, in virtual time: the real batched strategy (admission/sharing), one
in-memory store (internal/state/memstate) per shard with keys placed as a
Redis Cluster places them, T tenants with Zipf-distributed rates over quotas
they overload by 1.25×, and D GB200 NVL72 domains. It prints, per shard,
calls, bucket and gauge updates, bytes and keys; the domain bucket updates of
the whole fleet; each spread tenant's admissions against quota + (N_t−1)·R·W;
and how long the grants take to sum to a tenant's rate again after a replica
joins or leaves it. Two runs of one seed print the same tables; the wall
time and memory go to stderr. See docs/fleet-simulation.md.`,
		Example: `  sluicectl fleet-sim --replicas 50 --tenants 20000 --domains 70 --seconds 3 --rate 10000
  sluicectl fleet-sim --replicas 50 -o json`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg.Duration = time.Duration(seconds * float64(time.Second))
			if err := cfg.Validate(); err != nil {
				return usagef("%v", err)
			}
			start := time.Now()
			res, err := fleetsim.Run(c.Context(), cfg)
			if err != nil {
				return err
			}
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			fmt.Fprintf(g.stderr, "sluicectl fleet-sim: %v wall, %.2f GiB of memory from the OS\n",
				time.Since(start).Round(time.Millisecond), float64(m.Sys)/(1<<30))
			return g.out().value(res, res.WriteTable)
		},
	}
	fs := c.Flags()
	fs.IntVar(&cfg.Replicas, "replicas", d.Replicas, "N, the replicas sharing state")
	fs.IntVar(&cfg.Tenants, "tenants", d.Tenants, "T, the tenants (Zipf-distributed rates)")
	fs.IntVar(&cfg.Domains, "domains", d.Domains, "D, the GB200 NVL72 domains")
	fs.IntVar(&cfg.Shards, "shards", d.Shards, "S, the store's shards (a Redis Cluster's masters)")
	fs.Float64Var(&seconds, "seconds", d.Duration.Seconds(), "virtual seconds to simulate")
	fs.Uint64Var(&cfg.Seed, "seed", d.Seed, "the workload's random seed")
	fs.Float64Var(&cfg.Rate, "rate", d.Rate, "the fleet's offered requests per second")
	fs.IntVar(&cfg.EngineReaders, "engine-readers", 0, "simulate the engines' readings and their relay, each domain read by this many replicas (0: none)")
	return c
}
