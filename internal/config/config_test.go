package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/topology"
)

func TestDefaultServesTheSimulatedCluster(t *testing.T) {
	cfg, err := Default()
	if err != nil {
		t.Fatalf("embedded default: %v", err)
	}
	for name, tier := range map[string]string{"acme": "enterprise", "globex": "premium", "initech": "standard", "hooli": "free"} {
		if got := cfg.Tenants[name].Tier; got != tier {
			t.Errorf("tenant %s: tier %q, want %q", name, got, tier)
		}
	}
	if _, err := admission.New(cfg, topology.Simulated()); err != nil {
		t.Fatalf("engine refuses the default config on the default cluster: %v", err)
	}
}

func TestBadConfigNamesFileKeyAndReason(t *testing.T) {
	base := string(DefaultYAML())
	cases := []struct {
		name, edit, key, reason string
	}{
		{"unknown key", base + "\nbogus: 1\n", "", "bogus"},
		{"bad weight", strings.Replace(base, "weight: 8", "weight: 0.5", 1), "", "weight"},
		{"negative weight", strings.Replace(base, "weight: 8", "weight: -1", 1), "tiers.enterprise.weight", "must be in"},
		{"unknown tier", strings.Replace(base, "acme: {tier: enterprise}", "acme: {tier: platinum}", 1), "tenants.acme.tier", "unknown tier"},
		{"floor above rate", strings.Replace(base, "floor: 4000", "floor: 400000", 1), "tiers.standard.floor", "exceeds"},
		{"bad duration", strings.Replace(base, "default_wait: 30s", "default_wait: soon", 1), "", "duration"},
		{"bad soft fraction", strings.Replace(base, "soft_fraction: 0.70", "soft_fraction: 1.5", 1), "capacity", "soft_fraction"},
		{"no tiers", "tenants: {}\n", "tiers", "at least one"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "sluice.yaml")
			if err := os.WriteFile(path, []byte(c.edit), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Load(path)
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("got %v, want a config.Error", err)
			}
			if ce.File != path || (c.key != "" && ce.Key != c.key) || !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("got %q (file %q key %q), want file %s, key %q, reason containing %q", err, ce.File, ce.Key, path, c.key, c.reason)
			}
		})
	}
}

func TestJSONConfigAndOverrides(t *testing.T) {
	cfg, err := Parse("inline.json", []byte(`{
	  "tiers": {"t": {"rps": {"rate": 10, "burst": 10}, "tokens": {"rate": 1000, "burst": 2000}, "weight": 2}},
	  "tenants": {"x": {"tier": "t", "weight": 5, "floor": 100}}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	p, ok := cfg.Policy("x")
	if !ok || p.Weight != 5 || p.Floor != 100 || p.Tokens.Rate != 1000 {
		t.Fatalf("override not applied: %+v", p)
	}
	if cfg.Queue.DefaultWait.Duration == 0 || cfg.OutputTokenWeight != 4 {
		t.Fatal("defaults not filled")
	}
}
