package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

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

// models is a valid three-model catalog in flow style, one model a line,
// for tests to break.
const models = `
models:
  - {name: large, active_params: 405e9, bytes_per_param: 1, kv_bytes_per_token: 258048, decode_batch: 64, degrade_to: medium}
  - {name: medium, active_params: 70e9, bytes_per_param: 2, kv_bytes_per_token: 327680, decode_batch: 128, degrade_to: small}
  - {name: small, active_params: 8e9, bytes_per_param: 2, kv_bytes_per_token: 131072, decode_batch: 256}
`

func TestBadConfigNamesFileKeyAndReason(t *testing.T) {
	base := string(DefaultYAML())
	edit := func(old, new string) string {
		if !strings.Contains(base+models, old) {
			t.Fatalf("the default config has no %q", old)
		}
		return strings.Replace(base+models, old, new, 1)
	}
	cases := []struct {
		name, edit, key, reason string
	}{
		{"unknown key", base + "\nbogus: 1\n", "", `unknown key "bogus"`},
		{"case variant beside the key", edit("weight: 8", "weight: 8\n    WEIGHT: 1"), "tiers.enterprise", `unknown key "WEIGHT" (keys are case-sensitive: did you mean "weight"?)`},
		{"case variant alone", edit("output_token_weight: 4", "Output_Token_Weight: 7"), "", `unknown key "Output_Token_Weight"`},
		{"case variant of a section", edit("leases:", "Leases:"), "", `unknown key "Leases"`},
		{"duplicate key", edit("weight: 8", "weight: 8\n    weight: 1"), "", `key "weight" already set`},
		{"bad weight", edit("weight: 8", "weight: 0.5"), "tiers.enterprise.weight", "want a whole number, got 0.5"},
		{"weight not a number", edit("weight: 8", "weight: heavy"), "tiers.enterprise.weight", `want a whole number, got string "heavy"`},
		{"tenant override", edit("acme: {tier: enterprise}", "acme: {tier: enterprise, floor: 1.5}"), "tenants.acme.floor", "whole number"},
		{"unknown override", edit("acme: {tier: enterprise}", "acme: {tier: enterprise, Floor: 1}"), "tenants.acme", `unknown key "Floor"`},
		{"integer out of range", edit("max_prompt_tokens: 1048576", "max_prompt_tokens: 1e19"), "limits.max_prompt_tokens", "out of range"},
		{"int out of range", edit("max_per_flow: 1000", "max_per_flow: 99999999999999999999"), "queue.max_per_flow", "out of range"},
		{"float not a number", edit("mfu: 0.5", "mfu: half"), "capacity.mfu", "want a number"},
		{"string not a string", edit("acme: {tier: enterprise}", "acme: {tier: 5}"), "tenants.acme.tier", "want a string, got number 5"},
		{"scalar for a section", edit("rps: {rate: 200, burst: 400}", "rps: 200"), "tiers.enterprise.rps", "want a mapping"},
		{"bad duration", edit("default_wait: 30s", "default_wait: soon"), "queue.default_wait", "duration"},
		{"bad ttl", edit("ttl: 10m", "ttl: forever"), "leases.ttl", `bad duration "forever"`},
		{"bad nested duration", edit("window: 30s", "window: often"), "tiers.enterprise.burst_credit.window", "duration"},
		{"unknown model field", edit("decode_batch: 64,", "decode_batch: 64, bogus: 1,"), "models[0]", `unknown key "bogus"`},
		{"case variant model field", edit("decode_batch: 256", "Decode_Batch: 256"), "models[2]", `unknown key "Decode_Batch"`},
		{"bad model field", edit("decode_batch: 256", "decode_batch: 25e-1"), "models[2].decode_batch", "want a whole number, got 2.5"},
		{"bad model price", edit("bytes_per_param: 1,", "bytes_per_param: 1, price_input_per_1k: free,"), "models[0].price_input_per_1k", "want a number"},
		{"bad calibration", edit("decode_batch: 128,", "decode_batch: 128, calibrated: {H200: {Decode_Tokens_Per_GPU_Second: 5}},"), "models[1].calibrated.H200", `unknown key "Decode_Tokens_Per_GPU_Second"`},
		{"models not a list", base + "\nmodels: {large: {}}\n", "models", "want a list"},
		{"negative weight", edit("weight: 8", "weight: -1"), "tiers.enterprise.weight", "must be in"},
		{"unknown tier", edit("acme: {tier: enterprise}", "acme: {tier: platinum}"), "tenants.acme.tier", "unknown tier"},
		{"floor above rate", edit("floor: 4000", "floor: 400000"), "tiers.standard.floor", "exceeds"},
		{"bad soft fraction", edit("soft_fraction: 0.70", "soft_fraction: 1.5"), "capacity.soft_fraction", "must be in (0, 1]"},
		// A defaulted key written as 0 is refused, not silently defaulted.
		{"zero tier weight", edit("weight: 8", "weight: 0"), "tiers.enterprise.weight", "must not be 0 (omit the key for the default, 1)"},
		{"zero queue bound", edit("max_total: 100000", "max_total: 0"), "queue.max_total", "must not be 0"},
		{"zero critical bound", edit("max_critical: 1000", "max_critical: 0"), "queue.max_critical", "must not be 0"},
		{"zero soft fraction", edit("soft_fraction: 0.70", "soft_fraction: 0"), "capacity.soft_fraction", "must not be 0 (omit the key for the default, 0.7)"},
		{"zero mfu", edit("mfu: 0.5", "mfu: 0.0"), "capacity.mfu", "must not be 0"},
		{"zero weight copies", edit("weight_copies: 1", "weight_copies: 0"), "capacity.weight_copies", "must not be 0"},
		{"ttl rounding to zero", edit("ttl: 10m", "ttl: 1e-10"), "leases.ttl", "must not be 0"},
		{"ttl below a millisecond", edit("ttl: 10m", "ttl: 500us"), "leases.ttl", "must be at least 1ms"},
		{"zero idempotency ttl", edit("idempotency_ttl: 10m", `idempotency_ttl: "0s"`), "leases.idempotency_ttl", "must not be 0"},
		{"zero error rate", edit("error_rate: 0.20", "error_rate: 0"), "health.error_rate", "must not be 0"},
		{"zero cooldown", edit("cooldown: 30s", "cooldown: 0"), "health.cooldown", "must not be 0"},
		{"zero output weight", edit("output_token_weight: 4", "output_token_weight: 0"), "output_token_weight", "must not be 0"},
		{"zero prompt limit", edit("max_prompt_tokens: 1048576", "max_prompt_tokens: 0"), "limits.max_prompt_tokens", "must not be 0"},
		{"zero overrun multiple", edit("release_overrun_multiple: 4", "release_overrun_multiple: 0"), "limits.release_overrun_multiple", "must not be 0 (omit the key for the default, 4)"},
		{"negative overrun multiple", edit("release_overrun_multiple: 4", "release_overrun_multiple: -1"), "limits.release_overrun_multiple", "must be in [1, 1000]"},
		{"overrun multiple too large", edit("release_overrun_multiple: 4", "release_overrun_multiple: 1001"), "limits.release_overrun_multiple", "must be in [1, 1000]"},
		{"fractional overrun multiple", edit("release_overrun_multiple: 4", "release_overrun_multiple: 1.5"), "limits.release_overrun_multiple", "want a whole number"},
		{"zero breaker", edit("breaker_open: 60s}\n    budget: {daily_usd: 5000", "breaker_open: 0}\n    budget: {daily_usd: 5000"), "tiers.enterprise.burst_credit.breaker_open", "must not be 0"},
		{"zero credit window", edit("window: 30s", "window: 0s"), "tiers.enterprise.burst_credit.window", "must not be 0"},
		{"no tiers", "tenants: {}\n", "tiers", "at least one"},
		{"zero warm-up fraction", edit("start_fraction: 0.25", "start_fraction: 0"), "warmup.start_fraction", "must not be 0 (omit the key for the default, 0.25)"},
		{"warm-up fraction above 1", edit("start_fraction: 0.25", "start_fraction: 1.5"), "warmup.start_fraction", "must be in (0, 1]"},
		{"negative warm-up period", edit("period: 60s", "period: -1s"), "warmup.period", "must be in [0"},
		{"bad warm-up period", edit("period: 60s", "period: slowly"), "warmup.period", "duration"},
		{"unknown warm-up key", edit("period: 60s", "perod: 60s"), "warmup", `unknown key "perod"`},
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
			if ce.File != path || ce.Key != c.key || !strings.Contains(ce.Reason, c.reason) {
				t.Fatalf("got %q (file %q key %q), want file %s, key %q, reason containing %q", err, ce.File, ce.Key, path, c.key, c.reason)
			}
		})
	}
}

// Omitted keys take their defaults; null counts as omitted; a tier whose
// name holds a dot is still found.
func TestOmittedKeysTakeDefaults(t *testing.T) {
	cfg, err := Parse("omitted.yaml", []byte(`
queue: {max_total: null}
tiers:
  gpu.large: {rps: {rate: 1, burst: 1}, tokens: {rate: 10, burst: 10}}
  zero.weight: {rps: {rate: 1, burst: 1}, tokens: {rate: 10, burst: 10}, weight: 2}
tenants: {a: {tier: gpu.large}}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := admission.Config{}
	want.SetDefaults()
	// degrade_after and tier_share_window are pointers (0 means something):
	// compare what they say. degrade_after has no default (no cap).
	if cfg.Queue.DegradeAfter != nil || want.Queue.DegradeAfter != nil {
		t.Errorf("degrade_after: got %v, want %v (nil)", cfg.Queue.DegradeAfter, want.Queue.DegradeAfter)
	}
	if *cfg.Queue.TierShareWindow != *want.Queue.TierShareWindow {
		t.Errorf("tier_share_window: got %v, want %v", *cfg.Queue.TierShareWindow, *want.Queue.TierShareWindow)
	}
	cfg.Queue.DegradeAfter, want.Queue.DegradeAfter = nil, nil
	cfg.Queue.TierShareWindow, want.Queue.TierShareWindow = nil, nil
	if cfg.Queue != want.Queue || cfg.Leases != want.Leases || cfg.Health != want.Health || cfg.Limits != want.Limits ||
		cfg.Capacity != want.Capacity || cfg.OutputTokenWeight != 4 || *cfg.DegradeHeadroom != 0.1 {
		t.Errorf("defaults: got %+v %+v %+v %+v %+v", cfg.Queue, cfg.Leases, cfg.Health, cfg.Limits, cfg.Capacity)
	}
	if w := cfg.Tiers["gpu.large"].Weight; w != 1 {
		t.Errorf("omitted tier weight: %d, want 1", w)
	}
	if b := cfg.Tiers["gpu.large"].BurstCredit.BreakerOpen.Duration; b != 60*time.Second {
		t.Errorf("omitted breaker_open: %v, want 60s", b)
	}
	_, err = Parse("dotted.yaml", []byte(`
tiers:
  gpu.large: {rps: {rate: 1, burst: 1}, tokens: {rate: 10, burst: 10}, weight: 0}
`))
	var ce *Error
	if !errors.As(err, &ce) || ce.Key != "tiers.gpu.large.weight" {
		t.Fatalf("a dotted tier's zero weight: %v, want key tiers.gpu.large.weight", err)
	}
}

func TestStrictDecodingKeepsWhatIsValid(t *testing.T) {
	base := string(DefaultYAML())
	in := base + models
	for _, r := range [][2]string{
		{"max_output_tokens: 262144", "max_output_tokens: 2.62144e5"}, // whole numbers may have an exponent
		{"floor: 20000", "floor: 2e4"},
		{"ttl: 10m", "ttl: 90"}, // a number of seconds
		{"acme: {tier: enterprise}", "acme: {tier: enterprise, weight: 16, rps: {rate: 1e3, burst: 2000}}"},
		{"decode_batch: 128,", "decode_batch: 128, calibrated: {h200: {decode_tokens_per_gpu_second: 1.5e3}},"},
	} {
		if !strings.Contains(in, r[0]) {
			t.Fatalf("the default config has no %q", r[0])
		}
		in = strings.Replace(in, r[0], r[1], 1)
	}
	cfg, err := Parse("edited.yaml", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	p, _ := cfg.Policy("acme")
	switch {
	case cfg.Limits.MaxOutputTokens != 262144:
		t.Errorf("max_output_tokens = %d, want 262144", cfg.Limits.MaxOutputTokens)
	case cfg.Tiers["enterprise"].Floor != 20000:
		t.Errorf("floor = %d, want 20000", cfg.Tiers["enterprise"].Floor)
	case cfg.Leases.TTL.Duration != 90*time.Second:
		t.Errorf("ttl = %v, want 90s", cfg.Leases.TTL)
	case p.Weight != 16 || p.RPS.Rate != 1000:
		t.Errorf("acme overrides = %+v, want weight 16 and rps rate 1000", p)
	case len(cfg.Models) != 3 || cfg.Models[0].ActiveParams != 405e9 || cfg.Models[1].Calibrated["h200"].DecodeTokensPerGPUSecond != 1500:
		t.Errorf("models = %+v", cfg.Models)
	}
}

func TestJSONConfigIsStrictToo(t *testing.T) {
	for _, c := range []struct{ name, doc, key, reason string }{
		{"case variant", `{"tiers": {"t": {"rps": {"rate": 1, "burst": 1}, "tokens": {"rate": 1, "burst": 1}, "Weight": 2}}}`, "tiers.t", `unknown key "Weight"`},
		{"duplicate", `{"output_token_weight": 4, "output_token_weight": 5}`, "", "already set"},
		{"fraction", `{"queue": {"max_total": 10.5}}`, "queue.max_total", "whole number"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("inline.json", []byte(c.doc))
			var ce *Error
			if !errors.As(err, &ce) || ce.File != "inline.json" || ce.Key != c.key || !strings.Contains(ce.Reason, c.reason) {
				t.Fatalf("got %v, want key %q and a reason containing %q", err, c.key, c.reason)
			}
		})
	}
}

func TestJSONFieldsFollowEncodingJSON(t *testing.T) {
	type inner struct {
		A int `json:"a"`
		B int
		X int `json:"x"`
	}
	type other struct {
		B int
	}
	type outer struct {
		inner
		*other        // its B collides with inner's at the same depth: neither is decoded
		C      int    `json:"c,omitempty"`
		D      int    `json:"-"`
		Named  inner  `json:"named"`
		X      string `json:"x"` // shallower than inner's x: wins it
	}
	got := jsonFields(reflect.TypeFor[outer]())
	want := map[string]reflect.Type{
		"a":     reflect.TypeFor[int](),
		"c":     reflect.TypeFor[int](),
		"named": reflect.TypeFor[inner](),
		"x":     reflect.TypeFor[string](),
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("jsonFields = %v, want %v", got, want)
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
