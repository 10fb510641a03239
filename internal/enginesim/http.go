package enginesim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-sched/sluice/pd"
)

func (l *liveEngine) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { l.serveCompletion(w, r, true) })
	mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, r *http.Request) { l.serveCompletion(w, r, false) })
	mux.HandleFunc("GET /v1/models", l.serveModels)
	mux.HandleFunc("GET /metrics", l.serveMetrics)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return mux
}

// completionRequest is the part of an OpenAI chat or completions request
// the simulator reads; other fields are accepted and ignored.
type completionRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	Seed                *int64          `json:"seed"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// Usage is a response's token counts, in OpenAI's shape.
type Usage struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	TotalTokens         int64 `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// apiError is an OpenAI error body.
type apiError struct {
	status  int
	message string
	typ     string
	param   string
	code    string
}

func (e *apiError) Error() string { return e.message }

func badRequest(param, format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, message: fmt.Sprintf(format, a...), typ: "invalid_request_error", param: param}
}

func writeError(w http.ResponseWriter, e *apiError) {
	body := map[string]any{"error": map[string]any{"message": e.message, "type": e.typ, "param": nullable(e.param), "code": nullable(e.code)}}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	_ = json.NewEncoder(w).Encode(body)
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// prompt is a request's prompt as the engine sees it.
type prompt struct {
	text   string // what is counted, hashed and cached
	tokens int64
}

// chatPrompt is the messages' roles and text, one line each.
func chatPrompt(msgs []chatMessage) (prompt, *apiError) {
	if len(msgs) == 0 {
		return prompt{}, badRequest("messages", "messages: want at least one message")
	}
	var b strings.Builder
	for i, m := range msgs {
		b.WriteString(m.Role)
		b.WriteString(": ")
		var s string
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		switch {
		case len(m.Content) == 0 || string(m.Content) == "null":
		case json.Unmarshal(m.Content, &s) == nil:
			b.WriteString(s)
		case json.Unmarshal(m.Content, &parts) == nil:
			for _, p := range parts {
				b.WriteString(p.Text) // the text parts; others count for nothing
			}
		default:
			return prompt{}, badRequest(fmt.Sprintf("messages[%d].content", i), "messages[%d].content: want a string or an array of content parts", i)
		}
		b.WriteByte('\n')
	}
	return prompt{text: b.String(), tokens: promptTokens(b.String())}, nil
}

// completionPrompt reads a completions prompt: a string, an array of one
// string, or an array of token ids (each one token).
func completionPrompt(raw json.RawMessage) (prompt, *apiError) {
	var s string
	var ss []string
	var ids []int64
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return prompt{}, badRequest("prompt", "prompt: missing")
	case json.Unmarshal(raw, &s) == nil:
		return prompt{text: s, tokens: promptTokens(s)}, nil
	case json.Unmarshal(raw, &ss) == nil && len(ss) == 1:
		return prompt{text: ss[0], tokens: promptTokens(ss[0])}, nil
	case json.Unmarshal(raw, &ids) == nil && len(ids) > 0:
		return prompt{text: string(raw), tokens: int64(len(ids))}, nil
	}
	return prompt{}, badRequest("prompt", "prompt: want a string, an array of one string, or an array of token ids")
}

// parseCompletion reads and checks a request body.
func (l *liveEngine) parseCompletion(r *http.Request, chat bool) (*completionRequest, prompt, *pd.Model, *apiError) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, MaxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, prompt{}, nil, &apiError{status: http.StatusRequestEntityTooLarge, message: fmt.Sprintf("request body over %d bytes", MaxBody), typ: "invalid_request_error"}
		}
		return nil, prompt{}, nil, badRequest("", "reading the body: %v", err)
	}
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, prompt{}, nil, badRequest("", "the body is not a JSON request: %v", err)
	}
	m := l.cfg.byName[req.Model]
	switch {
	case req.Model == "":
		return nil, prompt{}, nil, badRequest("model", "model: missing")
	case m == nil:
		return nil, prompt{}, nil, &apiError{status: http.StatusNotFound, message: fmt.Sprintf("The model `%s` does not exist on this engine (it serves %s).", req.Model, strings.Join(l.cfg.Models, ", ")),
			typ: "invalid_request_error", param: "model", code: "model_not_found"}
	case req.N != nil && *req.N != 1:
		return nil, prompt{}, nil, badRequest("n", "n: the simulator answers with one choice, got %d", *req.N)
	case req.MaxTokens != nil && *req.MaxTokens < 1:
		return nil, prompt{}, nil, badRequest("max_tokens", "max_tokens: must be at least 1, got %d", *req.MaxTokens)
	case req.MaxCompletionTokens != nil && *req.MaxCompletionTokens < 1:
		return nil, prompt{}, nil, badRequest("max_completion_tokens", "max_completion_tokens: must be at least 1, got %d", *req.MaxCompletionTokens)
	}
	var p prompt
	var aerr *apiError
	if chat {
		p, aerr = chatPrompt(req.Messages)
	} else {
		p, aerr = completionPrompt(req.Prompt)
	}
	if aerr != nil {
		return nil, prompt{}, nil, aerr
	}
	return &req, p, m, nil
}

// maxTokens is the request's cap on its output; 0: none.
func (c *completionRequest) maxTokens() int64 {
	switch {
	case c.MaxCompletionTokens != nil:
		return *c.MaxCompletionTokens
	case c.MaxTokens != nil:
		return *c.MaxTokens
	}
	return 0
}

// serveCompletion answers a chat completion (chat) or a completion: it
// queues the request in the engine, then writes its tokens as the engine
// gives them out (stream) or all at its end.
func (l *liveEngine) serveCompletion(w http.ResponseWriter, r *http.Request, chat bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, &apiError{status: http.StatusMethodNotAllowed, message: "use POST", typ: "invalid_request_error"})
		return
	}
	req, p, m, aerr := l.parseCompletion(r, chat)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	var reqSeed int64
	if req.Seed != nil {
		reqSeed = *req.Seed
	}
	ans := newAnswer(l.seed, m.Name, p.text, reqSeed, req.maxTokens())
	output := int64(len(ans.tokens))
	blocks := blockHashes(p.text)

	l.mu.Lock()
	cached := min(int64(l.mu.cache.cached(blocks))*BlockTokens, p.tokens-1)
	cost, err := l.cfg.cap.CostCached(m, p.tokens, cached, output)
	if err != nil {
		l.mu.Unlock()
		writeError(w, badRequest("", "costing the request: %v", err))
		return
	}
	now := l.advanceLocked()
	er, err := l.mu.eng.Add(now, Work{Prompt: p.tokens, Output: output, PrefillFLOP: float64(cost.PrefillFLOP), DecodeBytes: float64(cost.DecodeBytes), KVBytes: cost.KVBytes})
	if err != nil {
		l.mu.Unlock()
		writeError(w, &apiError{status: http.StatusBadRequest, message: fmt.Sprintf("This request's context of %d prompt and %d output tokens does not fit the engine: %v", p.tokens, output, err),
			typ: "invalid_request_error", param: promptParam(chat), code: "context_length_exceeded"})
		return
	}
	l.mu.seq++
	id := l.requestID(l.mu.seq)
	l.changedLocked()
	l.mu.Unlock()
	l.wake()

	usage := Usage{PromptTokens: p.tokens, CompletionTokens: output, TotalTokens: p.tokens + output}
	usage.PromptTokensDetails.CachedTokens = cached
	finish := "stop"
	if ans.cut {
		finish = "length"
	}
	out := &responder{w: w, chat: chat, model: req.Model, created: time.Now().Unix()}
	if chat {
		out.id = "chatcmpl-" + id
	} else {
		out.id = "cmpl-" + id
	}
	var sent int64
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for first := true; ; {
		l.mu.Lock()
		now := l.advanceLocked()
		n := l.mu.eng.Tokens(er)
		finished := l.mu.eng.Finished(er)
		if n > 0 && first {
			l.mu.cache.add(blocks) // its prefill is computed: later prompts share it
		}
		var wait time.Duration = -1
		if at := l.mu.eng.TokenAt(er, n+1); at >= 0 {
			wait = max(time.Duration(at-now), streamInterval)
		}
		changed := l.mu.changed
		if finished {
			l.mu.promptTotal += p.tokens
			l.mu.generatedTotal += output
			l.mu.success++
		}
		l.mu.Unlock()
		if req.Stream && n > sent {
			if err := out.chunk(ans.text(sent, n), first, req.StreamOptions != nil && req.StreamOptions.IncludeUsage); err != nil {
				l.cancel(er)
				return
			}
			first = false
		}
		if n > 0 {
			first = false
		}
		sent = n
		if finished {
			break
		}
		var fire <-chan time.Time
		if wait >= 0 {
			timer.Reset(wait)
			fire = timer.C
		}
		select {
		case <-r.Context().Done():
			l.cancel(er) // the client left: free its place
			return
		case <-changed:
		case <-fire:
		}
	}
	if req.Stream {
		_ = out.end(finish, req.StreamOptions != nil && req.StreamOptions.IncludeUsage, usage)
		return
	}
	_ = out.whole(ans.text(0, output), finish, usage)
}

// promptParam names the prompt's field.
func promptParam(chat bool) string {
	if chat {
		return "messages"
	}
	return "prompt"
}

// cancel takes er out of the engine.
func (l *liveEngine) cancel(er *Request) {
	l.mu.Lock()
	l.mu.eng.Cancel(l.nowLocked(), er)
	l.changedLocked()
	l.mu.Unlock()
	l.wake()
}

// responder writes one answer in OpenAI's shapes.
type responder struct {
	w       http.ResponseWriter
	chat    bool
	id      string
	model   string
	created int64
	started bool
}

// chunk writes one SSE chunk of text; the first opens the stream (and, for
// chat, names the role).
func (o *responder) chunk(text string, first, includeUsage bool) error {
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": nil}
	if o.chat {
		delta := map[string]any{"content": text}
		if first {
			delta["role"] = "assistant"
		}
		choice["delta"] = delta
	} else {
		choice["text"] = text
	}
	return o.event(o.object(true, []any{choice}, includeUsage, nil))
}

// end writes the stream's last chunk, with the finish reason, the usage
// chunk when asked, and [DONE].
func (o *responder) end(finish string, includeUsage bool, usage Usage) error {
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": finish}
	if o.chat {
		choice["delta"] = map[string]any{}
	} else {
		choice["text"] = ""
	}
	if err := o.event(o.object(true, []any{choice}, includeUsage, nil)); err != nil {
		return err
	}
	if includeUsage {
		if err := o.event(o.object(true, []any{}, true, &usage)); err != nil {
			return err
		}
	}
	_, err := io.WriteString(o.w, "data: [DONE]\n\n")
	o.flush()
	return err
}

// whole writes a non-streamed answer.
func (o *responder) whole(text, finish string, usage Usage) error {
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": finish}
	if o.chat {
		choice["message"] = map[string]any{"role": "assistant", "content": text}
	} else {
		choice["text"] = text
	}
	body := o.object(false, []any{choice}, true, &usage)
	o.w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(o.w).Encode(body)
}

// object is a response or chunk object. A chunk carries "usage" (null
// but on the usage chunk) only when the client asked for it.
func (o *responder) object(chunk bool, choices []any, withUsage bool, usage *Usage) map[string]any {
	obj := "text_completion"
	switch {
	case o.chat && chunk:
		obj = "chat.completion.chunk"
	case o.chat:
		obj = "chat.completion"
	}
	body := map[string]any{"id": o.id, "object": obj, "created": o.created, "model": o.model, "choices": choices}
	if withUsage {
		body["usage"] = usage
	}
	return body
}

// event writes one SSE event.
func (o *responder) event(v any) error {
	if !o.started {
		h := o.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		o.w.WriteHeader(http.StatusOK)
		o.started = true
	}
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
	if _, err := o.w.Write(b.Bytes()); err != nil {
		return err
	}
	o.flush()
	return nil
}

func (o *responder) flush() {
	if f, ok := o.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (l *liveEngine) serveModels(w http.ResponseWriter, _ *http.Request) {
	data := make([]map[string]any, len(l.cfg.Models))
	for i, name := range l.cfg.Models {
		data[i] = map[string]any{"id": name, "object": "model", "created": 0, "owned_by": "sluice-engine-sim"}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// serveMetrics writes the engine's state as vLLM's Prometheus metrics.
func (l *liveEngine) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	l.mu.Lock()
	l.advanceLocked()
	st := l.mu.eng.Stats()
	prompt, generated, success := l.mu.promptTotal, l.mu.generatedTotal, l.mu.success
	l.mu.Unlock()
	labels := fmt.Sprintf(`{engine="0",model_name=%s}`, strconv.Quote(l.cfg.Models[0]))
	var b strings.Builder
	for _, m := range []struct {
		name, typ, help string
		value           string
	}{
		{"vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", strconv.Itoa(st.Running)},
		{"vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", strconv.Itoa(st.Waiting)},
		{"vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", strconv.FormatFloat(st.KVUsage, 'g', -1, 64)},
		{"vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage.", strconv.FormatFloat(st.KVUsage, 'g', -1, 64)},
		{"vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", strconv.FormatInt(prompt, 10)},
		{"vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", strconv.FormatInt(generated, 10)},
		{"vllm:request_success_total", "counter", "Count of successfully processed requests.", strconv.FormatInt(success, 10)},
	} {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n%s%s %s\n", m.name, m.help, m.name, m.typ, m.name, labels, m.value)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = io.WriteString(w, b.String())
}
