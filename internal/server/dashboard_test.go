package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
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
	"github.com/sluice-sched/sluice/internal/config"
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
