// Package admission is Sluice's decision engine: it answers, in a few
// hundred nanoseconds under one lock, whether a tenant's inference request
// runs now, where, on which model tier, or waits, or is refused with a
// precise Retry-After.
//
// # A decision
//
// Admit runs these steps (DESIGN.md, "Data flow"):
//
//  1. validate: malformed requests return *InvalidArgumentError naming the
//     field and change nothing.
//  2. idempotency: a request id seen before gets the same admission (or
//     joins the same queued request); rejections are not remembered, since
//     nothing was charged and a retry should decide afresh.
//  3. tenant gates, checked all before any is charged: breaker, daily and
//     monthly budget (priced per model in micro-USD), RPS bucket, token
//     bucket with burst credit, concurrency (in flight + queued).
//  4. placement: the domains in weighted rendezvous order for
//     (tenant, model), weights from domain health, drained domains left out;
//     the first domain whose prefill bucket, decode bucket and KV gauge all
//     fit gets the whole request. A request is never split across domains.
//  5. if nothing fits: the weighted fair queue (package wfq), or REJECTED at
//     once when it could never fit, its deadline cannot be met or the queue
//     is full.
//  6. degradation: a request that accepts lower tiers is tried on them, in
//     degrade-chain order, when its own tier does not fit with headroom
//     h = degrade_headroom · (1 − weight/max_weight) of the domain left over;
//     so low-weight tenants degrade first and the top weight only when full.
//
// # Floors
//
// Each domain's buckets carry a reserve watermark: the sum of all tenants'
// floors (weighted tokens/s, converted at the most expensive model's cost
// per token), spread over eligible domains by capacity. Shared traffic may
// take a bucket only down to its watermark; a request within its tenant's
// floor bucket (rate = floor) may take it to zero and skips the queue. The
// bucket refills at the full rate, so whatever the floors leave unused is
// above the watermark and lent to shared traffic: idle floors are lent,
// never lost, and a floor holds however hard another tenant bursts.
//
// # Burst credit
//
// A token bucket may go into debt down to credit = multiple × rate. Debt is
// repaid by refill; if the bucket is still in debt `window` after it first
// went negative, the tenant's breaker opens: BURST_CREDIT_EXHAUSTED for
// `breaker_open`, then half-open (no credit) until the debt is repaid, then
// closed with credit restored.
//
// # Leases
//
// An admission opens a lease holding its KV bytes. Release settles it: the
// domain's decode bucket gets back what was charged for output never
// generated (overruns are charged), the KV is freed, the tenant's token
// bucket and budget settle to the actual tokens, and the outcome feeds the
// domain's health weight (cut to 0.05 above a 20% error rate, back in 0.1
// steps after a 30 s cool-down). A lease not released within its TTL
// expires as if fully used.
//
// # Time and concurrency
//
// The engine reads time only from its injected clock; Tick does the timed
// work (deadlines, lease expiry, health steps, dispatch) and Run calls it
// in production. All state sits under Engine.mu; methods ending in Locked
// expect it held.
//
// # Where the adapters plug in
//
// The state is in memory (the embedded mode). The control plane reaches the
// engine through Apply (tiers, tenants, models: validated, swapped without
// dropping leases or queued work), SetTopology (domains come and go; their
// leases finish) and Drain/Undrain, which is all an etcd watcher needs.
// Shared state for several replicas attaches at the two kinds of bucket:
// the tenant gates (tenantState: RPS, tokens, floor, critical, budget) and
// the domain capacities (pd.DomainCapacity). Both are lazily refilled
// integer buckets whose rate, burst and level can be set live
// (tokenbucket.SetLimits), which is what a batched reconciler needs: it
// reports what a replica took and sets the replica's grant as the local
// rate, as CockroachDB's distributed token bucket does. Strict mode replaces
// checkGatesLocked/chargeGatesLocked and the domain Fits/Charge of one
// decision with a single atomic script call.
package admission
