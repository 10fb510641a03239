package enginemetrics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

const (
	// DefaultPeriod is the time between passes: twice the Inference
	// Extension's 50 ms scrape, halving the load on the engines' metrics
	// endpoints, and still half its 200 ms staleness bound, so a caller
	// with that bound rides out one failed pass.
	DefaultPeriod = 100 * time.Millisecond
	// DefaultConcurrency bounds the reads in flight in one pass, so a
	// reload naming thousands of endpoints does not open thousands of
	// connections at once.
	DefaultConcurrency = 64
	// MaxBody bounds one exposition. A vLLM or SGLang exposition is tens of
	// kilobytes; more than this is not an engine's metrics page.
	MaxBody = 4 << 20
)

// Endpoint is one serving engine's metrics URL and kind.
type Endpoint struct {
	// URL is the engine's metrics URL, e.g. http://10.0.0.7:8000/metrics.
	URL string
	// Kind names the metric names to read: "vllm", "sglang", or a kind in
	// Options.Kinds.
	Kind string
}

// Signal is what a domain's engines last said.
type Signal struct {
	// Queue is the requests waiting, summed over the domain's endpoints.
	Queue float64
	// Running is the requests running, summed over the domain's endpoints.
	Running float64
	// KVUsage is the highest KV-cache utilisation of its endpoints, 0..1:
	// the fullest engine is the one that refuses the next request.
	KVUsage float64
	// At is when the last pass's reads completed: the oldest completion
	// among the endpoints read, so that no value is older than At says.
	At time.Time
	// Endpoints is how many endpoints the domain named in the last pass.
	Endpoints int
	// Failed is how many of them failed in the last pass. Failed ==
	// Endpoints means every read failed and the values and At are those of
	// an earlier pass.
	Failed int
}

// Options configures a Reader. The zero value reads vLLM and SGLang every
// DefaultPeriod.
type Options struct {
	// Period is the time between passes; 0 means DefaultPeriod.
	Period time.Duration
	// Timeout bounds one endpoint's read; 0 means Period/2, so that a pass
	// with a hung endpoint still ends before the next one is due. It may
	// not exceed Period.
	Timeout time.Duration
	// Concurrency bounds the reads in flight; 0 means DefaultConcurrency.
	Concurrency int
	// Kinds adds kinds, or replaces the built-in vllm and sglang names.
	Kinds map[string]Names
	// Client makes the requests; nil means a client of its own with
	// Timeout and an idle pool large enough to keep every endpoint's
	// connection alive between passes. Each read is bounded by Timeout
	// whatever the client, and follows a redirect only to the
	// endpoint's own scheme, host and port (the Reader uses a copy of
	// Client with its own CheckRedirect).
	Client *http.Client
	// Clock gives Signal.At; nil means time.Now. Tests pass a fake.
	Clock func() time.Time
	// OnError, when not nil, is called for each failed read, from the
	// polling goroutines, so the caller may log or count why an endpoint
	// failed; Signal only counts that it did.
	OnError func(domain string, e Endpoint, err error)
}

// target is one endpoint with its kind resolved, so a pass does no lookups.
type target struct {
	Endpoint
	names Names
}

// domain is one domain's endpoints as of a SetDomains. Its pointer is its
// identity: a pass writes its result only to a domain still the same
// pointer, so a reload during a pass is never overwritten by the old set.
type domain struct {
	targets []target
}

// Reader polls the serving engines of a set of domains and keeps each
// domain's last Signal. It is safe for concurrent use.
type Reader struct {
	period      time.Duration
	timeout     time.Duration
	concurrency int
	kinds       map[string]Names
	client      *http.Client
	now         func() time.Time
	onError     func(string, Endpoint, error)

	// pass serialises Poll, so passes never interleave and At only moves
	// forward.
	pass sync.Mutex

	mu struct {
		sync.Mutex
		domains map[string]*domain
		signals map[string]Signal
		samples map[string]endpointSample // each endpoint's last read, by URL
	}
}

// endpointSample is one endpoint's last good read.
type endpointSample struct {
	s  Sample
	at time.Time
}

// EndpointSample returns the last good read of the endpoint whose metrics
// URL is url, and when it was made; false if it was never read, or is no
// longer an endpoint of a domain.
func (r *Reader) EndpointSample(url string) (Sample, time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.mu.samples[url]
	return e.s, e.at, ok
}

// NewReader returns a Reader with no domains, or an error naming the option
// or kind that is wrong.
func NewReader(opts Options) (*Reader, error) {
	r := &Reader{
		period:      opts.Period,
		timeout:     opts.Timeout,
		concurrency: opts.Concurrency,
		kinds:       maps.Clone(builtin),
		client:      opts.Client,
		now:         opts.Clock,
		onError:     opts.OnError,
	}
	if r.period < 0 {
		return nil, fmt.Errorf("period %v is negative", r.period)
	}
	if r.period == 0 {
		r.period = DefaultPeriod
	}
	if r.timeout < 0 {
		return nil, fmt.Errorf("timeout %v is negative", r.timeout)
	}
	if r.timeout == 0 {
		r.timeout = r.period / 2
	}
	if r.timeout > r.period {
		return nil, fmt.Errorf("timeout %v exceeds period %v: passes would overlap", r.timeout, r.period)
	}
	if r.concurrency < 0 {
		return nil, fmt.Errorf("concurrency %d is negative", r.concurrency)
	}
	if r.concurrency == 0 {
		r.concurrency = DefaultConcurrency
	}
	for _, kind := range slices.Sorted(maps.Keys(opts.Kinds)) {
		n := opts.Kinds[kind]
		if kind == "" {
			return nil, errors.New("kinds: a kind has an empty name")
		}
		if err := n.validate(); err != nil {
			return nil, fmt.Errorf("kind %q %w", kind, err)
		}
		r.kinds[kind] = n
	}
	if r.client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns = 0 // no limit: one kept-alive connection per endpoint
		r.client = &http.Client{Timeout: r.timeout, Transport: t}
	}
	c := *r.client // a copy: the caller's client keeps its own policy
	c.CheckRedirect = sameOrigin
	r.client = &c
	if r.now == nil {
		r.now = time.Now
	}
	r.mu.domains = map[string]*domain{}
	r.mu.signals = map[string]Signal{}
	return r, nil
}

// SetDomains replaces the set of domains and their endpoints, as a topology
// reload does. An endpoint of unknown kind or with a URL that is not http or
// https is an error naming the domain, and changes nothing. A domain that
// stays keeps its last Signal until the next pass; a domain that goes loses
// it.
func (r *Reader) SetDomains(m map[string][]Endpoint) error {
	next := make(map[string][]target, len(m))
	for _, name := range slices.Sorted(maps.Keys(m)) {
		ts := make([]target, 0, len(m[name]))
		for i, e := range m[name] {
			n, ok := r.kinds[e.Kind]
			if !ok {
				return fmt.Errorf("domain %q endpoint %d (%s): unknown kind %q (known: %v)", name, i, e.URL, e.Kind, r.kindNames())
			}
			u, err := url.Parse(e.URL)
			if err != nil {
				return fmt.Errorf("domain %q endpoint %d: %w", name, i, err)
			}
			if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("domain %q endpoint %d: URL %q is not an http or https URL with a host", name, i, e.URL)
			}
			ts = append(ts, target{Endpoint: e, names: n})
		}
		next[name] = ts
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	domains := make(map[string]*domain, len(next))
	for name, ts := range next {
		if old, ok := r.mu.domains[name]; ok && slices.Equal(old.targets, ts) {
			domains[name] = old // unchanged: a pass in flight may still write it
			continue
		}
		domains[name] = &domain{targets: ts}
	}
	for name := range r.mu.signals {
		if _, ok := domains[name]; !ok {
			delete(r.mu.signals, name)
		}
	}
	urls := make(map[string]bool)
	for _, es := range m {
		for _, e := range es {
			urls[e.URL] = true
		}
	}
	for url := range r.mu.samples {
		if !urls[url] {
			delete(r.mu.samples, url)
		}
	}
	r.mu.domains = domains
	return nil
}

// kindNames lists the kinds r knows, for an error.
func (r *Reader) kindNames() []string {
	return slices.Sorted(maps.Keys(r.kinds))
}

// result is one endpoint's read in a pass.
type result struct {
	s   Sample
	at  time.Time
	err error
}

// Poll makes one pass: it reads every endpoint of every domain, at most
// Concurrency at a time, and updates each domain's Signal. A domain whose
// every endpoint failed keeps its last values and At, with Failed updated.
// A pass cut short by ctx changes nothing, since its failures say nothing
// about the engines.
func (r *Reader) Poll(ctx context.Context) {
	r.pass.Lock()
	defer r.pass.Unlock()

	r.mu.Lock()
	snapshot := maps.Clone(r.mu.domains)
	r.mu.Unlock()

	names := slices.Sorted(maps.Keys(snapshot))
	var jobs []target
	var owner []string
	for _, name := range names {
		for _, t := range snapshot[name].targets {
			jobs = append(jobs, t)
			owner = append(owner, name)
		}
	}
	results := make([]result, len(jobs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(r.concurrency, len(jobs)) {
		wg.Go(func() {
			for i := range next {
				s, err := r.read(ctx, jobs[i])
				results[i] = result{s: s, at: r.now(), err: err}
			}
		})
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	if r.onError != nil {
		for i, res := range results {
			if res.err != nil {
				r.onError(owner[i], jobs[i].Endpoint, res.err)
			}
		}
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	i := 0
	for _, name := range names {
		d := snapshot[name]
		n := len(d.targets)
		rs := results[i : i+n]
		i += n
		if r.mu.domains[name] != d {
			continue // reloaded during the pass: this pass read the old endpoints
		}
		if r.mu.samples == nil {
			r.mu.samples = make(map[string]endpointSample)
		}
		for j, res := range rs {
			if res.err == nil {
				r.mu.samples[d.targets[j].URL] = endpointSample{res.s, res.at}
			}
		}
		r.updateLocked(name, n, rs)
	}
}

// updateLocked folds one domain's reads into its Signal. r.mu must be held.
func (r *Reader) updateLocked(name string, n int, rs []result) {
	var s Signal
	read := false
	for _, res := range rs {
		if res.err != nil {
			s.Failed++
			continue
		}
		s.Queue += res.s.Queue
		s.Running += res.s.Running
		s.KVUsage = max(s.KVUsage, res.s.KVUsage)
		if !read || res.at.Before(s.At) {
			s.At = res.at
		}
		read = true
	}
	s.Endpoints = n
	if !read {
		old, ok := r.mu.signals[name]
		if !ok {
			return // never read: Signal keeps saying so
		}
		old.Endpoints, old.Failed = n, s.Failed
		r.mu.signals[name] = old
		return
	}
	r.mu.signals[name] = s
}

// maxRedirects bounds the redirects one read follows: a metrics app
// mounted under /metrics redirects to /metrics/ once.
const maxRedirects = 3

// sameOrigin is the Reader's redirect policy: a redirect is followed only
// to the scheme, host and port of the endpoint's URL. Anywhere else is
// another server, whose queue would be taken for this domain's.
func sameOrigin(req *http.Request, via []*http.Request) error {
	if len(via) > maxRedirects {
		return fmt.Errorf("stopped after %d redirects", maxRedirects)
	}
	if to, from := origin(req.URL), origin(via[0].URL); to != from {
		return fmt.Errorf("redirected to %s: engine metrics are read only from %s, the endpoint's own host and port", req.URL.Redacted(), from)
	}
	return nil
}

// origin is u's scheme, host and port, the port made explicit.
func origin(u *url.URL) string {
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		}
	}
	return strings.ToLower(u.Scheme) + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// read fetches and parses one endpoint within r.timeout.
func (r *Reader) read(ctx context.Context, t target) (Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
	if err != nil {
		return Sample{}, err
	}
	// Ask for the classic text format: the engines' Python clients would
	// otherwise answer an OpenMetrics request in a form TextParser reads
	// differently.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := r.client.Do(req)
	if err != nil {
		return Sample{}, err
	}
	defer func() {
		// Drain a little so the connection is reused next pass, not redialled.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		return Sample{}, fmt.Errorf("GET %s: %s", t.URL, resp.Status)
	}
	// Read the whole body before parsing: an oversized one fails at the
	// cost of copying it, not of parsing it, and the parse holds no
	// connection.
	buf := bodies.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooled {
			buf.Reset()
			bodies.Put(buf)
		}
	}()
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, MaxBody+1)); err != nil {
		return Sample{}, fmt.Errorf("GET %s: read body: %w", t.URL, err)
	}
	if buf.Len() > MaxBody {
		return Sample{}, fmt.Errorf("GET %s: exposition exceeds %d bytes", t.URL, MaxBody)
	}
	s, err := Parse(bytes.NewReader(buf.Bytes()), t.names)
	if err != nil {
		return Sample{}, fmt.Errorf("GET %s: %w", t.URL, err)
	}
	return s, nil
}

// maxPooled is the largest body buffer kept for reuse: an engine's usual
// exposition, so one oversized answer does not pin MaxBody per worker.
const maxPooled = 256 << 10

// bodies recycles body buffers across reads, since every endpoint is read
// every Period.
var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// Run polls every Period until ctx ends, calling onPass (when not nil) after
// each complete pass, so a caller can recompute saturation as soon as the
// signals change. A pass that overruns Period delays the next rather than
// stacking passes.
func (r *Reader) Run(ctx context.Context, onPass func()) {
	tick := time.NewTicker(r.period)
	defer tick.Stop()
	for {
		r.Poll(ctx)
		if ctx.Err() != nil {
			return
		}
		if onPass != nil {
			onPass()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Signal returns domain's last Signal; false if it was never read, or is no
// longer a domain.
func (r *Reader) Signal(domain string) (Signal, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.mu.signals[domain]
	return s, ok
}

// Signals returns a copy of every domain's last Signal, keyed by domain.
// Domains never read are absent.
func (r *Reader) Signals() map[string]Signal {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.mu.signals)
}
