// Package pd is Sluice's prefill/decode cost model and the per-domain soft
// capacity that costs are drawn from. It imports topology (for a domain's
// peaks) and the integer token bucket; it knows nothing of tenants.
//
// # Catalog and cost
//
// A Catalog holds the model tiers. For a model with active parameters A,
// bytes per parameter b, KV bytes per token kv and decode batch B, a request
// of P prompt and O output tokens costs
//
//	prefill  = 2·A·P                                FLOP       (prefill bucket)
//	decode   = O·w + ⌈kv·O·(2P + O)/2⌉              bytes      (decode bucket)
//	           = O·(A·b/B + kv·(P + O/2)),  w = ⌈A·b/B⌉
//	KV       = (P + O)·kv                           bytes      (KV gauge, held until Release)
//
// Decode reads each output token's share of one weight pass (the weights are
// read once per step for a batch of B sequences) plus the KV cache of its
// context, which grows from P to P + O, P + O/2 on average. Everything is
// int64; a request whose cost overflows is invalid (ErrOverflow), as is a
// negative count (ErrNegativeTokens). The constants 2A, w, kv and the
// resident weight bytes ⌈T·b⌉ (T = total_params, or A) are computed once,
// when the catalog is built, and a catalog's models carry them, so a cost is
// a handful of multiplications with no map lookup and no allocation.
//
// The price of a request, in micro-USD rounded up, is
//
//	PriceMicros = ⌈(P·price_input_per_1k + O·price_output_per_1k) / 1000 · 1e6⌉
//
// computed in integer pico-USD per token. Each model may name the tier it
// degrades to (degrade_to); chains have no cycles, and DegradeChain lists
// the tiers below a model in order.
//
// # Soft capacity of a domain
//
// A DomainCapacity turns the peaks of a domain's healthy GPUs (topology) into
// two token buckets and a gauge. With f = soft_fraction (0.70), mfu (0.5),
// s = burst_seconds (2) and c = weight_copies (1):
//
//	prefill rate = f · Σ FLOPS · mfu              FLOP/s    burst = rate · s
//	decode rate  = f · Σ HBMBandwidth             B/s       burst = rate · s
//	KV limit     = f · (Σ HBMBytes − Σ_models ⌈T·b⌉ · c · nodes)   bytes
//
// where the sums run over healthy GPUs and nodes counts nodes with a healthy
// GPU. The fractions are applied as integers in units of 1e-9, so rates are
// exact: an NVL72 GB200 rack gets 0.7·72·2.5e15·0.5 = 6.3e16 FLOP/s. A domain
// whose resident weights leave no HBM for KV is a configuration error.
//
// # Calibration
//
// Where a model has a Calibration for the domain's GPU model (keyed by
// topology.ModelName, e.g. "GB200"), measured rates replace the formulas: a
// request costs, in that domain,
//
//	prefill = P · ⌈prefill rate / (prefill_tokens_per_gpu_second · GPUs)⌉
//	decode  = O · ⌈decode rate  / (decode_tokens_per_gpu_second  · GPUs)⌉
//
// so that the bucket admits exactly the calibrated tokens per second (a
// little less, from rounding up). A phase with no calibrated rate keeps its
// formula; KV always does. Cost is therefore per (model, domain):
// DomainCapacity.Cost.
//
// # Floors: reserve watermarks
//
// SetReserve gives a domain its share of the tenants' floors as rates
// r_p (FLOP/s) and r_d (B/s). They become watermarks
//
//	prefill reserve = min(r_p · s, prefill burst)
//	decode reserve  = min(r_d · s, decode burst)
//	KV reserve      = KV limit · min(r_p, prefill rate) / prefill rate
//
// Floor traffic may take a bucket down to 0 and the gauge up to its limit;
// shared traffic only down to the reserve and up to the limit less the KV
// reserve. Reserve that floor traffic does not use refills above the
// watermark, where shared traffic takes it: idle reserve is lent, never lost.
//
// # Warm-up
//
// StartWarmup(now, w0, end) ramps the shared part of every limit — each
// bucket's rate and burst, and the KV limit — linearly from w0 millionths
// at now to the whole at end:
//
//	limit(t) = reserve + w(t) · (base − reserve),  w(t) = w0 + (1e6 − w0) · (t − now)/(end − now)
//
// where base is the limit before warm-up (the whole domain's, or a
// replica's share) and reserve its floor watermark, which is whole from
// the first moment. Every method that takes a time moves the ramp first
// (one comparison when the domain is whole); buckets refill at the old
// rate up to that time. CanEverFit judges against the whole domain, and a
// request only the ramp keeps out gets the ramp's end from RetryAfter.
//
// # Admission and release
//
// The engine calls Fits (all three gates of one domain; a request never
// spans two), then Charge. Release(charged, actual) refunds what was charged
// for output never generated, charges overruns (a bucket's debt is bounded
// at one burst), and frees the KV. RetryAfter is the later of the two
// buckets' refill times; the KV gauge frees only at releases, at unknown
// times, so a request short only of KV gets 0 (wait for a release), and one
// that can never fit gets tokenbucket.Never. Times are int64 nanoseconds on
// the caller's clock; nothing here reads the time.
//
// A Catalog is immutable and safe to share. A DomainCapacity is not safe for
// concurrent use: the engine holds its lock around every call.
package pd
