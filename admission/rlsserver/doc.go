// Package rlsserver serves Envoy's rate-limit protocol
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) over the
// admission engine, so that an Envoy gateway's `ratelimit` HTTP filter can
// ask Sluice before it forwards an inference request, without a new client.
// It is an adapter beside admission/grpcserver: it translates the RLS
// messages into admission.Request values and the engine's decisions back,
// and decides nothing itself.
//
// # Mapping a request
//
// Every descriptor of a RateLimitRequest is looked at on its own, as
// Envoy's rate limit service does ("the server will limit on ALL of them"):
//
//   - A descriptor without a tenant entry (key "tenant" by default) is not
//     Sluice's to judge: its status is UNKNOWN and it charges nothing.
//   - A descriptor with one is one admission.Request: tenant and model from
//     their entries (the model entry may be left out when a default model is
//     configured), accepted lower tiers from "accept_downgrade" (a comma
//     separated list), and its cost from the tokens below.
//   - A descriptor whose own hits_addend is set to 0 is a check: Explain's
//     answer for that request (the cheapest one, without token entries),
//     with nothing charged and no placement named. It never waits: a
//     request that would queue is DEADLINE_UNMEETABLE with the estimated
//     wait. (The request-level hits_addend is 0 whenever Envoy leaves it
//     unset, so only the descriptor's asks for a check.)
//   - A descriptor with a usage entry (key "usage" by default) settles
//     tokens already used: its hits_addend (the descriptor's, else the
//     request's; 0 charges nothing) counts prompt tokens when the entry's
//     value is "prompt", output tokens when it is "output", and
//     Engine.ChargeUsage takes them, weighted, from the tenant's token
//     bucket and budget, into debt if need be: the request ran, so the
//     settlement is never refused (OK; OVER_LIMIT only for an unknown
//     tenant). This is Envoy AI Gateway's pattern: a check with
//     hits_addend 0 on the request path, and a rate limit applied on stream
//     done whose hits_addend is the usage AI Gateway wrote to dynamic
//     metadata (deploy/envoy/envoy-ai-gateway.yaml).
//
// The cost. Envoy's unit is the hit; Sluice's is the weighted token
// (prompt + w·output, w = output_token_weight, 4 by default). A descriptor
// may name its tokens in entries ("prompt_tokens", "max_output_tokens"); what
// it leaves out comes from hits_addend (the descriptor's, else the request's;
// 0 counts as 1), read as the request's cost in weighted tokens:
//
//	output = the max_output_tokens entry, else 1
//	prompt = the prompt_tokens entry, else max(1, hits − w·output)
//
// so that a descriptor that sends only hits is charged exactly hits weighted
// tokens (at least 1 + w, the cheapest request the engine takes: one prompt
// and one output token). The output token is real decode work, so a cost
// given as hits is placed on a domain as mostly prefill, which is how the
// engine converts floors too. w is the engine's: the handler starts from the
// configured value and, should a reload change it, learns the new one from the
// first decision's trace (weighted − prompt over output).
//
// The deadline. RLS callers wait for the answer with the request held, so by
// default nothing waits in the fair queue: a request that does not fit now is
// OVER_LIMIT at once with the engine's estimate of when it would
// (DEADLINE_UNMEETABLE). Options.MaxWait lets requests wait up to that long
// (never past the call's own deadline, less the engine's margin).
//
// # Settlement
//
// RLS has no Release: Envoy never says when the request ends, and says
// what it cost only through a usage descriptor, which settles against the
// tenant alone (the domain's capacity is not charged after the fact). An
// admission is therefore released at once, at its admitted cost
// (prompt and output as charged), in the same call: the tenant's token
// bucket, budget and the domain's prefill and decode buckets keep exactly
// the admitted charge (charged once), while the lease, its KV bytes and its
// place in the tenant's concurrency count are given back before the answer
// is sent. Nothing is left behind to leak. The release's outcome is
// admission.ReleaseUnobserved: Envoy never learns how the request went, so
// domain health gets no sample from it (an OK would dilute the error rate
// that routers' releases report). What this gives up: the KV gauge and
// max_concurrency do not see RLS traffic in flight.
//
// # Answer
//
// The overall code is OVER_LIMIT when any descriptor is, else OK (never
// UNKNOWN: Envoy's filter treats the overall code as OK or OVER_LIMIT).
// Each status carries the tenant's token limit (name "tokens", per second),
// what remains of it, and on OVER_LIMIT duration_until_reset = the engine's
// exact Retry-After. An unconfigured tenant is OVER_LIMIT (reason
// UNKNOWN_TENANT), as Admit rejects it. A request above its tenant's burst
// plus credit is OVER_LIMIT (REQUEST_TOO_LARGE) with no Retry-After and no
// duration_until_reset: no wait lets it pass. The answer's headers come from the
// deciding descriptor (the first OVER_LIMIT one, else the first with a
// tenant):
//
//	x-sluice-domain, x-sluice-model     the NVLink domain and the model granted (also added to the
//	                                    upstream request, so the model server can follow a downgrade)
//	x-sluice-downgrade                  on a downgrade, the path: "large>medium"
//	x-sluice-reason, retry-after        on OVER_LIMIT: the engine's reason and Retry-After in whole seconds, rounded up
//	ratelimit-policy, ratelimit         draft-ietf-httpapi-ratelimit-headers-11:
//	                                    "tokens";q=<burst>;w=<burst/rate, s>;qu="weighted-tokens" and
//	                                    "tokens";r=<remaining>;t=<s until full, or the Retry-After>
//	                                    (REQUEST_TOO_LARGE: the bucket as it stands)
//
// # Errors and roles
//
// gRPC errors are for what is not a decision: a domain other than the
// configured one, no descriptors, an unparsable token entry, negative hits,
// a request the engine finds invalid (INVALID_ARGUMENT, the field named as
// descriptors[i].<key>), a tenant the caller does not serve
// (PERMISSION_DENIED from the guard, checked for every descriptor before any
// is decided, so a refused call charges nothing). Envoy's failure_mode_deny
// decides what the gateway does with them.
package rlsserver
