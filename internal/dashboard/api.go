package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/auth"
)

// Bounds on what the API reads.
const (
	maxActionBody = 16 << 10 // a drain reason is at most 1 KiB; the rest is slack for JSON
	maxQuery      = 128      // a tenant search, as long as a tenant name may be
	// writeWait bounds each write to an event stream: a reader that stops
	// reading loses its stream instead of holding a goroutine forever.
	writeWait = 10 * time.Second
)

// Audited action names: the gRPC methods', so that one query finds both.
const (
	actionDrain   = "DrainDomain"
	actionUndrain = "UndrainDomain"
)

// apiError is the body of every error the API answers itself (the auth
// middleware's 401 and 403 are plain text, as on /v1/domains).
type apiError struct {
	Code    string `json:"code"`    // the gRPC code's name, e.g. "NOT_FOUND"
	Message string `json:"message"` // safe to show
}

// writeError answers err, a gRPC status error or not, with the HTTP status
// that matches its code.
func writeError(w http.ResponseWriter, err error) {
	st, _ := status.FromError(err)
	httpStatus := map[codes.Code]int{
		codes.InvalidArgument:    http.StatusBadRequest,
		codes.NotFound:           http.StatusNotFound,
		codes.PermissionDenied:   http.StatusForbidden,
		codes.Unauthenticated:    http.StatusUnauthorized,
		codes.FailedPrecondition: http.StatusConflict,
		codes.Unimplemented:      http.StatusNotImplemented,
		codes.Unavailable:        http.StatusServiceUnavailable,
		codes.ResourceExhausted:  http.StatusTooManyRequests,
	}[st.Code()]
	if httpStatus == 0 {
		httpStatus = http.StatusInternalServerError
	}
	writeJSON(w, httpStatus, apiError{Code: codeName(st.Code()), Message: st.Message()})
}

// codeName is a gRPC code as the status JSON spells it: "NOT_FOUND" for
// NotFound.
func codeName(c codes.Code) string {
	if c == codes.OK {
		return "OK"
	}
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// writeJSON answers v as JSON with status code.
func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	writeBody(w, code, b)
}

// writeProto answers m as the gRPC message's JSON.
func writeProto(w http.ResponseWriter, m proto.Message) {
	writeBody(w, http.StatusOK, protoJSON(m))
}

func writeBody(w http.ResponseWriter, code int, b []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// badRequest is an INVALID_ARGUMENT naming a query parameter.
func badRequest(field, reason string) error {
	return status.Errorf(codes.InvalidArgument, "invalid %s: %s", field, reason)
}

func (d *Dashboard) serveDomains(w http.ResponseWriter, r *http.Request) {
	resp, err := d.opts.Operator.ListDomains(r.Context(), &admissionv1.ListDomainsRequest{})
	if err != nil {
		writeError(w, err)
		return
	}
	writeProto(w, resp)
}

func (d *Dashboard) serveTopology(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, topologyView(d.opts.State.Topology()))
}

func (d *Dashboard) serveTenants(w http.ResponseWriter, r *http.Request) {
	req := &admissionv1.ListTenantsRequest{PageToken: r.URL.Query().Get("page_token")}
	if s := r.URL.Query().Get("page_size"); s != "" {
		n, err := strconv.ParseInt(s, 10, 32)
		if err != nil {
			writeError(w, badRequest("page_size", "not a 32-bit integer"))
			return
		}
		req.PageSize = int32(n)
	}
	resp, err := d.opts.Operator.ListTenants(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeProto(w, resp)
}

func (d *Dashboard) serveTenant(w http.ResponseWriter, r *http.Request) {
	resp, err := d.opts.Operator.GetTenant(r.Context(), &admissionv1.GetTenantRequest{Name: r.PathValue("name")})
	if err != nil {
		writeError(w, err)
		return
	}
	writeProto(w, resp)
}

func (d *Dashboard) serveSession(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, d.session(r))
}

func (d *Dashboard) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	q, err := parseTableQuery(r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	b, _ := json.Marshal(topologyView(d.opts.State.Topology()))
	s, err := d.snapshot(r.Context(), q, d.session(r), topologyVersion(b))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s)
}

// parseTableQuery reads q, sort and n.
func parseTableQuery(v url.Values) (tableQuery, error) {
	q := tableQuery{q: v.Get("q"), sort: v.Get("sort"), n: DefaultRows}
	if len(q.q) > maxQuery {
		return q, badRequest("q", "must be at most "+strconv.Itoa(maxQuery)+" bytes")
	}
	switch q.sort {
	case "":
		q.sort = "traffic"
	case "traffic", "name":
	default:
		return q, badRequest("sort", `must be "traffic" or "name"`)
	}
	if s := v.Get("n"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return q, badRequest("n", "must be a positive integer")
		}
		q.n = min(n, MaxRows)
	}
	return q, nil
}

// session describes the caller; the viewer middleware has put the
// principal in the request's context when auth is on.
func (d *Dashboard) session(r *http.Request) SessionView {
	if d.opts.Auth == nil || d.opts.Auth.Open() {
		return SessionView{Principal: "anonymous", CanAct: d.opts.Actions}
	}
	p, ok := auth.FromContext(r.Context())
	if !ok {
		return SessionView{Principal: "unauthenticated", AuthOn: true}
	}
	return SessionView{Principal: p.Name, CanAct: p.Has(auth.RoleOperator), AuthOn: true}
}

// serveEvents streams snapshots as server-sent events: "topology" (a
// TopologyView) first and whenever it changes, then "snapshot" every Every
// and at once after an action taken here.
func (d *Dashboard) serveEvents(w http.ResponseWriter, r *http.Request) {
	q, err := parseTableQuery(r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	select {
	case d.streams <- struct{}{}:
		defer func() { <-d.streams }()
	default:
		writeError(w, status.Errorf(codes.ResourceExhausted, "%d dashboard streams are open already; try again later", cap(d.streams)))
		return
	}
	rc := http.NewResponseController(w)
	// The server's read timeout would end a stream too: net/http cancels a
	// request whose connection's read deadline passes. A stream reads
	// nothing more after its request, so it has none.
	_ = rc.SetReadDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // a proxy in front must not hold the events back
	w.WriteHeader(http.StatusOK)
	sess := d.session(r)
	tick := time.NewTicker(d.opts.Every)
	defer tick.Stop()
	lastTopo := ""
	for {
		changed := d.changedChan()
		if err := d.sendEvents(r.Context(), w, rc, q, sess, &lastTopo); err != nil {
			d.opts.Logger.Debug("dashboard stream ended", "peer", r.RemoteAddr, "err", err)
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-d.done:
			return
		case <-tick.C:
		case <-changed:
		}
	}
}

// sendEvents writes the topology when it changed and a snapshot, then
// flushes.
func (d *Dashboard) sendEvents(ctx context.Context, w io.Writer, rc *http.ResponseController, q tableQuery, sess SessionView, lastTopo *string) error {
	// The server's write timeout would end a stream; each write gets its
	// own deadline instead.
	_ = rc.SetWriteDeadline(time.Now().Add(writeWait))
	topo, err := json.Marshal(topologyView(d.opts.State.Topology()))
	if err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	version := topologyVersion(topo)
	if version != *lastTopo {
		if _, err := fmt.Fprintf(w, "event: topology\ndata: %s\n\n", topo); err != nil {
			return fmt.Errorf("write topology: %w", err)
		}
		*lastTopo = version
	}
	s, err := d.snapshot(ctx, q, sess, version)
	if err != nil {
		return err
	}
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if _, err := fmt.Fprintf(w, "event: snapshot\ndata: %s\n\n", b); err != nil {
		return fmt.Errorf("write snapshot: %w", err)
	}
	if err := rc.Flush(); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	return nil
}

// action returns the handler of a drain or undrain: the caller must hold
// the operator role (or, without an auth file, actions must be on), send
// JSON from this origin, and every outcome is audited.
func (d *Dashboard) action(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		domain := r.PathValue("domain")
		ev := auth.Event{Principal: "anonymous", Peer: r.RemoteAddr, Action: name, Target: domain}
		refuse := func(outcome string, err error) {
			ev.Outcome, ev.Err = outcome, err
			d.opts.Audit.Record(r.Context(), ev)
			if outcome == auth.OutcomeUnauthenticated {
				w.Header().Set("WWW-Authenticate", `Bearer realm="sluiced"`)
			}
			writeError(w, err)
		}
		if d.opts.Auth != nil && !d.opts.Auth.Open() {
			p, err := d.opts.Auth.IdentifyHTTP(r)
			if err != nil {
				ev.Principal = "unauthenticated"
				refuse(auth.OutcomeUnauthenticated, status.Error(codes.Unauthenticated, err.Error()))
				return
			}
			ev.Principal = p.Name
			if !p.Has(auth.RoleOperator) {
				refuse(auth.OutcomeDenied, status.Errorf(codes.PermissionDenied, "principal %q may not %s: it needs the operator role", p.Name, name))
				return
			}
		} else if !d.opts.Actions {
			refuse(auth.OutcomeDenied, status.Error(codes.PermissionDenied,
				"dashboard actions are off: start sluiced with --auth (the operator role may act) or --dashboard-actions"))
			return
		}
		if err := sameOriginJSON(r); err != nil {
			refuse(auth.OutcomeDenied, err)
			return
		}
		reason, err := readReason(w, r)
		if err != nil {
			refuse(auth.OutcomeFailed, err)
			return
		}
		ev.Reason = reason
		var resp proto.Message
		switch name {
		case actionDrain:
			resp, err = d.opts.Operator.DrainDomain(r.Context(), &admissionv1.DrainDomainRequest{Domain: domain, Reason: reason})
		default:
			resp, err = d.opts.Operator.UndrainDomain(r.Context(), &admissionv1.UndrainDomainRequest{Domain: domain})
		}
		if err != nil {
			refuse(auth.OutcomeFailed, err)
			return
		}
		ev.Outcome = auth.OutcomeOK
		d.opts.Audit.Record(r.Context(), ev)
		if name == actionDrain {
			d.setMark(domain, &actionMark{by: ev.Principal, at: d.opts.Now(), reason: reason})
		} else {
			d.setMark(domain, nil)
		}
		d.notify()
		writeProto(w, resp)
	})
}

// sameOriginJSON refuses what a page of another site could make a browser
// send: a body that is not JSON (a form post needs no CORS preflight; a JSON
// one does, and it is never granted), or an Origin other than this host.
func sameOriginJSON(r *http.Request) error {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return status.Error(codes.PermissionDenied, "actions need Content-Type: application/json")
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return status.Error(codes.PermissionDenied, "cross-origin action refused")
		}
	}
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return status.Error(codes.PermissionDenied, "cross-site action refused")
	}
	return nil
}

// readReason reads the body, {"reason": "..."} or empty, as the request
// message's JSON (unknown fields refused, as protojson does).
func readReason(w http.ResponseWriter, r *http.Request) (string, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxActionBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return "", badRequest("body", "larger than "+strconv.Itoa(maxActionBody)+" bytes")
		}
		return "", badRequest("body", err.Error())
	}
	if len(body) == 0 {
		return "", nil
	}
	var req admissionv1.DrainDomainRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		return "", badRequest("body", err.Error())
	}
	if req.GetDomain() != "" && req.GetDomain() != r.PathValue("domain") {
		return "", badRequest("domain", "the body names another domain than the path")
	}
	return req.GetReason(), nil
}
