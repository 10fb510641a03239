package admission

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sluice-sched/sluice/pd"
)

// ConfigRefusal is a config that was refused while the last good one kept
// serving: what the control plane records and GetConfigStatus reports.
type ConfigRefusal struct {
	Source   string // a file path or an etcd key
	Key      string // the key path inside the document, when known
	Reason   string
	Revision int64 // etcd revision of the refused write; 0 for a file
	At       time.Time
}

// Config is the whole policy of an engine: tiers, tenants, the model catalog
// and the knobs of capacity, queueing, leases and domain health. It is what
// a config file or the etcd control plane holds; field names are its keys.
type Config struct {
	Tiers    map[string]TierPolicy   `json:"tiers"`
	Tenants  map[string]TenantConfig `json:"tenants"`
	Models   []pd.Model              `json:"models"`
	Capacity pd.Config               `json:"capacity"`
	Queue    QueueConfig             `json:"queue"`
	Leases   LeaseConfig             `json:"leases"`
	Health   HealthConfig            `json:"health"`
	Limits   RequestLimits           `json:"limits"`
	Warmup   WarmupConfig            `json:"warmup"`
	Feedback FeedbackConfig          `json:"feedback"`
	Deferral DeferralConfig          `json:"deferral"`
	// Metrics is for sluiced's metrics adapter; the engine does not read it.
	Metrics MetricsConfig `json:"metrics"`
	// DegradeHeadroom is the share of a domain's buckets a request of the
	// lowest-weight tenant must leave free on its requested tier before it is
	// degraded instead; it scales down linearly to 0 for the highest weight,
	// so low-weight tenants degrade first. Default 0.1; 0 turns it off.
	DegradeHeadroom *float64 `json:"degrade_headroom,omitempty"`
	// OutputTokenWeight is how many weighted tokens one output token costs
	// (weighted tokens = prompt + OutputTokenWeight × output).
	OutputTokenWeight int64 `json:"output_token_weight"`
}

// Limit is a token bucket: Rate units per second, up to Burst.
type Limit struct {
	Rate  float64 `json:"rate"`
	Burst float64 `json:"burst"`
}

// BurstCredit lets a tenant's token bucket go into debt.
type BurstCredit struct {
	// Multiple is the largest debt as a multiple of the token rate (seconds of refill).
	Multiple float64 `json:"multiple"`
	// Window is how long the tenant may stay in debt before its breaker opens.
	Window Duration `json:"window"`
	// BreakerOpen is how long the breaker stays open before it half-opens.
	BreakerOpen Duration `json:"breaker_open"`
}

// Budget caps what a tenant may spend, in USD; 0 means no cap.
type Budget struct {
	DailyUSD   float64 `json:"daily_usd"`
	MonthlyUSD float64 `json:"monthly_usd"`
}

// TierPolicy is everything a tier sets for its tenants.
type TierPolicy struct {
	RPS            Limit       `json:"rps"`             // requests per second
	Tokens         Limit       `json:"tokens"`          // weighted tokens per second
	MaxConcurrency int64       `json:"max_concurrency"` // in-flight plus queued; 0 = no limit
	Floor          int64       `json:"floor"`           // guaranteed weighted tokens per second
	Weight         int64       `json:"weight"`          // WFQ weight, ≥ 1
	BurstCredit    BurstCredit `json:"burst_credit"`
	Budget         Budget      `json:"budget"`
	Critical       Limit       `json:"critical"` // weighted tokens/s for priority=CRITICAL; rate 0 = no critical band
	// FailMode is what the tier's tenants get while shared state (Redis)
	// is unreachable: "open" (default) keeps admitting from this replica's
	// slice of the quotas, "closed" rejects with STATE_UNAVAILABLE.
	FailMode string `json:"fail_mode,omitempty"`
}

// Fail modes of a tier while shared state is unreachable.
const (
	FailOpen   = "open"
	FailClosed = "closed"
)

// TenantConfig names a tenant's tier and any per-tenant overrides.
type TenantConfig struct {
	Tier string `json:"tier"`
	// The overrides' keys sit beside tier in the document; nil when there
	// are none. Most tenants take their tier's policy as it is (the engine
	// keeps such a tenant as its name and a few bytes: tenantindex.go).
	// Read the overrides through Overrides, which is never nil.
	*TenantOverrides
}

// TenantOverrides are a tenant's own values for its tier's policy; a nil
// field keeps the tier's.
type TenantOverrides struct {
	RPS            *Limit       `json:"rps,omitempty"`
	Tokens         *Limit       `json:"tokens,omitempty"`
	MaxConcurrency *int64       `json:"max_concurrency,omitempty"`
	Floor          *int64       `json:"floor,omitempty"`
	Weight         *int64       `json:"weight,omitempty"`
	BurstCredit    *BurstCredit `json:"burst_credit,omitempty"`
	Budget         *Budget      `json:"budget,omitempty"`
	Critical       *Limit       `json:"critical,omitempty"`
}

// QueueConfig bounds the weighted fair queue.
type QueueConfig struct {
	MaxPerFlow  int      `json:"max_per_flow"`
	MaxTotal    int      `json:"max_total"`
	MaxCritical int      `json:"max_critical"`
	DefaultWait Duration `json:"default_wait"` // longest wait of a request that has no deadline
	// DeadlineMargin is answered before the caller's deadline so that a
	// rejection still reaches it.
	DeadlineMargin Duration `json:"deadline_margin"`
	// DegradeAfter caps how long a request that accepts lower tiers waits
	// in the fair order for its requested tier before it may take a lower
	// one (0: at once). nil: no cap; it waits for as long as the tier can
	// still serve it before its deadline (see docs/policy.md,
	// "Degradation"), so that degrading never leaves the tier idle for
	// work it could have done. While it waits, the tier goes to the tenant
	// whose turn it is there, so each tenant's share of a saturated tier
	// follows its weight.
	DegradeAfter *Duration `json:"degrade_after,omitempty"`
	// TierShareWindow is how long a tenant that wanted a tier and did not
	// get it (queued for it, degraded from it) keeps its turns there (nil:
	// 5s; 0: only while queued). Longer than the gap between a tenant's
	// waves of requests, or its share of the tier is forgotten in between;
	// but a tenant whose turn it is and that stopped asking holds the tier
	// back from the others (they degrade) for up to this long.
	TierShareWindow *Duration `json:"tier_share_window,omitempty"`
}

// LeaseConfig sets lease and idempotency lifetimes.
type LeaseConfig struct {
	TTL            Duration `json:"ttl"`             // a lease not released by then expires and frees its KV
	IdempotencyTTL Duration `json:"idempotency_ttl"` // how long a request id's admission is remembered
	// MaxIdempotencyRecords bounds the request ids remembered (about 70
	// bytes each); beyond it the oldest are forgotten first.
	MaxIdempotencyRecords int `json:"max_idempotency_records"`
}

// HealthConfig sets how Release outcomes move a domain's placement weight.
type HealthConfig struct {
	ErrorRate  float64  `json:"error_rate"`  // above this share of errors in a window the weight is cut
	MinSamples int64    `json:"min_samples"` // outcomes needed in a window before judging
	Window     Duration `json:"window"`      // outcome counting window
	CutWeight  float64  `json:"cut_weight"`  // the weight after a cut
	Cooldown   Duration `json:"cooldown"`    // time after a cut before recovery starts
	Step       float64  `json:"step"`        // weight regained per step
	StepEvery  Duration `json:"step_every"`  // time between steps
}

// WarmupConfig sets how a domain that returns — undrained, its GPUs healthy
// again, or new to the cluster after start-up — ramps its shared capacity
// back, so that returning hardware does not take a full burst at once.
type WarmupConfig struct {
	// StartFraction is the share of its shared capacity a returning domain
	// starts at, in (0, 1]; default 0.25 (1: no warm-up).
	StartFraction float64 `json:"start_fraction"`
	// Period is how long the linear ramp from StartFraction to the whole
	// takes (nil: 60s; 0: no warm-up).
	Period *Duration `json:"period,omitempty"`
}

// DeferralConfig sets how deferrable work waits in the durable backlog
// (package admission/deferral) and what capacity it may take.
type DeferralConfig struct {
	// DefaultWithin is how long a deferrable request may wait when it
	// names no defer_within (default 1h); MaxWithin the most it may ask
	// (default 24h, as a batch API's window).
	DefaultWithin Duration `json:"default_within"`
	MaxWithin     Duration `json:"max_within"`
	// MaxPerTenant and MaxTotal bound the backlog's tickets (defaults
	// 100,000 and 1,000,000): beyond them a deferrable request is
	// QUEUE_FULL.
	MaxPerTenant int `json:"max_per_tenant"`
	MaxTotal     int `json:"max_total"`
	// Headroom is the share of a domain's buckets deferred work leaves
	// free above the floors' reserve (default 0.2), so that interactive
	// requests arriving next find room at once; and deferred work runs
	// only while no interactive request waits in the queue.
	Headroom float64 `json:"headroom"`
}

// FeedbackConfig sets how each domain's capacity follows what its serving
// engines report and what it is measured to sustain (see feedback.go):
// AIMD on the engines' saturation signals, and calibration from the
// throughput Release reports show while the engines are busy.
type FeedbackConfig struct {
	// Period is the control step; default 250ms.
	Period Duration `json:"period"`
	// Stale is the age past which engine signals are ignored (the model
	// alone decides, visibly); default 500ms.
	Stale Duration `json:"stale"`
	// QueueThreshold and KVThreshold: engines waiting QueueThreshold
	// requests or more, or using more of their KV cache than KVThreshold,
	// are saturated (the guard keeps the queue within the threshold);
	// defaults 5 and 0.8 (the Gateway API Inference Extension's).
	QueueThreshold float64 `json:"queue_threshold"`
	KVThreshold    float64 `json:"kv_threshold"`
	// Decrease multiplies the capacity factor each saturated period
	// (default 0.8); Increase adds to it, as a share of the model, each
	// period the signals have been clear for ClearPeriods while the
	// domain's capacity is in demand (default 0.02, 4).
	Decrease     float64 `json:"decrease"`
	Increase     float64 `json:"increase"`
	ClearPeriods int     `json:"clear_periods"`
	// CutAfter is how long the engines must have been saturated, with no
	// signal within the thresholds, before Decrease applies (default
	// 500ms): a burst's queue, or one long prompt's, holds the domain to
	// its floors but leaves the factor alone; a standing queue cuts it.
	// At most the period: every saturated period cuts.
	CutAfter Duration `json:"cut_after"`
	// MinFactor and MaxFactor bound the factor, relative to the model;
	// defaults 0.25 and 2.
	MinFactor float64 `json:"min_factor"`
	MaxFactor float64 `json:"max_factor"`
	// Window is the calibration window (default 5s); CalibrationStep the
	// most one window moves the factor (default 0.1 of the model), and
	// Deadband the least (default 0.05): smaller moves are noise.
	Window          Duration `json:"window"`
	CalibrationStep float64  `json:"calibration_step"`
	Deadband        float64  `json:"deadband"`
	// BusyTTFT: without fresh engine signals, a window whose median
	// reported time to first token passes it counts as one where the
	// engines were busy; default 1s.
	BusyTTFT Duration `json:"busy_ttft"`
	// SpreadChoices: placement weighs this many of a tenant's first
	// domains by load (default 2, the power of two choices; 1: first fit
	// in rendezvous order; at most MaxSpreadChoices); SpreadMargin is how
	// much more loaded the first must be before the least loaded of them
	// goes ahead of it, as a share of the first's load (default 0.1: a
	// domain 10% busier; of a load of 0.1 at least; 1: load never moves a
	// request), so that a tenant's requests, and its prefixes, stay on its
	// first while the domains' loads are within the margin.
	SpreadChoices int     `json:"spread_choices"`
	SpreadMargin  float64 `json:"spread_margin"`
	// LoadSmoothing is the weight of each period's use in a domain's load,
	// the moving average placement compares (default 0.3: about the last
	// second at the default period). Smaller is smoother: fewer requests
	// leave their first domain on noise, and spreading follows more
	// slowly. The engines' signals count at once either way.
	LoadSmoothing float64 `json:"load_smoothing"`
}

// MaxSpreadChoices bounds feedback.spread_choices: more choices spread
// a tenant's prefixes over more domains.
const MaxSpreadChoices = 4

// MetricsConfig bounds what the metrics expose.
type MetricsConfig struct {
	// MaxTenantSeries is how many tenants get metric series of their own
	// (the busiest between scrapes; the rest are tenant="other"), so that
	// 100k tenants cannot flood Prometheus.
	MaxTenantSeries int `json:"max_tenant_series"`
}

// RequestLimits bound what one request may ask for, and what its Release
// may report.
type RequestLimits struct {
	MaxPromptTokens int64 `json:"max_prompt_tokens"`
	MaxOutputTokens int64 `json:"max_output_tokens"`
	// ReleaseOverrunMultiple bounds a Release's counts at this many times
	// what its lease admitted (prompt and max output tokens); more is
	// charged at the bound and counted as clamped. Default 4: serving
	// engines stop at max_tokens, so an honest report is within what was
	// admitted, and 4× leaves room for a router that admits on an estimate
	// of the output, while one report, mistaken or hostile, cannot charge
	// a tenant and its domain more than a few admissions' worth.
	ReleaseOverrunMultiple int64 `json:"release_overrun_multiple"`
}

// Duration is a time.Duration written as a Go duration string ("30s") in
// config files; a bare number is read as seconds.
type Duration struct{ time.Duration }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads "1m30s" or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("bad duration %q: %w", s, err)
		}
		d.Duration = v
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("bad duration %s: want a string such as \"30s\" or a number of seconds", b)
	}
	d.Duration = time.Duration(secs * float64(time.Second))
	return nil
}

// clone returns a deep copy, so that neither the caller nor the engine can
// change the other's config behind its back.
func (c *Config) clone() Config {
	out := c.cloneSettings()
	out.Tenants = make(map[string]TenantConfig, len(c.Tenants))
	for k, v := range c.Tenants {
		out.Tenants[k] = v.clone()
	}
	return out
}

// cloneSettings is clone without the tenants (nil in the copy).
func (c *Config) cloneSettings() Config {
	out := *c
	out.Tenants = nil
	out.Tiers = make(map[string]TierPolicy, len(c.Tiers))
	for k, v := range c.Tiers {
		out.Tiers[k] = v
	}
	if c.Models != nil {
		out.Models = make([]pd.Model, len(c.Models))
		for i, m := range c.Models {
			if m.Calibrated != nil {
				cal := make(map[string]pd.Calibration, len(m.Calibrated))
				for g, v := range m.Calibrated {
					cal[g] = v
				}
				m.Calibrated = cal
			}
			m.ServedNames = slices.Clone(m.ServedNames)
			out.Models[i] = m
		}
	}
	if c.DegradeHeadroom != nil {
		h := *c.DegradeHeadroom
		out.DegradeHeadroom = &h
	}
	out.Queue.DegradeAfter = clonePtr(c.Queue.DegradeAfter)
	out.Queue.TierShareWindow = clonePtr(c.Queue.TierShareWindow)
	out.Warmup.Period = clonePtr(c.Warmup.Period)
	return out
}

// noOverrides is what Overrides returns for a tenant without any.
var noOverrides TenantOverrides

// Overrides returns the tenant's overrides (all nil when it has none).
// The result is shared: do not modify it.
func (t TenantConfig) Overrides() *TenantOverrides {
	if t.TenantOverrides == nil {
		return &noOverrides
	}
	return t.TenantOverrides
}

// clone copies the overrides so that they share no pointers.
func (t TenantConfig) clone() TenantConfig {
	if t.TenantOverrides == nil {
		return t
	}
	o := *t.TenantOverrides
	o.RPS = clonePtr(o.RPS)
	o.Tokens = clonePtr(o.Tokens)
	o.MaxConcurrency = clonePtr(o.MaxConcurrency)
	o.Floor = clonePtr(o.Floor)
	o.Weight = clonePtr(o.Weight)
	o.BurstCredit = clonePtr(o.BurstCredit)
	o.Budget = clonePtr(o.Budget)
	o.Critical = clonePtr(o.Critical)
	t.TenantOverrides = &o
	return t
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// Policy returns the effective policy of a tenant: its tier's with the
// tenant's overrides applied.
func (c *Config) Policy(tenant string) (TierPolicy, bool) {
	tc, ok := c.Tenants[tenant]
	if !ok {
		return TierPolicy{}, false
	}
	return c.policyOf(tc)
}

// policyOf is the effective policy of a tenant entry under c's tiers.
func (c *Config) policyOf(tc TenantConfig) (TierPolicy, bool) {
	p, ok := c.Tiers[tc.Tier]
	if !ok {
		return TierPolicy{}, false
	}
	o := tc.Overrides()
	if o.RPS != nil {
		p.RPS = *o.RPS
	}
	if o.Tokens != nil {
		p.Tokens = *o.Tokens
	}
	if o.MaxConcurrency != nil {
		p.MaxConcurrency = *o.MaxConcurrency
	}
	if o.Floor != nil {
		p.Floor = *o.Floor
	}
	if o.Weight != nil {
		p.Weight = *o.Weight
	}
	if o.BurstCredit != nil {
		p.BurstCredit = *o.BurstCredit
	}
	if o.Budget != nil {
		p.Budget = *o.Budget
	}
	if o.Critical != nil {
		p.Critical = *o.Critical
	}
	return p, true
}

// ConfigError is a config value refused, with the key path that holds it.
type ConfigError struct {
	Key    string // e.g. "tenants.acme.weight"
	Reason string
	Err    error // the error Reason came from, if any
}

func (e *ConfigError) Error() string { return e.Key + ": " + e.Reason }

// Unwrap returns the error the refusal came from.
func (e *ConfigError) Unwrap() error { return e.Err }

func cfgErr(key, format string, args ...any) error {
	return &ConfigError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

// cfgWrap refuses the value at key for err, keeping err in the chain.
func cfgWrap(key string, err error) error {
	return &ConfigError{Key: key, Reason: err.Error(), Err: err}
}

// SetDefaults fills every knob left at zero with its default. It cannot
// tell a key written as 0 from one omitted; a config read from a file goes
// through ApplyDefaults instead, which can.
func (c *Config) SetDefaults() { _ = c.ApplyDefaults(nil) }

// ApplyDefaults fills every knob the document omitted with its default and
// refuses, with its key path, one written as zero: for every defaulted knob
// 0 would mean something the engine cannot serve (a weight of 0, no queue
// bound, a zero TTL, a zero soft capacity), and silently serving the default
// instead would say something the file does not. present reports whether a
// key path ("queue.max_total", "tiers.free.weight") holds a value in the
// document (a null counts as omitted); nil means nothing was written, so
// every zero takes its default. The defaults:
//
//	capacity: soft_fraction 0.70, mfu 0.5, burst_seconds 2, weight_copies 1
//	queue: max_per_flow 1000, max_total 100000, max_critical 1000, default_wait 30s, deadline_margin 5ms
//	leases: ttl 10m, idempotency_ttl 10m, max_idempotency_records 1000000
//	metrics: max_tenant_series 100
//	health: error_rate 0.20, min_samples 20, window 10s, cut_weight 0.05, cooldown 30s, step 0.1, step_every 5s
//	limits: max_prompt_tokens 1048576, max_output_tokens 262144, release_overrun_multiple 4
//	output_token_weight 4, degrade_headroom 0.1 (0 is allowed: it turns degrade headroom off)
//	queue.degrade_after unset: a request waits for its tier while the tier can serve it before its deadline (0 is allowed: degrade at once)
//	warmup: start_fraction 0.25, period 60s (0 is allowed: no warm-up)
//	feedback: period 250ms, stale 500ms, queue_threshold 5, kv_threshold 0.8, decrease 0.8, cut_after 500ms,
//	  increase 0.02, clear_periods 4, min_factor 0.25, max_factor 2, window 5s,
//	  calibration_step 0.1, deadband 0.05, busy_ttft 1s, spread_choices 2, spread_margin 0.1,
//	  load_smoothing 0.3
//	tiers.NAME: weight 1, burst_credit.breaker_open 60s, burst_credit.window 10s (when multiple > 0)
//	models: the built-in catalog (pd.DefaultModels)
func (c *Config) ApplyDefaults(present func(key string) bool) error {
	if present == nil {
		present = func(string) bool { return false }
	}
	d := &defaulter{present: present}
	if c.Models == nil {
		c.Models = pd.DefaultModels()
	}
	pdd := pd.DefaultConfig()
	d.float("capacity.soft_fraction", &c.Capacity.SoftFraction, pdd.SoftFraction)
	d.float("capacity.mfu", &c.Capacity.MFU, pdd.MFU)
	d.float("capacity.burst_seconds", &c.Capacity.BurstSeconds, pdd.BurstSeconds)
	d.int("capacity.weight_copies", &c.Capacity.WeightCopies, pdd.WeightCopies)
	d.int("queue.max_per_flow", &c.Queue.MaxPerFlow, 1000)
	d.int("queue.max_total", &c.Queue.MaxTotal, 100000)
	d.int("queue.max_critical", &c.Queue.MaxCritical, 1000)
	d.dur("queue.default_wait", &c.Queue.DefaultWait, 30*time.Second)
	d.dur("queue.deadline_margin", &c.Queue.DeadlineMargin, 5*time.Millisecond)
	d.dur("leases.ttl", &c.Leases.TTL, 10*time.Minute)
	d.dur("leases.idempotency_ttl", &c.Leases.IdempotencyTTL, 10*time.Minute)
	d.int("leases.max_idempotency_records", &c.Leases.MaxIdempotencyRecords, 1_000_000)
	d.int("metrics.max_tenant_series", &c.Metrics.MaxTenantSeries, 100)
	d.float("health.error_rate", &c.Health.ErrorRate, 0.20)
	d.int64("health.min_samples", &c.Health.MinSamples, 20)
	d.dur("health.window", &c.Health.Window, 10*time.Second)
	d.float("health.cut_weight", &c.Health.CutWeight, 0.05)
	d.dur("health.cooldown", &c.Health.Cooldown, 30*time.Second)
	d.float("health.step", &c.Health.Step, 0.1)
	d.dur("health.step_every", &c.Health.StepEvery, 5*time.Second)
	d.int64("limits.max_prompt_tokens", &c.Limits.MaxPromptTokens, 1<<20)
	d.int64("limits.max_output_tokens", &c.Limits.MaxOutputTokens, 1<<18)
	d.int64("limits.release_overrun_multiple", &c.Limits.ReleaseOverrunMultiple, 4)
	d.int64("output_token_weight", &c.OutputTokenWeight, 4)
	if c.DegradeHeadroom == nil {
		h := 0.1
		c.DegradeHeadroom = &h
	}
	if c.Queue.TierShareWindow == nil {
		c.Queue.TierShareWindow = &Duration{5 * time.Second}
	}
	d.float("warmup.start_fraction", &c.Warmup.StartFraction, 0.25)
	f := &c.Feedback
	d.dur("feedback.period", &f.Period, 250*time.Millisecond)
	d.dur("feedback.stale", &f.Stale, 500*time.Millisecond)
	d.float("feedback.queue_threshold", &f.QueueThreshold, 5)
	d.float("feedback.kv_threshold", &f.KVThreshold, 0.8)
	d.float("feedback.decrease", &f.Decrease, 0.8)
	d.dur("feedback.cut_after", &f.CutAfter, 500*time.Millisecond)
	d.float("feedback.increase", &f.Increase, 0.02)
	d.int("feedback.clear_periods", &f.ClearPeriods, 4)
	d.float("feedback.min_factor", &f.MinFactor, 0.25)
	d.float("feedback.max_factor", &f.MaxFactor, 2)
	d.dur("feedback.window", &f.Window, 5*time.Second)
	d.float("feedback.calibration_step", &f.CalibrationStep, 0.1)
	d.float("feedback.deadband", &f.Deadband, 0.05)
	d.dur("feedback.busy_ttft", &f.BusyTTFT, time.Second)
	d.int("feedback.spread_choices", &f.SpreadChoices, 2)
	df := &c.Deferral
	d.dur("deferral.default_within", &df.DefaultWithin, time.Hour)
	d.dur("deferral.max_within", &df.MaxWithin, 24*time.Hour)
	d.int("deferral.max_per_tenant", &df.MaxPerTenant, 100_000)
	d.int("deferral.max_total", &df.MaxTotal, 1_000_000)
	d.float("deferral.headroom", &df.Headroom, 0.2)
	d.float("feedback.spread_margin", &f.SpreadMargin, 0.1)
	d.float("feedback.load_smoothing", &f.LoadSmoothing, 0.3)
	if c.Warmup.Period == nil {
		c.Warmup.Period = &Duration{60 * time.Second}
	}
	for _, name := range sortedKeys(c.Tiers) {
		t, key := c.Tiers[name], "tiers."+name
		d.dur(key+".burst_credit.breaker_open", &t.BurstCredit.BreakerOpen, 60*time.Second)
		if t.BurstCredit.Multiple > 0 {
			d.dur(key+".burst_credit.window", &t.BurstCredit.Window, 10*time.Second)
		}
		d.int64(key+".weight", &t.Weight, 1)
		c.Tiers[name] = t
	}
	return d.err
}

// defaulter fills knobs left at zero with their defaults, and records the
// first one the document wrote as 0 (present says which keys it wrote).
type defaulter struct {
	present func(key string) bool
	err     error
}

// take reports whether a knob that isZero takes its default.
func (d *defaulter) take(key string, isZero bool, def any) bool {
	if !isZero {
		return false
	}
	if d.present(key) {
		if d.err == nil {
			d.err = cfgErr(key, "must not be 0 (omit the key for the default, %v)", def)
		}
		return false
	}
	return true
}

func (d *defaulter) int(key string, p *int, def int) {
	if d.take(key, *p == 0, def) {
		*p = def
	}
}

func (d *defaulter) int64(key string, p *int64, def int64) {
	if d.take(key, *p == 0, def) {
		*p = def
	}
}

func (d *defaulter) float(key string, p *float64, def float64) {
	if d.take(key, *p == 0, def) {
		*p = def
	}
}

func (d *defaulter) dur(key string, p *Duration, def time.Duration) {
	if d.take(key, p.Duration == 0, def) {
		p.Duration = def
	}
}

// minDuration is the shortest lifetime or period the engine's timers are
// given: below it (a TTL of 1e-10 s, say) they would fire at once.
const minDuration = time.Millisecond

// Validate checks the config on its own (not against a cluster); the first
// problem is returned as a *ConfigError naming its key.
func (c *Config) Validate() error {
	for _, check := range []func() error{c.validatePolicies, c.validateCapacity, c.validateKnobs, c.validateDurations} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validatePolicies checks the tiers and every tenant's resolved policy.
func (c *Config) validatePolicies() error {
	if len(c.Tiers) == 0 {
		return cfgErr("tiers", "at least one tier is required")
	}
	for _, name := range sortedKeys(c.Tiers) {
		if err := validatePolicy("tiers."+name, c.Tiers[name]); err != nil {
			return err
		}
	}
	// A million tenants are checked without sorting their names: the
	// refusal is the least name's, as a sorted pass would find first.
	var first string
	var firstErr error
	for name, tc := range c.Tenants {
		if firstErr != nil && name >= first {
			continue
		}
		if err := c.validateTenant(name, tc); err != nil {
			first, firstErr = name, err
		}
	}
	return firstErr
}

// validateTenant checks one tenant's name, tier and resolved policy.
func (c *Config) validateTenant(name string, tc TenantConfig) error {
	key := "tenants." + name
	if strings.TrimSpace(name) == "" || len(name) > 128 {
		return cfgErr(key, "tenant name must be 1 to 128 characters")
	}
	if _, ok := c.Tiers[tc.Tier]; !ok {
		return cfgErr(key+".tier", "unknown tier %q (known: %s)", tc.Tier, strings.Join(sortedKeys(c.Tiers), ", "))
	}
	p, _ := c.policyOf(tc)
	return validatePolicy(key, p)
}

// validateCapacity checks the catalog and the soft-capacity knobs.
func (c *Config) validateCapacity() error {
	if _, err := pd.NewCatalog(c.Models); err != nil {
		return cfgWrap("models", err)
	}
	switch cp := c.Capacity; {
	case !(cp.SoftFraction > 0 && cp.SoftFraction <= 1):
		return cfgErr("capacity.soft_fraction", "must be in (0, 1], got %g", cp.SoftFraction)
	case !(cp.MFU > 0 && cp.MFU <= 1):
		return cfgErr("capacity.mfu", "must be in (0, 1], got %g", cp.MFU)
	case !(cp.BurstSeconds > 0 && cp.BurstSeconds <= 3600):
		return cfgErr("capacity.burst_seconds", "must be in (0, 3600], got %g", cp.BurstSeconds)
	case cp.WeightCopies < 1:
		return cfgErr("capacity.weight_copies", "must be ≥ 1, got %d", cp.WeightCopies)
	}
	if err := c.Capacity.Validate(); err != nil {
		return cfgWrap("capacity", err)
	}
	return nil
}

// validateKnobs checks the queue, lease, metrics, health and limit knobs.
func (c *Config) validateKnobs() error {
	switch {
	case c.Queue.MaxPerFlow < 1:
		return cfgErr("queue.max_per_flow", "must be ≥ 1")
	case c.Queue.MaxTotal < c.Queue.MaxPerFlow:
		return cfgErr("queue.max_total", "must be ≥ queue.max_per_flow")
	case c.Queue.MaxCritical < 1:
		return cfgErr("queue.max_critical", "must be ≥ 1")
	case c.Queue.DefaultWait.Duration <= 0:
		return cfgErr("queue.default_wait", "must be positive")
	case c.Queue.DeadlineMargin.Duration < 0:
		return cfgErr("queue.deadline_margin", "must be ≥ 0")
	case c.Queue.DegradeAfter != nil && (c.Queue.DegradeAfter.Duration < 0 || c.Queue.DegradeAfter.Duration > maxDuration):
		return cfgErr("queue.degrade_after", "must be in [0, %v]", maxDuration)
	case c.Queue.TierShareWindow != nil && (c.Queue.TierShareWindow.Duration < 0 || c.Queue.TierShareWindow.Duration > maxDuration):
		return cfgErr("queue.tier_share_window", "must be in [0, %v]", maxDuration)
	case c.Leases.TTL.Duration <= 0:
		return cfgErr("leases.ttl", "must be positive")
	case c.Leases.IdempotencyTTL.Duration <= 0:
		return cfgErr("leases.idempotency_ttl", "must be positive")
	case c.Leases.MaxIdempotencyRecords < 1:
		return cfgErr("leases.max_idempotency_records", "must be ≥ 1")
	case c.Metrics.MaxTenantSeries < 1:
		return cfgErr("metrics.max_tenant_series", "must be ≥ 1")
	case !(c.Health.ErrorRate > 0 && c.Health.ErrorRate < 1):
		return cfgErr("health.error_rate", "must be in (0, 1)")
	case c.Health.MinSamples < 1:
		return cfgErr("health.min_samples", "must be ≥ 1")
	case !(c.Health.CutWeight > 0 && c.Health.CutWeight <= 1):
		return cfgErr("health.cut_weight", "must be in (0, 1]")
	case !(c.Health.Step > 0 && c.Health.Step <= 1):
		return cfgErr("health.step", "must be in (0, 1]")
	case c.Health.Window.Duration <= 0 || c.Health.Cooldown.Duration < 0 || c.Health.StepEvery.Duration <= 0:
		return cfgErr("health", "window and step_every must be positive, cooldown ≥ 0")
	case c.Limits.MaxPromptTokens < 1 || c.Limits.MaxPromptTokens > maxTokenLimit:
		return cfgErr("limits.max_prompt_tokens", "must be in [1, %d]", maxTokenLimit)
	case c.Limits.MaxOutputTokens < 1 || c.Limits.MaxOutputTokens > maxTokenLimit:
		return cfgErr("limits.max_output_tokens", "must be in [1, %d]", maxTokenLimit)
	case c.Limits.ReleaseOverrunMultiple < 1 || c.Limits.ReleaseOverrunMultiple > maxOverrunMultiple:
		return cfgErr("limits.release_overrun_multiple", "must be in [1, %d] (1: no overrun), got %d", maxOverrunMultiple, c.Limits.ReleaseOverrunMultiple)
	case c.OutputTokenWeight < 1 || c.OutputTokenWeight > 1000:
		return cfgErr("output_token_weight", "must be in [1, 1000]")
	case c.DegradeHeadroom != nil && !(*c.DegradeHeadroom >= 0 && *c.DegradeHeadroom < 1):
		return cfgErr("degrade_headroom", "must be in [0, 1)")
	case !(c.Warmup.StartFraction > 0 && c.Warmup.StartFraction <= 1):
		return cfgErr("warmup.start_fraction", "must be in (0, 1], got %g", c.Warmup.StartFraction)
	case c.Warmup.Period != nil && (c.Warmup.Period.Duration < 0 || c.Warmup.Period.Duration > maxDuration):
		return cfgErr("warmup.period", "must be in [0, %v] (0: no warm-up), got %v", maxDuration, c.Warmup.Period.Duration)
	}
	if err := c.Feedback.validate(); err != nil {
		return err
	}
	return c.Deferral.validate()
}

func (f *DeferralConfig) validate() error {
	switch {
	case f.MaxWithin.Duration < time.Second || f.MaxWithin.Duration > 7*24*time.Hour:
		return cfgErr("deferral.max_within", "must be in [1s, 168h], got %v", f.MaxWithin.Duration)
	case f.DefaultWithin.Duration < time.Second || f.DefaultWithin.Duration > f.MaxWithin.Duration:
		return cfgErr("deferral.default_within", "must be in [1s, deferral.max_within %v], got %v", f.MaxWithin.Duration, f.DefaultWithin.Duration)
	case f.MaxPerTenant < 1 || f.MaxPerTenant > 100_000_000:
		return cfgErr("deferral.max_per_tenant", "must be in [1, 100000000], got %d", f.MaxPerTenant)
	case f.MaxTotal < f.MaxPerTenant || f.MaxTotal > 100_000_000:
		return cfgErr("deferral.max_total", "must be in [deferral.max_per_tenant, 100000000], got %d", f.MaxTotal)
	case !(f.Headroom >= 0 && f.Headroom < 1):
		return cfgErr("deferral.headroom", "must be in [0, 1), got %g", f.Headroom)
	}
	return nil
}

func (f *FeedbackConfig) validate() error {
	switch {
	case f.Period.Duration < 10*time.Millisecond || f.Period.Duration > time.Minute:
		return cfgErr("feedback.period", "must be in [10ms, 1m], got %v", f.Period.Duration)
	case f.Stale.Duration <= 0 || f.Stale.Duration > time.Hour:
		return cfgErr("feedback.stale", "must be in (0, 1h], got %v", f.Stale.Duration)
	case !(f.QueueThreshold >= 0 && f.QueueThreshold < 1e9):
		return cfgErr("feedback.queue_threshold", "must be in [0, 1e9), got %g", f.QueueThreshold)
	case !(f.KVThreshold > 0 && f.KVThreshold <= 1):
		return cfgErr("feedback.kv_threshold", "must be in (0, 1], got %g", f.KVThreshold)
	case !(f.Decrease > 0 && f.Decrease < 1):
		return cfgErr("feedback.decrease", "must be in (0, 1), got %g", f.Decrease)
	case f.CutAfter.Duration < 0 || f.CutAfter.Duration > time.Minute:
		return cfgErr("feedback.cut_after", "must be in [0, 1m], got %v", f.CutAfter.Duration)
	case !(f.Increase > 0 && f.Increase <= 1):
		return cfgErr("feedback.increase", "must be in (0, 1], got %g", f.Increase)
	case f.ClearPeriods < 0 || f.ClearPeriods > 1000:
		return cfgErr("feedback.clear_periods", "must be in [0, 1000], got %d", f.ClearPeriods)
	case !(f.MinFactor > 0 && f.MinFactor <= 1):
		return cfgErr("feedback.min_factor", "must be in (0, 1], got %g", f.MinFactor)
	case !(f.MaxFactor >= 1 && f.MaxFactor <= float64(pd.MaxFactor)/pd.FactorFull):
		return cfgErr("feedback.max_factor", "must be in [1, %d], got %g", pd.MaxFactor/pd.FactorFull, f.MaxFactor)
	case f.Window.Duration < f.Period.Duration || f.Window.Duration > time.Hour:
		return cfgErr("feedback.window", "must be in [feedback.period, 1h], got %v", f.Window.Duration)
	case !(f.CalibrationStep > 0 && f.CalibrationStep <= 1):
		return cfgErr("feedback.calibration_step", "must be in (0, 1], got %g", f.CalibrationStep)
	case !(f.Deadband >= 0 && f.Deadband < 1):
		return cfgErr("feedback.deadband", "must be in [0, 1), got %g", f.Deadband)
	case f.BusyTTFT.Duration <= 0 || f.BusyTTFT.Duration > time.Hour:
		return cfgErr("feedback.busy_ttft", "must be in (0, 1h], got %v", f.BusyTTFT.Duration)
	case f.SpreadChoices < 1 || f.SpreadChoices > MaxSpreadChoices:
		return cfgErr("feedback.spread_choices", "must be in [1, %d] (1: first fit; k: the least loaded of the first k), got %d", MaxSpreadChoices, f.SpreadChoices)
	case !(f.SpreadMargin >= 0 && f.SpreadMargin <= 1):
		return cfgErr("feedback.spread_margin", "must be in [0, 1] (a share of the first domain's load), got %g", f.SpreadMargin)
	case !(f.LoadSmoothing > 0 && f.LoadSmoothing <= 1):
		return cfgErr("feedback.load_smoothing", "must be in (0, 1], got %g", f.LoadSmoothing)
	}
	return nil
}

// validateDurations bounds every duration: none so long that arithmetic
// on it overflows, and the lifetimes and periods the engine arms timers
// with not below minDuration.
func (c *Config) validateDurations() error {
	durations := map[string]Duration{
		"queue.default_wait": c.Queue.DefaultWait, "queue.deadline_margin": c.Queue.DeadlineMargin,
		"leases.ttl": c.Leases.TTL, "leases.idempotency_ttl": c.Leases.IdempotencyTTL,
		"health.window": c.Health.Window, "health.cooldown": c.Health.Cooldown, "health.step_every": c.Health.StepEvery,
	}
	for _, key := range sortedKeys(durations) {
		if d := durations[key]; d.Duration > maxDuration {
			return cfgErr(key, "must be at most %v", maxDuration)
		}
	}
	for _, key := range []string{"queue.default_wait", "leases.ttl", "leases.idempotency_ttl", "health.window", "health.step_every"} {
		if d := durations[key]; d.Duration < minDuration {
			return cfgErr(key, "must be at least %v, got %v", minDuration, d.Duration)
		}
	}
	return nil
}

// Bounds that keep time and token arithmetic far from int64 overflow:
// 2^40 tokens per request, with an output weight of at most 1000, sums
// below 2^50; a year of nanoseconds is below 2^55.
const (
	maxTokenLimit = 1 << 40
	maxDuration   = 366 * 24 * time.Hour
	// maxOverrunMultiple keeps a bound on a Release's counts (admitted ×
	// multiple, admitted ≤ 2^40) below 2^50.
	maxOverrunMultiple = 1000
)

func validatePolicy(key string, p TierPolicy) error {
	if err := validateLimit(key+".rps", p.RPS, true); err != nil {
		return err
	}
	if err := validateLimit(key+".tokens", p.Tokens, true); err != nil {
		return err
	}
	if err := validateLimit(key+".critical", p.Critical, false); err != nil {
		return err
	}
	switch {
	case p.MaxConcurrency < 0:
		return cfgErr(key+".max_concurrency", "must be ≥ 0 (0 means no limit)")
	case p.Floor < 0:
		return cfgErr(key+".floor", "must be ≥ 0")
	case float64(p.Floor) > p.Tokens.Rate:
		return cfgErr(key+".floor", "floor %d tokens/s exceeds the token rate %g", p.Floor, p.Tokens.Rate)
	case p.Weight < 1 || p.Weight > 1<<20:
		return cfgErr(key+".weight", "must be in [1, %d]", 1<<20)
	case p.BurstCredit.Multiple < 0 || p.BurstCredit.Multiple > 3600 || math.IsNaN(p.BurstCredit.Multiple):
		return cfgErr(key+".burst_credit.multiple", "must be in [0, 3600]")
	case p.BurstCredit.Multiple > 0 && p.BurstCredit.Window.Duration <= 0:
		return cfgErr(key+".burst_credit.window", "must be positive when credit is given")
	case p.BurstCredit.Window.Duration > maxDuration:
		return cfgErr(key+".burst_credit.window", "must be at most %v", maxDuration)
	case p.BurstCredit.BreakerOpen.Duration < 0 || p.BurstCredit.BreakerOpen.Duration > maxDuration:
		return cfgErr(key+".burst_credit.breaker_open", "must be in [0, %v]", maxDuration)
	case p.Budget.DailyUSD < 0 || p.Budget.MonthlyUSD < 0 || math.IsNaN(p.Budget.DailyUSD) || math.IsNaN(p.Budget.MonthlyUSD):
		return cfgErr(key+".budget", "budgets must be ≥ 0 (0 means none)")
	case p.FailMode != "" && p.FailMode != FailOpen && p.FailMode != FailClosed:
		return cfgErr(key+".fail_mode", "must be %q or %q, got %q", FailOpen, FailClosed, p.FailMode)
	}
	return nil
}

// validateLimit accepts rates up to 1e15 units/s; required limits need a positive rate and burst.
func validateLimit(key string, l Limit, required bool) error {
	if math.IsNaN(l.Rate) || math.IsNaN(l.Burst) || l.Rate < 0 || l.Burst < 0 || l.Rate > 1e15 || l.Burst > 1e15 {
		return cfgErr(key, "rate and burst must be in [0, 1e15]")
	}
	if required && (l.Rate <= 0 || l.Burst < 1) {
		return cfgErr(key, "rate must be positive and burst ≥ 1")
	}
	if !required && l.Rate > 0 && l.Burst < 1 {
		return cfgErr(key+".burst", "must be ≥ 1 when a rate is set")
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
