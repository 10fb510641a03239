package server

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestHostGuardAllows(t *testing.T) {
	g, err := newHostGuard("sluice-dev:7071", []string{"sluice.internal", " .corp.example", "*.lab.test", "10.1.2.3", "[::1]"})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		"":                       true, // HTTP/1.0
		"127.0.0.1:7071":         true,
		"127.8.9.10":             true,
		"[::1]:7071":             true,
		"10.244.3.17:7071":       true, // a probe of the pod IP
		"[2001:db8::5]:7071":     true,
		"localhost:7071":         true,
		"LOCALHOST.:7071":        true,
		"app.localhost:7071":     true,
		"sluice-dev:9999":        true, // --http-addr's host; the port is not compared
		"sluice.internal:7071":   true,
		"Sluice.Internal.":       true,
		"corp.example":           true,
		"a.b.corp.example:7071":  true,
		"x.lab.test":             true,
		"evil.example:7071":      false,
		"localhost.evil.example": false,
		"notcorp.example":        false,
		"sluice.internal.evil":   false,
		"127.0.0.1.nip.io:7071":  false, // a name, whatever it spells
		"lab.test.evil.example":  false,
		"2130706433":             false, // not an IP literal to netip (browsers write 127.0.0.1)
	} {
		if got := g.allows(host); got != want {
			t.Errorf("allows(%q) = %v, want %v", host, got, want)
		}
	}
	any, err := newHostGuard("127.0.0.1:0", []string{"*"})
	if err != nil || !any.allows("evil.example") {
		t.Errorf(`"*": %v %v`, any, err)
	}
	for _, bad := range [][]string{{""}, {"a", " "}, {"http://sluice.internal"}, {"sluice.internal:7071"}, {"a/b"}, {"*x.example"}} {
		if _, err := newHostGuard("127.0.0.1:0", bad); err == nil || !strings.Contains(err.Error(), "--http-allowed-hosts") {
			t.Errorf("%q: %v, want a refusal naming the flag", bad, err)
		}
	}
}

// A page on a name that rebinds to 127.0.0.1 sends a Host (and an Origin)
// of its own: without --auth the API answers it 421 and a drain it posts
// changes nothing, with --dashboard-actions on or off; loopback names, IP
// literals and the allowed names are answered, and /healthz answers every
// Host.
func TestDNSRebindingRefused(t *testing.T) {
	const dom = "hgx-h200-3"
	for _, actions := range []bool{true, false} {
		srv, _, _, _ := start(t, Options{Dashboard: DashboardOptions{Actions: actions}, Security: SecurityOptions{HTTPAllowedHosts: []string{"sluice.internal"}}})
		port := srv.HTTPAddr().String()[strings.LastIndexByte(srv.HTTPAddr().String(), ':'):]
		do := func(method, path, host string) (int, string) {
			t.Helper()
			req, err := http.NewRequest(method, "http://"+srv.HTTPAddr().String()+path, strings.NewReader(`{"reason":"x"}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Host = host
			if method == http.MethodPost {
				req.Header.Set("Origin", "http://"+host)
				req.Header.Set("Content-Type", "application/json")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		draining := func() bool {
			for _, d := range srv.Engine().Domains() {
				if d.ID == dom {
					return d.Draining
				}
			}
			t.Fatalf("no domain %s", dom)
			return false
		}
		evil := "evil.example" + port
		code, body := do("POST", "/api/v1/domains/"+dom+"/drain", evil)
		if code != http.StatusMisdirectedRequest || !strings.Contains(body, "--http-allowed-hosts") {
			t.Errorf("actions %v: a rebound drain = %d %q, want 421 naming --http-allowed-hosts", actions, code, body)
		}
		if draining() {
			t.Fatalf("actions %v: a rebound page drained %s", actions, dom)
		}
		for _, path := range []string{"/api/v1/domains", "/api/v1/tenants", "/v1/domains", "/metrics", "/"} {
			if code, _ := do("GET", path, evil); code != http.StatusMisdirectedRequest {
				t.Errorf("actions %v: GET %s with Host %s = %d, want 421", actions, path, evil, code)
			}
		}
		for _, host := range []string{"127.0.0.1" + port, "localhost" + port, "[::1]" + port, "10.244.3.17" + port, "sluice.internal" + port, "evil.example" + port} {
			want := http.StatusOK
			if strings.HasPrefix(host, "evil") {
				want = http.StatusMisdirectedRequest
			}
			for _, path := range []string{"/api/v1/domains", "/metrics"} {
				if code, _ := do("GET", path, host); code != want {
					t.Errorf("actions %v: GET %s with Host %s = %d, want %d", actions, path, host, code, want)
				}
			}
		}
		if code, _ := do("GET", "/healthz", evil); code != http.StatusOK {
			t.Errorf("/healthz with Host %s = %d, want 200", evil, code)
		}
		// From an allowed name the drain is the page's own: it takes
		// effect when actions are on.
		code, body = do("POST", "/api/v1/domains/"+dom+"/drain", "localhost"+port)
		if actions && (code != http.StatusOK || !draining()) {
			t.Errorf("a drain from localhost = %d %s, draining %v", code, body, draining())
		}
		if !actions && (code != http.StatusForbidden || draining()) {
			t.Errorf("actions off: a drain from localhost = %d %s, draining %v", code, body, draining())
		}
		_ = srv.Engine().Undrain(dom)
	}
}

// With --auth the Host guard is on only where --http-allowed-hosts names
// the hosts: a server beyond loopback is reached by whatever names its
// operators give it, and a rebound page holds none of their credentials.
func TestHostGuardWithAuth(t *testing.T) {
	get := func(f *secureFixture, host string) int {
		t.Helper()
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(f.ca.CertPEM)
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		defer hc.CloseIdleConnections()
		req, err := http.NewRequest("GET", "https://"+f.srv.HTTPAddr().String()+"/api/v1/domains", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		req.Header.Set("Authorization", "Bearer viewer-token")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	open := startSecure(t, nil)
	if code := get(open, "sluice.prod.example:7071"); code != http.StatusOK {
		t.Errorf("--auth, any name: %d, want 200", code)
	}
	guarded := startSecure(t, func(o *Options) { o.Security.HTTPAllowedHosts = []string{".prod.example"} })
	if code := get(guarded, "sluice.prod.example:7071"); code != http.StatusOK {
		t.Errorf("--auth, an allowed name: %d, want 200", code)
	}
	if code := get(guarded, "evil.example:7071"); code != http.StatusMisdirectedRequest {
		t.Errorf("--auth --http-allowed-hosts, another name: %d, want 421", code)
	}
}
