package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"time"

	"github.com/sluice-sched/sluice/internal/auth"
	"github.com/sluice-sched/sluice/internal/gateway"
)

// The paths served.
const (
	PathChat        = "/v1/chat/completions"
	PathCompletions = "/v1/completions"
	PathResponses   = "/v1/responses"
	PathModels      = "/v1/models"
)

// DefaultWriteTimeout bounds one write to the client, as the HTTP port's
// WriteTimeout bounds a whole answer: a client that reads nothing for this
// long is cut, a stream that goes on is not.
const DefaultWriteTimeout = 30 * time.Second

// Options configure a Front.
type Options struct {
	// Identify names the caller of a request (auth.Authenticator's
	// IdentifyClient); nil: every caller is trusted, the tenant header
	// names the tenant.
	Identify func(*http.Request) (auth.Client, error)
	// WriteTimeout bounds each write to the client; 0: DefaultWriteTimeout.
	WriteTimeout time.Duration
	// Transport carries requests to the engines; nil: NewTransport().
	Transport http.RoundTripper
	// Logger logs the engines' errors; nil: slog.Default().
	Logger *slog.Logger
}

// Front is the OpenAI-compatible HTTP handler over a Gateway. Safe for
// concurrent use.
type Front struct {
	gw    *gateway.Gateway
	o     Options
	proxy *httputil.ReverseProxy
	mux   *http.ServeMux
}

// New returns the front deciding through gw.
func New(gw *gateway.Gateway, o Options) *Front {
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.Transport == nil {
		o.Transport = NewTransport()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	f := &Front{gw: gw, o: o}
	f.proxy = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      o.Transport,
		FlushInterval:  -1, // every write reaches the client at once: SSE is not buffered
		ModifyResponse: modifyResponse,
		ErrorHandler:   f.upstreamError,
		BufferPool:     copyBuffers{},
		ErrorLog:       slog.NewLogLogger(o.Logger.Handler(), slog.LevelWarn),
	}
	f.mux = http.NewServeMux()
	for _, p := range []string{PathChat, PathCompletions, PathResponses} {
		f.mux.HandleFunc(p, f.serveGenerate)
	}
	f.mux.HandleFunc(PathModels, f.serveModels)
	f.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no route "+clip(r.URL.Path)+": the front serves "+PathChat+", "+PathCompletions+", "+PathResponses+" and "+PathModels, "invalid_request_error", "unknown_url")
	})
	return f
}

// NewTransport is a transport for many requests to a few engines: idle
// connections kept per engine for the concurrency a front sees (Go's
// default keeps 2, and every request past them would dial), no
// compression (the response is read for its usage as it passes, and an
// event stream must not wait on a compressor), no response header timeout
// (an engine answers a whole completion only when it is done).
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          0, // no bound in all: the per-host bound decides
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		ExpectContinueTimeout: 0,
		WriteBufferSize:       32 << 10,
		ReadBufferSize:        32 << 10,
	}
}

// ServeHTTP implements http.Handler.
func (f *Front) ServeHTTP(w http.ResponseWriter, r *http.Request) { f.mux.ServeHTTP(w, r) }

// caller identifies the request's caller; false: answered (401, 403).
func (f *Front) caller(w http.ResponseWriter, r *http.Request) (auth.Client, bool) {
	if f.o.Identify == nil {
		return auth.Client{}, true
	}
	c, err := f.o.Identify(r)
	switch {
	case errors.Is(err, auth.ErrUnauthenticated):
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluiced"`)
		writeError(w, http.StatusUnauthorized, err.Error()+" (an API key from the auth file's api_keys)", "invalid_request_error", "invalid_api_key")
		return c, false
	case err != nil:
		writeError(w, http.StatusInternalServerError, "identifying the caller failed", "server_error", "internal_error")
		return c, false
	case c.Principal != nil && !c.Principal.Has(auth.RoleGateway):
		writeError(w, http.StatusForbidden, "principal "+c.Principal.Name+" may not name a tenant: send an API key, or hold the gateway role", "permission_error", "permission_denied")
		return c, false
	}
	return c, true
}

// forward is what the proxy needs of one request, in its context.
type forward struct {
	x        *gateway.Exchange
	endpoint string
	body     []byte
	domain   string
	model    string
	// credential: the Authorization header is Sluice's (an API key or a
	// principal's token), not the engine's.
	credential bool
}

type forwardKey struct{}

// serveGenerate runs one completion through the lifecycle.
func (f *Front) serveGenerate(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, r.Method+" "+r.URL.Path+": want POST", "invalid_request_error", "method_not_allowed")
		return
	}
	client, ok := f.caller(w, r)
	if !ok {
		return
	}
	x := f.gw.Start()
	// Every way out of the handler releases a lease still held: the
	// client gone while waiting or streaming, a failed write (the proxy
	// panics with http.ErrAbortHandler), a refusal. After Done it does
	// nothing.
	defer x.Abort(gateway.OutcomeClientCancel)
	tenantHeader := f.gw.Options().TenantHeader
	get := func(name string) string {
		if name == tenantHeader && client.Tenant != "" {
			return client.Tenant // the key names the tenant, whatever the header says
		}
		return r.Header.Get(name)
	}
	if v := x.RequestHeaders(r.URL.Path, get); v != nil {
		f.answer(w, v)
		return
	}
	if v, err := readBody(x, r, f.gw.Options().MaxBody); v != nil || err != nil {
		if v != nil {
			f.answer(w, v)
		}
		return // a broken body: the client is gone or too slow
	}
	rc := http.NewResponseController(w)
	// The body is in: from here the request may wait in the fair queue and
	// then stream for longer than the server's timeouts. Lift them; each
	// write sets its own (deadlineWriter).
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	v := x.Decide(r.Context())
	if v.Status == 499 { // the client left: nobody to answer
		return
	}
	dw := &deadlineWriter{ResponseWriter: w, rc: rc, timeout: f.o.WriteTimeout}
	if !v.Forward() {
		dw.extend()
		f.answer(dw, &v)
		return
	}
	fw := &forward{x: x, endpoint: v.Endpoint, body: v.Body, domain: v.Domain, model: v.Model,
		credential: f.o.Identify != nil && r.Header.Get("Authorization") != ""}
	f.proxy.ServeHTTP(dw, r.WithContext(context.WithValue(r.Context(), forwardKey{}, fw)))
}

// readBody reads the request body, at most max bytes and one more to see
// that it is past them, into a buffer of its own (the Exchange keeps it,
// and forwards it), and gives it to x: a Verdict is a refusal (413, or 400
// for no body at all), an error a body that broke off.
func readBody(x *gateway.Exchange, r *http.Request, max int) (*gateway.Verdict, error) {
	var body []byte
	var err error
	if n := r.ContentLength; n >= 0 && n <= int64(max) {
		body = make([]byte, n)
		_, err = io.ReadFull(r.Body, body)
	} else {
		body, err = io.ReadAll(io.LimitReader(r.Body, int64(max)+1))
	}
	switch {
	case err != nil:
		return nil, err
	case len(body) == 0:
		// A completion without a body would go to an engine unadmitted.
		x.Abort(gateway.OutcomeInvalid)
		return &gateway.Verdict{Status: http.StatusBadRequest, Headers: [][2]string{{"content-type", "application/json"}},
			Body: gateway.ErrorBody("the request has no body: want a JSON object naming the model and the prompt", "invalid_request_error", "", "invalid_body")}, nil
	}
	return x.AppendBody(body), nil
}

// answer writes a Verdict that is not forwarded.
func (f *Front) answer(w http.ResponseWriter, v *gateway.Verdict) {
	h := w.Header()
	for _, kv := range v.Headers {
		h.Set(kv[0], kv[1])
	}
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/json")
	}
	w.WriteHeader(v.Status)
	_, _ = w.Write(v.Body)
}

// rewrite points the outbound request at the chosen engine with the body
// the gateway decided on.
func rewrite(pr *httputil.ProxyRequest) {
	fw := pr.In.Context().Value(forwardKey{}).(*forward)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = fw.endpoint
	pr.Out.Host = fw.endpoint
	pr.Out.Body = io.NopCloser(bytes.NewReader(fw.body))
	pr.Out.ContentLength = int64(len(fw.body))
	pr.Out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(fw.body)), nil }
	h := pr.Out.Header
	h.Del("Content-Length")
	h.Del("Accept-Encoding") // the response is read for its usage: plain
	if fw.credential {
		h.Del("Authorization")
	}
}

// modifyResponse reads the engine's status, names the decision in the
// client's headers and routes the body through the Exchange.
func modifyResponse(resp *http.Response) error {
	fw := resp.Request.Context().Value(forwardKey{}).(*forward)
	ct := resp.Header.Get("Content-Type")
	fw.x.ResponseHeaders(resp.StatusCode, ct)
	if strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "text/event-stream") {
		// The usage event the client did not ask for is taken out.
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
	}
	if fw.domain != "" {
		resp.Header.Set("X-Sluice-Domain", fw.domain)
		resp.Header.Set("X-Sluice-Model", fw.model)
	}
	resp.Body = &exchangeBody{body: resp.Body, x: fw.x, ctx: resp.Request.Context()}
	return nil
}

// upstreamError answers a request the engine did not answer (refused the
// connection, reset it before a response): 502 in OpenAI's shape.
func (f *Front) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	fw := r.Context().Value(forwardKey{}).(*forward)
	if r.Context().Err() != nil {
		fw.x.Abort(gateway.OutcomeClientCancel)
		return
	}
	fw.x.Abort(gateway.OutcomeUpstreamError)
	f.o.Logger.Warn("openai front: the engine did not answer", "endpoint", fw.endpoint, "err", err)
	writeError(w, http.StatusBadGateway, "the engine at "+fw.endpoint+" did not answer", "server_error", "upstream_error")
}

// exchangeBody is the engine's response body as the client gets it: each
// read goes through the Exchange, and its end ends the Exchange.
type exchangeBody struct {
	body    io.ReadCloser
	x       *gateway.Exchange
	ctx     context.Context
	pending []byte // output past the caller's buffer, passed on next
	ended   bool
}

// Read implements io.Reader.
func (b *exchangeBody) Read(p []byte) (int, error) {
	if len(b.pending) > 0 {
		n := copy(p, b.pending)
		b.pending = b.pending[n:]
		if len(b.pending) == 0 && b.ended {
			return n, io.EOF
		}
		return n, nil
	}
	if b.ended {
		return 0, io.EOF
	}
	n, err := b.body.Read(p)
	end := errors.Is(err, io.EOF)
	out := b.x.ResponseBody(p[:n], end)
	k := len(out)
	if k > 0 && (n == 0 || &out[0] != &p[0]) { // rewritten: a usage event left out, or held back
		k = copy(p, out)
		b.pending = append(b.pending[:0], out[k:]...)
	}
	switch {
	case end:
		b.ended = true
		if len(b.pending) > 0 {
			return k, nil
		}
		return k, io.EOF
	case err != nil:
		// The stream broke: the client's leaving cancels the engine's
		// request too, else the engine (or the path to it) failed.
		if b.ctx.Err() != nil {
			b.x.Abort(gateway.OutcomeClientCancel)
		} else {
			b.x.Abort(gateway.OutcomeUpstreamError)
		}
		return k, err
	}
	return k, nil
}

// Close implements io.Closer.
func (b *exchangeBody) Close() error { return b.body.Close() }

// deadlineWriter gives each write to the client WriteTimeout from the last
// extension, extended again once half of it has passed: a long stream
// goes on, a client that stops reading is cut.
type deadlineWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController
	timeout  time.Duration
	deadline time.Time
}

// extend moves the write deadline on when less than half of it is left.
func (d *deadlineWriter) extend() {
	now := time.Now()
	if d.deadline.Sub(now) < d.timeout/2 {
		d.deadline = now.Add(d.timeout)
		_ = d.rc.SetWriteDeadline(d.deadline)
	}
}

// WriteHeader implements http.ResponseWriter.
func (d *deadlineWriter) WriteHeader(code int) {
	d.extend()
	d.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (d *deadlineWriter) Write(p []byte) (int, error) {
	d.extend()
	return d.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController (the proxy's flushes) reach the
// server's writer.
func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }

// serveModels lists the models Sluice places, by their served names.
func (f *Front) serveModels(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		writeError(w, http.StatusMethodNotAllowed, r.Method+" "+r.URL.Path+": want GET", "invalid_request_error", "method_not_allowed")
		return
	}
	if _, ok := f.caller(w, r); !ok {
		return
	}
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
		Root    string `json:"root"` // Sluice's model that the name is served as
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	for _, m := range f.gw.ServedModels() {
		list.Data = append(list.Data, model{ID: m.Name, Object: "model", OwnedBy: "sluice", Root: m.Model})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

// writeError answers in OpenAI's error shape.
func writeError(w http.ResponseWriter, status int, message, typ, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(gateway.ErrorBody(message, typ, "", code))
}

// clip bounds a client's text quoted back in an answer.
func clip(s string) string {
	if len(s) > 128 {
		return s[:128] + "…"
	}
	return s
}

// copyPool holds the buffers requests and responses are copied through.
var copyPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyBuffers is the proxy's httputil.BufferPool over copyPool.
type copyBuffers struct{}

func (copyBuffers) Get() []byte  { return *copyPool.Get().(*[]byte) }
func (copyBuffers) Put(b []byte) { copyPool.Put(&b) }
