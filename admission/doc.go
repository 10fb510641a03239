// Package admission is Sluice's decision engine: it answers, in a few
// hundred nanoseconds under one lock, whether a tenant's inference request
// runs now, where, on which model tier, or waits, or is refused with a
// precise Retry-After.
//
// # Four rooms under one lock
//
// The engine's state lives in four components, each owning its fields and
// its methods, all guarded by Engine.mu (as CockroachDB's admission control
// splits requesters from granters under one mutex). Engine holds no logic
// of its own beyond orchestrating a decision across them:
//
//   - tenant gates (tenantGates, tenantState; gates.go, tenant.go,
//     burstcredit.go, creditfreeze.go, budget.go): per tenant, the
//     burst-credit breaker, the daily and monthly cost budget, the RPS
//     bucket, the token bucket with its credit, the floor and critical
//     buckets, and the concurrency limit; for all tenants, an operator's
//     credit freeze. Idle tenants live only in the config.
//   - placement (placer, domainState; placer.go, domain.go, reserves.go,
//     drain.go, warmup.go): the catalog's models and degrade chains, the
//     NVLink domains with their soft capacity (package pd) and its warm-up
//     after a return, drain marks and health weights, the floor reserves,
//     and the rendezvous tree that orders the domains per (tenant, model).
//   - the waiting room (waitingRoom; waitingroom.go, idempotency.go): the
//     weighted fair queue (package wfq), the deadlines of queued requests,
//     the estimated work queued, and the idempotency records.
//   - the lease table (leaseTable; leases.go): admitted requests in a slab,
//     found by a random 64-bit id, in lists by expiry.
//
// A charge (charge.go) is what one admission took from these rooms: the
// tenant's gates and, once placed, the domain's capacity. Like
// x/time/rate's Reservation it knows how to undo itself: every path that
// takes a decision back — refused after the gates were charged, a deadline
// passed in the queue, a caller gone, a store refusal — calls Cancel, and
// Release and lease expiry call Settle.
//
// # A decision
//
// Admit runs these steps (docs/architecture.md, "One decision"):
//
//  1. validate: malformed requests return *InvalidArgumentError naming the
//     field and change nothing.
//  2. idempotency: a request id seen before (scoped to its tenant, with
//     the same body) gets the same lease or joins the same queued request;
//     one whose lease has ended is ErrLeaseEnded. Rejections are not
//     remembered, since nothing was charged and a retry should decide
//     afresh. Records are 32 bytes, bounded in count, and dropped by
//     generation after the TTL.
//  3. tenant gates, screened all before any is charged: breaker, the shared
//     store's fail mode, daily and monthly budget (priced per model in
//     micro-USD), RPS bucket, token bucket with burst credit, concurrency
//     (in flight + queued).
//  4. placement: the domains in weighted rendezvous order for
//     (tenant, model), weights from domain health, drained domains left out
//     (see Placement at fleet scale); the first domain whose prefill
//     bucket, decode bucket and KV gauge all fit gets the whole request. A
//     request is never split across domains.
//  5. degradation: a request that accepts lower tiers is tried on them, in
//     degrade-chain order, when its own tier does not fit with headroom
//     h = degrade_headroom · (1 − weight/max_weight) of the domain left over;
//     so low-weight tenants degrade first and the top weight only when full.
//     While others wait in the queue, the requested tier is theirs first and
//     such a request waits its turn or goes straight to its lower tiers.
//     It waits for its requested tier only while the tier can serve it
//     before its deadline (waitingRoom.waitsForTier: the work queued ahead
//     of it and the tier's refill; its tenant's quota not in debt), and
//     queue.degrade_after, if set, caps the wait; else it takes a lower
//     tier at once, or waits in its first lower tier's flow. A queued head
//     takes a lower tier once no domain refills for its tier before its
//     deadline, and at its deadline a lower tier that fits rather than a
//     refusal. Whose turn it is at a tier many tenants want is tierShares'
//     answer (tiershare.go): the least use of that model over weight among
//     the contenders, so a saturated tier goes by weight.
//  6. if nothing fits: the waiting room, or REJECTED at once when it could
//     never fit, its deadline cannot be met or the queue is full. The
//     dispatcher admits queued requests in fair order as capacity frees; a
//     head that does not fit reserves the domain it waits for, and later
//     requests backfill other domains.
//
// # Placement at fleet scale
//
// The order of domains is a rendezvous tree (internal/rendezvous Tree)
// over the cluster's domains, weighted by placeWeight: a domain's health
// weight while it is eligible, 0 while it is drained, removed or without a
// healthy GPU. The tree groups the domains by their id hashes, at most 16
// to a group, and ranks each group's members by weighted rendezvous on
// their summed weights, so a domain is a tenant's first choice with
// probability its share of the weight, exactly as with a flat rendezvous,
// and a cluster of up to 16 domains is one flat rendezvous. Each
// (tenant, model) caches only its key hash and its first choice, 24 bytes,
// valid while the placer's generation (bumped by every weight change)
// stands; the domains after the first are walked from the tree, one group
// ranked at a time, only when the first does not fit.
//
// Costs, for D domains: a placement that fits its first choice costs one
// generation check, or after a weight change one descent of the tree, 16
// scores per level and ⌈log₁₆(D/16)⌉ + 1 levels (38 scores at 1,400
// domains, about a microsecond); each further domain tried costs one
// group's ranking when the walk enters it. A drain, undrain or health step
// re-sums one path of the tree, O(16 log₁₆ D), and bumps the generation;
// the drain's floor reserves are spread again over every domain, O(D),
// once per change, never per tenant. A topology change rebuilds the tree,
// O(D). Nothing placement keeps per tenant grows with D. The cost the
// tree adds to a weight change is stickiness: a change of domain i moves
// the keys whose choices on i's path down the tree flip, about 2.7 times
// as many as a flat rendezvous moves at 1,400 domains, all of them into or
// out of i's top-level group.
//
// When no domain fits, the outlook over every domain (whether the request
// could ever fit, the shortest wait) costs O(D): paid by requests that
// queue or are refused, not by those admitted.
//
// # Floors
//
// Each domain's buckets carry a reserve watermark: the sum of all tenants'
// floors (weighted tokens/s, converted at the most expensive model's cost
// per token), spread over eligible domains by capacity. Shared traffic may
// take a bucket only down to its watermark; a request within its tenant's
// floor bucket (rate = floor), or of a tenant admitted less than its floor
// in the current second, may take it to zero and skips the queue. The
// bucket refills at the full rate, so whatever the floors leave unused is
// above the watermark and lent to shared traffic: idle floors are lent,
// never lost, and a floor holds however hard another tenant bursts. A
// floor request, new or queued, passes the capacity guard's hold too, but
// looks first past the domains the guard holds and those a queued head
// that takes no lower tier awaits (placer.findFloor): where another
// domain's reserve holds it, it adds to no saturated engines and takes no
// refill a head waits for. A floor places a request on its requested tier,
// and on a lower one only once that tier cannot serve it in time.
//
// # Burst credit
//
// A token bucket may go into debt down to credit = multiple × rate. Debt is
// repaid by refill; if the bucket is still in debt `window` after it first
// went negative, the tenant's breaker opens (creditBreakerOpen):
// BURST_CREDIT_EXHAUSTED for `breaker_open`, then half-open
// (creditHalfOpen: no credit) until the debt is repaid, then lending again.
// An operator may freeze every tenant's credit until a deadline
// (creditfreeze.go): meanwhile the token gate lends nothing, and a request
// only credit could carry is BURST_CREDIT_FROZEN, retrying at the earlier
// of its quota refilling and the freeze's end. A request above burst +
// credit (and, if critical, above the critical burst) can never pass:
// REQUEST_TOO_LARGE, with no Retry-After.
//
// # Warm-up
//
// A domain that returns (undrained, healthy GPUs back, new after start-up)
// ramps its shared capacity — both buckets' rates and bursts and the KV
// limit, each above the floor reserve it holds — linearly from
// warmup.start_fraction to the whole over warmup.period (warmup.go;
// pd.DomainCapacity.StartWarmup keeps the ramp and moves it lazily):
//
//	limit(t) = reserve + w(t)·(base − reserve),  w(t) = min(1, w0 + (1 − w0)·(t − t0)/T0)
//
// in integer millionths, where T0 = period·(1 − w0)/(1 − start_fraction).
// Reserves are spread by the rates before warm-up, so floors hold and no
// reserve moves while a domain ramps.
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
// # Shared state
//
// With several replicas, quotas and domain capacity are shared through the
// sharing.Store port (internal/state/redisstate on Redis). The engine uses it
// through a strategy (package sharing) with three implementations, called
// at a few named hooks — a tenant's state built or re-limited, a domain's capacity
// rebuilt, the store's gate in the screen, a quota refusal, every answer
// (decided), every release, and a background loop — so that no gate asks
// which mode it runs in:
//
//   - embedded (the default): every hook does nothing; the buckets are whole.
//   - batched (package sharing): every bucket is this replica's local grant;
//     decisions never wait for the store. Every interval one Reconcile
//     call reports what each bucket took (cumulative counters per epoch, so
//     a repeated report is counted once) and the demand, and brings the
//     next grants: a max-min fair share of the rate and a share of the
//     level, negative for an overage (backpressure). A tenant new to the
//     replica starts from a 1/N slice without refill; one idle for ten
//     intervals stops being reported and freezes at its level.
//   - strict (package sharing): the replica decides locally on whole buckets, as
//     if alone, then confirms every admission with one atomic Commit that
//     takes the tenant's and the domain's amounts from the shared buckets
//     or refuses them all; a refusal cancels the local charge and answers
//     REJECTED with the store's reason and Retry-After. Release settles the
//     difference with Settle. Duplicates of an admission wait for its one
//     commit.
//
// The strategies see the engine only through a narrow view (sharing.View,
// implemented in engine.go): its lock and clock, the tenants' buckets, the
// domains' capacities, the leases' charges and a revoke; the capacity
// loop's engine-reading relay has its own port beside it (sharing.Readings:
// the readings this replica made, the domains placement wants read, and
// where a relayed reading goes). What they keep of their own is theirs. Both share the store's circuit breaker (open after
// consecutive failures, probed every reconcile interval, or cool-down if
// shorter). While it is open, fail-closed tiers are refused with
// STATE_UNAVAILABLE and fail-open tiers keep deciding locally: batched from
// their last grants, strict from their share of the levels the store last
// returned. When the store answers again, the first reports rebuild each
// shared bucket from what the replicas hold (their local levels already net
// what they took during the outage) instead of charging the outage's takes
// against a refill capped at the burst, so an outage of any length, with
// the store's data kept or lost, ends without a window of refusals.
//
// # Time and concurrency
//
// The engine reads time only from its injected clock; Tick does the timed
// work (deadlines, lease expiry, health steps, dispatch) and Run calls it
// in production, beside the strategy's background loop. Every goroutine
// the engine starts is owned: Close answers the queue, ends them and waits
// for them. All state sits under Engine.mu; methods ending in Locked, and
// every method of the four rooms, expect it held.
//
// # Where the adapters plug in
//
// The control plane reaches the engine through Apply (tiers, tenants,
// models: validated, swapped without dropping leases or queued work),
// SetTopology (domains come and go; their leases finish) and
// Drain/DrainAhead/Undrain, which is all an etcd watcher needs. Metrics
// observe every answer and release through an Observer, outside the lock.
package admission
