package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"pgregory.net/rapid"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/auth"
	"github.com/sluice-sched/sluice/internal/cli"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/controlplane"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/internal/dashboard"
	"github.com/sluice-sched/sluice/internal/grpctest"
)

// The dashboard on the real server over TLS: the page open, the API for
// viewers, drains for the operator role (here a client certificate),
// audited, and the event stream naming who drained.
func TestDashboardOverTLSWithRoles(t *testing.T) {
	f := startSecure(t, func(o *Options) { o.Dashboard.Every = 50 * time.Millisecond })
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(f.ca.CertPEM)
	sre := f.clients["sre"]
	pair, err := tls.X509KeyPair(sre.CertPEM, sre.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	plain := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	operator := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}}
	defer plain.CloseIdleConnections()
	defer operator.CloseIdleConnections()
	base := "https://" + f.srv.HTTPAddr().String()
	do := func(hc *http.Client, method, path, token, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := do(plain, "GET", "/", "", ""); code != 200 || !strings.Contains(body, "/assets/app.js") {
		t.Errorf("GET / = %d %.100s", code, body)
	}
	for _, c := range []struct {
		path, token string
		want        int
	}{
		{"/api/v1/domains", "", 401},
		{"/api/v1/domains", "router-acme-token", 403},
		{"/api/v1/domains", "viewer-token", 200},
		{"/api/v1/tenants?page_size=2", "viewer-token", 200},
		{"/api/v1/topology", "viewer-token", 200},
	} {
		if code, body := do(plain, "GET", c.path, c.token, ""); code != c.want {
			t.Errorf("GET %s (token %q) = %d %.200s, want %d", c.path, c.token, code, body, c.want)
		}
	}
	if code, _ := do(plain, "POST", "/api/v1/domains/hgx-h200-1/drain", "viewer-token", `{"reason":"no"}`); code != 403 {
		t.Errorf("a viewer's drain = %d, want 403", code)
	}
	code, body := do(operator, "POST", "/api/v1/domains/hgx-h200-1/drain", "", `{"reason":"rack swap"}`)
	if code != 200 {
		t.Fatalf("the operator's drain = %d %s", code, body)
	}
	var dr admissionv1.DrainDomainResponse
	if err := protojson.Unmarshal([]byte(body), &dr); err != nil || !dr.GetDomain().GetDraining() {
		t.Fatalf("drain answer %s: %v", body, err)
	}
	reg := f.srv.metrics.Registry
	if auth.AuditCount(reg, "DrainDomain", auth.OutcomeOK) != 1 || auth.AuditCount(reg, "DrainDomain", auth.OutcomeDenied) != 1 {
		t.Error("the dashboard's drains are not audited as the gRPC ones are")
	}

	// The stream names who drained it; shutting down ends the stream.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/api/v1/events", nil)
	resp, err := operator.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("events: %v %v", err, resp)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	found := false
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "data: ") && strings.Contains(line, `"drainedBy":"sre"`) {
			found = true
			break
		}
	}
	if !found {
		t.Fatalf("no snapshot names the drain's principal: %v", sc.Err())
	}
}

// ListTenants pages from the server's tenant directory, which follows a
// config reload.
func TestListTenantsPagesFollowReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	yaml := string(config.DefaultYAML())
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, _, _, _ := start(t, Options{ConfigPath: path})
	conn := grpctest.Dial(t, srv.GRPCAddr().String())
	op := admissionv1.NewOperatorClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list := func() []string {
		t.Helper()
		var names []string
		tok := ""
		for range 100 {
			resp, err := op.ListTenants(ctx, &admissionv1.ListTenantsRequest{PageSize: 3, PageToken: tok})
			if err != nil {
				t.Fatal(err)
			}
			for _, ti := range resp.GetTenants() {
				names = append(names, ti.GetName())
			}
			if tok = resp.GetNextPageToken(); tok == "" {
				return names
			}
		}
		t.Fatal("no last page")
		return nil
	}
	if got := strings.Join(list(), ","); got != "acme,globex,hooli,initech" {
		t.Fatalf("tenants %s", got)
	}
	yaml = strings.Replace(yaml, "  hooli: {tier: free}", "  hooli: {tier: free}\n  aaa: {tier: free}\n  zzz: {tier: standard}", 1)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(list(), ","); got != "aaa,acme,globex,hooli,initech,zzz" {
		t.Fatalf("tenants after the reload: %s", got)
	}
}

// The tenant directory after tenant updates is the one built from the
// config with those updates: names sorted, own budgets kept, removed
// tenants gone.
func TestTenantDirectoryFollowsTenantUpdates(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		name := rapid.SampledFrom([]string{"a", "b", "c", "d", "e", "f"})
		draw := func(label string) admission.TenantConfig {
			tc := admission.TenantConfig{Tier: "free"}
			if rapid.Bool().Draw(t, label+" budget") {
				tc.TenantOverrides = &admission.TenantOverrides{Budget: &admission.Budget{DailyUSD: rapid.Float64Range(1, 9).Draw(t, label+" usd")}}
			}
			return tc
		}
		cfg := admission.Config{Tiers: map[string]admission.TierPolicy{"free": {Budget: admission.Budget{MonthlyUSD: 5}}}, Tenants: map[string]admission.TenantConfig{}}
		for range rapid.IntRange(0, 6).Draw(t, "tenants") {
			cfg.Tenants[name.Draw(t, "name")] = draw("initial")
		}
		st := &serverState{}
		st.configChanged(cfg)
		var updates []admission.TenantUpdate
		seen := map[string]bool{}
		for range rapid.IntRange(1, 4).Draw(t, "updates") {
			u := admission.TenantUpdate{Name: name.Draw(t, "changed"), Remove: rapid.Bool().Draw(t, "remove")}
			if seen[u.Name] {
				continue
			}
			seen[u.Name] = true
			if u.Remove {
				delete(cfg.Tenants, u.Name)
			} else {
				u.Config = draw("update")
				cfg.Tenants[u.Name] = u.Config
			}
			updates = append(updates, u)
		}
		st.tenantsChanged(updates)
		got, want := st.dir.Load(), newTenantDirectory(cfg)
		if !slices.Equal(got.names, want.names) || !maps.Equal(got.ownBudget, want.ownBudget) || !maps.Equal(got.tierBudget, want.tierBudget) {
			t.Fatalf("after %+v:\ngot  %v %v\nwant %v %v", updates, got.names, got.ownBudget, want.names, want.ownBudget)
		}
	})
}

// The dashboard's header and fleet strip on the real server: the replica's
// etcd member id, the build sluice_build_info labels, the config status
// GetConfigStatus reports, and an Admit latency over the very calls
// sluice_admit_latency_seconds counts (invalid requests in neither).
func TestDashboardNamesTheServerAndTimesItsAdmits(t *testing.T) {
	etcd := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := controlplane.ApplyConfig(ctx, etcd.Client(t), controlplane.DefaultPrefix, "sluice.yaml", config.DefaultYAML()); err != nil {
		t.Fatal(err)
	}
	eo := etcdOpts(etcd.Endpoint())
	eo.ReplicaID = "sluiced-west-2"
	srv, c, _, _ := start(t, Options{Etcd: eo})
	const calls = 20
	for range calls {
		if _, err := c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "acme", Model: "small", PromptTokens: 10, MaxOutputTokens: 10}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "acme", Model: "small", MaxOutputTokens: 10}); err == nil {
		t.Fatal("a request of no prompt tokens was answered")
	}
	timed := func() uint64 {
		fams, err := srv.metrics.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, f := range fams {
			if f.GetName() == "sluice_admit_latency_seconds" {
				for _, m := range f.GetMetric() {
					n += m.GetHistogram().GetSampleCount()
				}
			}
		}
		return n
	}
	if n := timed(); n != calls {
		t.Fatalf("sluice_admit_latency_seconds counts %d calls, want %d", n, calls)
	}
	// The first sample after the calls holds them all (a sample taken
	// during them, some).
	var snap dashboard.Snapshot
	eventually(t, func() bool {
		snap = dashboard.Snapshot{}
		return json.Unmarshal([]byte(get(t, srv, "/api/v1/dashboard")), &snap) == nil && snap.AdmitLatency.Count == calls
	})
	if snap.AdmitLatency.P99Seconds <= 0 {
		t.Errorf("the fleet strip's Admit latency %+v, want a p99 over the %d calls the metric counts", snap.AdmitLatency, calls)
	}
	st, err := admissionv1.NewOperatorClient(dial(t, srv)).GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sv := snap.Server
	if sv.Replica != "sluiced-west-2" || sv.Version != cli.ReadBuild().Version || sv.Revision != cli.ReadBuild().Revision {
		t.Errorf("server %+v, want replica sluiced-west-2 and build %+v", sv, cli.ReadBuild())
	}
	if cv := sv.Config; cv == nil || cv.Source != "etcd" || cv.Revision != st.GetRevision() || cv.AppliedAt == nil || !cv.AppliedAt.Equal(st.GetAppliedAt().AsTime()) {
		t.Errorf("config %+v, want GetConfigStatus's %v", cv, st)
	}
}
