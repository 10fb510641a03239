package enginemetrics_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/enginemetrics"
)

const model = `model_name="meta-llama/Llama-3.1-8B-Instruct"`

// vllmV1 is a vLLM V1 exposition with two data-parallel engines, trimmed to
// a few families of each type: process metrics, counters with their
// _created gauges, histograms, an info gauge and the gauges read.
const vllmV1 = `# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 18342.0
python_gc_objects_collected_total{generation="1"} 4521.0
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 3.4177024e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",` + model + `} 12.0
vllm:num_requests_running{engine="1",` + model + `} 9.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",` + model + `} 3.0
vllm:num_requests_waiting{engine="1",` + model + `} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",` + model + `} 0.42
vllm:kv_cache_usage_perc{engine="1",` + model + `} 0.61
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",` + model + `} 102400.0
vllm:prefix_cache_queries_total{engine="1",` + model + `} 98304.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",` + model + `} 1.7563e+09
vllm:prefix_cache_queries_created{engine="1",` + model + `} 1.7563e+09
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="27189"} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",` + model + `} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",` + model + `} 311.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",` + model + `} 1875.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",` + model + `} 1902.0
vllm:time_to_first_token_seconds_count{engine="0",` + model + `} 1902.0
vllm:time_to_first_token_seconds_sum{engine="0",` + model + `} 187.33
# HELP vllm:time_to_first_token_seconds_created Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds_created gauge
vllm:time_to_first_token_seconds_created{engine="0",` + model + `} 1.7563e+09
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",` + model + `} 404.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",` + model + `} 1900.0
vllm:e2e_request_latency_seconds_count{engine="0",` + model + `} 1900.0
vllm:e2e_request_latency_seconds_sum{engine="0",` + model + `} 3821.9
`

// vllmV0 is an older vLLM exposition, before gpu_cache_usage_perc became
// kv_cache_usage_perc.
const vllmV0 = `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="27189"} 1.0
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{` + model + `} 31.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{` + model + `} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{` + model + `} 11.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{` + model + `} 0.87
# HELP vllm:cpu_cache_usage_perc CPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{` + model + `} 0.0
# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.01",` + model + `} 5012.0
vllm:time_per_output_token_seconds_bucket{le="+Inf",` + model + `} 90210.0
vllm:time_per_output_token_seconds_count{` + model + `} 90210.0
vllm:time_per_output_token_seconds_sum{` + model + `} 2140.5
`

// sglang is an SGLang exposition.
const sglang = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{` + model + `} 24.0
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{` + model + `} 183204.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{` + model + `} 0.91
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{` + model + `} 2815.4
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{` + model + `} 6.0
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{` + model + `} 0.33
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{` + model + `} 4.812e+06
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",` + model + `} 140.0
sglang:time_to_first_token_seconds_bucket{le="1.0",` + model + `} 980.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",` + model + `} 1001.0
sglang:time_to_first_token_seconds_count{` + model + `} 1001.0
sglang:time_to_first_token_seconds_sum{` + model + `} 412.7
`

// tgi is a Text Generation Inference exposition, a kind only Options.Kinds
// knows; it exports a queue but no KV-cache gauge.
const tgi = `# TYPE tgi_queue_size gauge
tgi_queue_size 5
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 16
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.5"} 3
tgi_request_duration_bucket{le="+Inf"} 9
tgi_request_duration_sum 14.2
tgi_request_duration_count 9
`

var tgiNames = enginemetrics.Names{Queue: "tgi_queue_size", Running: "tgi_batch_current_size"}

func names(t *testing.T, kind string) enginemetrics.Names {
	t.Helper()
	n, ok := enginemetrics.BuiltinNames(kind)
	if !ok {
		t.Fatalf("BuiltinNames(%q) = false", kind)
	}
	return n
}

func TestParse(t *testing.T) {
	tests := []struct {
		name  string
		kind  string
		body  string
		names *enginemetrics.Names // overrides kind
		want  enginemetrics.Sample
	}{
		{name: "vllm two engines: sum queue and running, max kv", kind: "vllm", body: vllmV1,
			want: enginemetrics.Sample{Queue: 7, Running: 21, KVUsage: 0.61}},
		{name: "vllm old kv name", kind: "vllm", body: vllmV0,
			want: enginemetrics.Sample{Queue: 11, Running: 31, KVUsage: 0.87}},
		{name: "vllm both kv names: the newer wins", kind: "vllm",
			body: vllmV1 + "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{engine=\"0\"} 0.99\n",
			want: enginemetrics.Sample{Queue: 7, Running: 21, KVUsage: 0.61}},
		{name: "sglang", kind: "sglang", body: sglang,
			want: enginemetrics.Sample{Queue: 6, Running: 24, KVUsage: 0.91}},
		{name: "custom kind without kv", names: &tgiNames, body: tgi,
			want: enginemetrics.Sample{Queue: 5, Running: 16}},
		{name: "queue only reads kv 0", kind: "vllm",
			body: "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 2\n",
			want: enginemetrics.Sample{Queue: 2}},
		{name: "KV a little past 1 reads as full", kind: "vllm",
			body: "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 1.0001\n",
			want: enginemetrics.Sample{KVUsage: 1.0001}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := enginemetrics.Names{}
			if tt.names != nil {
				n = *tt.names
			} else {
				n = names(t, tt.kind)
			}
			got, err := enginemetrics.Parse(strings.NewReader(tt.body), n)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got != tt.want {
				t.Errorf("Parse = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseFails(t *testing.T) {
	tests := []struct {
		name, kind, body string
		want             []string // substrings of the error
	}{
		{name: "other engine's exposition", kind: "vllm", body: sglang,
			want: []string{"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}},
		{name: "histogram only", kind: "sglang",
			body: "# TYPE sglang:time_to_first_token_seconds histogram\nsglang:time_to_first_token_seconds_bucket{le=\"+Inf\"} 1\nsglang:time_to_first_token_seconds_count 1\nsglang:time_to_first_token_seconds_sum 0.2\n",
			want: []string{"sglang:num_queue_reqs", "sglang:token_usage"}},
		{name: "empty", kind: "sglang", body: "", want: []string{"sglang:num_queue_reqs"}},
		{name: "not an exposition", kind: "vllm", body: "<html>502 Bad Gateway</html>\n", want: []string{"parse"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := enginemetrics.Parse(strings.NewReader(tt.body), names(t, tt.kind))
			if err == nil {
				t.Fatal("Parse succeeded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

// engine is a loopback metrics endpoint whose answer a test sets.
type engine struct {
	srv    *httptest.Server
	hits   atomic.Int64
	mu     sync.Mutex
	status int
	body   string
}

func newEngine(t *testing.T, body string) *engine {
	e := &engine{status: http.StatusOK, body: body}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.hits.Add(1)
		if a := r.Header.Get("Accept"); !strings.HasPrefix(a, "text/plain") {
			http.Error(w, "want text/plain, got "+a, http.StatusNotAcceptable)
			return
		}
		e.mu.Lock()
		status, body := e.status, e.body
		e.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *engine) set(status int, body string) {
	e.mu.Lock()
	e.status, e.body = status, body
	e.mu.Unlock()
}

func (e *engine) endpoint(kind string) enginemetrics.Endpoint {
	return enginemetrics.Endpoint{URL: e.srv.URL + "/metrics", Kind: kind}
}

// fakeClock reads one second later each time it is read, so a pass's
// readings are known as a set whatever order the reads finish in.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Second)
	return c.t
}

func newReader(t *testing.T, opts enginemetrics.Options) (*enginemetrics.Reader, *fakeClock) {
	t.Helper()
	c := &fakeClock{t: t0}
	opts.Clock = c.now
	if opts.Period == 0 {
		// Generous on a loaded machine: a loopback read never nears it
		// (the 4 MiB oversized body under the race detector took more
		// than a second with other work on the VM).
		opts.Period, opts.Timeout = 10*time.Second, 10*time.Second
	}
	r, err := enginemetrics.NewReader(opts)
	if err != nil {
		t.Fatalf("NewReader: %v", err)
	}
	return r, c
}

func setDomains(t *testing.T, r *enginemetrics.Reader, m map[string][]enginemetrics.Endpoint) {
	t.Helper()
	if err := r.SetDomains(m); err != nil {
		t.Fatalf("SetDomains: %v", err)
	}
}

func signal(t *testing.T, r *enginemetrics.Reader, domain string) enginemetrics.Signal {
	t.Helper()
	s, ok := r.Signal(domain)
	if !ok {
		t.Fatalf("Signal(%q): never read", domain)
	}
	return s
}

func TestPollDomainSumsQueuesAndTakesMaxKV(t *testing.T) {
	v, s := newEngine(t, vllmV1), newEngine(t, sglang)
	r, _ := newReader(t, enginemetrics.Options{})
	setDomains(t, r, map[string][]enginemetrics.Endpoint{
		"nvl-0": {v.endpoint("vllm"), s.endpoint("sglang")},
		"nvl-1": {newEngine(t, vllmV0).endpoint("vllm")},
	})
	if _, ok := r.Signal("nvl-0"); ok {
		t.Fatal("Signal before any pass says read")
	}
	r.Poll(context.Background())

	got := signal(t, r, "nvl-0")
	want := enginemetrics.Signal{Queue: 7 + 6, Running: 21 + 24, KVUsage: 0.91, Endpoints: 2}
	at := got.At
	got.At = time.Time{}
	if got != want {
		t.Errorf("nvl-0 = %+v, want %+v", got, want)
	}
	// Three reads in the pass took the readings t0+1s..t0+3s; At is the
	// older of nvl-0's two, so it is at most t0+2s.
	if !at.After(t0) || at.After(t0.Add(2*time.Second)) {
		t.Errorf("nvl-0 At = %v, want the older of its two readings, in (t0, t0+2s]", at)
	}
	if all := r.Signals(); len(all) != 2 || all["nvl-1"].KVUsage != 0.87 {
		t.Errorf("Signals = %+v, want nvl-0 and nvl-1 with KVUsage 0.87", all)
	}
}

func TestPollFailures(t *testing.T) {
	good, flaky := newEngine(t, vllmV1), newEngine(t, sglang)
	gone := newEngine(t, sglang)
	gone.srv.Close() // refuses connections from the start

	var mu sync.Mutex
	failed := map[string]int{}
	var lastErr error // flaky's
	r, _ := newReader(t, enginemetrics.Options{OnError: func(domain string, e enginemetrics.Endpoint, err error) {
		mu.Lock()
		failed[domain]++
		if domain == "flaky" {
			lastErr = err
		}
		mu.Unlock()
	}})
	setDomains(t, r, map[string][]enginemetrics.Endpoint{
		"partial": {good.endpoint("vllm"), gone.endpoint("sglang")},
		"flaky":   {flaky.endpoint("sglang")},
		"dead":    {gone.endpoint("sglang")},
	})
	ctx := context.Background()
	r.Poll(ctx)

	p := signal(t, r, "partial")
	if p.Endpoints != 2 || p.Failed != 1 || p.Queue != 7 || p.KVUsage != 0.61 {
		t.Errorf("partial = %+v, want the good endpoint's values with Failed 1 of 2", p)
	}
	if _, ok := r.Signal("dead"); ok {
		t.Error("a domain never read has a Signal")
	}
	first := signal(t, r, "flaky")

	for _, fail := range []struct {
		name string
		set  func()
		says string // in the error OnError was given
	}{
		{"500", func() { flaky.set(http.StatusInternalServerError, "engine dead\n") }, "500 Internal Server Error"},
		{"not an exposition", func() { flaky.set(http.StatusOK, "<html>starting</html>\n") }, "parse"},
		{"oversized", func() { flaky.set(http.StatusOK, strings.Repeat("# padding\n", enginemetrics.MaxBody/10+1)+sglang) }, "exceeds"},
		{"closed server", func() { flaky.srv.Close() }, "refused"},
	} {
		fail.set()
		r.Poll(ctx)
		got := signal(t, r, "flaky")
		want := first
		want.Failed = 1
		if got != want {
			t.Errorf("after %s: flaky = %+v, want the last good signal %+v with Failed 1", fail.name, got, want)
		}
		mu.Lock()
		if lastErr == nil || !strings.Contains(lastErr.Error(), fail.says) {
			t.Errorf("after %s: OnError got %v, want an error saying %q", fail.name, lastErr, fail.says)
		}
		lastErr = nil
		mu.Unlock()
	}
	mu.Lock()
	defer mu.Unlock()
	if want := map[string]int{"partial": 5, "dead": 5, "flaky": 4}; len(failed) != len(want) ||
		failed["partial"] != want["partial"] || failed["dead"] != want["dead"] || failed["flaky"] != want["flaky"] {
		t.Errorf("OnError calls per domain = %v, want %v", failed, want)
	}
}

func TestPollRecoversWithNewAt(t *testing.T) {
	e := newEngine(t, sglang)
	r, _ := newReader(t, enginemetrics.Options{})
	setDomains(t, r, map[string][]enginemetrics.Endpoint{"d": {e.endpoint("sglang")}})
	ctx := context.Background()

	r.Poll(ctx) // reading t0+1s
	e.set(http.StatusServiceUnavailable, "")
	r.Poll(ctx) // t0+2s, failed
	if s := signal(t, r, "d"); !s.At.Equal(t0.Add(time.Second)) || s.Failed != 1 {
		t.Fatalf("after a failed pass: %+v, want At t0+1s and Failed 1", s)
	}
	e.set(http.StatusOK, strings.Replace(sglang, "sglang:num_queue_reqs{"+model+"} 6.0", "sglang:num_queue_reqs{"+model+"} 0.0", 1))
	r.Poll(ctx) // t0+3s
	s := signal(t, r, "d")
	if !s.At.Equal(t0.Add(3*time.Second)) || s.Failed != 0 || s.Queue != 0 {
		t.Errorf("after recovery: %+v, want At t0+3s, Failed 0, Queue 0", s)
	}
}

func TestSetDomainsRejectsAndKeepsOldSet(t *testing.T) {
	e := newEngine(t, vllmV1)
	r, _ := newReader(t, enginemetrics.Options{})
	setDomains(t, r, map[string][]enginemetrics.Endpoint{"nvl-0": {e.endpoint("vllm")}})
	r.Poll(context.Background())
	before := signal(t, r, "nvl-0")

	for _, tt := range []struct {
		name string
		eps  map[string][]enginemetrics.Endpoint
		want []string
	}{
		{"unknown kind", map[string][]enginemetrics.Endpoint{
			"nvl-0": {e.endpoint("vllm")},
			"nvl-9": {e.endpoint("vllm"), e.endpoint("tgi")},
		}, []string{`"nvl-9"`, `"tgi"`}},
		{"bad url", map[string][]enginemetrics.Endpoint{
			"nvl-3": {{URL: "10.0.0.7:8000/metrics", Kind: "vllm"}},
		}, []string{`"nvl-3"`}},
	} {
		err := r.SetDomains(tt.eps)
		if err == nil {
			t.Fatalf("%s: SetDomains succeeded", tt.name)
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not name %s", tt.name, err, w)
			}
		}
	}

	hits := e.hits.Load()
	r.Poll(context.Background())
	if n := e.hits.Load() - hits; n != 1 {
		t.Errorf("after refused reloads a pass made %d reads, want 1 (the old set)", n)
	}
	after := signal(t, r, "nvl-0")
	if after.Queue != before.Queue || after.Endpoints != 1 || !after.At.After(before.At) {
		t.Errorf("after refused reloads nvl-0 = %+v, want the old set read again (was %+v)", after, before)
	}
	if len(r.Signals()) != 1 {
		t.Errorf("Signals = %v, want only nvl-0", r.Signals())
	}
}

func TestSetDomainsDropsRemovedDomains(t *testing.T) {
	e := newEngine(t, sglang)
	r, _ := newReader(t, enginemetrics.Options{})
	setDomains(t, r, map[string][]enginemetrics.Endpoint{"a": {e.endpoint("sglang")}, "b": {e.endpoint("sglang")}})
	r.Poll(context.Background())
	kept := signal(t, r, "a")
	setDomains(t, r, map[string][]enginemetrics.Endpoint{"a": {e.endpoint("sglang")}})
	if _, ok := r.Signal("b"); ok {
		t.Error("a removed domain still has a Signal")
	}
	if got := signal(t, r, "a"); got != kept {
		t.Errorf("a kept domain's Signal changed on reload: %+v, was %+v", got, kept)
	}
}

func TestCustomKinds(t *testing.T) {
	e := newEngine(t, tgi)
	// A custom kind may also replace a built-in one: this deployment's
	// "vllm" is patched to export only the old KV name.
	old := enginemetrics.Names{Queue: "vllm:num_requests_waiting", KVUsage: "vllm:gpu_cache_usage_perc"}
	r, _ := newReader(t, enginemetrics.Options{Kinds: map[string]enginemetrics.Names{"tgi": tgiNames, "vllm": old}})
	setDomains(t, r, map[string][]enginemetrics.Endpoint{
		"tgi":  {e.endpoint("tgi")},
		"vllm": {newEngine(t, vllmV1).endpoint("vllm")},
		"old":  {newEngine(t, vllmV0).endpoint("vllm")},
	})
	r.Poll(context.Background())
	if s := signal(t, r, "tgi"); s.Queue != 5 || s.Running != 16 || s.KVUsage != 0 || s.Failed != 0 {
		t.Errorf("tgi = %+v, want Queue 5, Running 16", s)
	}
	// The override reads the queue of V1 but not its new KV name.
	if s := signal(t, r, "vllm"); s.Queue != 7 || s.KVUsage != 0 || s.Running != 0 {
		t.Errorf("overridden vllm on V1 = %+v, want Queue 7 and no KV or running", s)
	}
	if s := signal(t, r, "old"); s.KVUsage != 0.87 {
		t.Errorf("overridden vllm on V0 = %+v, want KVUsage 0.87", s)
	}
}

func TestNewReaderValidates(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts enginemetrics.Options
		want string
	}{
		{"kind with neither signal", enginemetrics.Options{Kinds: map[string]enginemetrics.Names{"tgi": {Running: "tgi_batch_current_size"}}}, `"tgi"`},
		{"empty kind name", enginemetrics.Options{Kinds: map[string]enginemetrics.Names{"": tgiNames}}, "empty"},
		{"fallback without kv", enginemetrics.Options{Kinds: map[string]enginemetrics.Names{"x": {Queue: "q", KVUsageFallback: "kv"}}}, `"x"`},
		{"timeout over period", enginemetrics.Options{Period: 50 * time.Millisecond, Timeout: 60 * time.Millisecond}, "exceeds"},
		{"negative period", enginemetrics.Options{Period: -1}, "negative"},
	} {
		_, err := enginemetrics.NewReader(tt.opts)
		if err == nil {
			t.Errorf("%s: NewReader succeeded", tt.name)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %q does not say %s", tt.name, err, tt.want)
		}
	}
}

func TestPollCancelledChangesNothing(t *testing.T) {
	e := newEngine(t, sglang)
	r, _ := newReader(t, enginemetrics.Options{})
	setDomains(t, r, map[string][]enginemetrics.Endpoint{"d": {e.endpoint("sglang")}})
	r.Poll(context.Background())
	before := signal(t, r, "d")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r.Poll(ctx)
	if got := signal(t, r, "d"); got != before {
		t.Errorf("a cancelled pass changed the Signal: %+v, was %+v", got, before)
	}
}

// TestRunConcurrentReaders runs passes while other goroutines read the
// signals; under -race it checks that Signal and Signals may be called
// while Run runs.
func TestRunConcurrentReaders(t *testing.T) {
	e := newEngine(t, vllmV1)
	r, _ := newReader(t, enginemetrics.Options{Period: 5 * time.Millisecond, Timeout: 5 * time.Millisecond})
	setDomains(t, r, map[string][]enginemetrics.Endpoint{"a": {e.endpoint("vllm")}, "b": {e.endpoint("vllm")}})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				r.Signal("a")
				_ = r.Signals()
			}
		})
	}
	passes := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx, func() {
			passes++
			if passes == 3 {
				// A reload between passes, raced against the readers.
				if err := r.SetDomains(map[string][]enginemetrics.Endpoint{"a": {e.endpoint("vllm")}}); err != nil {
					t.Error(err)
				}
			}
			// Stop once the reloaded set has been read cleanly, however
			// many passes a loaded machine's timeouts cost.
			if s, ok := r.Signal("a"); passes >= 5 && ok && s.Failed == 0 {
				cancel()
			}
		})
	}()
	<-done
	wg.Wait()
	if passes < 5 {
		t.Errorf("Run made %d passes, want at least 5", passes)
	}
	if s := signal(t, r, "a"); s.Queue != 7 {
		t.Errorf("a = %+v, want Queue 7", s)
	}
	if _, ok := r.Signal("b"); ok {
		t.Error("b, removed on the third pass, still has a Signal")
	}
	if len(r.Signals()) != 1 {
		t.Errorf("Signals = %v, want only a", r.Signals())
	}
}
