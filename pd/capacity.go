package pd

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/sluice-sched/sluice/internal/tokenbucket"
	"github.com/sluice-sched/sluice/topology"
)

// Config sets how a domain's peaks become soft capacity. A zero field takes
// its default (DefaultConfig).
type Config struct {
	SoftFraction float64 `json:"soft_fraction"` // share of peak admitted, in (0, 1]; default 0.70
	MFU          float64 `json:"mfu"`           // model FLOP utilisation of prefill, in (0, 1]; default 0.5
	BurstSeconds float64 `json:"burst_seconds"` // bucket depth in seconds of rate; default 2
	WeightCopies int     `json:"weight_copies"` // copies of every model's weights per node; default 1
}

// DefaultConfig returns the defaults: 70% soft capacity, MFU 0.5,
// 2 s of burst, one copy of each model's weights per node.
func DefaultConfig() Config {
	return Config{SoftFraction: 0.70, MFU: 0.5, BurstSeconds: 2, WeightCopies: 1}
}

// Validate reports the first field out of range, naming it. Zero fields
// are valid (they take defaults). Fractions count to 1e-9 and burst_seconds
// to the nanosecond.
func (c Config) Validate() error {
	switch {
	case !(c.SoftFraction >= 0 && c.SoftFraction <= 1):
		return fmt.Errorf("pd: config: soft_fraction: must be in (0, 1], got %g", c.SoftFraction)
	case !(c.MFU >= 0 && c.MFU <= 1):
		return fmt.Errorf("pd: config: mfu: must be in (0, 1], got %g", c.MFU)
	case !(c.BurstSeconds >= 0 && c.BurstSeconds <= 3600):
		return fmt.Errorf("pd: config: burst_seconds: must be in (0, 3600], got %g", c.BurstSeconds)
	case c.SoftFraction > 0 && c.SoftFraction < 1e-6:
		return fmt.Errorf("pd: config: soft_fraction: must be at least 1e-6, got %g", c.SoftFraction)
	case c.MFU > 0 && c.MFU < 1e-6:
		return fmt.Errorf("pd: config: mfu: must be at least 1e-6, got %g", c.MFU)
	case c.BurstSeconds > 0 && c.BurstSeconds < 1e-9:
		return fmt.Errorf("pd: config: burst_seconds: must be at least 1 ns, got %g", c.BurstSeconds)
	case c.WeightCopies < 0:
		return fmt.Errorf("pd: config: weight_copies: must be positive, got %d", c.WeightCopies)
	}
	return nil
}

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.SoftFraction == 0 {
		c.SoftFraction = d.SoftFraction
	}
	if c.MFU == 0 {
		c.MFU = d.MFU
	}
	if c.BurstSeconds == 0 {
		c.BurstSeconds = d.BurstSeconds
	}
	if c.WeightCopies == 0 {
		c.WeightCopies = d.WeightCopies
	}
	return c
}

const billion = 1_000_000_000

// maxBurst bounds every bucket's burst so that the bucket arithmetic, whose
// levels stay within [−burst, burst], never comes near int64's limits.
const maxBurst = math.MaxInt64 / 4

// DomainCapacity is one NVLink domain's soft capacity: a prefill bucket in
// FLOP, a decode bucket in bytes of HBM traffic, and a KV gauge in bytes of
// HBM, with reserve watermarks that keep tenants' floors (see the package
// documentation). Times are int64 nanoseconds on the caller's monotonic
// clock.
//
// A DomainCapacity is not safe for concurrent use: the engine serialises
// every call under its lock.
type DomainCapacity struct {
	id       string
	gpuModel string // topology.ModelName form, or topology.MixedModel
	gpus     int    // healthy GPUs
	cat      *Catalog
	cfg      Config // defaults applied

	prefill tokenbucket.Bucket // FLOP
	decode  tokenbucket.Bucket // bytes
	kvInUse int64
	kvLimit int64

	fullPrefillRate, fullDecodeRate, fullKV int64 // the whole domain's, before a replica share

	resPrefillRate, resDecodeRate int64 // reserve rates as set, capped at the rates
	resPR, resDR                  int64 // the reserve rates this slice keeps (scaled to a share)
	resPrefill, resDecode, resKV  int64 // the watermarks shared traffic stops at

	// The limits before warm-up: the whole domain's, or a replica's share.
	basePrefillRate, basePrefillBurst int64
	baseDecodeRate, baseDecodeBurst   int64
	baseKV                            int64

	// Warm-up (see StartWarmup): the shared part of every limit is warm
	// millionths of its base, ramping linearly from warmFrom at warmAt to
	// WarmupFull at warmEnd; warmEnd is 0 when the domain is whole.
	warm, warmFrom  int64
	warmAt, warmEnd int64
	// paused: the buckets refill at rate 0 until the next ApplyShare (Pause).
	paused bool

	// The measured correction of the model (SetFactor), in millionths of
	// the prior: FactorFull when uncorrected. prior is the model's limits
	// before it, kept so that a new factor applies to them, not to the
	// last one's.
	factor int64
	prior  limits
	// floorsShort: a reserve asked for more than the corrected rate holds.
	floorsShort bool

	perModel []modelRates // by catalog id
}

// modelRates are a model's calibrated costs in one domain; 0 means the formula.
type modelRates struct {
	prefillPerToken int64 // FLOP-equivalents per prompt token
	decodePerToken  int64 // byte-equivalents per output token
}

// limits are what a domain's peaks give.
type limits struct {
	gpus                      int
	gpuModel                  string
	prefillRate, prefillBurst int64
	decodeRate, decodeBurst   int64
	kvLimit                   int64
	perModel                  []modelRates
}

// NewDomainCapacity builds the soft capacity of domain d for the models of
// cat, with both buckets full and no KV in use at now. It fails when cfg is
// invalid, when a rate or burst does not fit in int64/4, or when the
// resident weights leave no HBM for KV. A domain without healthy GPUs has
// zero capacity (nothing fits), which is not an error.
func NewDomainCapacity(d *topology.Domain, cat *Catalog, cfg Config, now int64) (*DomainCapacity, error) {
	if d == nil || cat == nil {
		return nil, errors.New("pd: NewDomainCapacity: nil domain or catalog")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &DomainCapacity{id: d.ID, cat: cat, cfg: cfg.withDefaults(), warm: WarmupFull, factor: FactorFull}
	lim, err := c.limits(d)
	if err != nil {
		return nil, err
	}
	c.prefill = tokenbucket.New(lim.prefillRate, lim.prefillBurst, 0, now)
	c.decode = tokenbucket.New(lim.decodeRate, lim.decodeBurst, 0, now)
	c.apply(lim)
	return c, nil
}

// limits computes the rates, bursts, KV limit and calibrated costs that the
// healthy GPUs of d give:
//
//	prefill rate = soft_fraction · Σ FLOPS · mfu      burst = rate · burst_seconds
//	decode rate  = soft_fraction · Σ HBMBandwidth     burst = rate · burst_seconds
//	KV limit     = soft_fraction · (Σ HBMBytes − Σ_models resident · weight_copies · nodes)
func (c *DomainCapacity) limits(d *topology.Domain) (limits, error) {
	fail := func(format string, args ...any) (limits, error) {
		return limits{}, fmt.Errorf("pd: domain %q: "+format, append([]any{d.ID}, args...)...)
	}
	peaks := d.TotalPeaks()
	lim := limits{gpus: d.HealthyGPUCount(), gpuModel: d.GPUModel(), perModel: make([]modelRates, len(c.cat.models))}
	if lim.gpus == 0 {
		return lim, nil
	}
	if peaks.FLOPS >= maxBurst || peaks.HBMBandwidth >= maxBurst {
		return fail("peaks %g FLOP/s, %g B/s do not fit in int64", peaks.FLOPS, peaks.HBMBandwidth)
	}
	sf := uint64(math.Round(c.cfg.SoftFraction * billion))
	mfu := uint64(math.Round(c.cfg.MFU * billion))
	burstNanos := uint64(math.Round(c.cfg.BurstSeconds * billion))
	flops, _ := mulDiv(uint64(peaks.FLOPS), sf, billion)
	lim.prefillRate, _ = mulDiv(uint64(flops), mfu, billion)
	lim.decodeRate, _ = mulDiv(uint64(peaks.HBMBandwidth), sf, billion)
	var ok1, ok2 bool
	lim.prefillBurst, ok1 = mulDiv(uint64(lim.prefillRate), burstNanos, billion)
	lim.decodeBurst, ok2 = mulDiv(uint64(lim.decodeRate), burstNanos, billion)
	if !ok1 || !ok2 || lim.prefillBurst > maxBurst || lim.decodeBurst > maxBurst {
		return fail("a burst of %g s of %d FLOP/s or %d B/s does not fit in int64/4; lower burst_seconds", c.cfg.BurstSeconds, lim.prefillRate, lim.decodeRate)
	}

	perNode := int64(0)
	for _, m := range c.cat.models {
		var ok bool
		if perNode, ok = add(perNode, m.k.residentBytes); !ok {
			return fail("resident weights overflow int64")
		}
	}
	resident, ok1 := mul(perNode, int64(c.cfg.WeightCopies))
	resident, ok2 = mul(resident, int64(d.HealthyNodeCount()))
	if !ok1 || !ok2 || resident >= peaks.HBMBytes {
		return fail("resident weights (%d B per copy × %d copies × %d nodes) leave no HBM for KV out of %d B",
			perNode, c.cfg.WeightCopies, d.HealthyNodeCount(), peaks.HBMBytes)
	}
	lim.kvLimit, _ = mulDiv(uint64(peaks.HBMBytes-resident), sf, billion)
	if lim.kvLimit <= 0 {
		return fail("no KV capacity left (%d B free HBM)", peaks.HBMBytes-resident)
	}

	// Calibrated: cost per token = bucket rate / (tokens/s per GPU · GPUs),
	// so that the bucket admits exactly the calibrated tokens/s. Rounded up.
	for _, m := range c.cat.models {
		cal, ok := m.Calibrated[lim.gpuModel]
		if !ok {
			continue
		}
		r := &lim.perModel[m.k.id]
		var err error
		if r.prefillPerToken, err = perToken(lim.prefillRate, cal.PrefillTokensPerGPUSecond, lim.gpus); err != nil {
			return fail("model %q: calibrated prefill: %v", m.Name, err)
		}
		if r.decodePerToken, err = perToken(lim.decodeRate, cal.DecodeTokensPerGPUSecond, lim.gpus); err != nil {
			return fail("model %q: calibrated decode: %v", m.Name, err)
		}
	}
	return lim, nil
}

// perToken is ⌈rate/(tokensPerGPU·gpus)⌉, at least 1; 0 when not calibrated.
func perToken(rate int64, tokensPerGPU float64, gpus int) (int64, error) {
	if tokensPerGPU == 0 {
		return 0, nil
	}
	v, ok := ceilInt(float64(rate) / (tokensPerGPU * float64(gpus)))
	if !ok || v > maxBurst {
		return 0, fmt.Errorf("%g tokens/s per GPU gives a per-token cost past int64/4", tokensPerGPU)
	}
	return max(v, 1), nil
}

// apply installs lim as the base limits and recomputes the reserve
// watermarks and the buckets' (warmed) limits.
func (c *DomainCapacity) apply(lim limits) {
	c.prior = lim
	lim = c.corrected(lim)
	c.gpus, c.gpuModel, c.perModel = lim.gpus, lim.gpuModel, lim.perModel
	c.basePrefillRate, c.basePrefillBurst = lim.prefillRate, lim.prefillBurst
	c.baseDecodeRate, c.baseDecodeBurst = lim.decodeRate, lim.decodeBurst
	c.baseKV = lim.kvLimit
	c.fullPrefillRate, c.fullDecodeRate, c.fullKV = lim.prefillRate, lim.decodeRate, lim.kvLimit
	c.applyReserve()
}

// FactorFull is the capacity factor of an uncorrected model, in
// millionths; MaxFactor the largest SetFactor takes.
const (
	FactorFull = 1_000_000
	MaxFactor  = 16 * FactorFull
)

// corrected is lim with its rates scaled by the capacity factor (bounded
// at maxBurst). The bursts stay the model's: a burst is the largest
// request the domain takes at once, which a slower engine serves more
// slowly, not never; the KV limit is HBM the engines hold, and the
// calibrated costs per token are the model's.
func (c *DomainCapacity) corrected(lim limits) limits {
	if c.factor == FactorFull {
		return lim
	}
	f := uint64(c.factor)
	scale := func(v int64) int64 {
		r, ok := mulDiv(uint64(v), f, FactorFull)
		if !ok || r > maxBurst {
			return maxBurst
		}
		return r
	}
	lim.prefillRate, lim.decodeRate = scale(lim.prefillRate), scale(lim.decodeRate)
	return lim
}

// SetFactor corrects the model's capacity by what the domain is measured
// to sustain: from now on its rates are factor millionths of the model's
// (bursts, KV and the costs per token stay the model's). A replica
// holding a share of the domain keeps its share, scaled the same; levels
// are kept; the reserves' watermarks follow the new rates. factor is
// taken within [1, MaxFactor].
func (c *DomainCapacity) SetFactor(now, factor int64) {
	factor = min(max(factor, 1), MaxFactor)
	if factor == c.factor {
		return
	}
	c.warmTo(now)
	c.prefill.Level(now) // refill at the old rates up to now
	c.decode.Level(now)
	baseP, baseD, baseKV := c.basePrefillRate, c.baseDecodeRate, c.baseKV
	fullP, fullD := c.fullPrefillRate, c.fullDecodeRate
	c.factor = factor
	c.apply(c.prior)
	if baseP != fullP || baseD != fullD || baseKV != c.fullKV { // a share: scale it
		c.basePrefillRate = rescale(baseP, c.fullPrefillRate, fullP)
		c.baseDecodeRate = rescale(baseD, c.fullDecodeRate, fullD)
		c.baseKV = baseKV
		c.applyReserve()
	}
}

// rescale is v·to/from (v when from is 0).
func rescale(v, to, from int64) int64 {
	if from <= 0 {
		return v
	}
	r, ok := mulDiv(uint64(max(v, 0)), uint64(max(to, 0)), uint64(from))
	if !ok {
		return to
	}
	return r
}

// Factor returns the capacity factor, in millionths of the model.
func (c *DomainCapacity) Factor() int64 { return c.factor }

// PriorRates returns the model's prefill and decode rates of the whole
// domain, before the capacity factor.
func (c *DomainCapacity) PriorRates() (prefill, decode int64) {
	return c.prior.prefillRate, c.prior.decodeRate
}

// FloorsShort reports whether the floor reserves given to the domain ask
// for more than its corrected rates hold: the capacity measured can no
// longer keep them whole.
func (c *DomainCapacity) FloorsShort() bool { return c.floorsShort }

// ShareGrant is one replica's slice of a domain that several replicas
// share (batched shared state): refill rates, the replica's share of the
// global bucket levels, and its KV limit.
type ShareGrant struct {
	PrefillRate, PrefillLevel int64
	DecodeRate, DecodeLevel   int64
	KVLimit                   int64
}

// ApplyShare makes this capacity one replica's slice: the grant's rates,
// levels and KV limit, with the floor reserves scaled by the same share.
// Bursts stay whole so that a request the domain can hold fits any replica
// that has the level for it. Resize restores the whole domain.
func (c *DomainCapacity) ApplyShare(now int64, g ShareGrant) {
	c.warmTo(now)
	c.paused = false
	c.basePrefillRate, c.baseDecodeRate = max(g.PrefillRate, 0), max(g.DecodeRate, 0)
	c.baseKV = max(g.KVLimit, 0)
	c.applyReserve()
	c.prefill.SetLevel(now, g.PrefillLevel)
	c.decode.SetLevel(now, g.DecodeLevel)
}

// Pause stops the buckets refilling, keeping their levels, bursts and
// reserve watermarks, until the next ApplyShare: the slice of a domain a
// replica has stopped reporting (batched shared state), so that a share
// the store no longer accounts for cannot grow.
func (c *DomainCapacity) Pause(now int64) {
	c.warmTo(now)
	c.prefill.Level(now) // refill at the old rates up to now
	c.decode.Level(now)
	c.paused = true
	c.applyLimits()
}

// FullLimits returns the whole domain's prefill and decode rates and KV
// limit, whatever share this replica holds.
func (c *DomainCapacity) FullLimits() (prefillRate, decodeRate, kvLimit int64) {
	return c.fullPrefillRate, c.fullDecodeRate, c.fullKV
}

// Bucket returns a copy of the decode bucket (decode) or the prefill
// bucket, to read levels and counters without changing anything.
func (c *DomainCapacity) Bucket(decode bool) tokenbucket.Bucket {
	if decode {
		return c.decode
	}
	return c.prefill
}

// Taken returns the net FLOP and bytes taken from the prefill and decode
// buckets (wrapping, as tokenbucket.Bucket.Taken).
func (c *DomainCapacity) Taken() (prefill, decode int64) {
	return c.prefill.Taken(), c.decode.Taken()
}

// Resize rebuilds the rates, bursts, KV limit and calibrated costs from d,
// the same domain after its healthy GPUs changed. Levels are kept (cut to
// the new bursts) and refill from then on at the new rates; KV in use is
// kept, even above a smaller limit (nothing fits until releases bring it
// back under). The reserve rates are kept and their watermarks recomputed.
// On error (another domain's id, weights that no longer fit) nothing changes.
func (c *DomainCapacity) Resize(d *topology.Domain) error {
	if d == nil || d.ID != c.id {
		return fmt.Errorf("pd: domain %q: Resize with another domain", c.id)
	}
	lim, err := c.limits(d)
	if err != nil {
		return err
	}
	c.apply(lim)
	return nil
}

// CopyLevels sets this domain's bucket levels, KV in use and warm-up ramp to
// from's at now (levels cut to this domain's bursts). With NewDomainCapacity it carries a
// domain's live state across a catalog or config reload.
func (c *DomainCapacity) CopyLevels(now int64, from *DomainCapacity) {
	from.warmTo(now)
	c.warm, c.warmFrom, c.warmAt, c.warmEnd = from.warm, from.warmFrom, from.warmAt, from.warmEnd
	if from.factor != c.factor {
		c.factor = from.factor
		c.apply(c.prior)
	}
	c.applyLimits()
	setLevel(&c.prefill, now, from.prefill.Level(now))
	setLevel(&c.decode, now, from.decode.Level(now))
	c.kvInUse = from.kvInUse
}

// setLevel moves a bucket's level to want (at most its burst, at least
// minus its burst).
func setLevel(b *tokenbucket.Bucket, now, want int64) {
	b.SetLevel(now, max(want, -b.Burst())) // not a take: shared state must not report it
}

// SetReserve sets the reserve rates kept for tenant floors: prefill FLOP/s
// and decode B/s, each capped at its bucket's rate (negative is 0). The
// watermarks below which shared traffic may not take the buckets are
//
//	prefill reserve = min(prefillPerSec · burst_seconds, prefill burst)
//	decode reserve  = min(decodePerSec · burst_seconds, decode burst)
//	KV reserve      = KV limit · min(prefillPerSec, prefill rate) / prefill rate
//
// Floor traffic may take the buckets to 0. Reserve that floor traffic leaves
// unused refills the buckets above the watermarks, where shared traffic uses
// it: idle reserve is lent, never lost.
func (c *DomainCapacity) SetReserve(prefillFLOPPerSec, decodeBytesPerSec int64) {
	c.resPrefillRate = max(prefillFLOPPerSec, 0)
	c.resDecodeRate = max(decodeBytesPerSec, 0)
	c.applyReserve()
}

// applyReserve recomputes the watermarks from the base limits (a ramp never
// shrinks a reserve) and then the buckets' limits.
func (c *DomainCapacity) applyReserve() {
	burstNanos := uint64(math.Round(c.cfg.BurstSeconds * billion))
	// A replica holding a share of the domain keeps the same share of the
	// reserves.
	wantP := scaleRate(c.resPrefillRate, c.basePrefillRate, c.fullPrefillRate)
	wantD := scaleRate(c.resDecodeRate, c.baseDecodeRate, c.fullDecodeRate)
	pr, dr := min(wantP, c.basePrefillRate), min(wantD, c.baseDecodeRate)
	c.floorsShort = c.gpus > 0 && (wantP > pr || wantD > dr)
	c.resPR, c.resDR = pr, dr
	p, _ := mulDiv(uint64(pr), burstNanos, billion)
	d, _ := mulDiv(uint64(dr), burstNanos, billion)
	c.resPrefill = min(p, c.basePrefillBurst)
	c.resDecode = min(d, c.baseDecodeBurst)
	c.resKV = 0
	if rate := c.basePrefillRate; rate > 0 {
		c.resKV, _ = mulDiv(uint64(c.baseKV), uint64(pr), uint64(rate))
	}
	c.applyLimits()
}

// applyLimits sets the buckets' rates and bursts and the KV limit to
//
//	limit = reserve + warm · (base − reserve)
//
// for each of them: the reserve part, which keeps tenants' floors, is whole
// from the first moment; the shared part ramps.
func (c *DomainCapacity) applyLimits() {
	pr, dr := warmed(c.resPR, c.basePrefillRate, c.warm), warmed(c.resDR, c.baseDecodeRate, c.warm)
	if c.paused {
		pr, dr = 0, 0
	}
	c.prefill.SetLimits(pr, warmed(c.resPrefill, c.basePrefillBurst, c.warm), 0)
	c.decode.SetLimits(dr, warmed(c.resDecode, c.baseDecodeBurst, c.warm), 0)
	c.kvLimit = warmed(c.resKV, c.baseKV, c.warm)
}

// warmed is reserve + w·(base − reserve)/WarmupFull, in integers.
func warmed(reserve, base, w int64) int64 {
	if w >= WarmupFull || base <= reserve {
		return base
	}
	shared, _ := mulDiv(uint64(base-reserve), uint64(max(w, 0)), WarmupFull)
	return reserve + shared
}

// WarmupFull is the warm-up fraction of a whole domain, in millionths.
const WarmupFull = 1_000_000

// StartWarmup ramps the domain's shared capacity — each bucket's rate and
// burst and the KV limit, less the floor reserves — linearly from from
// millionths of it at now to the whole at end. Levels above the ramped
// bursts are cut, so hardware that returns does not take a full burst at
// once. from ≥ WarmupFull or end ≤ now makes the domain whole at once; a
// from below 1 counts as 1. Every method that takes a time moves the ramp.
func (c *DomainCapacity) StartWarmup(now, from, end int64) {
	c.prefill.Level(now) // refill at the old rates up to now
	c.decode.Level(now)
	if from >= WarmupFull || end <= now {
		c.warm, c.warmEnd = WarmupFull, 0
		c.applyLimits()
		return
	}
	c.warmFrom, c.warmAt, c.warmEnd = max(from, 1), now, end
	c.warm = c.warmFrom
	c.applyLimits()
}

// Warmup returns the warm-up fraction at now in millionths (WarmupFull when
// whole) and when the ramp ends (0 when whole).
func (c *DomainCapacity) Warmup(now int64) (fraction, end int64) {
	c.warmTo(now)
	return c.warm, c.warmEnd
}

// warmTo moves the ramp to now: one comparison while the domain is whole.
func (c *DomainCapacity) warmTo(now int64) {
	if c.warmEnd == 0 {
		return
	}
	w := c.warmFrom
	switch {
	case now >= c.warmEnd:
		w, c.warmEnd = WarmupFull, 0
	case now > c.warmAt:
		d, _ := mulDiv(uint64(WarmupFull-c.warmFrom), uint64(now-c.warmAt), uint64(c.warmEnd-c.warmAt))
		w += d
	}
	if w == c.warm {
		return
	}
	c.prefill.Level(now) // refill at the old rates up to now
	c.decode.Level(now)
	c.warm = w
	c.applyLimits()
}

// scaleRate returns v · share/whole (v when whole is 0 or share is whole).
func scaleRate(v, share, whole int64) int64 {
	if whole <= 0 || share >= whole {
		return v
	}
	r, _ := mulDiv(uint64(max(v, 0)), uint64(max(share, 0)), uint64(whole))
	return r
}

// Cost returns the cost in this domain of a request of prompt and output
// tokens on m, a model of the domain's catalog: the formulas, with a phase
// replaced by its calibrated cost where m has a calibration for the domain's
// GPU model. It allocates only on error; errors are as Catalog.Cost's.
func (c *DomainCapacity) Cost(m *Model, prompt, output int64) (Cost, error) {
	k, err := c.cat.consts(m)
	if err != nil {
		return Cost{}, err
	}
	r := c.perModel[k.id]
	return k.cost(m.Name, prompt, output, r.prefillPerToken, r.decodePerToken)
}

// CostCached is Cost for a request whose first cached prompt tokens are
// served from the engine's prefix cache: its prefill is charged on the
// uncached tokens only; decode and KV still see the whole context. cached
// is taken within [0, prompt].
func (c *DomainCapacity) CostCached(m *Model, prompt, cached, output int64) (Cost, error) {
	cost, err := c.Cost(m, prompt, output)
	if err != nil || cached <= 0 {
		return cost, err
	}
	uncached, err := c.Cost(m, prompt-min(cached, prompt), 0)
	if err != nil {
		return Cost{}, err
	}
	cost.PrefillFLOP = uncached.PrefillFLOP
	return cost, nil
}

// watermarks returns the least each bucket may be left at and the most KV
// may reach, for floor or shared traffic.
func (c *DomainCapacity) watermarks(floor bool) (prefillMin, decodeMin, kvMax int64) {
	if floor {
		return 0, 0, c.kvLimit
	}
	return c.resPrefill, c.resDecode, c.kvLimit - c.resKV
}

// Fits reports whether cost fits the domain at now: both buckets keep at
// least their watermark (0 for floor traffic, the reserve for shared) and
// KV in use stays within the limit (less the KV reserve, for shared). A
// domain without healthy GPUs fits nothing, not even a zero cost.
func (c *DomainCapacity) Fits(now int64, cost Cost, floor bool) bool {
	c.warmTo(now)
	if c.gpus == 0 || cost.PrefillFLOP < 0 || cost.DecodeBytes < 0 || cost.KVBytes < 0 {
		return false
	}
	pMin, dMin, kvMax := c.watermarks(floor)
	return cost.KVBytes <= kvMax-c.kvInUse &&
		c.prefill.Fits(now, cost.PrefillFLOP, pMin) &&
		c.decode.Fits(now, cost.DecodeBytes, dMin)
}

// Charge takes cost from both buckets and adds its KV to the gauge at now,
// unconditionally (call Fits first). A bucket's debt is bounded at one
// burst: what would take it further is forgiven. Negative parts count as 0.
func (c *DomainCapacity) Charge(now int64, cost Cost) {
	c.warmTo(now)
	take(&c.prefill, now, cost.PrefillFLOP)
	take(&c.decode, now, cost.DecodeBytes)
	if kv := max(cost.KVBytes, 0); kv > math.MaxInt64-c.kvInUse {
		c.kvInUse = math.MaxInt64
	} else {
		c.kvInUse += kv
	}
}

// Release settles a finished request at now: each bucket gets back
// charged − actual where positive (output never generated), or has the
// overrun taken where negative (debt bounded at one burst, as in Charge);
// charged.KVBytes leaves the gauge, which never goes below 0.
func (c *DomainCapacity) Release(now int64, charged, actual Cost) {
	c.warmTo(now)
	settle(&c.prefill, now, max(charged.PrefillFLOP, 0)-max(actual.PrefillFLOP, 0))
	settle(&c.decode, now, max(charged.DecodeBytes, 0)-max(actual.DecodeBytes, 0))
	c.kvInUse = max(c.kvInUse-max(charged.KVBytes, 0), 0)
}

// take takes n ≥ 0 units, leaving the level no lower than −burst.
func take(b *tokenbucket.Bucket, now, n int64) {
	if n <= 0 {
		return
	}
	room := b.Level(now) + b.Burst() // ≥ 0: levels stay in [−burst, burst]
	b.Take(now, min(n, max(room, 0)))
}

// settle refunds diff > 0 or takes −diff > 0.
func settle(b *tokenbucket.Bucket, now, diff int64) {
	switch {
	case diff > 0:
		b.Refund(now, diff)
	case diff < 0:
		take(b, now, -diff)
	}
}

// RetryAfter returns how long after now until cost fits both buckets (the
// later of the two), or tokenbucket.Never if it never can (CanEverFit is
// false, a shared request exceeds a bucket's burst less its reserve or the
// KV limit less the KV reserve, or a bucket does not refill). The KV gauge
// frees only at releases, at times this cannot know, so a request short only
// of KV gets 0 although Fits is false: the caller waits for a release.
//
// While the domain warms up, a request too large for the ramped limits but
// not for the whole domain gets the time until the ramp ends.
func (c *DomainCapacity) RetryAfter(now int64, cost Cost, floor bool) time.Duration {
	if !c.CanEverFit(cost) {
		return tokenbucket.Never
	}
	c.warmTo(now)
	pMin, dMin, _ := c.watermarks(floor)
	kvMax := c.baseKV // the KV a warmed-up domain holds: a ramp only delays
	if !floor {
		kvMax -= c.resKV
	}
	if cost.KVBytes > kvMax {
		return tokenbucket.Never
	}
	wait := max(c.prefill.RetryAfter(now, cost.PrefillFLOP, pMin), c.decode.RetryAfter(now, cost.DecodeBytes, dMin))
	if wait == tokenbucket.Never && c.warmEnd != 0 && c.prefill.Rate() > 0 && c.decode.Rate() > 0 &&
		cost.PrefillFLOP <= c.basePrefillBurst-pMin && cost.DecodeBytes <= c.baseDecodeBurst-dMin {
		return time.Duration(c.warmEnd - now)
	}
	return wait
}

// CanEverFit reports whether cost fits an idle, full, warmed-up domain as
// floor traffic: the domain has healthy GPUs, and each part is non-negative
// and within its bucket's burst and the KV limit.
func (c *DomainCapacity) CanEverFit(cost Cost) bool {
	return c.gpus > 0 && cost.PrefillFLOP >= 0 && cost.PrefillFLOP <= c.basePrefillBurst &&
		cost.DecodeBytes >= 0 && cost.DecodeBytes <= c.baseDecodeBurst &&
		cost.KVBytes >= 0 && cost.KVBytes <= c.baseKV
}

// ID returns the domain's id.
func (c *DomainCapacity) ID() string { return c.id }

// GPUModel returns the domain's GPU model, as topology.Domain.GPUModel.
func (c *DomainCapacity) GPUModel() string { return c.gpuModel }

// GPUs returns the number of healthy GPUs the capacity counts.
func (c *DomainCapacity) GPUs() int { return c.gpus }

// Levels returns the prefill (FLOP) and decode (byte) bucket levels at now;
// negative while in debt after an overrun.
func (c *DomainCapacity) Levels(now int64) (prefill, decode int64) {
	c.warmTo(now)
	return c.prefill.Level(now), c.decode.Level(now)
}

// KV returns the KV bytes in use and the KV limit.
func (c *DomainCapacity) KV() (inUse, limit int64) { return c.kvInUse, c.kvLimit }

// PrefillRate returns the prefill bucket's rate in FLOP/s.
func (c *DomainCapacity) PrefillRate() int64 { return c.prefill.Rate() }

// PrefillBurst returns the prefill bucket's depth in FLOP.
func (c *DomainCapacity) PrefillBurst() int64 { return c.prefill.Burst() }

// DecodeRate returns the decode bucket's rate in bytes/s.
func (c *DomainCapacity) DecodeRate() int64 { return c.decode.Rate() }

// DecodeBurst returns the decode bucket's depth in bytes.
func (c *DomainCapacity) DecodeBurst() int64 { return c.decode.Burst() }

// Reserves returns the watermarks shared traffic stops at: prefill FLOP,
// decode bytes, and KV bytes held back from the KV limit.
func (c *DomainCapacity) Reserves() (prefill, decode, kv int64) {
	return c.resPrefill, c.resDecode, c.resKV
}

// ReserveRates returns the floor reserves' rates given to the domain
// (SetReserve): prefill FLOP/s and decode B/s, whole or not held.
func (c *DomainCapacity) ReserveRates() (prefill, decode int64) {
	return c.resPrefillRate, c.resDecodeRate
}

// ReservedFraction returns the reserved share of the prefill rate, in [0, 1]
// (for display and for sizing the KV reserve).
func (c *DomainCapacity) ReservedFraction() float64 {
	rate := c.prefill.Rate()
	if rate == 0 {
		return 0
	}
	return float64(min(c.resPrefillRate, rate)) / float64(rate)
}

// BaseLimits returns the prefill and decode rates and the KV limit before
// warm-up: the whole domain's, or this replica's share (FullLimits is always
// the whole domain's). Floor reserves are spread by them, so that a ramp
// moves no reserve between domains.
func (c *DomainCapacity) BaseLimits() (prefillRate, decodeRate, kvLimit int64) {
	return c.basePrefillRate, c.baseDecodeRate, c.baseKV
}

// FullBursts returns the prefill and decode bursts of the whole domain,
// before warm-up (a replica's share keeps the whole bursts): what shared
// state sizes the domain's buckets by, whatever this replica's ramp.
func (c *DomainCapacity) FullBursts() (prefill, decode int64) {
	return c.basePrefillBurst, c.baseDecodeBurst
}
