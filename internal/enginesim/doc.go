// Package enginesim simulates LLM serving engines behind OpenAI-compatible
// endpoints (`sluicectl engine-sim`): one HTTP listener per engine of a
// topology, answering /v1/chat/completions and /v1/completions, streamed
// (SSE) or not, with OpenAI's usage, and serving vLLM's Prometheus gauges
// on /metrics, so that sluiced's capacity loop and gateway run live
// against something with no GPU behind it.
//
// # The engine
//
// Each engine is the replay's continuous-batching engine
// (internal/replay, simEngine), in wall-clock time:
//
//   - sizing: prefill FLOP/s = capacity × the domain's pd prefill rate ÷
//     soft_fraction, decode bytes/s = capacity × its pd decode rate ÷
//     soft_fraction (the peak-derived rates the soft capacity is a share
//     of), KV = the domain's pd KV limit; a domain of N engines splits the
//     three evenly. A request's work is its pd cost in the domain
//     (DomainCapacity.CostCached: calibrated rates where the catalog has
//     them, the prefix cache's tokens taken off its prefill).
//   - scheduling: a FIFO waiting queue in front of a batch of at most
//     max_batch requests; the head enters when it fits the batch, the KV
//     and the prefill budget (the prompt tokens in prefill below
//     prefill_tokens; any prompt when none is in prefill), and holds its
//     KV until it completes or its client leaves.
//   - time: the requests in prefill share the prefill rate equally, those
//     in decode the decode rate (processor sharing, as a step is shared).
//     A request's first token is out when its prefill ends; its other
//     tokens come out in proportion to its decode work done, the last as
//     its decode ends.
//
// At each event's instant prefills that end move to decode, the batch is
// filled, decodes that end leave, and it is filled again, in the replay's
// order, with the replay's rounding (an event at the next whole
// nanosecond): a request alone takes the same prefill and decode time
// here as in a replay (TestAloneMatchesReplay). The model is its own
// small copy (Engine) rather than the replay's, whose engine is woven
// into the replay's event loop and measures.
//
// # Requests and answers
//
// A prompt is counted at BytesPerToken (4) bytes a token: a chat's text is
// each message's role and text; a completions prompt its string, or one
// token per id of a token-id array. The answer is MinOutput..MaxOutput
// words, cut at max_tokens (finish_reason "length"), each word one
// completion token, drawn from a generator seeded by --seed and the
// request's model, prompt and seed field: one request gets one answer,
// whatever else runs. Each engine has a prefix cache of prompt blocks
// (BlockTokens tokens, chained hashes, as vLLM's): a prompt that shares
// whole leading blocks with one prefilled before reports them as
// prompt_tokens_details.cached_tokens (at most prompt_tokens − 1) and
// prefills only the rest.
//
// # Metrics
//
// /metrics is what sluiced reads for kind "vllm" (internal/enginemetrics):
// vllm:num_requests_waiting, vllm:num_requests_running,
// vllm:kv_cache_usage_perc (and the older vllm:gpu_cache_usage_perc, the
// same value), read from the engine at the scrape; and the counters
// vllm:prompt_tokens_total, vllm:generation_tokens_total and
// vllm:request_success_total.
package enginesim
