package fleetgen_test

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/fleetgen"
	"github.com/sluice-sched/sluice/topology"
)

// The files are what sluiced reads: the topology parses strictly into N
// NVL72 domains of 18 trays × 4 GB200s, the config into T tenants named by
// the format on the tier whose quotas never bind, with the health settings
// a churn's failed Release relies on.
func TestWriteReadsBackAsAFleet(t *testing.T) {
	dir := t.TempDir()
	f, err := fleetgen.Write(dir, fleetgen.Spec{Domains: 12, Tenants: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if f.Domains != 12 || f.GPUs != 12*72 || f.Tenants != 1000 || f.TenantFormat != "fleet-%03d" || f.TenantPool != "fleet-%03d:1000:small" {
		t.Errorf("files: %+v", f)
	}
	c, err := topology.LoadFile(f.Topology)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Domains) != 12 {
		t.Fatalf("%d domains, want 12", len(c.Domains))
	}
	for i, d := range c.Domains {
		if d.ID != fleetgen.DomainID(i, 12) || d.Kind != "nvl72" || len(d.Nodes) != 18 || d.GPUCount() != 72 || d.HealthyGPUCount() != 72 || d.GPUModel() != "GB200" {
			t.Errorf("domain %d: %s kind %s, %d nodes, %d GPUs (%d healthy), model %s; want %s, nvl72, 18 trays of 4 healthy GB200s",
				i, d.ID, d.Kind, len(d.Nodes), d.GPUCount(), d.HealthyGPUCount(), d.GPUModel(), fleetgen.DomainID(i, 12))
		}
	}
	if c.Domains[0].ID != "nvl72-01" || c.Domains[0].Nodes[17].Name != "nvl72-01-tray18" {
		t.Errorf("first domain %s, its last tray %s", c.Domains[0].ID, c.Domains[0].Nodes[17].Name)
	}

	cfg, err := config.Load(f.Config)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Tenants) != 1000 {
		t.Fatalf("%d tenants, want 1000", len(cfg.Tenants))
	}
	for _, i := range []int{0, 1, 999} {
		name := fmt.Sprintf(f.TenantFormat, i)
		if tc, ok := cfg.Tenants[name]; !ok || tc.Tier != "fleet" {
			t.Errorf("tenant %s: %+v, %v; want it on the tier fleet", name, tc, ok)
		}
	}
	tier := cfg.Tiers["fleet"]
	if tier.Floor != 0 || tier.MaxConcurrency != 0 || tier.RPS.Rate < 1e9 || tier.Tokens.Rate < 1e12 {
		t.Errorf("tier fleet: %+v; want no floor, no concurrency bound, quotas that never bind", tier)
	}
	if h := cfg.Health; h.MinSamples != 1 || h.ErrorRate != 1e-6 || h.Window.Duration != time.Second || h.Cooldown.Duration != time.Hour {
		t.Errorf("health %+v: want one failure in a 1 s window to cut a weight for an hour", h)
	}
	if cfg.Leases.TTL.Duration != time.Hour {
		t.Errorf("lease TTL %v, want 1h", cfg.Leases.TTL.Duration)
	}
}

// Names are zero-padded to the last index's width, so that they sort in
// index order and the pattern names every one.
func TestTenantFormatAndDomainID(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want string
	}{{1, "fleet-%01d"}, {10, "fleet-%01d"}, {11, "fleet-%02d"}, {100_000, "fleet-%05d"}, {1_000_000, "fleet-%06d"}, {1_000_001, "fleet-%07d"}} {
		if got := fleetgen.TenantFormat(tc.n); got != tc.want {
			t.Errorf("TenantFormat(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
	if got := fleetgen.DomainID(0, 1400); got != "nvl72-0001" {
		t.Errorf("DomainID(0, 1400) = %q", got)
	}
	if got := fleetgen.DomainID(1399, 1400); got != "nvl72-1400" {
		t.Errorf("DomainID(1399, 1400) = %q", got)
	}
	var b bytes.Buffer
	if err := fleetgen.WriteConfig(&b, 11); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "\n  fleet-00: {tier: fleet}\n") || !strings.HasSuffix(b.String(), "\n  fleet-10: {tier: fleet}\n") {
		t.Errorf("config of 11 tenants:\n%s", b.String())
	}
}

// A spec out of bounds is refused, naming the flag, and writes nothing.
func TestWriteRefusesOutOfBounds(t *testing.T) {
	for _, tc := range []struct {
		spec fleetgen.Spec
		want string
	}{
		{fleetgen.Spec{Domains: 0, Tenants: 10}, "--domains 0"},
		{fleetgen.Spec{Domains: fleetgen.MaxDomains + 1, Tenants: 10}, "--domains"},
		{fleetgen.Spec{Domains: 3, Tenants: 0}, "--tenants 0"},
		{fleetgen.Spec{Domains: 3, Tenants: fleetgen.MaxTenants + 1}, "--tenants"},
	} {
		dir := t.TempDir()
		if _, err := fleetgen.Write(dir, tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Write(%+v): %v, want an error naming %s", tc.spec, err, tc.want)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("Write(%+v) wrote %d files", tc.spec, len(entries))
		}
	}
}
