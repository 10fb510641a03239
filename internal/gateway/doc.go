// Package gateway runs one OpenAI-style HTTP request through Sluice: the
// request lifecycle that an inference gateway's adapter drives, whatever
// protocol carries it (Envoy's external processing in internal/extproc;
// an HTTP front likewise).
//
// An Exchange is one request, driven by one goroutine in this order:
//
//	RequestHeaders   the tenant from a trusted header, priority, deadline,
//	                 deferrable, accepted downgrades
//	AppendBody       the body, bounded (413 past Options.MaxBody)
//	Decide           parse the body (model, prompt, max tokens, stream),
//	                 estimate the prompt's tokens, Admit (waiting in the fair
//	                 queue while the caller holds the request), then pick an
//	                 endpoint of the granted domain and rewrite the body
//	                 (the degraded tier's served name; include_usage)
//	ResponseHeaders  the upstream's status
//	ResponseBody     each chunk: the first is the time to first token; the
//	                 usage is read from the JSON body or the SSE usage event
//	Done / Abort     Release exactly once with the real usage, or with what
//	                 was seen when the stream ended early
//
// Every path out of an Exchange that holds a lease releases it: Done,
// Abort, a refusal after the grant (no endpoint fits), and an Abort after
// Done does nothing. The adapters call Abort on every exit, so no lease
// outlives its stream.
//
// Prompt tokens are estimated from the prompt's bytes with a per-model
// ratio of tokens to bytes (Estimator), calibrated from the prompt tokens
// the engines report in each response's usage: the estimate converges on
// the model's real tokenizer and its error is a metric.
package gateway
