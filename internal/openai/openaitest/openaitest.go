// Package openaitest holds the setup the OpenAI front's tests share, in
// internal/openai and in the assembled server: the default models with the
// large one served as llama-405b, and a config of two tenants, acme with
// room to spare and tiny with one request per 100 s.
package openaitest

import (
	"encoding/json"
	"testing"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/pd"
)

// Setup is the two tenants' config, as the file and as parsed.
type Setup struct {
	// Raw is the config file's JSON.
	Raw []byte
	// Config is Raw parsed.
	Config admission.Config
	// Models are the config's models: pd.DefaultModels with the large
	// model served as llama-405b.
	Models []pd.Model
}

// TwoTenants returns a config of two tenants: acme, whose quotas, tokens
// and concurrency never bind, and tiny, whose RPS bucket holds one request
// and refills one every 100 s, so that its second request is over quota.
func TwoTenants(t testing.TB) Setup {
	t.Helper()
	models := pd.DefaultModels()
	for i := range models {
		if models[i].Name == "large" {
			models[i].ServedNames = []string{"llama-405b"}
		}
	}
	tier := func(rps, burst float64) map[string]any {
		return map[string]any{"rps": map[string]any{"rate": rps, "burst": burst}, "tokens": map[string]any{"rate": 1e9, "burst": 1e9},
			"max_concurrency": 100000, "weight": 1}
	}
	raw, err := json.Marshal(map[string]any{
		"tiers":   map[string]any{"big": tier(1e9, 1e9), "tiny": tier(0.01, 1)},
		"tenants": map[string]any{"acme": map[string]any{"tier": "big"}, "tiny": map[string]any{"tier": "tiny"}},
		"models":  models,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("config.json", raw)
	if err != nil {
		t.Fatal(err)
	}
	return Setup{Raw: raw, Config: cfg, Models: models}
}
