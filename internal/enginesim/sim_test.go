package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/enginemetrics"
	"github.com/sluice-sched/sluice/internal/testwait"
	"github.com/sluice-sched/sluice/topology"
)

// startSim serves the simulated cluster's first domain's engine (edit
// changes its config) and returns its base URL.
func startSim(t *testing.T, seed uint64, edit func(*EngineConfig)) (*Simulator, string) {
	t.Helper()
	_, cl := setup(t)
	plan := planFor(t, 1, 1)[:1]
	if edit != nil {
		edit(&plan[0])
	}
	s, err := Start(plan, cl, seed, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, "http://" + s.Endpoints()[0].Address
}

func post(t *testing.T, ctx context.Context, url string, body any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// chatResponse is the part of a chat completion or chunk the tests read.
type chatResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Message      struct{ Role, Content string } `json:"message"`
		Delta        struct{ Role, Content string } `json:"delta"`
		Text         string                         `json:"text"`
		FinishReason *string                        `json:"finish_reason"`
	} `json:"choices"`
	Usage *Usage `json:"usage"`
}

func chat(prompt string, extra map[string]any) map[string]any {
	body := map[string]any{"model": "medium", "messages": []map[string]any{{"role": "user", "content": prompt}}}
	for k, v := range extra {
		body[k] = v
	}
	return body
}

// whole sends a non-streamed request and decodes its answer.
func whole(t *testing.T, url string, body any) chatResponse {
	t.Helper()
	resp := post(t, context.Background(), url, body)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var out chatResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// stream sends a streamed request and returns its chunks; it fails unless
// the stream is SSE data lines ending in [DONE].
func stream(t *testing.T, url string, body any) []chatResponse {
	t.Helper()
	resp := post(t, context.Background(), url, body)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var chunks []chatResponse
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case done:
			t.Fatalf("%q after [DONE]", line)
		case line == "data: [DONE]":
			done = true
		case strings.HasPrefix(line, "data: "):
			var c chatResponse
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &c); err != nil {
				t.Fatalf("chunk %q: %v", line, err)
			}
			chunks = append(chunks, c)
		default:
			t.Fatalf("not an SSE data line: %q", line)
		}
	}
	if !done {
		t.Fatal("the stream ended without [DONE]")
	}
	return chunks
}

func checkUsage(t *testing.T, u *Usage, prompt int64, text string) {
	t.Helper()
	if u == nil {
		t.Fatal("no usage")
	}
	if words := int64(len(strings.Fields(text))); u.CompletionTokens != words || words == 0 {
		t.Errorf("completion_tokens %d, the text has %d words", u.CompletionTokens, words)
	}
	if u.PromptTokens != prompt || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Errorf("usage %+v, want %d prompt tokens and the total their sum", u, prompt)
	}
}

// A chat completion, whole and streamed, answers the same text, with
// usage that counts it; the stream's last chunk is the usage when asked.
func TestChatCompletion(t *testing.T) {
	_, base := startSim(t, 7, nil)
	url := base + "/v1/chat/completions"
	const prompt = "Tell me about NVLink domains." // "user: " + it + "\n": 36 bytes, 9 tokens
	w := whole(t, url, chat(prompt, nil))
	if w.Object != "chat.completion" || len(w.Choices) != 1 || w.Choices[0].Message.Role != "assistant" || w.Model != "medium" {
		t.Fatalf("answer %+v", w)
	}
	if f := w.Choices[0].FinishReason; f == nil || *f != "stop" {
		t.Errorf("finish_reason %v, want stop", f)
	}
	checkUsage(t, w.Usage, 9, w.Choices[0].Message.Content)

	chunks := stream(t, url, chat(prompt, map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true}}))
	var text strings.Builder
	for i, c := range chunks[:len(chunks)-1] {
		if c.Object != "chat.completion.chunk" || len(c.Choices) != 1 {
			t.Fatalf("chunk %d: %+v", i, c)
		}
		if (i == 0) != (c.Choices[0].Delta.Role == "assistant") {
			t.Errorf("chunk %d: role %q; the first chunk, and only it, names the role", i, c.Choices[0].Delta.Role)
		}
		text.WriteString(c.Choices[0].Delta.Content)
	}
	if f := chunks[len(chunks)-2].Choices[0].FinishReason; f == nil || *f != "stop" {
		t.Errorf("the last choice chunk's finish_reason %v, want stop", f)
	}
	last := chunks[len(chunks)-1]
	if len(last.Choices) != 0 {
		t.Errorf("the usage chunk has %d choices, want none", len(last.Choices))
	}
	if text.String() != w.Choices[0].Message.Content {
		t.Errorf("streamed %q, whole %q", text.String(), w.Choices[0].Message.Content)
	}
	checkUsage(t, last.Usage, 9, text.String())

	for _, c := range stream(t, url, chat(prompt, map[string]any{"stream": true})) {
		if c.Usage != nil || len(c.Choices) == 0 {
			t.Errorf("a stream that did not ask for usage has chunk %+v", c)
		}
	}
}

// Completions answer text, whole and streamed, and max_tokens cuts the
// answer with finish_reason length.
func TestCompletions(t *testing.T) {
	_, base := startSim(t, 7, nil)
	url := base + "/v1/completions"
	body := map[string]any{"model": "small", "prompt": "0123456789abcdef", "max_tokens": 3}
	w := whole(t, url, body)
	if w.Object != "text_completion" || len(w.Choices) != 1 {
		t.Fatalf("answer %+v", w)
	}
	if f := w.Choices[0].FinishReason; f == nil || *f != "length" {
		t.Errorf("finish_reason %v, want length", f)
	}
	checkUsage(t, w.Usage, 4, w.Choices[0].Text)
	if w.Usage.CompletionTokens != 3 {
		t.Errorf("%d completion tokens, want max_tokens 3", w.Usage.CompletionTokens)
	}
	body["stream"] = true
	body["stream_options"] = map[string]any{"include_usage": true}
	var text strings.Builder
	chunks := stream(t, url, body)
	for _, c := range chunks {
		for _, ch := range c.Choices {
			text.WriteString(ch.Text)
		}
	}
	if text.String() != w.Choices[0].Text {
		t.Errorf("streamed %q, whole %q", text.String(), w.Choices[0].Text)
	}
	checkUsage(t, chunks[len(chunks)-1].Usage, 4, text.String())
}

// One seed gives one answer to one request, on any simulator; another
// seed another.
func TestSameSeedSameAnswers(t *testing.T) {
	answers := map[uint64][]string{}
	for _, seed := range []uint64{1, 1, 2} {
		_, base := startSim(t, seed, nil)
		var got []string
		for _, p := range []string{"first question", "second question"} {
			w := whole(t, base+"/v1/chat/completions", chat(p, nil))
			got = append(got, w.ID+" "+w.Choices[0].Message.Content)
		}
		if prev, ok := answers[seed]; ok && strings.Join(prev, "|") != strings.Join(got, "|") {
			t.Errorf("seed %d answered %q, then %q", seed, prev, got)
		}
		answers[seed] = got
	}
	if answers[1][0] == answers[2][0] {
		t.Errorf("seeds 1 and 2 gave the same answer %q", answers[1][0])
	}
}

// A prompt that shares whole blocks with one prefilled before reports
// them as cached tokens.
func TestPrefixCacheReportsCachedTokens(t *testing.T) {
	_, base := startSim(t, 7, nil)
	url := base + "/v1/completions"
	prompt := strings.Repeat("x", 200) // 50 tokens: 3 whole blocks of 64 bytes
	first := whole(t, url, map[string]any{"model": "small", "prompt": prompt})
	second := whole(t, url, map[string]any{"model": "small", "prompt": prompt})
	if got := first.Usage.PromptTokensDetails.CachedTokens; got != 0 {
		t.Errorf("the first prompt has %d cached tokens, want 0", got)
	}
	if got := second.Usage.PromptTokensDetails.CachedTokens; got != 3*BlockTokens {
		t.Errorf("the second has %d cached tokens, want %d", got, 3*BlockTokens)
	}
}

func readMetrics(t *testing.T, base string) enginemetrics.Sample {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	names, _ := enginemetrics.BuiltinNames(enginemetrics.KindVLLM)
	s, err := enginemetrics.Parse(resp.Body, names)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// /metrics follows the engine, as sluiced reads it: a request in the
// batch runs, one behind it waits, and a client leaving frees its place.
func TestMetricsFollowTheEngine(t *testing.T) {
	_, base := startSim(t, 7, func(ec *EngineConfig) {
		// Slow enough that nothing ends during the test; a batch of one.
		ec.Spec = Spec{PrefillRate: 1, DecodeRate: 1, KVBytes: 1 << 40, MaxBatch: 1, PrefillTokens: 8192}
	})
	send := func() (context.CancelFunc, chan struct{}) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			b, _ := json.Marshal(chat("hold on", map[string]any{"stream": true}))
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(b))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		return cancel, done
	}
	state := func(running, waiting float64) func() bool {
		return func() bool { s := readMetrics(t, base); return s.Running == running && s.Queue == waiting }
	}
	if s := readMetrics(t, base); s.Running != 0 || s.Queue != 0 || s.KVUsage != 0 {
		t.Fatalf("an idle engine reports %+v", s)
	}
	cancelA, doneA := send()
	testwait.Until(t, 10*time.Second, "one running", state(1, 0))
	if s := readMetrics(t, base); s.KVUsage <= 0 {
		t.Errorf("a running request holds no KV: %+v", s)
	}
	cancelB, doneB := send()
	testwait.Until(t, 10*time.Second, "one running, one waiting", state(1, 1))
	cancelA()
	<-doneA
	testwait.Until(t, 10*time.Second, "the waiting one running", state(1, 0))
	cancelB()
	<-doneB
	testwait.Until(t, 10*time.Second, "an idle engine", state(0, 0))
}

// Bad requests get OpenAI's error shape and change nothing.
func TestBadRequests(t *testing.T) {
	_, base := startSim(t, 7, nil)
	for _, c := range []struct {
		path   string
		body   any
		status int
		want   string
	}{
		{"/v1/chat/completions", chat("hi", map[string]any{"model": "gpt-9"}), http.StatusNotFound, "model_not_found"},
		{"/v1/chat/completions", chat("hi", map[string]any{"n": 2}), http.StatusBadRequest, "n:"},
		{"/v1/chat/completions", chat("hi", map[string]any{"max_tokens": 0}), http.StatusBadRequest, "max_tokens"},
		{"/v1/chat/completions", map[string]any{"model": "medium"}, http.StatusBadRequest, "messages"},
		{"/v1/chat/completions", chat(strings.Repeat("long ", 4<<20/5+1), nil), http.StatusRequestEntityTooLarge, "request body"},
		{"/v1/completions", map[string]any{"model": "small", "prompt": 42}, http.StatusBadRequest, "prompt"},
		{"/v1/completions", "not an object", http.StatusBadRequest, "not a JSON request"},
	} {
		resp := post(t, context.Background(), base+c.path, c.body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Error struct{ Message, Type string } `json:"error"`
		}
		if resp.StatusCode != c.status || json.Unmarshal(b, &e) != nil || e.Error.Type == "" || !strings.Contains(string(b), c.want) {
			t.Errorf("%s %.60v: %d %s; want %d naming %q", c.path, c.body, resp.StatusCode, b, c.status, c.want)
		}
	}
	resp, err := http.Get(base + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", resp.StatusCode)
	}
	if s := readMetrics(t, base); s.Running != 0 || s.Queue != 0 {
		t.Errorf("after bad requests the engine reports %+v", s)
	}
}

// The topology the simulator writes names each engine's address, metrics
// and models, parses back, and its engines answer.
func TestTopologyNamesTheEngines(t *testing.T) {
	cfg, cl := setup(t)
	plan, err := Plan(cl, cfg.Models, cfg.Capacity, PlanOptions{Capacity: 1, PerDomain: 2, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(plan, cl, 1, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	y, err := topology.EncodeYAML(s.Topology())
	if err != nil {
		t.Fatal(err)
	}
	back, err := topology.Parse(y)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range back.Domains {
		if len(d.Engines) != 2 {
			t.Errorf("domain %s has %d engines, want 2", d.ID, len(d.Engines))
		}
		for _, e := range d.Engines {
			n++
			if e.Kind != "vllm" || e.Metrics != "http://"+e.Address+"/metrics" || !strings.Contains(strings.Join(e.Models, ","), "medium") {
				t.Errorf("domain %s engine %+v", d.ID, e)
			}
		}
	}
	if n != len(plan) {
		t.Fatalf("the topology names %d engines, the plan %d", n, len(plan))
	}
	e := back.Domains[len(back.Domains)-1].Engines[1]
	w := whole(t, "http://"+e.Address+"/v1/chat/completions", chat("hello", nil))
	checkUsage(t, w.Usage, promptTokens("user: hello\n"), w.Choices[0].Message.Content)
}

// Plan refuses what it cannot serve, naming it.
func TestPlanErrors(t *testing.T) {
	cfg, cl := setup(t)
	named := cl.Clone()
	named.Domains[0].Engines = []topology.Engine{{Metrics: "http://x:1/metrics", Kind: "vllm", Models: []string{"gpt-9"}}}
	for _, c := range []struct {
		cluster topology.Cluster
		o       PlanOptions
		want    string
	}{
		{cl, PlanOptions{Capacity: 0, Listen: "127.0.0.1:0"}, "capacity 0"},
		{cl, PlanOptions{Capacity: 101, Listen: "127.0.0.1:0"}, "capacity 101"},
		{cl, PlanOptions{Capacity: 1, PerDomain: -1, Listen: "127.0.0.1:0"}, "engines per domain"},
		{cl, PlanOptions{Capacity: 1, Listen: "8100"}, "want host:port"},
		{cl, PlanOptions{Capacity: 1, Listen: "127.0.0.1:http"}, "not in 0..65535"},
		{cl, PlanOptions{Capacity: 1, Listen: "127.0.0.1:8100-8102"}, "more engines than ports"},
		{cl, PlanOptions{Capacity: 1, Listen: "127.0.0.1:8102-8100"}, "first-last"},
		{named, PlanOptions{Capacity: 1, Listen: "127.0.0.1:0"}, `model "gpt-9" is not in the catalog`},
	} {
		_, err := Plan(c.cluster, cfg.Models, cfg.Capacity, c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %q", c.o, err, c.want)
		}
	}
}
