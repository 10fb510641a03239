package auth

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/auth/authtest"
)

const goodFile = `
principals:
  - name: router-east
    token_sha256: "%ROUTER%"
    roles: [router]
    tenants: [acme, globex]
  - name: sre
    mtls_san: "spiffe://prod/sre"
    roles: [operator]
  - name: dash
    mtls_san: dash.prod.example
    token_sha256: "%VIEWER%"
    roles: [viewer]
  - name: fleet
    mtls_san: fleet-router
    roles: [router]
    tenants: ["*"]
`

func goodPolicy(t testing.TB) []byte {
	t.Helper()
	s := strings.ReplaceAll(goodFile, "%ROUTER%", authtest.TokenSHA256("router-token"))
	return []byte(strings.ReplaceAll(s, "%VIEWER%", authtest.TokenSHA256("viewer-token")))
}

func TestParseGoodFile(t *testing.T) {
	pol, err := Parse("auth.yaml", goodPolicy(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(pol.Principals(), ","); got != "router-east,sre,dash,fleet" {
		t.Fatalf("principals %s", got)
	}
	r := pol.byToken("router-token")
	if r == nil || r.Name != "router-east" || !r.Has(RoleRouter) || r.Has(RoleViewer) || r.Has(RoleOperator) {
		t.Fatalf("router: %+v", r)
	}
	if !r.MayServe("acme") || !r.MayServe("globex") || r.MayServe("hooli") {
		t.Error("router-east's tenants")
	}
	sre := pol.bySANs([]string{"spiffe://prod/sre"})
	if sre == nil || !sre.Has(RoleOperator) || !sre.Has(RoleViewer) || sre.Has(RoleRouter) || sre.MayServe("acme") {
		t.Errorf("sre: %+v (operator holds viewer rights, serves no tenant)", sre)
	}
	if fleet := pol.bySANs([]string{"fleet-router"}); fleet == nil || !fleet.MayServe("anyone") {
		t.Errorf("fleet: %+v", fleet)
	}
	if pol.byToken("wrong") != nil || pol.byToken("") != nil {
		t.Error("an unknown token names a principal")
	}
	if d := pol.byToken("viewer-token"); d == nil || d != pol.bySANs([]string{"nobody", "dash.prod.example"}) {
		t.Error("a principal with both credentials")
	}
}

func TestParseRefusesWithKeyPath(t *testing.T) {
	tok := authtest.TokenSHA256("t")
	cases := []struct {
		name, doc, key, reason string
	}{
		{"unknown key", "principals: []\nbogus: 1\n", "", `unknown key "bogus"`},
		{"unknown principal key", "principals: [{name: a, token_sha256: " + tok + ", roles: [viewer], Roles: [operator]}]", "principals[0]", `unknown key "Roles"`},
		{"duplicate key", "principals: []\nprincipals: []\n", "", "already set"},
		{"wrong type", "principals: {name: a}", "principals", "want a list"},
		{"no name", "principals: [{token_sha256: " + tok + ", roles: [viewer]}]", "principals[0].name", "required"},
		{"duplicate name", "principals: [{name: a, token_sha256: " + tok + ", roles: [viewer]}, {name: a, mtls_san: x, roles: [viewer]}]", "principals[1].name", "earlier principal"},
		{"no credential", "principals: [{name: a, roles: [viewer]}]", "principals[0]", "no credential"},
		{"bad digest", "principals: [{name: a, token_sha256: my-secret-token, roles: [viewer]}]", "principals[0].token_sha256", "64 hex digits"},
		{"short digest", "principals: [{name: a, token_sha256: abcd, roles: [viewer]}]", "principals[0].token_sha256", "64 hex digits"},
		{"shared token", "principals: [{name: a, token_sha256: " + tok + ", roles: [viewer]}, {name: b, token_sha256: " + strings.ToUpper(tok) + ", roles: [viewer]}]", "principals[1].token_sha256", `"a" has the same token`},
		{"shared SAN", "principals: [{name: a, mtls_san: x, roles: [viewer]}, {name: b, mtls_san: x, roles: [viewer]}]", "principals[1].mtls_san", "same SAN"},
		{"no roles", "principals: [{name: a, mtls_san: x}]", "principals[0].roles", "at least one"},
		{"unknown role", "principals: [{name: a, mtls_san: x, roles: [viewer, admin]}]", "principals[0].roles[1]", `unknown role "admin"`},
		{"router without tenants", "principals: [{name: a, mtls_san: x, roles: [router]}]", "principals[0].tenants", "needs the tenants"},
		{"tenants without router", "principals: [{name: a, mtls_san: x, roles: [operator], tenants: [acme]}]", "principals[0].tenants", "only the router role"},
		{"star with names", "principals: [{name: a, mtls_san: x, roles: [router], tenants: [acme, '*']}]", "principals[0].tenants[1]", "stands alone"},
		{"empty tenant", "principals: [{name: a, mtls_san: x, roles: [router], tenants: ['']}]", "principals[0].tenants[0]", "1 to"},
		{"not yaml", "principals: [", "", "yaml"},
		{"empty file", "", "", "empty"},
		{"only a comment", "# principals: to come\n", "", "empty"},
		{"no principals", "principals: []", "principals", "at least one principal"},
		{"null principals", "principals: null", "principals", "at least one principal"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("auth.yaml", []byte(c.doc))
			var fe *FileError
			if !errors.As(err, &fe) {
				t.Fatalf("got %v, want a *FileError", err)
			}
			if fe.File != "auth.yaml" || fe.Key != c.key || !strings.Contains(fe.Reason, c.reason) {
				t.Fatalf("got %q (key %q), want key %q, reason containing %q", err, fe.Key, c.key, c.reason)
			}
			if strings.Contains(err.Error(), "my-secret-token") {
				t.Fatalf("the refusal echoes what may be a token: %v", err)
			}
		})
	}
}

// FuzzParseAuth: no input makes the parser panic, and whatever it accepts
// is a policy whose every principal has a credential and a role.
func FuzzParseAuth(f *testing.F) {
	f.Add(goodPolicy(f))
	f.Add([]byte(""))
	f.Add([]byte("principals: []"))
	f.Add([]byte("principals: [{name: a, mtls_san: x, roles: [router], tenants: ['*']}]"))
	f.Add([]byte(`{"principals":[{"name":"a","token_sha256":"` + authtest.TokenSHA256("x") + `","roles":["viewer"]}]}`))
	f.Add([]byte("principals: [{name: a, roles: [router], tenants: [a, '*']}]"))
	f.Add([]byte("principals:\n  - name: &a x\n    mtls_san: *a\n    roles: [viewer]\n"))
	f.Add([]byte("principals: [{name: 1e999, token_sha256: null, roles: null}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		pol, err := Parse("fuzz.yaml", data)
		if err != nil {
			var fe *FileError
			if !errors.As(err, &fe) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		if len(pol.names) != len(pol.tokens)+len(pol.bySAN)-countBoth(pol) {
			t.Fatalf("%d principals, %d tokens, %d SANs", len(pol.names), len(pol.tokens), len(pol.bySAN))
		}
		for _, e := range pol.tokens {
			if !e.p.Has(RoleRouter) && !e.p.Has(RoleViewer) {
				t.Fatalf("principal %q has no role", e.p.Name)
			}
		}
	})
}

// countBoth counts principals recognised both by a token and by a SAN.
func countBoth(pol *Policy) int {
	n := 0
	for _, e := range pol.tokens {
		for _, p := range pol.bySAN {
			if p == e.p {
				n++
			}
		}
	}
	return n
}

func TestIdentify(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	authtest.WriteFile(t, path, goodPolicy(t))
	a, err := New(path, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	spiffe, _ := url.Parse("spiffe://prod/sre")
	cases := []struct {
		name string
		c    Credentials
		want string // principal name, or the error's text
	}{
		{"token over TLS", Credentials{HasAuthorization: true, Bearer: "router-token", TLS: true}, "router-east"},
		{"token over loopback plaintext", Credentials{HasAuthorization: true, Bearer: "router-token", Loopback: true}, "router-east"},
		{"token over remote plaintext", Credentials{HasAuthorization: true, Bearer: "router-token"}, "bearer tokens need TLS"},
		{"unknown token", Credentials{HasAuthorization: true, Bearer: "guess", TLS: true}, "unknown bearer token"},
		{"malformed header", Credentials{HasAuthorization: true, TLS: true}, `must be "Bearer <token>"`},
		{"URI SAN", Credentials{TLS: true, Cert: &x509.Certificate{URIs: []*url.URL{spiffe}}}, "sre"},
		{"DNS SAN", Credentials{TLS: true, Cert: &x509.Certificate{DNSNames: []string{"other", "dash.prod.example"}}}, "dash"},
		{"CN", Credentials{TLS: true, Cert: &x509.Certificate{DNSNames: []string{"other"}}}, "names no principal"},
		{"unknown token beside a good certificate", Credentials{HasAuthorization: true, Bearer: "guess", TLS: true, Cert: &x509.Certificate{URIs: []*url.URL{spiffe}}}, "unknown bearer token"},
		{"nothing", Credentials{TLS: true}, "no credential"},
	}
	for _, c := range cases {
		p, err := a.Identify(c.c)
		switch {
		case err != nil && !errors.Is(err, ErrUnauthenticated):
			t.Errorf("%s: error %v does not wrap ErrUnauthenticated", c.name, err)
		case err != nil && !strings.Contains(err.Error(), c.want):
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		case err == nil && p.Name != c.want:
			t.Errorf("%s: %s, want %s", c.name, p.Name, c.want)
		}
	}
	cn := &x509.Certificate{}
	cn.Subject.CommonName = "fleet-router"
	if p, err := a.Identify(Credentials{TLS: true, Cert: cn}); err != nil || p.Name != "fleet" {
		t.Errorf("CN: %v %v", p, err)
	}
	open, _ := New("", nil, nil)
	if p, err := open.Identify(Credentials{}); p != nil || err != nil || !open.Open() {
		t.Errorf("open: %v %v", p, err)
	}
}

// A bad auth file is refused with file, key and reason, audited once, and
// the last good one keeps serving; a good one then takes effect.
func TestReloadKeepsLastGood(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	authtest.WriteFile(t, path, goodPolicy(t))
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	audit, err := NewAuditor(slog.New(slog.NewJSONHandler(&logs, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(path, slog.New(slog.DiscardHandler), audit)
	if err != nil {
		t.Fatal(err)
	}
	token := Credentials{HasAuthorization: true, Bearer: "router-token", TLS: true}
	authtest.WriteFile(t, path, []byte("principals: [{name: a, roles: [viewer]}]"))
	err = a.ReloadIfChanged()
	var fe *FileError
	if !errors.As(err, &fe) || fe.File != path || fe.Key != "principals[0]" {
		t.Fatalf("bad file: %v", err)
	}
	if p, err := a.Identify(token); err != nil || p.Name != "router-east" {
		t.Fatalf("after a refused reload: %v %v", p, err)
	}
	if err := a.ReloadIfChanged(); err == nil {
		t.Fatal("the same bad file again: no error")
	}
	if n := AuditCount(reg, ActionAuthReload, OutcomeFailed); n != 1 {
		t.Errorf("a bad file polled twice is audited %v times, want once", n)
	}
	if err := a.Reload(); err == nil {
		t.Fatal("SIGHUP on a bad file: no error")
	}
	if n := AuditCount(reg, ActionAuthReload, OutcomeFailed); n != 2 {
		t.Errorf("a forced reload of a bad file is audited: count %v, want 2", n)
	}
	newTok := authtest.TokenSHA256("new-token")
	authtest.WriteFile(t, path, []byte("principals: [{name: new, token_sha256: "+newTok+", roles: [operator]}]"))
	if err := a.ReloadIfChanged(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Identify(token); err == nil {
		t.Error("the old token still works")
	}
	if p, err := a.Identify(Credentials{HasAuthorization: true, Bearer: "new-token", TLS: true}); err != nil || p.Name != "new" {
		t.Errorf("new token: %v %v", p, err)
	}
	if n := AuditCount(reg, ActionAuthReload, OutcomeOK); n != 1 {
		t.Errorf("auth_reload ok: %v", n)
	}
	if strings.Contains(logs.String(), "router-token") || strings.Contains(logs.String(), "new-token") {
		t.Error("a token reached the log")
	}
	if !strings.Contains(logs.String(), `"msg":"audit"`) || !strings.Contains(logs.String(), `"action":"auth_reload"`) {
		t.Errorf("audit lines: %s", logs.String())
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := a.ReloadIfChanged(); err == nil {
		t.Error("a vanished file: no error")
	}
	if p, err := a.Identify(Credentials{HasAuthorization: true, Bearer: "new-token", TLS: true}); err != nil || p.Name != "new" {
		t.Errorf("after the file vanished: %v %v", p, err)
	}
}

// An auth file that names nobody (truncated by a non-atomic write, say)
// would lock every caller out: it is refused at start and on reload,
// naming the file, and the last good one keeps serving.
func TestEmptyAuthFileRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	authtest.WriteFile(t, path, nil)
	if _, err := New(path, slog.New(slog.DiscardHandler), nil); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("an empty auth file at start: %v, want a refusal naming %s", err, path)
	}
	authtest.WriteFile(t, path, goodPolicy(t))
	a, err := New(path, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	token := Credentials{HasAuthorization: true, Bearer: "router-token", TLS: true}
	for _, doc := range []string{"", "\n", "principals: []\n"} {
		authtest.WriteFile(t, path, []byte(doc))
		err := a.ReloadIfChanged()
		var fe *FileError
		if !errors.As(err, &fe) || fe.File != path {
			t.Errorf("reload of %q: %v, want a *FileError naming %s", doc, err, path)
		}
		if p, err := a.Identify(token); err != nil || p.Name != "router-east" {
			t.Errorf("after %q was refused: %v %v", doc, p, err)
		}
	}
}

func TestCheckTenant(t *testing.T) {
	pol, err := Parse("auth.yaml", goodPolicy(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := NewContext(context.Background(), pol.byToken("router-token"))
	if err := CheckTenant(ctx, "acme"); err != nil {
		t.Errorf("bound tenant: %v", err)
	}
	if err := CheckTenant(ctx, "hooli"); err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Errorf("unbound tenant: %v", err)
	}
	if err := CheckTenant(context.Background(), "hooli"); err != nil {
		t.Errorf("no auth: %v", err)
	}
	if err := CheckTenant(context.WithValue(context.Background(), authedKey{}, true), "acme"); err == nil {
		t.Error("an authenticated server's call with no principal is allowed")
	}
}

func TestClip(t *testing.T) {
	if got := clip(strings.Repeat("é", 100), 9); got != "éééé…" {
		t.Errorf("clip on a rune boundary: %q", got)
	}
	if got := clip("short", 128); got != "short" {
		t.Errorf("%q", got)
	}
}

// Every method sluiced serves is in the access table, so that none is
// closed by accident; and the table names no method that does not exist.
func TestEveryMethodHasAnAccessRule(t *testing.T) {
	known := map[string]bool{reflectionV1: true, reflectionV1Alpha: true}
	for _, sd := range []grpc.ServiceDesc{admissionv1.Admission_ServiceDesc, admissionv1.Operator_ServiceDesc, healthpb.Health_ServiceDesc, rlsv3.RateLimitService_ServiceDesc, extprocv3.ExternalProcessor_ServiceDesc} {
		for _, m := range sd.Methods {
			known["/"+sd.ServiceName+"/"+m.MethodName] = true
		}
		for _, m := range sd.Streams {
			known["/"+sd.ServiceName+"/"+m.StreamName] = true
		}
	}
	for m := range known {
		if _, ok := methodAccess[m]; !ok {
			t.Errorf("%s has no access rule", m)
		}
	}
	for m := range methodAccess {
		if !known[m] {
			t.Errorf("the access table names %s, which no service has", m)
		}
	}
	for m := range auditedWrites {
		if methodAccess[m] != accessOperator {
			t.Errorf("audited write %s is not operator-only", m)
		}
	}
}

// An audited call on an open server names its caller's address in the
// audit line (the address is formatted only then, not on every call).
func TestAuditNamesThePeer(t *testing.T) {
	var logs bytes.Buffer
	audit, err := NewAuditor(slog.New(slog.NewTextHandler(&logs, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New("", nil, audit)
	if err != nil {
		t.Fatal(err)
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4242}})
	info := &grpc.UnaryServerInfo{FullMethod: admissionv1.Operator_DrainDomain_FullMethodName}
	_, err = a.UnaryServerInterceptor()(ctx, &admissionv1.DrainDomainRequest{Domain: "rack-a"}, info,
		func(context.Context, any) (any, error) { return &admissionv1.DrainDomainResponse{}, nil })
	if err != nil {
		t.Fatal(err)
	}
	if line := logs.String(); !strings.Contains(line, "peer=127.0.0.1:4242") || !strings.Contains(line, "target=rack-a") {
		t.Errorf("audit line %q: want the peer and the target", line)
	}
}
