package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/grpcserver"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/auth"
	"github.com/sluice-sched/sluice/internal/auth/authtest"
	"github.com/sluice-sched/sluice/internal/cli"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/dashboard"
	"github.com/sluice-sched/sluice/internal/testwait"
	"github.com/sluice-sched/sluice/topology"
)

// fakeState is the server's side of the dashboard over a real engine: the
// simulated cluster and the config's tenant names.
type fakeState struct {
	eng     *admission.Engine
	cluster topology.Cluster
	names   []string
	cfg     admission.Config
}

func (s *fakeState) Topology() topology.Cluster { return s.cluster }
func (s *fakeState) TenantNames() []string      { return s.names }
func (s *fakeState) TenantBudget(name, tier string) admission.Budget {
	if b := s.cfg.Tenants[name].Overrides().Budget; b != nil {
		return *b
	}
	return s.cfg.Tiers[tier].Budget
}
func (s *fakeState) QueueLen() int   { return s.eng.QueueLen() }
func (s *fakeState) LeaseCount() int { return s.eng.LeaseCount() }

// fixture is a dashboard on httptest over a real engine.
type fixture struct {
	url     string
	eng     *admission.Engine
	dash    *dashboard.Dashboard
	traffic *dashboard.Traffic
	// auditOK counts sluice_audit_actions_total{action,outcome}.
	auditOK func(action, outcome string) float64
}

// Test principals' tokens (the auth file holds their digests).
const (
	viewerToken   = "viewer-token"
	operatorToken = "operator-token"
	routerToken   = "router-token"
)

// fixtureOpts choose the fixture's auth and size.
type fixtureOpts struct {
	authOn  bool
	actions bool
	extra   int // tenants beyond the embedded config's four, named t00000…
	// configStatus answers the Operator's GetConfigStatus; nil leaves it
	// UNIMPLEMENTED.
	configStatus grpcserver.ConfigStatusSource
}

func newFixture(t *testing.T, fo fixtureOpts) *fixture {
	t.Helper()
	cfg, err := config.Default()
	if err != nil {
		t.Fatal(err)
	}
	for i := range fo.extra {
		cfg.Tenants[fmt.Sprintf("t%05d", i)] = admission.TenantConfig{Tier: "free"}
	}
	traffic := dashboard.NewTraffic()
	cluster := topology.Simulated()
	eng, err := admission.New(cfg, cluster, admission.WithObserver(traffic))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go eng.Run(ctx)
	t.Cleanup(eng.Close)
	st := &fakeState{eng: eng, cluster: cluster, cfg: cfg}
	for n := range cfg.Tenants {
		st.names = append(st.names, n)
	}
	slices.Sort(st.names)

	reg := prometheus.NewRegistry()
	audit, err := auth.NewAuditor(slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	var authn *auth.Authenticator
	if fo.authOn {
		file := filepath.Join(t.TempDir(), "auth.yaml")
		authtest.WriteFile(t, file, []byte(fmt.Sprintf(`principals:
  - {name: ops, token_sha256: %q, roles: [operator]}
  - {name: watcher, token_sha256: %q, roles: [viewer]}
  - {name: router-acme, token_sha256: %q, roles: [router], tenants: [acme]}
`, authtest.TokenSHA256(operatorToken), authtest.TokenSHA256(viewerToken), authtest.TokenSHA256(routerToken))))
		if authn, err = auth.New(file, nil, audit); err != nil {
			t.Fatal(err)
		}
	} else if authn, err = auth.New("", nil, audit); err != nil {
		t.Fatal(err)
	}
	var opOpts []grpcserver.RegisterOption
	if fo.configStatus != nil {
		opOpts = append(opOpts, grpcserver.WithConfigStatus(fo.configStatus))
	}
	d, err := dashboard.New(dashboard.Options{
		Operator: grpcserver.NewOperator(eng, opOpts...), State: st, Traffic: traffic,
		Auth: authn, Audit: audit, Actions: fo.actions,
		Build:   cli.Build{Version: "v1.4.2", Revision: "0123456789abcdef0123456789abcdef01234567", GoVersion: "go1.24"},
		Replica: func() string { return "sluiced-2" },
		Every:   50 * time.Millisecond, SampleEvery: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	go d.Run(ctx)
	mux := http.NewServeMux()
	d.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(d.Close) // before srv.Close runs (cleanups run last first): streams end
	return &fixture{url: srv.URL, eng: eng, dash: d, traffic: traffic,
		auditOK: func(action, outcome string) float64 { return auth.AuditCount(reg, action, outcome) }}
}

// call makes one request with token (none when ""), returning the status
// and body.
func (f *fixture) call(t *testing.T, method, path, token, contentType, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, f.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func (f *fixture) get(t *testing.T, path, token string) (int, []byte) {
	t.Helper()
	return f.call(t, http.MethodGet, path, token, "", "")
}

func (f *fixture) post(t *testing.T, path, token, body string) (int, []byte) {
	t.Helper()
	return f.call(t, http.MethodPost, path, token, "application/json", body)
}

func TestAPIRolesWithAuth(t *testing.T) {
	f := newFixture(t, fixtureOpts{authOn: true})
	reads := []string{"/api/v1/domains", "/api/v1/topology", "/api/v1/tenants", "/api/v1/tenants/acme", "/api/v1/dashboard", "/api/v1/session"}
	for _, path := range reads {
		for _, tc := range []struct {
			token string
			want  int
		}{{"", 401}, {"guessed", 401}, {routerToken, 403}, {viewerToken, 200}, {operatorToken, 200}} {
			if code, body := f.get(t, path, tc.token); code != tc.want {
				t.Errorf("GET %s with %q = %d %s, want %d", path, tc.token, code, body, tc.want)
			}
		}
	}
	// The page and its assets hold no data: open to all.
	for _, path := range []string{"/", "/assets/app.js", "/assets/style.css"} {
		if code, _ := f.get(t, path, ""); code != 200 {
			t.Errorf("GET %s = %d, want 200", path, code)
		}
	}

	// Actions: the operator role only, every outcome audited.
	for _, tc := range []struct {
		token, outcome string
		want           int
	}{{"", auth.OutcomeUnauthenticated, 401}, {routerToken, auth.OutcomeDenied, 403}, {viewerToken, auth.OutcomeDenied, 403}} {
		if code, body := f.post(t, "/api/v1/domains/nvl72-a/drain", tc.token, `{"reason":"x"}`); code != tc.want {
			t.Errorf("drain with %q = %d %s, want %d", tc.token, code, body, tc.want)
		}
		if got := f.auditOK("DrainDomain", tc.outcome); got < 1 {
			t.Errorf("drain refused as %s not audited", tc.outcome)
		}
	}
	if ds := domains(t, f); ds["nvl72-a"].GetDraining() {
		t.Fatal("a refused drain drained the domain")
	}
	code, body := f.post(t, "/api/v1/domains/nvl72-a/drain", operatorToken, `{"reason":"rack swap"}`)
	if code != 200 {
		t.Fatalf("operator drain = %d %s", code, body)
	}
	var dr admissionv1.DrainDomainResponse
	if err := protojson.Unmarshal(body, &dr); err != nil || !dr.GetDomain().GetDraining() || dr.GetDomain().GetDrainReason() != "rack swap" {
		t.Fatalf("drain answer %s (%v)", body, err)
	}
	if f.auditOK("DrainDomain", auth.OutcomeOK) != 1 {
		t.Error("the drain is not audited")
	}
	// Who drained it shows on the dashboard.
	var snap dashboard.Snapshot
	getJSON(t, f, "/api/v1/dashboard", operatorToken, &snap)
	if v := snap.Domains[0]; v.DrainedBy != "ops" || v.DrainedAt == nil {
		t.Errorf("dashboard domain %s: drainedBy %q at %v, want ops", v.Domain, v.DrainedBy, v.DrainedAt)
	}
	if !snap.Session.CanAct || snap.Session.Principal != "ops" || !snap.Session.AuthOn {
		t.Errorf("operator session %+v", snap.Session)
	}
	var sess dashboard.SessionView
	getJSON(t, f, "/api/v1/session", viewerToken, &sess)
	if sess.CanAct || sess.Principal != "watcher" {
		t.Errorf("viewer session %+v", sess)
	}
	if code, body := f.post(t, "/api/v1/domains/nvl72-a/undrain", operatorToken, ""); code != 200 {
		t.Fatalf("undrain = %d %s", code, body)
	}
	if ds := domains(t, f); ds["nvl72-a"].GetDraining() {
		t.Fatal("undrain left the domain drained")
	}
	if f.auditOK("UndrainDomain", auth.OutcomeOK) != 1 {
		t.Error("the undrain is not audited")
	}
}

func TestAPIActionsRefuseCrossSiteAndBadInput(t *testing.T) {
	f := newFixture(t, fixtureOpts{authOn: true})
	// A form post (no JSON) is what another site could make a browser send.
	if code, _ := f.call(t, "POST", "/api/v1/domains/nvl72-a/drain", operatorToken, "application/x-www-form-urlencoded", "reason=x"); code != 403 {
		t.Errorf("form drain = %d, want 403", code)
	}
	req, _ := http.NewRequest("POST", f.url+"/api/v1/domains/nvl72-a/drain", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+operatorToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", "https://evil.example")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Errorf("cross-origin drain = %d, want 403", resp.StatusCode)
	}
	for _, tc := range []struct {
		path, body string
		want       int
		code       string
	}{
		{"/api/v1/domains/nope/drain", `{}`, 404, "NOT_FOUND"},
		{"/api/v1/domains/nvl72-a/drain", `{"reason":` + fmt.Sprintf("%q", strings.Repeat("r", 2000)) + `}`, 400, "INVALID_ARGUMENT"},
		{"/api/v1/domains/nvl72-a/drain", `{"reason":1}`, 400, "INVALID_ARGUMENT"},
		{"/api/v1/domains/nvl72-a/drain", `{"domain":"nvl72-b"}`, 400, "INVALID_ARGUMENT"},
		{"/api/v1/domains/nvl72-a/drain", strings.Repeat(" ", 20<<10), 400, "INVALID_ARGUMENT"},
		{"/api/v1/domains/" + strings.Repeat("d", 200) + "/undrain", ``, 400, "INVALID_ARGUMENT"},
	} {
		code, body := f.post(t, tc.path, operatorToken, tc.body)
		var e struct{ Code, Message string }
		_ = json.Unmarshal(body, &e)
		if code != tc.want || e.Code != tc.code {
			t.Errorf("POST %.60s %.40q = %d %s, want %d %s", tc.path, tc.body, code, body, tc.want, tc.code)
		}
	}
	if ds := domains(t, f); ds["nvl72-a"].GetDraining() {
		t.Fatal("a refused action drained the domain")
	}
}

func TestAPIActionsWithoutAuth(t *testing.T) {
	off := newFixture(t, fixtureOpts{})
	if code, body := off.post(t, "/api/v1/domains/nvl72-a/drain", "", `{}`); code != 403 || !strings.Contains(string(body), "--dashboard-actions") {
		t.Errorf("drain without --dashboard-actions = %d %s, want 403 naming the flag", code, body)
	}
	if off.auditOK("DrainDomain", auth.OutcomeDenied) != 1 {
		t.Error("the refused drain is not audited")
	}
	var sess dashboard.SessionView
	getJSON(t, off, "/api/v1/session", "", &sess)
	if sess.CanAct || sess.AuthOn || sess.Principal != "anonymous" {
		t.Errorf("session without auth or actions: %+v", sess)
	}
	on := newFixture(t, fixtureOpts{actions: true})
	if code, body := on.post(t, "/api/v1/domains/hgx-h200-2/drain", "", `{"reason":"swap"}`); code != 200 {
		t.Fatalf("drain with --dashboard-actions = %d %s", code, body)
	}
	if on.auditOK("DrainDomain", auth.OutcomeOK) != 1 {
		t.Error("the drain is not audited")
	}
}

func TestAPIFieldNamesAreTheGRPCJSONNames(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	_, body := f.get(t, "/api/v1/domains", "")
	for _, name := range []string{`"kvInUse"`, `"drainReason"`, `"healthWeight"`, `"prefillBurst"`, `"reservedFrac"`} {
		if !strings.Contains(string(body), name) {
			t.Errorf("/api/v1/domains lacks %s: %.300s", name, body)
		}
	}
	var ld admissionv1.ListDomainsResponse
	if err := (protojson.UnmarshalOptions{}).Unmarshal(body, &ld); err != nil || len(ld.GetDomains()) != 6 {
		t.Fatalf("/api/v1/domains is not a ListDomainsResponse of 6 domains: %v %.200s", err, body)
	}
	_, body = f.get(t, "/api/v1/tenants/acme", "")
	var gt admissionv1.GetTenantResponse
	if err := protojson.Unmarshal(body, &gt); err != nil || gt.GetTenant().GetTier() != "enterprise" || !strings.Contains(string(body), `"floorTokens"`) {
		t.Fatalf("/api/v1/tenants/acme: %v %s", err, body)
	}
	if code, _ := f.get(t, "/api/v1/tenants/nope", ""); code != 404 {
		t.Errorf("unknown tenant = %d, want 404", code)
	}
	var topo dashboard.TopologyView
	getJSON(t, f, "/api/v1/topology", "", &topo)
	slots := map[string]int{}
	for _, d := range topo.Domains {
		for _, n := range d.Nodes {
			for _, g := range n.GPUs {
				if g.Slot != fmt.Sprintf("%s/%s/%d", d.ID, n.Name, g.Index) || !g.Healthy || g.NVLinkState != "up" {
					t.Errorf("GPU %+v", g)
				}
				slots[d.ID]++
			}
		}
	}
	want := map[string]int{"nvl72-a": 72, "nvl72-b": 72, "hgx-h200-1": 8, "hgx-h200-2": 8, "hgx-h200-3": 8, "hgx-h200-4": 8}
	if !equalMaps(slots, want) {
		t.Errorf("slots per domain %v, want %v", slots, want)
	}
}

func TestAPITenantPages(t *testing.T) {
	f := newFixture(t, fixtureOpts{extra: 2500})
	var names []string
	tok, pages := "", 0
	for {
		_, body := f.get(t, "/api/v1/tenants?page_size=1000&page_token="+tok, "")
		var lt admissionv1.ListTenantsResponse
		if err := protojson.Unmarshal(body, &lt); err != nil {
			t.Fatalf("page %d: %v %.200s", pages, err, body)
		}
		pages++
		for _, ti := range lt.GetTenants() {
			names = append(names, ti.GetName())
		}
		if tok = lt.GetNextPageToken(); tok == "" {
			break
		}
		if pages > 10 {
			t.Fatal("no last page")
		}
	}
	if pages != 3 || len(names) != 2504 || !slices.IsSorted(names) {
		t.Fatalf("%d names in %d pages (sorted: %v), want 2504 in 3", len(names), pages, slices.IsSorted(names))
	}
	// No page size: the default page, 1000.
	var lt admissionv1.ListTenantsResponse
	_, body := f.get(t, "/api/v1/tenants", "")
	if err := protojson.Unmarshal(body, &lt); err != nil || len(lt.GetTenants()) != grpcserver.MaxTenantPage || lt.GetNextPageToken() == "" {
		t.Fatalf("default page: %d tenants, next %q, %v", len(lt.GetTenants()), lt.GetNextPageToken(), err)
	}
	for _, q := range []string{"page_size=-1", "page_size=x", "page_token=garbage"} {
		if code, body := f.get(t, "/api/v1/tenants?"+q, ""); code != 400 {
			t.Errorf("?%s = %d %s, want 400", q, code, body)
		}
	}
}

func TestTenantTableTopByTraffic(t *testing.T) {
	f := newFixture(t, fixtureOpts{extra: 3000})
	// Load on three tenants deep in the name order, most on t02999.
	stop := load(t, f.eng, map[string]int{"t02999": 3, "t01500": 2, "t00007": 1})
	defer stop()
	var snap dashboard.Snapshot
	testwait.Until(t, 10*time.Second, "the busiest tenants first", func() bool {
		snap = dashboard.Snapshot{}
		getJSON(t, f, "/api/v1/dashboard?n=5", "", &snap)
		return len(snap.Tenants.Rows) == 5 && rowName(t, snap.Tenants.Rows[0]) == "t02999"
	})
	got := make([]string, len(snap.Tenants.Rows))
	for i, r := range snap.Tenants.Rows {
		got[i] = rowName(t, r)
	}
	// The three with traffic (busiest first), then names in order.
	if want := []string{"t02999", "t01500", "t00007", "acme", "globex"}; !slices.Equal(got, want) {
		t.Errorf("rows %v, want %v", got, want)
	}
	stop()
	if snap.Tenants.Total != 3004 || snap.Tenants.Active != 3 || snap.Tenants.Matched != 3004 {
		t.Errorf("table totals %+v", snap.Tenants)
	}
	if r := snap.Tenants.Rows[0]; r.AdmittedPerSecond <= 0 || r.AchievedTokensRate <= 0 || r.BudgetLeftMicros == nil {
		t.Errorf("busiest row %+v", r)
	}
	// A search picks among the matching names only.
	getJSON(t, f, "/api/v1/dashboard?n=3&q=t015", "", &snap)
	if len(snap.Tenants.Rows) != 3 || rowName(t, snap.Tenants.Rows[0]) != "t01500" || snap.Tenants.Matched != 100 {
		t.Errorf("search t015: %d rows, first %s, %d matched", len(snap.Tenants.Rows), rowName(t, snap.Tenants.Rows[0]), snap.Tenants.Matched)
	}
	// Sorted by name, traffic does not reorder.
	getJSON(t, f, "/api/v1/dashboard?n=2&sort=name", "", &snap)
	if rowName(t, snap.Tenants.Rows[0]) != "acme" {
		t.Errorf("sort=name starts with %s", rowName(t, snap.Tenants.Rows[0]))
	}
	// However many are asked for, at most MaxRows come.
	getJSON(t, f, "/api/v1/dashboard?n=100000", "", &snap)
	if len(snap.Tenants.Rows) != dashboard.MaxRows {
		t.Errorf("n=100000 sent %d rows, want %d", len(snap.Tenants.Rows), dashboard.MaxRows)
	}
	for _, q := range []string{"n=0", "n=x", "sort=weight", "q=" + strings.Repeat("a", 200)} {
		if code, _ := f.get(t, "/api/v1/dashboard?"+q, ""); code != 400 {
			t.Errorf("?%.30s = %d, want 400", q, code)
		}
	}
}

func TestEventsStreamPushesDrains(t *testing.T) {
	f := newFixture(t, fixtureOpts{actions: true})
	events, ct := openEvents(t, f)
	if ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	first := <-events
	if first[0] != "topology" || !strings.Contains(first[1], `"slot":"nvl72-a/nvl72-a-tray01/0"`) {
		t.Fatalf("first event %s %.200s", first[0], first[1])
	}
	if ev := <-events; ev[0] != "snapshot" {
		t.Fatalf("second event %s", ev[0])
	}
	// A drain through the engine (as gRPC's DrainDomain) comes in a later snapshot.
	if err := f.eng.Drain("hgx-h200-3", "bad fans"); err != nil {
		t.Fatal(err)
	}
	waitSnapshot(t, events, "the drain", func(s dashboard.Snapshot) bool {
		for _, v := range s.Domains {
			if strings.Contains(string(v.Domain), `"id":"hgx-h200-3","kind":"hgx","gpus":"8","draining":true,"drainReason":"bad fans"`) {
				return true
			}
		}
		return false
	})
	// The topology is not sent again while it does not change.
	for range 3 {
		if ev := <-events; ev[0] != "snapshot" {
			t.Fatalf("event %s again", ev[0])
		}
	}
	// Close ends the stream.
	f.dash.Close()
	for ev := range events {
		_ = ev
	}
}

func TestEventsStreamsAreBounded(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var open []io.Closer
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := range dashboard.DefaultMaxStreams {
		req, _ := http.NewRequestWithContext(ctx, "GET", f.url+"/api/v1/events", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("stream %d: %v %v", i, err, resp)
		}
		open = append(open, resp.Body)
	}
	if code, _ := f.get(t, "/api/v1/events", ""); code != http.StatusTooManyRequests {
		t.Errorf("stream beyond the bound = %d, want 429", code)
	}
}

// load admits requests of each tenant in a loop, weight[tenant] at a time,
// releasing each at once, until the returned stop is called.
func load(t *testing.T, eng *admission.Engine, weight map[string]int) (stop func()) {
	t.Helper()
	return steadyLoad(func(ctx context.Context, _ int) {
		for tenant, n := range weight {
			for range n {
				d, err := eng.Admit(ctx, admission.Request{Tenant: tenant, Model: "small", PromptTokens: 10, MaxOutputTokens: 10})
				if err == nil && d.LeaseID != 0 {
					_, _ = eng.Release(ctx, admission.Release{LeaseID: d.LeaseID, OutputTokens: 10, Outcome: admission.ReleaseOK})
				}
			}
		}
	})
}

// steadyLoad runs round, numbered from 0, once a millisecond at most on a
// goroutine of its own until the returned stop is called (stop waits for
// the round under way, and may be called again): a steady load, not a spin
// on two shared cores. The engine and the dashboard run on the wall clock
// here, as a server's do, so the pacing does too.
func steadyLoad(round func(ctx context.Context, i int)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			round(ctx, i)
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
}

// openEvents subscribes to the event stream with two events of history and
// returns its events as readEvents delivers them, and the stream's
// Content-Type; the stream closes when the test ends.
func openEvents(t *testing.T, f *fixture) (<-chan [2]string, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", f.url+"/api/v1/events?n=2", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	events := make(chan [2]string, 64)
	go readEvents(resp.Body, events)
	return events, resp.Header.Get("Content-Type")
}

// readEvents sends each server-sent event (type, data) on ch, closing it at
// the end of the stream.
func readEvents(r io.Reader, ch chan<- [2]string) {
	defer close(ch)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var typ, data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			typ = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			data = line[len("data: "):]
		case line == "":
			ch <- [2]string{typ, data}
			typ, data = "", ""
		}
	}
}

// waitSnapshot reads snapshots until cond holds; the stream's own period
// bounds the wait.
func waitSnapshot(t *testing.T, events <-chan [2]string, what string, cond func(dashboard.Snapshot) bool) {
	t.Helper()
	for i := 0; ; i++ {
		ev, ok := <-events
		if !ok || i > 200 {
			t.Fatalf("no snapshot shows %s", what)
		}
		if ev[0] != "snapshot" {
			continue
		}
		var s dashboard.Snapshot
		if err := json.Unmarshal([]byte(ev[1]), &s); err != nil {
			t.Fatal(err)
		}
		if cond(s) {
			return
		}
	}
}

func getJSON(t *testing.T, f *fixture, path, token string, v any) {
	t.Helper()
	code, body := f.get(t, path, token)
	if code != 200 {
		t.Fatalf("GET %s = %d %s", path, code, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

func domains(t *testing.T, f *fixture) map[string]*admissionv1.DomainInfo {
	t.Helper()
	_, body := f.get(t, "/api/v1/domains", operatorToken)
	var ld admissionv1.ListDomainsResponse
	if err := protojson.Unmarshal(body, &ld); err != nil {
		t.Fatalf("domains: %v %s", err, body)
	}
	out := map[string]*admissionv1.DomainInfo{}
	for _, d := range ld.GetDomains() {
		out[d.GetId()] = d
	}
	return out
}

func rowName(t *testing.T, r dashboard.TenantRow) string {
	t.Helper()
	var ti admissionv1.TenantInfo
	if err := protojson.Unmarshal(r.Tenant, &ti); err != nil {
		t.Fatal(err)
	}
	return ti.GetName()
}

func equalMaps(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// The event stream carries a domain's warm-up after an undrain and the
// operator's credit freeze.
func TestEventsStreamShowsWarmupAndFreeze(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	if err := f.eng.Drain("hgx-h200-2", "swap"); err != nil {
		t.Fatal(err)
	}
	if err := f.eng.Undrain("hgx-h200-2"); err != nil {
		t.Fatal(err)
	}
	f.eng.FreezeCreditFor(time.Hour, "incident 42")
	events, _ := openEvents(t, f)
	waitSnapshot(t, events, "the warm-up and the freeze", func(s dashboard.Snapshot) bool {
		var warming, whole bool
		for _, v := range s.Domains {
			switch {
			case strings.Contains(string(v.Domain), `"id":"hgx-h200-2"`):
				warming = v.Warmup != nil && v.Warmup.Fraction >= 0.25 && v.Warmup.Fraction < 1 && v.Warmup.LeftSeconds > 0
			case strings.Contains(string(v.Domain), `"id":"hgx-h200-1"`):
				whole = v.Warmup == nil
			}
		}
		return warming && whole && s.Totals["warming"] == 1 && strings.Contains(string(s.CreditFreeze), `"reason":"incident 42"`)
	})
	f.dash.Close()
	for range events {
	}
}

// fixedConfigStatus is a config status as the server's control plane
// reports it for a config from etcd.
type fixedConfigStatus grpcserver.ConfigStatus

func (s fixedConfigStatus) ConfigStatus() grpcserver.ConfigStatus { return grpcserver.ConfigStatus(s) }

// timedAdmit admits req as the server's Admission service does for the
// dashboard: the engine's Admit, its latency given to the traffic counters.
func timedAdmit(ctx context.Context, f *fixture, req admission.Request) (admission.Decision, time.Duration, error) {
	start := time.Now()
	d, err := f.eng.Admit(ctx, req)
	took := time.Since(start)
	if err == nil {
		f.traffic.ObserveLatency(took)
	}
	if err == nil && d.LeaseID != 0 {
		_, _ = f.eng.Release(ctx, admission.Release{LeaseID: d.LeaseID, OutputTokens: 10, Outcome: admission.ReleaseOK})
	}
	return d, took, err
}

// The snapshot carries the fleet strip (answers per second, the Admit p99,
// the commonest refusal reasons), each tenant's refusal reasons, and what
// answers (build, config, replica), all from decisions the engine made.
func TestSnapshotFleetStripReasonsAndServer(t *testing.T) {
	applied := time.Date(2026, 3, 1, 9, 30, 0, 0, time.FixedZone("CET", 3600))
	f := newFixture(t, fixtureOpts{configStatus: fixedConfigStatus{Source: "etcd", Revision: 4211, AppliedAt: applied}})
	// acme is admitted; hooli (free: 5 rps) is refused over its quota far
	// more often than initech asks for more tokens than it can ever have.
	var mu sync.Mutex
	var fastest, slowest time.Duration
	reasons := map[string]map[admission.Reason]int{}
	stop := steadyLoad(func(ctx context.Context, i int) {
		reqs := []admission.Request{
			{Tenant: "acme", Model: "small", PromptTokens: 10, MaxOutputTokens: 10},
			{Tenant: "hooli", Model: "small", PromptTokens: 10, MaxOutputTokens: 10},
			{Tenant: "hooli", Model: "small", PromptTokens: 10, MaxOutputTokens: 10},
		}
		if i%4 == 0 {
			reqs = append(reqs, admission.Request{Tenant: "initech", Model: "small", PromptTokens: 900000, MaxOutputTokens: 10})
		}
		for _, req := range reqs {
			d, took, err := timedAdmit(ctx, f, req)
			if err != nil {
				continue
			}
			mu.Lock()
			if fastest == 0 || took < fastest {
				fastest = took
			}
			slowest = max(slowest, took)
			if d.Outcome == admission.Rejected {
				if reasons[req.Tenant] == nil {
					reasons[req.Tenant] = map[admission.Reason]int{}
				}
				reasons[req.Tenant][d.Reason]++
			}
			mu.Unlock()
		}
	})
	defer stop()
	var snap dashboard.Snapshot
	testwait.Until(t, 10*time.Second, "the fleet strip to show the refusals and the latency", func() bool {
		snap = dashboard.Snapshot{}
		getJSON(t, f, "/api/v1/dashboard", "", &snap)
		return snap.Answers.Refused > 0 && len(snap.RefusalReasons) == 2 && snap.AdmitLatency.Count > 0
	})
	stop()
	mu.Lock()
	defer mu.Unlock()
	if got := reasons["hooli"]; got[admission.ReasonQuotaExceeded] == 0 || len(got) != 1 {
		t.Fatalf("hooli's refusals by reason: %v, want QUOTA_EXCEEDED only", got)
	}
	if got := reasons["initech"]; got[admission.ReasonRequestTooLarge] == 0 || len(got) != 1 {
		t.Fatalf("initech's refusals by reason: %v, want REQUEST_TOO_LARGE only", got)
	}

	// The fleet strip: every tenant's reasons, the commonest first, summing
	// to the refusals per second.
	fleet := snap.RefusalReasons
	if fleet[0].Reason != "QUOTA_EXCEEDED" || fleet[1].Reason != "REQUEST_TOO_LARGE" || fleet[1].PerSecond <= 0 || fleet[0].PerSecond < fleet[1].PerSecond {
		t.Errorf("fleet refusal reasons %+v, want QUOTA_EXCEEDED then REQUEST_TOO_LARGE", fleet)
	}
	if sum := fleet[0].PerSecond + fleet[1].PerSecond; !near(sum, snap.Answers.Refused) {
		t.Errorf("fleet reasons sum to %.2f/s, refused %.2f/s", sum, snap.Answers.Refused)
	}
	// The p99 lies among the latencies the test timed (to the histogram's
	// 1%, in whole microseconds).
	p99 := time.Duration(snap.AdmitLatency.P99Seconds * float64(time.Second))
	if p99 < fastest.Truncate(time.Microsecond)*99/100 || p99 > slowest*101/100+time.Microsecond {
		t.Errorf("Admit p99 %v over %d calls, outside the latencies timed (%v to %v)", p99, snap.AdmitLatency.Count, fastest, slowest)
	}

	// Each tenant's row names its own reasons.
	rows := map[string]dashboard.TenantRow{}
	for _, r := range snap.Tenants.Rows {
		rows[rowName(t, r)] = r
	}
	for tenant, want := range map[string]string{"hooli": "QUOTA_EXCEEDED", "initech": "REQUEST_TOO_LARGE"} {
		r := rows[tenant]
		if len(r.RefusalReasons) != 1 || r.RefusalReasons[0].Reason != want || !near(r.RefusalReasons[0].PerSecond, r.RefusedPerSecond) {
			t.Errorf("%s's row: reasons %+v, refused %.2f/s, want %s at that rate", tenant, r.RefusalReasons, r.RefusedPerSecond, want)
		}
	}
	if r := rows["acme"]; r.AdmittedPerSecond <= 0 || r.RefusalReasons == nil || len(r.RefusalReasons) != 0 {
		t.Errorf("acme's row: %.2f admitted/s, reasons %#v, want admissions and an empty list", r.AdmittedPerSecond, r.RefusalReasons)
	}

	// What answers: the build, the config status (its time in UTC), the replica.
	sv := snap.Server
	if sv.Version != "v1.4.2" || sv.Revision != "0123456789abcdef0123456789abcdef01234567" || sv.Replica != "sluiced-2" {
		t.Errorf("server %+v", sv)
	}
	if c := sv.Config; c == nil || c.Source != "etcd" || c.Revision != 4211 || c.AppliedAt == nil || !c.AppliedAt.Equal(applied) || c.AppliedAt.Location() != time.UTC {
		t.Errorf("config %+v, want etcd revision 4211 applied at %v in UTC", c, applied.UTC())
	}
	_, body := f.get(t, "/api/v1/dashboard", "")
	for _, field := range []string{`"admitLatency":{"p99Seconds":`, `"refusalReasons":[`, `"server":{"version":"v1.4.2"`, `"config":{"source":"etcd","revision":4211,"appliedAt":"2026-03-01T08:30:00Z"}`} {
		if !strings.Contains(string(body), field) {
			t.Errorf("the snapshot's JSON lacks %s: %.400s", field, body)
		}
	}

	// A server that does not report its config status has none, and one
	// without traffic no latency and no reasons.
	bare := newFixture(t, fixtureOpts{})
	getJSON(t, bare, "/api/v1/dashboard", "", &snap)
	if snap.Server.Config != nil || snap.AdmitLatency.Count != 0 || len(snap.RefusalReasons) != 0 {
		t.Errorf("an idle server without config status: config %+v, latency %+v, reasons %+v", snap.Server.Config, snap.AdmitLatency, snap.RefusalReasons)
	}
}

// near reports whether a tenant's reasons' rate a and its refusals' rate b,
// sampled together, agree: to one refusal in the fixture's window (4
// samples of 50 ms), as one may land between the two reads while the load
// runs.
func near(a, b float64) bool { return math.Abs(a-b) <= 1/(4*0.050)+1e-9 }
