// Package openai serves an OpenAI-compatible API in front of the engines
// Sluice places (sluiced's --openai-addr), for teams that run no gateway:
// /v1/chat/completions, /v1/completions and /v1/responses run each request
// through the lifecycle of package gateway and forward it to the chosen
// engine with httputil.ReverseProxy; /v1/models lists the models Sluice
// places by their served names.
//
// One request goes as follows:
//
//	caller       an API key (Authorization: Bearer sk-…) names its tenant;
//	             a principal with the gateway role names it in the trusted
//	             header; without an auth file the header names it
//	headers      gateway.Exchange.RequestHeaders (priority, deadline, …)
//	body         read in chunks into AppendBody, bounded (413)
//	decide       Admit, waiting in the fair queue while the client waits;
//	             refused: the Verdict's status, headers and OpenAI error
//	forward      ReverseProxy to the endpoint, the body as the gateway
//	             rewrote it, Accept-Encoding dropped (the usage must be
//	             readable) and Sluice's credential kept from the engine
//	response     every read of the engine's body goes through the Exchange
//	             (TTFT, usage, the usage event the client did not ask for
//	             dropped) and is flushed to the client at once
//	end          the body's end is Done; an engine's broken stream is an
//	             upstream error; anything else that ends the handler (the
//	             client gone, a write failed) is a client cancel: Release
//	             runs exactly once on each path
//
// Deadlines are per request (http.ResponseController): the server's read
// and write timeouts bound the headers and the body; then the read
// deadline is lifted (a stream outlives it, and on HTTP/1.1 its expiry
// would cancel the request) and each write to the client must finish
// within WriteTimeout of the last, so that a long stream goes on and a
// client that stops reading is cut.
package openai
