// Package replay runs a recorded trace of inference requests through a
// simulated cluster, under Sluice's real admission engine or a baseline
// policy, and reports what each tenant got. It is an adapter: it drives
// package admission through its exported API on a manual clock and costs
// requests with package pd; nothing in the core imports it.
//
// # Arrivals
//
// A trace is read (LoadTrace) in the Azure format
// (TIMESTAMP,ContextTokens,GeneratedTokens), whose rows get a tenant and a
// model from a seeded mix (each row its own generator seeded by the seed
// and its line, so a row's tenant depends on nothing else), or as CSV or
// JSONL naming tenant and model per row. Offsets are from the first row;
// --from/--to cut a window of them, a burst multiplies one tenant's rows
// in a window (copies at seeded offsets within the gap to its next row),
// and --speed divides the offsets.
//
// # Virtual time
//
// Run is an event loop over integer nanoseconds. The next instant is the
// earliest of the next arrival, the next end of a request's prefill or
// decode, and — while any request waits in a queue — the next millisecond
// (the engine's own busy tick in production). At each instant completions
// run first (their Release frees capacity), then arrivals (Submit), then
// the policy's Tick. With the engine, a queued request is a Ticket; the
// loop looks for answered tickets only when the engine's queue is shorter
// than its list of tickets, so no goroutine waits per request.
//
// # Service
//
// An admitted request runs prefill, then decode, inside the one domain its
// answer named, on the model granted. Each domain's prefill FLOP/s and
// decode bytes/s are the pd soft-capacity rates (70% of peak, prefill at
// the configured MFU), and each is processor-shared: the n requests in a
// phase progress at rate/n each, as a continuous batch shares a step.
// Work is the pd cost of the request's real tokens: prefill 2·P·params
// FLOPs, decode O·(weights/batch + kv·(P + O/2)) bytes. When decode ends
// the lease is released with the real output tokens. The requests hold
// their KV from admission to release in the engine's gauge; the simulated
// hardware does not model KV beyond that.
//
// # Policies
//
// sluice is the engine. The baselines share the same capacity model (the
// domains' pd buckets without floor reserves) and one FIFO queue; fifo has
// no gate, global-bucket one token bucket for the cluster, tenant-buckets
// each tenant's token bucket (see baseline).
//
// # Measures
//
// Per tenant: answers by outcome and reason; queue wait (admission −
// arrival) p50/p95/p99 in an HdrHistogram; per second, the weighted tokens
// admitted (achieved), the demand (backlog + arrivals − refusals by the
// tenant's own limits) and the target, the weighted max-min fair share of
// that second's admitted total; floor violations (seconds with unmet demand
// — a refusal not by the tenant's own limits, or a request waiting a
// second or more — and less than the floor admitted); the 2-Wasserstein
// distance between the achieved and target per-second rates. Over tenants:
// Jain's index of achieved/target, and the largest service difference of
// two tenants while both were backlogged, against VTC's bound of twice the
// largest request. Per domain: the busy share of its prefill and decode
// rates. Admissions whose answer does not name exactly one of the
// cluster's domains are counted as spanning two domains (must be 0).
//
// The same input and seed give a byte-identical report: virtual time,
// seeded generators, ordered iteration everywhere a report is built.
//
// # Recommend
//
// Recommend sizes each tenant's token bucket from its own demand: R at the
// knee of p99 wait against capacity (the tenant alone on a FIFO server,
// swept from its mean rate to 50×), and C from the largest 5-second
// window of demand that R alone would not carry.
package replay
