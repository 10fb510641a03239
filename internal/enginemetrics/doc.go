// Package enginemetrics reads the Prometheus metrics that LLM serving
// engines (vLLM, SGLang) export, to learn how saturated each NVLink domain
// is. It reads the same two signals the Gateway API Inference Extension's
// saturation detector reads under its model-server protocol
// (docs/proposals/003-model-server-protocol): the depth of the engine's
// waiting queue and the fraction of its KV cache in use. A queue says work
// is already waiting for a slot; a full KV cache says the next admitted
// request will preempt or queue. Either one means admitting more work to the
// domain only adds latency.
//
// Per engine kind, the gauges read are:
//
//	kind    queue                      KV-cache use (fraction 0..1)                          running
//	vllm    vllm:num_requests_waiting  vllm:kv_cache_usage_perc, else vllm:gpu_cache_usage_perc  vllm:num_requests_running
//	sglang  sglang:num_queue_reqs      sglang:token_usage                                    sglang:num_running_reqs
//
// Options.Kinds adds kinds or replaces these. vLLM's "perc" gauges are
// fractions despite the name; the older gpu_cache_usage_perc is read only
// where the newer name is absent, so one engine is never counted twice.
//
// One exposition may hold several series of a gauge (one per model_name,
// per data-parallel engine, per rank). The queue and running gauges are
// summed over series and over a domain's endpoints, since a request waiting
// anywhere in the domain is waiting; the KV-cache use is the maximum, since
// the fullest engine is the one that refuses the next request. Each value is
// checked where it is read, before any sum: an endpoint with a series that
// is negative, NaN, infinite or past its bound (MaxRequests, MaxKVUsage)
// gives no reading at all (an InvalidReadingError, whose Reason a caller
// may count), so a domain is described by its sane endpoints alone and one
// broken engine neither hides the others' saturation nor invents some.
//
// A Reader polls every endpoint once a pass (every Options.Period, 100 ms by
// default, about the Inference Extension's 50 ms scrape), all endpoints at
// once with bounded concurrency, each read bounded by Options.Timeout and
// its body by 4 MiB. A read follows a redirect only to the endpoint's own
// scheme, host and port (a metrics app mounted under /metrics redirects to
// /metrics/); a redirect anywhere else fails the read, since another
// server's queue is not this domain's. A failed read (transport error,
// non-200 status, a redirect elsewhere, unparsable or oversized body,
// neither signal present, a value that is no reading) counts in
// Signal.Failed. A domain with some endpoints read is described by those
// alone; a domain whose every endpoint failed keeps its last values and its
// last Signal.At, so its age grows. This package never decides that a
// signal is stale: the caller compares Signal.At with its own clock and
// threshold (the Inference Extension treats metrics older than 200 ms as
// stale), because only the caller knows what an old signal should mean for
// admission.
package enginemetrics
