package pd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"

	"github.com/sluice-sched/sluice/topology"
)

// Calibration is an operator's measurement of a model on one GPU model:
// tokens per second per GPU at full load. A non-zero rate replaces the cost
// formula for that phase in every domain of that GPU model.
type Calibration struct {
	PrefillTokensPerGPUSecond float64 `json:"prefill_tokens_per_gpu_second,omitempty"`
	DecodeTokensPerGPUSecond  float64 `json:"decode_tokens_per_gpu_second,omitempty"`
}

// Model is one model tier of the catalog.
type Model struct {
	Name             string  `json:"name"`
	ActiveParams     int64   `json:"active_params"`          // parameters used per token
	TotalParams      int64   `json:"total_params,omitempty"` // resident weights; 0 means ActiveParams
	BytesPerParam    float64 `json:"bytes_per_param"`        // 1 for fp8, 2 for bf16
	KVBytesPerToken  int64   `json:"kv_bytes_per_token"`     // KV cache per token of context
	DecodeBatch      int64   `json:"decode_batch"`           // sequences sharing one weight read
	PriceInputPer1K  float64 `json:"price_input_per_1k"`     // USD per 1000 prompt tokens
	PriceOutputPer1K float64 `json:"price_output_per_1k"`    // USD per 1000 output tokens
	DegradeTo        string  `json:"degrade_to,omitempty"`   // the next tier down; "" for none
	// ServedNames are the names clients and serving engines give the model
	// (an OpenAI request's "model", e.g. "meta-llama/Llama-3.1-70B-Instruct");
	// the first is the one a gateway writes into a request it degrades to
	// this tier. Empty: the model is served under Name.
	ServedNames []string `json:"served_names,omitempty"`
	// Calibrated holds measured rates by GPU model ("GB200", "H200"; any
	// spelling topology.ModelName maps to one).
	Calibrated map[string]Calibration `json:"calibrated,omitempty"`

	k *consts // set on a Catalog's own copies only
}

// UnmarshalJSON decodes a Model strictly (an unknown key is an error) and
// accepts whole numbers written with an exponent (active_params: 405e9), as
// YAML configs write them.
func (m *Model) UnmarshalJSON(data []byte) error {
	type plain Model // no methods, so no recursion
	var s struct {
		plain
		ActiveParams    json.Number `json:"active_params"`
		TotalParams     json.Number `json:"total_params"`
		KVBytesPerToken json.Number `json:"kv_bytes_per_token"`
		DecodeBatch     json.Number `json:"decode_batch"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return fmt.Errorf("pd: model: %w", err)
	}
	out := Model(s.plain)
	for _, f := range []struct {
		key string
		n   json.Number
		dst *int64
	}{
		{"active_params", s.ActiveParams, &out.ActiveParams},
		{"total_params", s.TotalParams, &out.TotalParams},
		{"kv_bytes_per_token", s.KVBytesPerToken, &out.KVBytesPerToken},
		{"decode_batch", s.DecodeBatch, &out.DecodeBatch},
	} {
		v, err := wholeNumber(f.n)
		if err != nil {
			return fmt.Errorf("pd: model %q: %s: %w", out.Name, f.key, err)
		}
		*f.dst = v
	}
	*m = out
	return nil
}

func wholeNumber(n json.Number) (int64, error) {
	if n == "" {
		return 0, nil
	}
	if v, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		return v, nil
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) >= math.MaxInt64 {
		return 0, fmt.Errorf("want a whole number, got %s", n)
	}
	return int64(f), nil
}

// DefaultModels returns the built-in three-tier catalog: large (405B fp8),
// medium (70B bf16) and small (8B bf16), degrading large → medium → small.
func DefaultModels() []Model {
	return []Model{
		{
			Name: "large", ActiveParams: 405e9, BytesPerParam: 1, KVBytesPerToken: 258048, DecodeBatch: 64,
			PriceInputPer1K: 0.003, PriceOutputPer1K: 0.015, DegradeTo: "medium",
		},
		{
			Name: "medium", ActiveParams: 70e9, BytesPerParam: 2, KVBytesPerToken: 327680, DecodeBatch: 128,
			PriceInputPer1K: 0.0008, PriceOutputPer1K: 0.0024, DegradeTo: "small",
		},
		{
			Name: "small", ActiveParams: 8e9, BytesPerParam: 2, KVBytesPerToken: 131072, DecodeBatch: 256,
			PriceInputPer1K: 0.0001, PriceOutputPer1K: 0.0002,
		},
	}
}

// consts are a catalog model's integer constants, computed once.
type consts struct {
	cat             *Catalog
	id              int   // index in the catalog
	prefillPerToken int64 // 2·active_params, FLOP per prompt token
	weightPerToken  int64 // ⌈active_params·bytes_per_param/decode_batch⌉, weight bytes read per output token
	kvPerToken      int64 // kv_bytes_per_token
	residentBytes   int64 // ⌈total_params·bytes_per_param⌉, one copy of the weights
	picoIn, picoOut int64 // price per token in 1e-12 USD
	chain           []string
}

// Catalog is a validated set of models with their hot-path constants.
// It is immutable once built and safe for concurrent use.
type Catalog struct {
	models  []*Model // the catalog's own copies, by id
	byName  map[string]*Model
	names   []string
	largest *Model
}

// Errors a cost computation wraps; each means the request is invalid.
var (
	// ErrUnknownModel: the model is not from this catalog.
	ErrUnknownModel = errors.New("unknown model")
	// ErrNegativeTokens: a token count is negative.
	ErrNegativeTokens = errors.New("negative token count")
	// ErrOverflow: the cost does not fit in int64.
	ErrOverflow = errors.New("cost overflows int64")
)

// NewCatalog validates models and builds a catalog. Each error names the
// model and the field: names non-empty and unique; active_params,
// bytes_per_param, kv_bytes_per_token and decode_batch positive; total_params
// 0 or at least active_params; prices non-negative; degrade_to naming another
// model, with no cycle along the chain; calibration rates non-negative and
// finite, at least one of them set, one entry per GPU model. The catalog
// keeps its own copies, with calibration keys in topology.ModelName form.
func NewCatalog(models []Model) (*Catalog, error) {
	if len(models) == 0 {
		return nil, errors.New("pd: catalog: no models")
	}
	c := &Catalog{byName: make(map[string]*Model, len(models))}
	at := make(map[string]int, len(models))
	for i := range models {
		m := models[i] // a copy
		if m.Name == "" {
			return nil, fmt.Errorf("pd: models[%d]: name: empty", i)
		}
		if j, dup := at[m.Name]; dup {
			return nil, fmt.Errorf("pd: model %q: name: duplicate (models[%d] and models[%d])", m.Name, j, i)
		}
		at[m.Name] = i
		k, err := newConsts(&m)
		if err != nil {
			return nil, fmt.Errorf("pd: model %q: %w", m.Name, err)
		}
		k.cat, k.id = c, i
		m.k = k
		c.models = append(c.models, &m)
		c.byName[m.Name] = &m
		c.names = append(c.names, m.Name)
		if c.largest == nil || k.prefillPerToken > c.largest.k.prefillPerToken {
			c.largest = &m
		}
	}
	served := make(map[string]string)
	for _, m := range c.models {
		for j, n := range m.ServedNames {
			other, dup := served[n]
			switch {
			case n == "":
				return nil, fmt.Errorf("pd: model %q: served_names[%d]: empty", m.Name, j)
			case dup:
				return nil, fmt.Errorf("pd: model %q: served_names[%d]: %q is already a served name of model %q", m.Name, j, n, other)
			case n != m.Name && c.byName[n] != nil:
				return nil, fmt.Errorf("pd: model %q: served_names[%d]: %q is another model's name", m.Name, j, n)
			}
			served[n] = m.Name
		}
	}
	for _, m := range c.models {
		if m.DegradeTo == "" {
			continue
		}
		if m.DegradeTo == m.Name {
			return nil, fmt.Errorf("pd: model %q: degrade_to: names the model itself", m.Name)
		}
		if _, ok := c.byName[m.DegradeTo]; !ok {
			return nil, fmt.Errorf("pd: model %q: degrade_to: unknown model %q", m.Name, m.DegradeTo)
		}
	}
	for _, m := range c.models {
		path := []string{m.Name}
		for next := m.DegradeTo; next != ""; next = c.byName[next].DegradeTo {
			path = append(path, next)
			if next == m.Name {
				return nil, fmt.Errorf("pd: model %q: degrade_to: cycle %s", m.Name, strings.Join(path, " → "))
			}
			if len(path) > len(c.models) { // a cycle below m; reported from its own members
				break
			}
		}
		if len(path) <= len(c.models) {
			m.k.chain = path[1:]
		}
	}
	return c, nil
}

// newConsts checks one model's fields and computes its constants.
func newConsts(m *Model) (*consts, error) {
	switch {
	case m.ActiveParams <= 0:
		return nil, fmt.Errorf("active_params: must be positive, got %d", m.ActiveParams)
	case m.TotalParams < 0 || (m.TotalParams > 0 && m.TotalParams < m.ActiveParams):
		return nil, fmt.Errorf("total_params: must be 0 (= active_params) or at least active_params %d, got %d", m.ActiveParams, m.TotalParams)
	case !(m.BytesPerParam > 0) || math.IsInf(m.BytesPerParam, 0):
		return nil, fmt.Errorf("bytes_per_param: must be positive, got %g", m.BytesPerParam)
	case m.KVBytesPerToken <= 0:
		return nil, fmt.Errorf("kv_bytes_per_token: must be positive, got %d", m.KVBytesPerToken)
	case m.DecodeBatch <= 0:
		return nil, fmt.Errorf("decode_batch: must be positive, got %d", m.DecodeBatch)
	}
	k := &consts{kvPerToken: m.KVBytesPerToken}
	var ok bool
	if k.prefillPerToken, ok = mul(2, m.ActiveParams); !ok {
		return nil, fmt.Errorf("active_params: 2·%d overflows int64", m.ActiveParams)
	}
	active, ok := ceilInt(float64(m.ActiveParams) * m.BytesPerParam)
	if !ok {
		return nil, fmt.Errorf("bytes_per_param: active weights %g B overflow int64", float64(m.ActiveParams)*m.BytesPerParam)
	}
	k.weightPerToken = active/m.DecodeBatch + min(active%m.DecodeBatch, 1)
	total := m.TotalParams
	if total == 0 {
		total = m.ActiveParams
	}
	if k.residentBytes, ok = ceilInt(float64(total) * m.BytesPerParam); !ok {
		return nil, fmt.Errorf("bytes_per_param: resident weights %g B overflow int64", float64(total)*m.BytesPerParam)
	}
	for _, p := range []struct {
		key string
		usd float64
		dst *int64
	}{{"price_input_per_1k", m.PriceInputPer1K, &k.picoIn}, {"price_output_per_1k", m.PriceOutputPer1K, &k.picoOut}} {
		// USD per 1000 tokens · 1e12 pUSD/USD / 1000 tokens = pUSD per token.
		pico := math.Round(p.usd * 1e9)
		if !(p.usd >= 0) || pico >= 1<<62 {
			return nil, fmt.Errorf("%s: must be a non-negative price in USD, got %g", p.key, p.usd)
		}
		*p.dst = int64(pico)
	}
	if len(m.Calibrated) > 0 {
		cal := make(map[string]Calibration, len(m.Calibrated))
		for gpu, r := range m.Calibrated {
			key := topology.ModelName(gpu)
			where := fmt.Sprintf("calibrated[%q]", gpu)
			switch _, dup := cal[key]; {
			case key == "":
				return nil, fmt.Errorf("calibrated: empty GPU model")
			case dup:
				return nil, fmt.Errorf("%s: a second entry for GPU model %s", where, key)
			case !finiteNonNeg(r.PrefillTokensPerGPUSecond):
				return nil, fmt.Errorf("%s.prefill_tokens_per_gpu_second: must be non-negative, got %g", where, r.PrefillTokensPerGPUSecond)
			case !finiteNonNeg(r.DecodeTokensPerGPUSecond):
				return nil, fmt.Errorf("%s.decode_tokens_per_gpu_second: must be non-negative, got %g", where, r.DecodeTokensPerGPUSecond)
			case r.PrefillTokensPerGPUSecond == 0 && r.DecodeTokensPerGPUSecond == 0:
				return nil, fmt.Errorf("%s: sets no rate", where)
			}
			cal[key] = r
		}
		m.Calibrated = cal
	}
	return k, nil
}

func finiteNonNeg(f float64) bool { return f >= 0 && !math.IsInf(f, 0) }

// ceilInt returns ⌈f⌉ for 0 ≤ f < 2⁶³.
func ceilInt(f float64) (int64, bool) {
	f = math.Ceil(f)
	if !(f >= 0) || f >= math.MaxInt64 {
		return 0, false
	}
	return int64(f), true
}

// Get returns the catalog's model of that name. The model is the catalog's
// own: read it, never change it. Pass it to Cost and DomainCapacity.Cost.
func (c *Catalog) Get(name string) (*Model, bool) {
	m, ok := c.byName[name]
	return m, ok
}

// Names returns the model names in catalog order.
func (c *Catalog) Names() []string {
	return append([]string(nil), c.names...)
}

// DegradeChain returns the names below a model, in degrade order (for the
// default catalog, large gives [medium small]); nil for the bottom tier or
// an unknown name.
func (c *Catalog) DegradeChain(name string) []string {
	m, ok := c.byName[name]
	if !ok || len(m.k.chain) == 0 {
		return nil
	}
	return append([]string(nil), m.k.chain...)
}

// Largest returns the model with the highest prefill cost per token (the
// first such in catalog order).
func (c *Catalog) Largest() *Model {
	return c.largest
}

// PriceMicros returns what a request costs the tenant, in micro-USD, rounded
// up: ⌈(prompt·price_input_per_1k + output·price_output_per_1k)/1000 · 1e6⌉.
// Prices count to 1e-9 USD per 1000 tokens. A model not from this catalog
// or a negative count prices at 0; a sum past int64 saturates.
func (c *Catalog) PriceMicros(m *Model, prompt, output int64) int64 {
	if m == nil || m.k == nil || m.k.cat != c || prompt < 0 || output < 0 {
		return 0
	}
	h1, l1 := bits.Mul64(uint64(prompt), uint64(m.k.picoIn))
	h2, l2 := bits.Mul64(uint64(output), uint64(m.k.picoOut))
	lo, carry := bits.Add64(l1, l2, 0)
	hi, overflow := bits.Add64(h1, h2, carry)
	const perMicro = 1e6 // pUSD per µUSD
	if overflow != 0 || hi >= perMicro {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, perMicro)
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// consts returns m's constants if m is this catalog's.
func (c *Catalog) consts(m *Model) (*consts, error) {
	if m == nil || m.k == nil || m.k.cat != c {
		name := "<nil>"
		if m != nil {
			name = m.Name
		}
		return nil, fmt.Errorf("pd: model %q: %w (not from this catalog)", name, ErrUnknownModel)
	}
	return m.k, nil
}
