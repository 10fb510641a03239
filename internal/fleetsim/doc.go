// Package fleetsim simulates a fleet of sluiced replicas sharing state in
// batched mode, in one process and in virtual time, with the real parts:
// each replica is a sharing.View (its own lock, the virtual clock, its
// tenants' tokenbucket.Buckets, a pd.DomainCapacity of every domain)
// under the strategy sharing.New builds, whose Reconcile is its round;
// the store is S memstate stores, the shards, behind a sharing.Sharded
// that places keys as a Redis Cluster places redisstate's (Slot) and
// counts what each shard serves. Nothing sleeps and no goroutine's timing
// matters: one seed gives one Result.
//
// Time. Requests arrive evenly spaced at the fleet's rate; replica i
// reconciles at k·W + i·W/N (W = Interval), so the fleet's rounds are
// spread over the interval as independent processes' are.
//
// Tenants. Tenant k (rank 0 the busiest) offers λ_k = rate·(k+1)^−s / Σ_j
// (j+1)^−s requests/s (s = ZipfExponent); each request's tenant is drawn
// by math/rand/v2's Zipf. Its quota is λ_k/Overload requests/s of Weight
// tokens each, in the token bucket, with a burst of one second of it (at
// least 5 requests); the RPS bucket is twice that, so the token bucket is
// the one that binds. Floor and critical have no limits and are never
// reported.
//
// Routing. A replica carries rate/N on average. A tenant offering no more
// is routed to one replica, a hash of its rank mod N; a busier one to N_t
// = ⌈λ_k/(rate/N)⌉ consecutive replicas from there, taken in turn. At
// Duration/2, rounded down to a whole interval, a replica joins tenant 0
// (the next after its set) and tenant 1, if spread, loses its last one.
//
// Admission, as the engine's, simplified: the strategy's gate, the RPS
// and token buckets (Fits), then the first of 3 domains from the
// replica's cursor, which moves one domain per request, whose capacity
// fits the request (a "small" model request of PromptTokens and
// OutputTokens); then the buckets and the capacity are charged, and the
// KV held for LeaseTime. A tenant has state on a replica from its first
// request there (TenantReadyLocked), and every domain from the start
// (CapacityRebuiltLocked with no old capacity).
//
// Measures: per shard, calls, bucket and gauge updates, RESP bytes and
// distinct keys; for each tenant on several replicas, the weighted tokens
// admitted over the run against its quota R·T + B and the batched bound's
// excess (N_t−1)·R·W; for each mid-run change, the sum of the local token
// rates of the tenant's replicas (the one that left included: it admits
// at its grant until its buckets freeze) sampled at every interval, and
// how long after the change its last run within 5% of R began.
package fleetsim
