// Package drill runs chaos drills against a live Sluice fleet under a load
// it generates itself, and says which of Sluice's failure promises held.
// `sluicectl drill NAME` is its command. It is an adapter: it speaks the
// wire contract (admission/v1 through client.Router, the Operator API) and
// the control plane's keys, and never touches the engine.
//
// # A drill
//
// Every drill has three phases: before (steady load), during (the fault)
// and after (the recovery action, then steady load again). The load is
// internal/load's open loop (Poisson arrivals of a tenant mix), sent through
// a client.Router as a router would: each tenant to its replica by
// rendezvous, failing over on UNAVAILABLE with the same request id. A
// recorder between the two keeps every answer (when sent and answered,
// tenant, cost in weighted tokens, decision, reason, domain, retry_after,
// the replica that granted it) and every Release, and the report cuts them
// into the phases by the time each request was sent:
//
//   - lost: Admits that got no decision at all (a gRPC error other than the
//     deadline); past deadline: those that got none in time;
//   - admitted per second, refusals by reason, Admit p50 and p99 and their
//     change from before;
//   - floors held per whole second: a floor tenant's admitted weighted
//     tokens reach (1 − tolerance) · min(floor, offered);
//   - the quota tenant (offered more than its quota): admitted tokens
//     within [(1 − undershoot) · B, rate · T + burst + credit +
//     (N − 1) · rate · W], B what one exact token bucket of its rate and
//     burst, empty at the phase's start, admits of the same requests
//     (rate · T under steady overload; less under a bursty trace);
//   - placements on the drained (or departed) domain of requests sent from
//     the grace after the mark until the recovery action;
//   - the fault's span: asked (--during), and real, from when it took
//     effect (the stop returned, the mark was written, the agent's record
//     left etcd) to its end (the recovery action done); a fault is held
//     for --during from when it took effect;
//   - the time to recover: whole seconds from the fault's end to the
//     first second of the mix's load back within the promise (its share
//     admitted at least a fraction of before's, its p50 and p99 at most a
//     multiple of before's plus a slack), in per-second buckets from that
//     end;
//   - for kill-replica, the dead replica's capacity: from the kill until
//     the replicas' KV limits, summed per domain, are back to 95% of
//     their sum before it, within the member TTL (with etcd: its member
//     lease's expiry; without, sharing.SilentHoldRounds reconcile
//     intervals of silence) and ten intervals more (two seconds at
//     least: at short intervals ten are less than a busy machine's
//     scheduling delays).
//
// The drills are drain-domain (a drain mark in etcd, or the Operator API
// of every replica), kill-agent, kill-replica, stop-etcd, kill-redis
// (Faults: the self-contained fleet's own processes, or the operator's
// --stop/--start commands), credit-exhaustion, which drives one tenant
// past its burst credit and watches its breaker open, answer
// BURST_CREDIT_EXHAUSTED with a Retry-After that points at the end of the
// open period, half-open and close, while the others keep their rates, and
// deferred-burst: two or more tenants burst to 15× their rate, every other
// request deferrable, beside the steady mix, and a worker pool of the
// drill's own (Claim streams on every replica, each ticket run for a while
// and released) drains what was deferred. Its promises: no deferrable
// request lost (each admitted, or deferred with a ticket that GetTicket
// shows DONE at the end); the mix's tenants within their share never
// refused during the burst and their floors held; the backlog drained
// within a bound; and, in every whole second after the burst in which two
// or more tenants were backlogged on one replica, each one's share of the
// weighted tokens claimed there within a tolerance of its weight's share.
// Its report adds the burst loss of either half: the share of the burst's
// interactive requests refused, and of its deferrable ones lost.
//
// # The self-contained fleet
//
// StartLocal starts redis-server, an etcd server in this process (embed),
// one sluice-agent per node of a four-node HGX topology and N sluiced
// replicas, on free loopback ports, with TTLs of 5 s so that a dead agent
// or replica leaves within a phase. Children die with the drill (Close, and
// on Linux the parent-death signal for a drill killed outright).
package drill
