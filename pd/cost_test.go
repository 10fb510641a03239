package pd

import (
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

func defaultCatalog(t testing.TB) *Catalog {
	t.Helper()
	cat, err := NewCatalog(DefaultModels())
	if err != nil {
		t.Fatal(err)
	}
	return cat
}

func get(t testing.TB, cat *Catalog, name string) *Model {
	t.Helper()
	m, ok := cat.Get(name)
	if !ok {
		t.Fatalf("no model %q", name)
	}
	return m
}

// Hand-computed: w = A·b/B is 6_328_125_000 (large), 1_093_750_000 (medium),
// 62_500_000 (small); for P = 1000, O = 500 the KV-read term is
// kv·O·(2P+O)/2 = kv·625_000.
func TestCostFormulas(t *testing.T) {
	cat := defaultCatalog(t)
	for _, tc := range []struct {
		model  string
		p, o   int64
		want   Cost
		micros int64
	}{
		{"large", 1000, 500, Cost{
			PrefillFLOP: 810_000_000_000_000,                 // 2·405e9·1000
			DecodeBytes: 3_164_062_500_000 + 161_280_000_000, // 500·6_328_125_000 + 258048·625_000
			KVBytes:     387_072_000,                         // 1500·258048
		}, 10_500}, // 1000·0.003/1000 + 500·0.015/1000 = $0.0105
		{"medium", 1000, 500, Cost{
			PrefillFLOP: 140_000_000_000_000,
			DecodeBytes: 546_875_000_000 + 204_800_000_000,
			KVBytes:     491_520_000,
		}, 2_000}, // $0.0008 + $0.0012
		{"small", 1000, 500, Cost{
			PrefillFLOP: 16_000_000_000_000,
			DecodeBytes: 31_250_000_000 + 81_920_000_000,
			KVBytes:     196_608_000,
		}, 200}, // $0.0001 + $0.0001
		{"large", 0, 0, Cost{}, 0},
		{"large", 7, 0, Cost{PrefillFLOP: 5_670_000_000_000, KVBytes: 7 * 258048}, 21},
		{"small", 1, 0, Cost{PrefillFLOP: 16_000_000_000, KVBytes: 131072}, 1}, // 0.1 µUSD rounds up
		{"small", 11, 0, Cost{PrefillFLOP: 176_000_000_000, KVBytes: 11 * 131072}, 2},
		{"small", 0, 1, Cost{DecodeBytes: 62_500_000 + 65536, KVBytes: 131072}, 1}, // kv·1·1/2
	} {
		m := get(t, cat, tc.model)
		got, err := cat.Cost(m, tc.p, tc.o)
		if err != nil || got != tc.want {
			t.Errorf("Cost(%s, %d, %d) = %+v, %v; want %+v", tc.model, tc.p, tc.o, got, err, tc.want)
		}
		if got := cat.PriceMicros(m, tc.p, tc.o); got != tc.micros {
			t.Errorf("PriceMicros(%s, %d, %d) = %d, want %d", tc.model, tc.p, tc.o, got, tc.micros)
		}
	}
}

func TestCostRoundsUp(t *testing.T) {
	cat, err := NewCatalog([]Model{{Name: "odd", ActiveParams: 10, BytesPerParam: 1.5, KVBytesPerToken: 3, DecodeBatch: 4}})
	if err != nil {
		t.Fatal(err)
	}
	// w = ⌈15/4⌉ = 4; decode(P=0, O=1) = 4 + ⌈3·1·1/2⌉ = 6; decode(P=1, O=3) = 12 + ⌈3·3·5/2⌉ = 35.
	for _, tc := range []struct{ p, o, want int64 }{{0, 1, 6}, {1, 3, 35}} {
		if c, err := cat.Cost(get(t, cat, "odd"), tc.p, tc.o); err != nil || c.DecodeBytes != tc.want {
			t.Errorf("decode(%d, %d) = %d, %v; want %d", tc.p, tc.o, c.DecodeBytes, err, tc.want)
		}
	}
}

func TestCostRejectsInvalid(t *testing.T) {
	cat := defaultCatalog(t)
	large := get(t, cat, "large")
	for _, tc := range []struct {
		p, o int64
		want error
	}{
		{1 << 40, 0, ErrOverflow},       // 8.1e11 · 1.1e12 FLOP
		{0, 1 << 40, ErrOverflow},       // kv·O²
		{math.MaxInt64, 0, ErrOverflow}, // everything
		{math.MaxInt64, 1, ErrOverflow}, // P + O itself
		{5e6, 5e6, ErrOverflow},         // kv·O·(2P+O) = 258048·5e6·1.5e7
		{-1, 10, ErrNegativeTokens},     //
		{10, math.MinInt64, ErrNegativeTokens},
	} {
		_, err := cat.Cost(large, tc.p, tc.o)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), `model "large"`) {
			t.Errorf("Cost(large, %d, %d) error = %v, want %v", tc.p, tc.o, err, tc.want)
		}
	}
	if _, err := cat.Cost(large, 1e6, 1e5); err != nil {
		t.Errorf("a 1M-token prompt: %v", err)
	}
	other := DefaultModels()[0]
	if _, err := cat.Cost(&other, 1, 1); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("model not from the catalog: %v", err)
	}
	cat2 := defaultCatalog(t)
	if _, err := cat.Cost(get(t, cat2, "large"), 1, 1); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("model from another catalog: %v", err)
	}
	if _, err := cat.Cost(nil, 1, 1); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("nil model: %v", err)
	}
	if got := cat.PriceMicros(large, math.MaxInt64, math.MaxInt64); got != math.MaxInt64 {
		t.Errorf("huge price = %d, want saturation", got)
	}
}

func TestCatalog(t *testing.T) {
	cat := defaultCatalog(t)
	if got := cat.Names(); !slices.Equal(got, []string{"large", "medium", "small"}) {
		t.Errorf("Names = %v", got)
	}
	for name, want := range map[string][]string{"large": {"medium", "small"}, "medium": {"small"}, "small": nil, "nope": nil} {
		if got := cat.DegradeChain(name); !slices.Equal(got, want) {
			t.Errorf("DegradeChain(%s) = %v, want %v", name, got, want)
		}
	}
	if got := cat.Largest().Name; got != "large" {
		t.Errorf("Largest = %s", got)
	}
	if m := get(t, cat, "large"); m.TotalParams != 0 || m.PriceOutputPer1K != 0.015 {
		t.Errorf("large = %+v", m)
	}
	cat.Names()[0] = "changed"
	cat.DegradeChain("large")[0] = "changed"
	if cat.Names()[0] != "large" || cat.DegradeChain("large")[0] != "medium" {
		t.Error("callers can change the catalog through returned slices")
	}
	in := DefaultModels()
	in[0].Calibrated = map[string]Calibration{"NVIDIA GB200": {PrefillTokensPerGPUSecond: 1}}
	cat, err := NewCatalog(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := get(t, cat, "large").Calibrated["GB200"]; !ok {
		t.Error("calibration key not canonical")
	}
	if _, ok := in[0].Calibrated["NVIDIA GB200"]; !ok || in[0].k != nil {
		t.Error("NewCatalog changed its input")
	}
}

func TestCatalogValidation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(ms []Model) []Model
		want   string
	}{
		{"cycle", func(ms []Model) []Model { ms[2].DegradeTo = "large"; return ms }, `model "large": degrade_to: cycle large → medium → small → large`},
		{"self", func(ms []Model) []Model { ms[2].DegradeTo = "small"; return ms }, `model "small": degrade_to: names the model itself`},
		{"dangling", func(ms []Model) []Model { ms[1].DegradeTo = "tiny"; return ms }, `model "medium": degrade_to: unknown model "tiny"`},
		{"duplicate", func(ms []Model) []Model { ms[2].Name = "medium"; return ms }, `model "medium": name: duplicate (models[1] and models[2])`},
		{"empty name", func(ms []Model) []Model { ms[1].Name = ""; return ms }, `models[1]: name: empty`},
		{"zero params", func(ms []Model) []Model { ms[0].ActiveParams = 0; return ms }, `model "large": active_params: must be positive`},
		{"total below active", func(ms []Model) []Model { ms[0].TotalParams = 1; return ms }, `model "large": total_params:`},
		{"bytes", func(ms []Model) []Model { ms[0].BytesPerParam = math.NaN(); return ms }, `model "large": bytes_per_param: must be positive`},
		{"kv", func(ms []Model) []Model { ms[1].KVBytesPerToken = -1; return ms }, `model "medium": kv_bytes_per_token: must be positive`},
		{"batch", func(ms []Model) []Model { ms[2].DecodeBatch = 0; return ms }, `model "small": decode_batch: must be positive`},
		{"price", func(ms []Model) []Model { ms[2].PriceOutputPer1K = -0.1; return ms }, `model "small": price_output_per_1k: must be a non-negative price`},
		{"overflow", func(ms []Model) []Model { ms[0].ActiveParams = math.MaxInt64; return ms }, `model "large": active_params: 2·`},
		{"calibration", func(ms []Model) []Model {
			ms[0].Calibrated = map[string]Calibration{"GB200": {DecodeTokensPerGPUSecond: -3}}
			return ms
		}, `model "large": calibrated["GB200"].decode_tokens_per_gpu_second: must be non-negative`},
		{"empty calibration", func(ms []Model) []Model {
			ms[0].Calibrated = map[string]Calibration{"H200": {}}
			return ms
		}, `model "large": calibrated["H200"]: sets no rate`},
		{"none", func([]Model) []Model { return nil }, "no models"},
		{"served name empty", func(ms []Model) []Model { ms[1].ServedNames = []string{"llama-70b", ""}; return ms }, `model "medium": served_names[1]: empty`},
		{"served name twice", func(ms []Model) []Model {
			ms[1].ServedNames = []string{"llama"}
			ms[2].ServedNames = []string{"llama"}
			return ms
		}, `model "small": served_names[0]: "llama" is already a served name of model "medium"`},
		{"served name of another model", func(ms []Model) []Model { ms[1].ServedNames = []string{"small"}; return ms }, `model "medium": served_names[0]: "small" is another model's name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewCatalog(tc.change(DefaultModels()))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want it to contain %s", err, tc.want)
			}
		})
	}
}

func TestModelJSON(t *testing.T) {
	var ms []Model
	data := `[{"name":"big","active_params":4.05e11,"total_params":1e12,"bytes_per_param":1,"kv_bytes_per_token":258048,
		"decode_batch":64,"price_input_per_1k":0.003,"price_output_per_1k":0.015,"degrade_to":"",
		"calibrated":{"GB200":{"prefill_tokens_per_gpu_second":1e4,"decode_tokens_per_gpu_second":500}}}]`
	if err := json.Unmarshal([]byte(data), &ms); err != nil {
		t.Fatal(err)
	}
	want := Model{Name: "big", ActiveParams: 405e9, TotalParams: 1e12, BytesPerParam: 1, KVBytesPerToken: 258048, DecodeBatch: 64,
		PriceInputPer1K: 0.003, PriceOutputPer1K: 0.015, Calibrated: map[string]Calibration{"GB200": {1e4, 500}}}
	if len(ms) != 1 || ms[0].Name != want.Name || ms[0].ActiveParams != want.ActiveParams || ms[0].TotalParams != want.TotalParams ||
		ms[0].Calibrated["GB200"] != want.Calibrated["GB200"] || ms[0].DecodeBatch != 64 {
		t.Errorf("got %+v", ms)
	}
	out, err := json.Marshal(DefaultModels()[0])
	if err != nil || !strings.Contains(string(out), `"active_params":405000000000`) || !strings.Contains(string(out), `"degrade_to":"medium"`) {
		t.Errorf("Marshal = %s, %v", out, err)
	}
	var back Model
	if err := json.Unmarshal(out, &back); err != nil || back.ActiveParams != 405e9 || back.KVBytesPerToken != 258048 {
		t.Errorf("round trip = %+v, %v", back, err)
	}
	for in, want := range map[string]string{
		`{"name":"x","active_params":4.5}`:       `active_params: want a whole number, got 4.5`,
		`{"name":"x","activeparams":1}`:          `unknown field "activeparams"`,
		`{"name":"x","kv_bytes_per_token":1e30}`: `kv_bytes_per_token: want a whole number`,
	} {
		var m Model
		if err := json.Unmarshal([]byte(in), &m); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Unmarshal(%s) error = %v, want %s", in, err, want)
		}
	}
}
