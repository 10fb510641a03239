package enginemetrics_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-sched/sluice/internal/enginemetrics"
)

// vllmQueue is a vLLM exposition whose waiting gauge has the series
// given (one value each, on data-parallel engines 0, 1, ...).
func vllmQueue(values ...string) string {
	var b strings.Builder
	b.WriteString("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 4\n")
	b.WriteString("# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.3\n")
	b.WriteString("# TYPE vllm:num_requests_waiting gauge\n")
	for i, v := range values {
		fmt.Fprintf(&b, "vllm:num_requests_waiting{engine=\"%d\"} %s\n", i, v)
	}
	return b.String()
}

// A series of a metric read that is negative, NaN, infinite or past its
// bound makes the endpoint's whole reading invalid, with the metric and
// the reason named; the sum of the other series is not taken.
func TestParseRefusesValuesThatAreNoReadings(t *testing.T) {
	tests := []struct {
		name, kind, body string
		metric, reason   string
	}{
		{"negative queue", "vllm", vllmQueue("50", "-1000"), "vllm:num_requests_waiting", enginemetrics.ReasonNegative},
		{"two queues that sum past float64", "vllm", vllmQueue("1e308", "1e308"), "vllm:num_requests_waiting", enginemetrics.ReasonTooLarge},
		{"queue past MaxRequests", "vllm", vllmQueue(fmt.Sprint(enginemetrics.MaxRequests + 1)), "vllm:num_requests_waiting", enginemetrics.ReasonTooLarge},
		{"NaN queue", "vllm", vllmQueue("3", "NaN"), "vllm:num_requests_waiting", enginemetrics.ReasonNaN},
		{"infinite queue", "vllm", vllmQueue("+Inf"), "vllm:num_requests_waiting", enginemetrics.ReasonInfinite},
		{"NaN KV use", "sglang",
			"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 1\n# TYPE sglang:token_usage gauge\nsglang:token_usage{dp_rank=\"0\"} NaN\nsglang:token_usage{dp_rank=\"1\"} 0.25\n",
			"sglang:token_usage", enginemetrics.ReasonNaN},
		{"KV use as a percentage", "vllm",
			"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 1\n# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 85\n",
			"vllm:kv_cache_usage_perc", enginemetrics.ReasonTooLarge},
		{"negative KV use in the fallback", "vllm",
			"# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc -0.2\n",
			"vllm:gpu_cache_usage_perc", enginemetrics.ReasonNegative},
		{"negative running", "vllm",
			"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 1\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running -Inf\n",
			"vllm:num_requests_running", enginemetrics.ReasonInfinite},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := enginemetrics.Parse(strings.NewReader(tt.body), names(t, tt.kind))
			var inv *enginemetrics.InvalidReadingError
			if !errors.As(err, &inv) {
				t.Fatalf("Parse = %+v, %v; want an InvalidReadingError", s, err)
			}
			if inv.Metric != tt.metric || inv.Reason != tt.reason {
				t.Errorf("InvalidReadingError names %s (%s), want %s (%s)", inv.Metric, inv.Reason, tt.metric, tt.reason)
			}
			if !strings.Contains(err.Error(), tt.metric) {
				t.Errorf("error %q does not name %s", err, tt.metric)
			}
		})
	}
}

// One engine's bad reading does not hide its domain's saturation: an
// engine reporting -1000 waiting, or two series of 1e308, beside an
// honest one at 50 leaves the domain at 50, each bad engine failed and
// its reason given to OnError. A domain whose only engine is bad is not
// read.
func TestPollCombinesOnlyValidReadings(t *testing.T) {
	honest := newEngine(t, vllmQueue("50"))
	negative := newEngine(t, vllmQueue("-1000"))
	overflow := newEngine(t, vllmQueue("1e308", "1e308"))
	var mu sync.Mutex
	reasons := map[string][]string{}
	r, _ := newReader(t, enginemetrics.Options{OnError: func(domain string, _ enginemetrics.Endpoint, err error) {
		var inv *enginemetrics.InvalidReadingError
		if !errors.As(err, &inv) {
			t.Errorf("%s: OnError got %v, want an InvalidReadingError", domain, err)
			return
		}
		mu.Lock()
		reasons[domain] = append(reasons[domain], inv.Reason)
		mu.Unlock()
	}})
	setDomains(t, r, map[string][]enginemetrics.Endpoint{
		"negative": {negative.endpoint("vllm"), honest.endpoint("vllm")},
		"overflow": {honest.endpoint("vllm"), overflow.endpoint("vllm")},
		"bad-only": {negative.endpoint("vllm")},
	})
	r.Poll(context.Background())
	for _, d := range []string{"negative", "overflow"} {
		s := signal(t, r, d)
		if s.Queue != 50 || s.Running != 4 || s.KVUsage != 0.3 || s.Failed != 1 || s.Endpoints != 2 {
			t.Errorf("%s = %+v, want the honest engine's queue 50, running 4, KV 0.3, with 1 of 2 failed", d, s)
		}
	}
	if s, ok := r.Signal("bad-only"); ok {
		t.Errorf("a domain whose only engine reports -1000 waiting reads %+v, want no reading", s)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]string{"negative": enginemetrics.ReasonNegative, "overflow": enginemetrics.ReasonTooLarge, "bad-only": enginemetrics.ReasonNegative}
	for d, reason := range want {
		if got := reasons[d]; len(got) != 1 || got[0] != reason {
			t.Errorf("%s: OnError reasons %v, want [%s]", d, got, reason)
		}
	}
}

// A read follows a redirect on the endpoint's own host and port (a
// metrics app mounted at /metrics/), and no other: a redirect to
// another server fails the read rather than take that server's queue
// for the domain's, whatever client the caller gives. A redirect loop
// on the endpoint's host ends after a few.
func TestPollFollowsRedirectsOnlyToTheSameHostAndPort(t *testing.T) {
	other := newEngine(t, vllmQueue("1000")) // another server, same host, another port
	redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/elsewhere":
			http.Redirect(w, r, other.srv.URL+"/metrics", http.StatusFound)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		case "/metrics":
			http.Redirect(w, r, "/metrics/", http.StatusTemporaryRedirect)
		case "/metrics/":
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = w.Write([]byte(vllmQueue("2")))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(redirecting.Close)

	for _, client := range []*http.Client{nil, {}} {
		var mu sync.Mutex
		errs := map[string][]error{}
		r, _ := newReader(t, enginemetrics.Options{Client: client, OnError: func(domain string, _ enginemetrics.Endpoint, err error) {
			mu.Lock()
			errs[domain] = append(errs[domain], err)
			mu.Unlock()
		}})
		setDomains(t, r, map[string][]enginemetrics.Endpoint{
			"mounted":    {{URL: redirecting.URL + "/metrics", Kind: "vllm"}},
			"redirected": {{URL: redirecting.URL + "/elsewhere", Kind: "vllm"}},
			"looping":    {{URL: redirecting.URL + "/loop", Kind: "vllm"}},
		})
		r.Poll(context.Background())
		if s := signal(t, r, "mounted"); s.Queue != 2 || s.Failed != 0 {
			t.Errorf("client %v: /metrics redirected to /metrics/ on its host reads %+v, want queue 2", client, s)
		}
		if s, ok := r.Signal("redirected"); ok {
			t.Errorf("client %v: an endpoint redirected to another server reads %+v, want no reading", client, s)
		}
		mu.Lock()
		if e := errs["redirected"]; len(e) != 1 || !strings.Contains(e[0].Error(), "redirected to "+other.srv.URL) {
			t.Errorf("client %v: OnError got %v, want one error naming the redirect to %s", client, e, other.srv.URL)
		}
		if e := errs["looping"]; len(e) != 1 || !strings.Contains(e[0].Error(), "stopped after 3 redirects") {
			t.Errorf("client %v: a redirect loop: OnError got %v, want one error saying it stopped after 3", client, e)
		}
		if len(errs) != 2 {
			t.Errorf("client %v: OnError got %v, want errors for redirected and looping only", client, errs)
		}
		mu.Unlock()
		if client != nil && client.CheckRedirect != nil {
			t.Error("NewReader changed the caller's client")
		}
	}
	if n := other.hits.Load(); n != 0 {
		t.Errorf("the other server was read %d times, want never", n)
	}
}
