package load_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/load"
)

// fakeEngine is an OpenAI endpoint that refuses tenant "refused" with 429
// QUOTA_EXCEEDED (its own limit) and tenant "squeezed" with 429
// CAPACITY_EXCEEDED, and streams every other request three chunks, the
// usage and [DONE], moving its clock on by hold before the first chunk.
type fakeEngine struct {
	hold   time.Duration
	clock  *clock.Manual // advanced by hold before the first chunk
	mu     sync.Mutex
	seen   map[string]int // requests by tenant header
	bodies []map[string]any
}

func (f *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	tenant := r.Header.Get(load.DefaultTenantHeader)
	f.mu.Lock()
	f.seen[tenant]++
	f.bodies = append(f.bodies, body)
	f.mu.Unlock()
	if reason := map[string]string{"refused": "QUOTA_EXCEEDED", "squeezed": "CAPACITY_EXCEEDED"}[tenant]; reason != "" {
		w.Header().Set("Retry-After", "1")
		w.Header().Set("x-sluice-reason", reason)
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"error":{"message":"not admitted","type":"rate_limit_exceeded"}}`))
		return
	}
	f.clock.Advance(f.hold)
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range 3 {
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"w%d \"}}]}\n\n", i)
		w.(http.Flusher).Flush()
	}
	fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n")
}

func TestOpenAICountsAnswersRefusalsAndTTFT(t *testing.T) {
	// The engine moves the run's clock on by hold before every first
	// chunk, so every TTFT, measured from before the send, is at least hold.
	const hold = 50 * time.Millisecond
	clk := clock.NewManual(time.Unix(0, 0))
	eng := &fakeEngine{hold: hold, clock: clk, seen: map[string]int{}}
	srv := httptest.NewServer(eng)
	defer srv.Close()
	var arrivals []load.Arrival
	for i := range 6 {
		tenant := "served"
		if i%3 == 2 {
			tenant = "refused"
		}
		arrivals = append(arrivals, load.Arrival{Tenant: tenant, Model: "small", Prompt: 10, Output: 3})
	}
	arrivals = append(arrivals, load.Arrival{Tenant: "squeezed", Model: "small", Prompt: 10, Output: 3})
	// Floors: squeezed's refusal is not its own limit and it got nothing
	// in that second (a violation); refused's is its own (none); served
	// got 4 × (10 + 4×3) = 88 weighted tokens, above its floor, and never
	// waited a second.
	floors := map[string]int64{"served": 50, "refused": 1000, "squeezed": 1000}
	res, err := load.RunOpenAI(context.Background(), load.OpenAIOptions{BaseURL: srv.URL + "/v1", Arrivals: arrivals, Client: srv.Client(),
		Deadline: 2 * time.Second, OutputWeight: 4, Floors: floors, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 7 || res.Answered != 4 || res.Refused != 3 || res.Errors != 0 || res.Dropped != 0 {
		t.Fatalf("requests %d answered %d refused %d errors %d dropped %d (first error %q), want 7 4 3 0 0",
			res.Requests, res.Answered, res.Refused, res.Errors, res.Dropped, res.FirstError)
	}
	if eng.seen["served"] != 4 || eng.seen["refused"] != 2 || eng.seen["squeezed"] != 1 {
		t.Fatalf("the engine saw %v, want 4 served, 2 refused and 1 squeezed", eng.seen)
	}
	if res.TTFT.Count != 4 || res.TTFT.P50 < float64(hold.Microseconds()) {
		t.Fatalf("TTFT %+v µs: want 4 values, each at least the %v the first chunk was held", res.TTFT, hold)
	}
	if res.PromptTokens != 40 || res.CompletionTokens != 12 || res.AskedOutputTokens != 21 {
		t.Fatalf("usage %d prompt %d completion (%d asked), want 40 12 21", res.PromptTokens, res.CompletionTokens, res.AskedOutputTokens)
	}
	byName := map[string]load.OpenAITenant{}
	for _, tr := range res.Tenants {
		byName[tr.Name] = tr
	}
	if s, r := byName["served"], byName["refused"]; s.Answered != 4 || s.Refused != 0 || r.Refused != 2 || r.RefusedBy["QUOTA_EXCEEDED"] != 2 {
		t.Fatalf("tenants %+v", res.Tenants)
	}
	if s, r, q := byName["served"], byName["refused"], byName["squeezed"]; s.FloorViolations != 0 || r.FloorViolations != 0 || q.FloorViolations != 1 || res.FloorViolations != 1 {
		t.Fatalf("floor-violation seconds: served %d refused %d squeezed %d, all %d; want 0 0 1 1", s.FloorViolations, r.FloorViolations, q.FloorViolations, res.FloorViolations)
	}
	for _, b := range eng.bodies {
		if b["stream"] != true || b["model"] != "small" || b["max_tokens"] != float64(3) {
			t.Fatalf("request body %v: want a streamed chat completion of small with max_tokens 3", b)
		}
	}
}
