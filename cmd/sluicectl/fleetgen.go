package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/sluice-sched/sluice/internal/fleetgen"
)

// newFleetCmd is `sluicectl fleet`: the files of a GPU fleet at scale, for
// running sluiced at the size it is for (fleet generate).
func newFleetCmd(g *globals) *cobra.Command {
	return group("fleet", "Write the files of a fleet at scale: NVL72 domains and tenants (fleet generate)",
		`Write the topology and config of a fleet at the scale Sluice is for —
thousands of NVL72 domains, a million tenants — for a benchmark or a test
(deploy/bench-fleet.sh runs on them).`,
		newFleetGenerateCmd(g))
}

// newFleetGenerateCmd is `sluicectl fleet generate`.
func newFleetGenerateCmd(g *globals) *cobra.Command {
	var (
		spec fleetgen.Spec
		dir  string
	)
	c := &cobra.Command{
		Use:   "generate --dir DIR [--domains N] [--tenants T]",
		Short: "Write a topology of N NVL72 domains and a config of T tenants whose quotas never bind",
		Long: `Write two files into --dir: topology.yaml, N GB200 NVL72 domains (each one
NVLink clique of 18 compute trays × 4 GPUs, ids nvl72-0001…), and
config.yaml, T tenants (fleet-000000…) on one tier whose quotas never bind,
with leases that outlive a run and domain health that cuts a domain's
weight on the first failed Release of a window and keeps it cut (so that
sluicectl load --churn changes a domain's health weight with one failed
Release). Serve them with

  sluiced --topology DIR/topology.yaml --config DIR/config.yaml

and draw load from the tenants with sluicectl load --tenant-pool, whose
value it prints (tenantPool in -o json). The rest of the config is the
embedded default's.`,
		Example: `  sluicectl fleet generate --dir /tmp/fleet --domains 1400 --tenants 1000000
  sluicectl fleet generate --dir /tmp/fleet --domains 100 --tenants 1000 -o json`,
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			if dir == "" {
				return usagef("--dir: want the directory to write into")
			}
			f, err := fleetgen.Write(dir, spec)
			if err != nil {
				return err
			}
			return g.out().value(f, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "%s: %d NVL72 domains, %d GPUs\n%s: %d tenants (%s)\n"+
					"serve:  sluiced --topology %s --config %s\nload:   sluicectl load --tenant-pool %s\n",
					f.Topology, f.Domains, f.GPUs, f.Config, f.Tenants, fmt.Sprintf(f.TenantFormat, 0)+"…",
					f.Topology, f.Config, f.TenantPool)
				return err
			})
		},
	}
	fs := c.Flags()
	fs.StringVar(&dir, "dir", "", "directory to write topology.yaml and config.yaml into (created if missing)")
	fs.IntVar(&spec.Domains, "domains", 1400, fmt.Sprintf("GB200 NVL72 domains, 1 to %d (1,400: a 100k-GPU fleet)", fleetgen.MaxDomains))
	fs.IntVar(&spec.Tenants, "tenants", 1_000_000, fmt.Sprintf("tenants, 1 to %d", fleetgen.MaxTenants))
	fs.StringVar(&spec.Model, "model", "small", "the model tier the printed --tenant-pool names")
	return c
}
