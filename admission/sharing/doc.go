// Package sharing is how several admission engines, one per sluiced
// replica, enforce one set of tenant quotas and domain capacities through
// a shared store (the Store port; internal/state/redisstate on Redis,
// internal/state/memstate in memory). It holds the two strategies, batched
// and strict, the store's circuit breaker, and the port's messages.
//
// # The view
//
// A strategy changes the engine's state — it cuts a tenant's buckets to
// this replica's share, installs grants, makes them whole again, takes
// back an admission the store refused — but it owns none of it. It sees
// the engine through View, implemented by package admission beside the
// engine:
//
//	View   = lock · clock · tenants · domains · leases · revoke · background
//	Tenant = name · buckets b_k (k ∈ rps, tokens, floor, critical) · whole limits (R_k, B_k) · credit · fail mode
//	Domain = id · capacity (prefill, decode, KV) · restore to whole
//	Charge = what one lease took: tenant, domain, weighted tokens, cost, granted, expires
//
// and the engine calls it back at a few hooks (Strategy): a tenant built
// or re-limited, a domain's capacity rebuilt, the store's gate in the
// screen, a quota refusal, every answer (Decided), every release, and a
// background loop. Everything a strategy keeps of its own — the report
// entries, the activity of tenants, the commits in flight, the last levels
// the store returned — is its own, under the engine's lock. The engine
// holds no strategy state; the strategies hold no engine beyond the view.
//
// # Slices and grants
//
// With N replicas, a replica's share of a bucket of whole rate R and burst
// B starts as the 1/N slice
//
//	rate = R/N,  level = min(level, B/N)
//
// so that before any store call N replicas together hold one bucket, not
// N. Batched: a tenant new to the replica refills nothing (rate 0) until
// the store has heard of it. Every interval one Reconcile reports, per
// bucket, the cumulative units taken in the entry's epoch (modulo
// CumModulus, scaled by a power of two so that both R and B stay below
// 2³²) and a demand; the store charges each epoch's counter once and
// answers a grant (r, ℓ): the replica's max-min fair share r of R and its
// share ℓ of the store's level (negative: its share of an overage). The
// local bucket becomes
//
//	rate = r,  level = ℓ − (taken since the report)
//
// Strict: the engine decides on whole buckets as if alone, then one Commit
// takes every amount of the admission from the store's buckets or refuses
// them all; a refusal revokes the lease through the view. Release settles
// the difference with Settle.
//
// # Outages
//
// The breaker (breaker.go) opens after Options.Failures consecutive
// failures and lets one probe through every min(Cooldown, Interval)/2.
// While it is open, fail-closed tiers are refused (Unavailable) and
// fail-open tiers decide locally: batched from their last grants, strict
// from 1/N slices whose levels start from this replica's share of what the
// store last returned, L/N refilled since, rather than a fresh B/N. An
// admission decided on whole buckets just before the breaker opened is
// taken from the slices too, or refused where they cannot hold it. When
// the store answers again, the first reports bring each replica's level
// (Resume), and a store that lost the bucket or heard nothing for longer
// than the stale bound rebuilds it from those levels instead of charging
// the outage's takes against a refill capped at B.
package sharing
