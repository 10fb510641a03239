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
// (the engine's own busy tick in production); with the engines on, also
// the next report and capacity change while anything is left to do. At
// each instant completions run first (their Release frees capacity), then
// changes and the report, then arrivals (Submit), then the policy's Tick. With the engine, a queued request is a Ticket; the
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
// # Engines
//
// With EngineOptions.Capacity set, each domain is instead a simulated
// continuous-batching serving engine that really sustains Capacity × the
// model's peak-derived rates: prefill FLOP/s = Capacity · pd prefill rate
// / soft_fraction (= Capacity · Σ peak FLOP/s · mfu), decode bytes/s =
// Capacity · pd decode rate / soft_fraction (= Capacity · Σ HBM B/s). At
// Capacity 1 the model is right and admits soft_fraction of what the
// engine sustains; at 0.6 the engine sustains 0.6/0.7 of what the model
// admits; at 1.5 the model admits 0.7/1.5 of it. An admitted request
// joins the engine's FIFO waiting queue and enters the batch when it is
// the head and fits: at most MaxBatch requests, their KV within the
// domain's pd KV limit (KV use = held / limit), and room in the prefill
// budget (PrefillTokens prompt tokens in prefill; any prompt when none
// is). In the batch it prefills, processor-shared with the batch's other
// prefills at the true prefill rate, then decodes, processor-shared at
// the true decode rate, holding its KV until it completes. Its time to
// first token runs from its admission (dispatch) to the end of its
// prefill, the engine queue included. Every Report (100 ms) each engine's
// waiting queue, running count and KV use are sampled and handed to the
// policy (sluice: ObserveEngines, age 0, unless OpenLoop); a completed
// request is released with its measured TTFT and duration (not with
// OpenLoop). A change (EngineChange) sets one domain's capacity from a
// replay time on.
//
// # Policies
//
// sluice is the engine. The baselines share the same capacity model (the
// domains' pd buckets without floor reserves) and one FIFO queue; fifo has
// no gate, global-bucket one token bucket for the cluster, tenant-buckets
// each tenant's token bucket (see baseline). threshold, with the engines
// only, is the Gateway API Inference Extension's rule on their signals:
// one FIFO queue whose head goes to the least loaded domain under the
// saturation thresholds, no capacity model and no quotas (see threshold).
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
// With the engines (EngineReport): per domain the engine's waiting queue
// p99 and peak (one sample per report), peak KV use, TTFT p99, the share
// of time its batch held a request and the work served over what its true
// rates offered; overall TTFT p50/p99 from dispatch, first token p99 from
// arrival and the share of requests whose first token came within the SLO
// (2 s) of arrival, admitted weighted tokens per second, floor violation
// seconds, refusals not by a tenant's own limits in seconds its demand was
// within its weighted fair share, the busiest over the least busy domain
// of the same GPUs, each tenant's share of admissions on its first domain
// (sluice: its rendezvous first choice, asked of the engine by Explain
// before the replay; otherwise its most used domain), and after a change
// how long the domain's queue stayed past the queue threshold.
//
// The same input and seed give a byte-identical report: virtual time,
// seeded generators, ordered iteration everywhere a report is built.
//
// # Deferrable work
//
// TraceOptions.DeferrableShare marks that share of the bursts' rows
// deferrable (Row.Deferrable). Under sluice they go through a
// deferral.Backlog on the engine and the manual clock (a MemStore): one
// simulated worker pool holds a Claim, each delivery is served like an
// admitted request and released, then Backlog.Released, when it
// completes; the backlog steps every 20 ms (its drain loop's period) and
// at once after a ticket is issued or deferred work released, after the
// engine's Tick. The replay runs until no ticket is pending. The baselines
// treat the rows as any other. DeferralReport says per policy how many
// deferrable requests were lost (refused, their ticket ended unserved, or
// unanswered), the bursts' interactive requests refused, the tickets'
// wait, the drain after the last deferrable arrival, and each tenant's
// share of the deferred work admitted while two tenants or more competed
// in the backlog, beside its weighted share. A ticket's wait is not in
// the tenant's queue wait, nor unmet demand for its floor.
//
// # Verdict
//
// With more than one policy the report leads with a verdict on the
// measures that decide, over the tenants that do not burst: refusals of
// tenants within their fair share (refusals not by their own limits in
// seconds their demand was within it), floor-violation seconds, the worst
// p99 wait, utilisation, and VTC's bound; each names the policy that wins
// it, and the summary the one best on most. The burster's own figures,
// Jain's index and W2 are shown beside, not counted: they reward equal
// service even to a burster.
//
// # Recommend
//
// Recommend sizes each tenant's token bucket from its own demand: R at the
// knee of p99 wait against capacity (the tenant alone on a FIFO server,
// swept from its mean rate to 50×), and C from the largest 5-second
// window of demand that R alone would not carry. RecommendChecked checks
// that on the cluster, or with a target p99 searches for R there: the
// smallest rate whose replay of the tenant's rows alone (the engine, with
// the tenant's requests waiting in arrival order for its bucket's tokens,
// as a client honouring Retry-After) meets the target p99 time to
// admission, by doubling from the mean and bisection, at most
// MaxSearchReplays replays a tenant. Then it weighs the rates' sum
// against the cluster's soft capacity at each tenant's cost per weighted
// token, the floors and weights of the config, and replays every tenant
// together at its proposal (see Plan).
package replay
