// Package load drives a running sluiced (or a fleet of them) with live gRPC
// Admit and Release calls from outside its process, the position of a real
// inference router, and measures what came back. It is an adapter: it speaks
// the wire contract (admission/v1's generated client, or a client.Router
// over the etcd members) and never touches the engine. `sluicectl load` is
// its command; a later `sluicectl drill` can drive the same Run.
//
// # Arrivals
//
// Three ways to decide when a call starts:
//
//   - closed loop (ModeClosed): Concurrency callers, each Admits, holds the
//     lease for Hold, Releases it (when Release is set), and starts again at
//     once; the offered load is whatever the server lets through, which is
//     what a throughput measurement wants;
//   - open loop (ModeOpen): arrivals at Rate per second, Poisson (exponential
//     gaps, seeded) or evenly spaced, each a goroutine of its own, at most
//     MaxInFlight outstanding; an arrival that finds them all busy is counted
//     as Dropped, not queued in the client, so a slow server cannot slow the
//     arrivals down (no coordinated omission in the arrival process);
//   - trace (ModeTrace): the arrival times, tenants, models and token counts
//     of a trace (package replay reads the Azure format with a seeded mix),
//     otherwise as the open loop.
//
// In the closed and open loops each call's tenant and model are drawn from
// a weighted mix (ParseTenants: "acme:large:0.5,globex:small:0.5") by a
// generator seeded per caller, and per round of Compare, so that a round
// does not repeat the last one's draws. An entry of the mix may stand for
// many tenants (ParseTenantPools: "fleet-%06d:100000:small" is
// fleet-000000 … fleet-099999): a call draws one of its names at random,
// or in turn (Options.Sequential, one counter shared by the callers and
// the rounds), and its answers are counted as one row with how many of its
// names were called (a bit per name), so that a million tenants cost
// neither a flag value nor a row each.
//
// # Churn
//
// A fleet's placement changes while it serves: Options.Churn (NewChurn)
// drains a random domain, cuts a domain's health weight and undrains the
// domain it drained longest ago, in turn, at a rate, during each run of the
// load (not the reference's), through the server's public API only: the
// Operator API's DrainDomain and UndrainDomain, and for a weight, an Admit
// of a tenant of the mix released with OUTCOME_ERROR on the domain it was
// placed on. Each run ends by undoing its drains and reading the server's
// domains: how many are draining and how many have a cut weight.
//
// # What is measured
//
// Per tenant: answers by decision (admitted, degraded, rejected) and their
// rates over the run, refusals by reason, gRPC errors by code. Over the run:
// HdrHistograms of Admit latency (the RPC's own time, from send to answer),
// of the queued time the server reports in each admission, of Release
// latency and, in the open loop and trace modes, of start lag (how late the
// client sent a call after its scheduled arrival: when it grows, the client,
// not the server, is the bottleneck). Calls counts RPCs: an Admit and its
// Release are two calls, as two health Checks are. CPU time per call is read
// for the client (getrusage) and, when the server runs on the same machine
// and its pid is given, for the server (/proc/<pid>/stat): on a machine
// shared with other work it does not depend on how the cores were shared
// out during the run, as calls per second does.
//
// # The reference
//
// A throughput figure alone says little on a shared machine. RunHealth runs
// the same callers, concurrency, connections and duration against the same
// server's gRPC health Check, a near-empty handler whose throughput is the
// limit of the gRPC stack on that machine; Compare alternates the two in
// rounds (reference first in odd rounds, load first in even ones, so that a
// drift of the machine falls on both) and reports each side's calls per
// second and their ratio, per round, over all rounds and as the median of
// the rounds, and the ratio of their CPU time per call.
package load
