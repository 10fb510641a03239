package load

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/sluice-sched/sluice/internal/clock"
)

// DefaultTenantHeader is the header the OpenAI front reads the tenant from.
const DefaultTenantHeader = "x-llm-d-inference-fairness-id"

// OpenAIOptions say what trace to offer an OpenAI-compatible endpoint.
type OpenAIOptions struct {
	// BaseURL is the API's base, as an SDK's (http://host:port/v1); each
	// arrival is a POST to BaseURL + "/chat/completions".
	BaseURL string
	// TenantHeader carries the arrival's tenant (DefaultTenantHeader if "").
	TenantHeader string
	// Arrivals are the calls, sorted by At; Duration cuts them (0: all).
	Arrivals []Arrival
	Duration time.Duration
	// MaxInFlight bounds the requests outstanding (an arrival past it is
	// dropped and counted); 0: 10,000.
	MaxInFlight int
	// OutputWeight weighs an output token against a prompt token in the
	// admitted work per second (the config's output_token_weight); 0: 1.
	OutputWeight int64
	// Floors are the tenants' floors in weighted tokens per second: a
	// tenant with one gets its floor-violation seconds counted.
	Floors map[string]int64
	// Deadline, when above 0, is each request's wait for admission, sent
	// as x-sluice-deadline-ms (as the gRPC load's --deadline).
	Deadline time.Duration
	// Client sends the requests (http.DefaultClient if nil).
	Client *http.Client
	// Clock times the run, its arrivals and each first token (nil: the
	// wall clock).
	Clock clock.Clock
}

// OpenAIResult is what came back from an OpenAI run.
type OpenAIResult struct {
	BaseURL  string  `json:"baseURL"`
	Seconds  float64 `json:"seconds"`
	Requests int     `json:"requests"`
	// Answered are streams that ended with [DONE]; Refused the 429s;
	// Errors every other failure (a status, a broken stream, a transport
	// error); Dropped the arrivals past MaxInFlight.
	Answered int `json:"answered"`
	Refused  int `json:"refused"`
	Errors   int `json:"errors"`
	Dropped  int `json:"dropped"`
	// TTFT is from sending a request to its first SSE data chunk, over
	// the requests that got one.
	TTFT Percentiles `json:"ttft"`
	// PromptTokens and CompletionTokens are the usage the answers
	// reported; AskedOutputTokens the arrivals' output tokens (max_tokens).
	PromptTokens      int64 `json:"promptTokens"`
	CompletionTokens  int64 `json:"completionTokens"`
	AskedOutputTokens int64 `json:"askedOutputTokens"`
	// FloorViolations sums the tenants'.
	FloorViolations int            `json:"floorViolationSeconds"`
	FirstError      string         `json:"firstError,omitempty"`
	Tenants         []OpenAITenant `json:"tenants"`
}

// OpenAITenant is one tenant's share of an OpenAI run.
type OpenAITenant struct {
	Name     string `json:"name"`
	Requests int    `json:"requests"`
	Answered int    `json:"answered"`
	Refused  int    `json:"refused"`
	// RefusedBy counts the 429s by their x-sluice-reason.
	RefusedBy map[string]int `json:"refusedBy,omitempty"`
	Errors    int            `json:"errors"`
	TTFTP99   float64        `json:"ttftP99Us"`
	Floor     int64          `json:"floor,omitempty"`
	// FloorViolations counts the seconds with unmet demand (a 429 not by
	// the tenant's own limits, or a request whose first chunk came a
	// second or more after it was sent) in which its answered requests'
	// weighted tokens, counted in the second of their first chunk, were
	// below its floor.
	FloorViolations int `json:"floorViolationSeconds"`
}

// ownRefusal reports whether a 429's reason is the tenant's own limit
// (its quota, credit, budget or concurrency), which leaves no demand unmet.
func ownRefusal(reason string) bool {
	r := strings.ToUpper(reason)
	for _, own := range []string{"QUOTA_EXCEEDED", "BURST_CREDIT", "BUDGET_EXHAUSTED", "CONCURRENCY_EXCEEDED", "UNKNOWN_TENANT", "REQUEST_TOO_LARGE"} {
		if strings.Contains(r, own) {
			return true
		}
	}
	return false
}

// openAICall is one request's outcome.
type openAICall struct {
	tenant     string
	sent       time.Duration // from the run's start
	first      time.Duration // to the first data chunk; -1: none
	status     int
	reason     string
	done       bool
	err        string
	weighted   int64
	prompt     int64
	completion int64
}

// RunOpenAI sends opts.Arrivals as streamed chat completions at their
// offsets, each its own goroutine, and reports what came back.
func RunOpenAI(ctx context.Context, opts OpenAIOptions) (*OpenAIResult, error) {
	if opts.BaseURL == "" {
		return nil, errors.New("openai: no base URL")
	}
	if len(opts.Arrivals) == 0 {
		return nil, errors.New("openai: no arrivals")
	}
	header := opts.TenantHeader
	if header == "" {
		header = DefaultTenantHeader
	}
	client := opts.Client
	if client == nil {
		client = http.DefaultClient
	}
	maxIn := opts.MaxInFlight
	if maxIn <= 0 {
		maxIn = 10000
	}
	outW := max(opts.OutputWeight, 1)
	url := strings.TrimSuffix(opts.BaseURL, "/") + "/chat/completions"
	slots := make(chan struct{}, maxIn)
	var (
		mu    sync.Mutex
		calls []openAICall
		wg    sync.WaitGroup
	)
	res := &OpenAIResult{BaseURL: opts.BaseURL}
	clk := opts.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	start := clk.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
arrivals:
	for i, a := range opts.Arrivals {
		if opts.Duration > 0 && a.At >= opts.Duration {
			break
		}
		if d := a.At - clk.Since(start); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				break arrivals
			case <-timer.C:
			}
		}
		res.Requests++
		res.AskedOutputTokens += a.Output
		select {
		case slots <- struct{}{}:
		default:
			res.Dropped++
			continue
		}
		wg.Add(1)
		go func(i int, a Arrival) {
			defer wg.Done()
			defer func() { <-slots }()
			c := sendChat(ctx, clk, client, url, header, opts.Deadline, i, a, start)
			c.weighted = a.Prompt + outW*a.Output
			mu.Lock()
			calls = append(calls, c)
			mu.Unlock()
		}(i, a)
	}
	wg.Wait()
	res.Seconds = clk.Since(start).Seconds()
	summarize(res, calls, opts.Floors)
	return res, nil
}

// chatBody is a streamed chat completion of a's tokens: a prompt of
// a.Prompt tokens at 4 bytes a token (the simulator's count), led by the
// call's index so that no two prompts share a cached prefix.
func chatBody(i int, a Arrival) ([]byte, error) {
	const role = "user: " // the simulator counts each message as "role: content\n"
	n := max(int(a.Prompt)*4-len(role)-1, 1)
	var b strings.Builder
	b.Grow(n)
	b.WriteString("request " + strconv.Itoa(i) + ":")
	for b.Len() < n {
		b.WriteString(" lorem")
	}
	content := b.String()[:n]
	return json.Marshal(map[string]any{
		"model":          a.Model,
		"messages":       []map[string]string{{"role": "user", "content": content}},
		"max_tokens":     max(a.Output, 1),
		"stream":         true,
		"stream_options": map[string]bool{"include_usage": true},
	})
}

// sendChat sends one arrival and reads its answer to the end.
func sendChat(ctx context.Context, clk clock.Clock, client *http.Client, url, header string, deadline time.Duration, i int, a Arrival, start time.Time) openAICall {
	c := openAICall{tenant: a.Tenant, first: -1}
	body, err := chatBody(i, a)
	if err != nil {
		c.err = fmt.Sprintf("encoding the request: %v", err)
		return c
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		c.err = fmt.Sprintf("building the request: %v", err)
		return c
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set(header, a.Tenant)
	if deadline > 0 {
		req.Header.Set("x-sluice-deadline-ms", strconv.FormatInt(deadline.Milliseconds(), 10))
	}
	sent := clk.Now()
	c.sent = sent.Sub(start)
	resp, err := client.Do(req)
	if err != nil {
		c.err = err.Error()
		return c
	}
	defer resp.Body.Close()
	c.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		c.reason = resp.Header.Get("x-sluice-reason")
		if resp.StatusCode != http.StatusTooManyRequests {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			c.err = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		}
		return c
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if c.first < 0 {
			c.first = clk.Since(sent)
		}
		if data == "[DONE]" {
			c.done = true
			break
		}
		var chunk struct {
			Usage *struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &chunk) == nil && chunk.Usage != nil {
			c.prompt, c.completion = chunk.Usage.PromptTokens, chunk.Usage.CompletionTokens
		}
	}
	if !c.done {
		c.err = "the stream ended before [DONE]"
		if err := sc.Err(); err != nil {
			c.err = fmt.Sprintf("reading the stream: %v", err)
		}
	}
	return c
}

// summarize fills res from the calls.
func summarize(res *OpenAIResult, calls []openAICall, floors map[string]int64) {
	sort.Slice(calls, func(i, j int) bool { return calls[i].sent < calls[j].sent })

	all := newHist()
	type tenantAcc struct {
		t        OpenAITenant
		ttft     *hdrhistogram.Histogram
		achieved map[int]int64
		unmet    map[int]bool
	}
	byName := map[string]*tenantAcc{}
	var names []string
	sec := func(d time.Duration) int { return int(d / time.Second) }
	for _, c := range calls {
		ta := byName[c.tenant]
		if ta == nil {
			ta = &tenantAcc{t: OpenAITenant{Name: c.tenant, RefusedBy: map[string]int{}}, ttft: newHist(), achieved: map[int]int64{}, unmet: map[int]bool{}}
			byName[c.tenant] = ta
			names = append(names, c.tenant)
		}
		ta.t.Requests++
		switch {
		case c.status == http.StatusTooManyRequests:
			res.Refused++
			ta.t.Refused++
			ta.t.RefusedBy[c.reason]++
			if !ownRefusal(c.reason) {
				ta.unmet[sec(c.sent)] = true
			}
		case c.err != "":
			res.Errors++
			ta.t.Errors++
			if res.FirstError == "" {
				res.FirstError = c.err
			}
		default:
			res.Answered++
			ta.t.Answered++
		}
		if c.first >= 0 {
			ns := max(c.first.Nanoseconds(), 1)
			_ = all.RecordValue(ns)
			_ = ta.ttft.RecordValue(ns)
			at := c.sent + c.first
			ta.achieved[sec(at)] += c.weighted
			// As the replay counts a wait: unmet in every second past the first.
			for x := sec(c.sent + time.Second); c.first > time.Second && x <= sec(at-1); x++ {
				ta.unmet[x] = true
			}
		}
		res.PromptTokens += c.prompt
		res.CompletionTokens += c.completion
	}
	res.TTFT = percentiles(all)
	sort.Strings(names)
	for _, n := range names {
		ta := byName[n]
		ta.t.TTFTP99 = percentiles(ta.ttft).P99
		if f, ok := floors[n]; ok && f > 0 {
			ta.t.Floor = f
			for x := range ta.unmet {
				if ta.achieved[x] < f {
					ta.t.FloorViolations++
				}
			}
			res.FloorViolations += ta.t.FloorViolations
		}
		if len(ta.t.RefusedBy) == 0 {
			ta.t.RefusedBy = nil
		}
		res.Tenants = append(res.Tenants, ta.t)
	}
}

// WriteOpenAI prints r as a table.
func WriteOpenAI(w io.Writer, r *OpenAIResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d requests in %.1f s: %d answered, %d refused (429), %d errors, %d dropped\n",
		r.BaseURL, r.Requests, r.Seconds, r.Answered, r.Refused, r.Errors, r.Dropped)
	ms := func(us float64) float64 { return us / 1000 }
	fmt.Fprintf(&b, "TTFT (send to first chunk) ms: p50 %.1f  p90 %.1f  p99 %.1f  p99.9 %.1f  max %.1f\n",
		ms(r.TTFT.P50), ms(r.TTFT.P90), ms(r.TTFT.P99), ms(r.TTFT.P999), ms(r.TTFT.Max))
	fmt.Fprintf(&b, "usage: %d prompt, %d completion tokens (%d asked); floor-violation seconds %d\n",
		r.PromptTokens, r.CompletionTokens, r.AskedOutputTokens, r.FloorViolations)
	if r.FirstError != "" {
		fmt.Fprintf(&b, "first error: %s\n", r.FirstError)
	}
	fmt.Fprintf(&b, "%-12s %8s %8s %8s %6s %11s %6s %8s  %s\n", "tenant", "requests", "answered", "refused", "errors", "TTFT p99 ms", "floor", "floor s", "refused by")
	for _, t := range r.Tenants {
		var by []string
		for k, v := range t.RefusedBy {
			by = append(by, fmt.Sprintf("%s %d", k, v))
		}
		sort.Strings(by)
		fmt.Fprintf(&b, "%-12s %8d %8d %8d %6d %11.1f %6d %8d  %s\n", t.Name, t.Requests, t.Answered, t.Refused, t.Errors, ms(t.TTFTP99), t.Floor, t.FloorViolations, strings.Join(by, ", "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
