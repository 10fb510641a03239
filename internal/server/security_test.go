package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/client"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/auth"
	"github.com/sluice-sched/sluice/internal/auth/authtest"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/testwait"
)

// The principals of the security tests' auth file.
const testAuthFile = `
principals:
  - name: router-acme
    token_sha256: "%s"
    roles: [router]
    tenants: [acme]
  - name: router-all
    mtls_san: "spiffe://test/router-all"
    roles: [router]
    tenants: ["*"]
  - name: sre
    mtls_san: sre.test
    roles: [operator]
  - name: viewer
    token_sha256: "%s"
    roles: [viewer]
  - name: dashboard
    mtls_san: dashboard
    roles: [viewer]
`

func writeAuthFile(t *testing.T, path string) {
	t.Helper()
	authtest.WriteFile(t, path, fmt.Appendf(nil, testAuthFile, authtest.TokenSHA256("router-acme-token"), authtest.TokenSHA256("viewer-token")))
}

// secureFixture is a sluiced serving TLS (verifying client certificates
// against a test CA) with the test auth file, and the files it reads.
type secureFixture struct {
	srv                         *Server
	ca                          *authtest.CA
	authFile, certFile, keyFile string
	clients                     map[string]*authtest.Leaf
}

// startSecure starts the fixture's sluiced on loopback; mutate may change
// its options first.
func startSecure(t *testing.T, mutate func(*Options)) *secureFixture {
	t.Helper()
	f := &secureFixture{ca: authtest.NewCA(t, "test"), clients: map[string]*authtest.Leaf{}}
	dir := t.TempDir()
	f.authFile = filepath.Join(dir, "auth.yaml")
	writeAuthFile(t, f.authFile)
	leaf := f.ca.Server(t, "server")
	f.certFile, f.keyFile = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	leaf.Write(t, f.certFile, f.keyFile)
	for name, id := range map[string]authtest.Identity{
		"router-all": {URIs: []string{"spiffe://test/router-all"}},
		"sre":        {DNS: []string{"sre.test"}, CN: "someone"},
		"dashboard":  {CN: "dashboard"},
		"stranger":   {URIs: []string{"spiffe://test/stranger"}, DNS: []string{"stranger.test"}},
	} {
		f.clients[name] = f.ca.Client(t, name, id)
	}
	opts := Options{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Logger: slog.New(slog.DiscardHandler),
		Security: SecurityOptions{
			AuthFile: f.authFile, TLSCert: f.certFile, TLSKey: f.keyFile, ClientCA: f.ca.File,
			ReloadEvery: 5 * time.Millisecond,
		},
	}
	if mutate != nil {
		mutate(&opts)
	}
	srv, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.srv = srv
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	go func() { _ = srv.Serve(ctx); close(finished) }()
	t.Cleanup(func() { cancel(); <-finished })
	return f
}

// dial connects to the fixture's gRPC listener with sec.
func (f *secureFixture) dial(t *testing.T, sec client.Security) *grpc.ClientConn {
	t.Helper()
	conn, err := client.Dial(f.srv.GRPCAddr().String(), sec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// caller returns the Security of a named test caller.
func (f *secureFixture) caller(name string) client.Security {
	sec := client.Security{CAFile: f.ca.File}
	switch name {
	case "router-acme":
		sec.Token = "router-acme-token"
	case "viewer":
		sec.Token = "viewer-token"
	case "bad-token":
		sec.Token = "guessed-token"
	case "anonymous":
	default:
		l := f.clients[name]
		sec.CertFile, sec.KeyFile = l.CertFile, l.KeyFile
	}
	return sec
}

// rpc is one call of the table, with what it would change.
type rpc struct {
	name string
	// prepare readies the engine (a lease to release, a drained domain);
	// call makes the call; changed reports whether it took effect; reset
	// undoes it for the next caller.
	prepare func(t *testing.T) any
	call    func(ctx context.Context, conn *grpc.ClientConn, prep any) error
	changed func(prep any) bool
}

// Every RPC of the Admission and Operator services, against a real engine.
func (f *secureFixture) rpcs() []rpc {
	eng := f.srv.Engine()
	draining := func(id string) bool {
		for _, d := range eng.Domains() {
			if d.ID == id {
				return d.Draining
			}
		}
		return false
	}
	const dom = "nvl72-a"
	return []rpc{
		{name: "Admit", prepare: func(*testing.T) any { return eng.LeaseCount() },
			call: func(ctx context.Context, c *grpc.ClientConn, _ any) error {
				_, err := admissionv1.NewAdmissionClient(c).Admit(ctx, &admissionv1.AdmitRequest{Tenant: "acme", Model: "small", PromptTokens: 10, MaxOutputTokens: 10})
				return err
			},
			changed: func(prep any) bool { return eng.LeaseCount() != prep.(int) }},
		{name: "Release", prepare: func(t *testing.T) any {
			d, err := eng.Admit(context.Background(), admission.Request{Tenant: "acme", Model: "small", PromptTokens: 10, MaxOutputTokens: 10})
			if err != nil || d.LeaseID == 0 {
				t.Fatalf("admit for release: %+v %v", d, err)
			}
			return d.LeaseID
		},
			call: func(ctx context.Context, c *grpc.ClientConn, prep any) error {
				_, err := admissionv1.NewAdmissionClient(c).Release(ctx, &admissionv1.ReleaseRequest{LeaseId: fmt.Sprintf("l-%d", prep.(uint64)), PromptTokens: 10, OutputTokens: 10})
				return err
			},
			changed: func(prep any) bool {
				// The lease is gone when released: a second release is NOT_FOUND.
				_, err := eng.Release(context.Background(), admission.Release{LeaseID: prep.(uint64)})
				return err != nil
			}},
		{name: "ListDomains", call: func(ctx context.Context, c *grpc.ClientConn, _ any) error {
			_, err := admissionv1.NewOperatorClient(c).ListDomains(ctx, &admissionv1.ListDomainsRequest{})
			return err
		}},
		{name: "DrainDomain", prepare: func(*testing.T) any { return nil },
			call: func(ctx context.Context, c *grpc.ClientConn, _ any) error {
				_, err := admissionv1.NewOperatorClient(c).DrainDomain(ctx, &admissionv1.DrainDomainRequest{Domain: dom, Reason: "test"})
				return err
			},
			changed: func(any) bool {
				d := draining(dom)
				_ = eng.Undrain(dom)
				return d
			}},
		{name: "UndrainDomain", prepare: func(t *testing.T) any {
			if err := eng.Drain(dom, "prepared"); err != nil {
				t.Fatal(err)
			}
			return nil
		},
			call: func(ctx context.Context, c *grpc.ClientConn, _ any) error {
				_, err := admissionv1.NewOperatorClient(c).UndrainDomain(ctx, &admissionv1.UndrainDomainRequest{Domain: dom})
				return err
			},
			changed: func(any) bool {
				d := draining(dom)
				_ = eng.Undrain(dom)
				return !d
			}},
		{name: "ListTenants", call: func(ctx context.Context, c *grpc.ClientConn, _ any) error {
			_, err := admissionv1.NewOperatorClient(c).ListTenants(ctx, &admissionv1.ListTenantsRequest{})
			return err
		}},
		{name: "GetTenant", call: func(ctx context.Context, c *grpc.ClientConn, _ any) error {
			_, err := admissionv1.NewOperatorClient(c).GetTenant(ctx, &admissionv1.GetTenantRequest{Name: "acme"})
			return err
		}},
		{name: "GetConfigStatus", call: func(ctx context.Context, c *grpc.ClientConn, _ any) error {
			_, err := admissionv1.NewOperatorClient(c).GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
			return err
		}},
		{name: "FreezeBurstCredit", prepare: func(*testing.T) any { return nil },
			call: func(ctx context.Context, c *grpc.ClientConn, _ any) error {
				_, err := admissionv1.NewOperatorClient(c).FreezeBurstCredit(ctx, &admissionv1.FreezeBurstCreditRequest{Duration: durationpb.New(time.Minute), Reason: "test"})
				return err
			},
			changed: func(any) bool { return eng.ThawCredit() }},
		{name: "ThawBurstCredit", prepare: func(*testing.T) any {
			eng.FreezeCreditFor(time.Minute, "prepared")
			return nil
		},
			call: func(ctx context.Context, c *grpc.ClientConn, _ any) error {
				_, err := admissionv1.NewOperatorClient(c).ThawBurstCredit(ctx, &admissionv1.ThawBurstCreditRequest{})
				return err
			},
			changed: func(any) bool { return !eng.ThawCredit() }},
	}
}

// Each role × every RPC of the Admission and Operator services, over real
// TLS with bearer tokens and client certificates: allowed calls are neither
// UNAUTHENTICATED nor PERMISSION_DENIED (and take effect); refused ones get
// the right code and change nothing.
func TestRolesOverEveryRPC(t *testing.T) {
	f := startSecure(t, nil)
	const ok = codes.OK
	unauth, denied := codes.Unauthenticated, codes.PermissionDenied
	//            Admit  Release ListDomains Drain   Undrain ListTenants GetTenant GetConfigStatus FreezeBurstCredit ThawBurstCredit
	want := map[string][10]codes.Code{
		"router-acme": {ok, ok, denied, denied, denied, denied, denied, denied, denied, denied},
		"router-all":  {ok, ok, denied, denied, denied, denied, denied, denied, denied, denied},
		"sre":         {denied, denied, ok, ok, ok, ok, ok, ok, ok, ok},
		"viewer":      {denied, denied, ok, denied, denied, ok, ok, ok, denied, denied},
		"dashboard":   {denied, denied, ok, denied, denied, ok, ok, ok, denied, denied},
		"stranger":    {unauth, unauth, unauth, unauth, unauth, unauth, unauth, unauth, unauth, unauth},
		"bad-token":   {unauth, unauth, unauth, unauth, unauth, unauth, unauth, unauth, unauth, unauth},
		"anonymous":   {unauth, unauth, unauth, unauth, unauth, unauth, unauth, unauth, unauth, unauth},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rpcs := f.rpcs()
	for caller, codesWant := range want {
		conn := f.dial(t, f.caller(caller))
		for i, r := range rpcs {
			var prep any
			if r.prepare != nil {
				prep = r.prepare(t)
			}
			err := r.call(ctx, conn, prep)
			got := status.Code(err)
			switch w := codesWant[i]; {
			case w == ok && (got == unauth || got == denied):
				t.Errorf("%s → %s: %v, want allowed", caller, r.name, err)
			case w != ok && got != w:
				t.Errorf("%s → %s: %v, want %v", caller, r.name, err, w)
			}
			if r.changed != nil {
				if changed := r.changed(prep); changed != (codesWant[i] == ok) {
					t.Errorf("%s → %s (%v): changed %v", caller, r.name, got, changed)
				}
			}
		}
	}
	// A router bound to acme may not Admit for globex; nothing is charged.
	before := f.srv.Engine().LeaseCount()
	_, err := admissionv1.NewAdmissionClient(f.dial(t, f.caller("router-acme"))).Admit(ctx,
		&admissionv1.AdmitRequest{Tenant: "globex", Model: "small", PromptTokens: 10, MaxOutputTokens: 10})
	if status.Code(err) != denied || !strings.Contains(err.Error(), "globex") {
		t.Errorf("router-acme admitting for globex: %v", err)
	}
	if f.srv.Engine().LeaseCount() != before {
		t.Error("a refused Admit took a lease")
	}
	// Nor release globex's lease, even knowing its id: NOT_FOUND, as for a
	// forged id, in the same words, and the lease and globex's quota are
	// as they were. (Tokens only refill meanwhile: the real clock runs.)
	eng := f.srv.Engine()
	theirs, err := eng.Admit(ctx, admission.Request{Tenant: "globex", Model: "small", PromptTokens: 10, MaxOutputTokens: 10})
	if err != nil || theirs.LeaseID == 0 {
		t.Fatalf("admit for globex: %+v %v", theirs, err)
	}
	quota, _ := eng.Tenant("globex")
	routerAcme := admissionv1.NewAdmissionClient(f.dial(t, f.caller("router-acme")))
	_, foreign := routerAcme.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: fmt.Sprintf("l-%d", theirs.LeaseID), OutputTokens: 1 << 30, Outcome: admissionv1.Outcome_OUTCOME_ERROR})
	if status.Code(foreign) != codes.NotFound || strings.Contains(foreign.Error(), "globex") {
		t.Errorf("router-acme releasing globex's lease: %v, want NOT_FOUND naming no tenant", foreign)
	}
	if after, _ := eng.Tenant("globex"); after.InFlight != 1 || after.TokenLevel < quota.TokenLevel {
		t.Errorf("a refused release changed globex: in flight %d, tokens %d → %d", after.InFlight, quota.TokenLevel, after.TokenLevel)
	}
	_, forged := routerAcme.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: fmt.Sprintf("l-%d", theirs.LeaseID^1)})
	if status.Code(forged) != codes.NotFound || status.Convert(forged).Message() != status.Convert(foreign).Message() {
		t.Errorf("a forged lease id: %v, want NOT_FOUND as for globex's (%v)", forged, foreign)
	}
	// Health stays open: load balancers probe it without credentials.
	if _, err := healthpb.NewHealthClient(f.dial(t, f.caller("anonymous"))).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health without credentials: %v", err)
	}
	// Operator actions and refusals were audited.
	reg := f.srv.metrics.Registry
	for _, c := range []struct{ action, outcome string }{
		{"DrainDomain", auth.OutcomeOK}, {"DrainDomain", auth.OutcomeDenied}, {"DrainDomain", auth.OutcomeUnauthenticated},
		{"UndrainDomain", auth.OutcomeOK}, {"ListTenants", auth.OutcomeDenied},
		{"FreezeBurstCredit", auth.OutcomeOK}, {"FreezeBurstCredit", auth.OutcomeDenied}, {"FreezeBurstCredit", auth.OutcomeUnauthenticated},
		{"ThawBurstCredit", auth.OutcomeOK}, {"ThawBurstCredit", auth.OutcomeDenied},
	} {
		if auth.AuditCount(reg, c.action, c.outcome) == 0 {
			t.Errorf("no audit count of %s %s", c.action, c.outcome)
		}
	}
}

// The HTTP listener serves TLS too: /healthz and /metrics open, the JSON
// API for viewers only.
func TestHTTPAuth(t *testing.T) {
	f := startSecure(t, nil)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(f.ca.CertPEM)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer hc.CloseIdleConnections()
	get := func(path, token string) int {
		req, err := http.NewRequest("GET", "https://"+f.srv.HTTPAddr().String()+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		path, token string
		want        int
	}{
		{"/healthz", "", 200},
		{"/metrics", "", 200},
		{"/v1/domains", "", 401},
		{"/v1/domains", "guessed", 401},
		{"/v1/domains", "router-acme-token", 403},
		{"/v1/domains", "viewer-token", 200},
	} {
		if got := get(c.path, c.token); got != c.want {
			t.Errorf("GET %s (token %q): %d, want %d", c.path, c.token, got, c.want)
		}
	}
	if f.srv.http.WriteTimeout == 0 || f.srv.http.ReadTimeout == 0 || f.srv.http.IdleTimeout == 0 {
		t.Error("HTTP server timeouts unset")
	}

	g := startSecure(t, func(o *Options) { o.Security.MetricsAuth = true })
	pool2 := x509.NewCertPool()
	pool2.AppendCertsFromPEM(g.ca.CertPEM)
	hc2 := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool2}}}
	defer hc2.CloseIdleConnections()
	resp, err := hc2.Get("https://" + g.srv.HTTPAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("--metrics-auth: /metrics without a token: %d", resp.StatusCode)
	}
}

// Without TLS, a bearer token is accepted from a loopback peer; from any
// other address it is UNAUTHENTICATED, saying that TLS is required.
func TestBearerOverPlaintext(t *testing.T) {
	f := startSecure(t, func(o *Options) {
		o.Security.TLSCert, o.Security.TLSKey, o.Security.ClientCA = "", "", ""
		o.GRPCAddr = "0.0.0.0:0"
	})
	port := f.srv.GRPCAddr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := client.Dial(fmt.Sprintf("127.0.0.1:%d", port), client.Security{Token: "viewer-token"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := admissionv1.NewOperatorClient(conn).ListDomains(ctx, &admissionv1.ListDomainsRequest{}); err != nil {
		t.Fatalf("token over loopback plaintext: %v", err)
	}
	if _, err := client.Dial("192.0.2.1:7070", client.Security{Token: "viewer-token"}); err == nil {
		t.Error("the client sends a token over plaintext beyond loopback")
	}
	ip := nonLoopbackIP()
	if ip == nil {
		t.Log("no non-loopback address on this machine: the remote case is covered by internal/auth's tests only")
		return
	}
	// Dial the machine's own non-loopback address, so that the server sees
	// a peer that is not loopback; send the token by hand, as a careless
	// client would.
	raw, err := grpc.NewClient(net.JoinHostPort(ip.String(), fmt.Sprint(port)), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	mdCtx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer viewer-token")
	_, err = admissionv1.NewOperatorClient(raw).ListDomains(mdCtx, &admissionv1.ListDomainsRequest{})
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "TLS") {
		t.Errorf("token over plaintext from %s: %v, want UNAUTHENTICATED saying TLS is needed", ip, err)
	}
}

// nonLoopbackIP returns one of this machine's addresses that is not
// loopback, or nil.
func nonLoopbackIP() net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil && !n.IP.IsLinkLocalUnicast() {
			return n.IP
		}
	}
	return nil
}

// Certificates rewritten while serving are used by the next handshakes, on
// both listeners, without a restart; a broken pair is refused and the last
// good one keeps serving.
func TestCertificateRotation(t *testing.T) {
	f := startSecure(t, nil)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(f.ca.CertPEM)
	serial := func(addr net.Addr, protos ...string) string {
		c, err := tls.Dial("tcp", addr.String(), &tls.Config{RootCAs: pool, NextProtos: protos})
		if err != nil {
			t.Fatalf("handshake with %s: %v", addr, err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	old := serial(f.srv.GRPCAddr(), "h2")
	next := f.ca.Server(t, "rotated")
	if next.Cert.SerialNumber.String() == old {
		t.Fatal("the test minted the same serial")
	}
	// A key that does not match is refused; the old pair keeps serving.
	authtest.WriteFile(t, f.keyFile, f.clients["stranger"].KeyPEM)
	if err := f.srv.ReloadSecurity(); err == nil {
		t.Fatal("a mismatched key was accepted")
	}
	if got := serial(f.srv.GRPCAddr(), "h2"); got != old {
		t.Fatalf("after a refused pair the server serves %s, want %s", got, old)
	}
	next.Write(t, f.certFile, f.keyFile)
	want := next.Cert.SerialNumber.String()
	testwait.Until(t, 10*time.Second, "the gRPC listener serving the rotated certificate", func() bool {
		return serial(f.srv.GRPCAddr(), "h2") == want
	})
	testwait.Until(t, 10*time.Second, "the HTTP listener serving the rotated certificate", func() bool {
		return serial(f.srv.HTTPAddr(), "http/1.1") == want
	})
	// RPCs still work over a fresh connection.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := admissionv1.NewOperatorClient(f.dial(t, f.caller("viewer"))).ListDomains(ctx, &admissionv1.ListDomainsRequest{}); err != nil {
		t.Fatalf("after rotation: %v", err)
	}
	if auth.AuditCount(f.srv.metrics.Registry, auth.ActionTLSReload, auth.OutcomeOK) == 0 {
		t.Error("the rotation was not audited")
	}
}

// An auth file rewritten while serving takes effect without a restart: a
// new principal is let in, a removed one is refused; a bad rewrite is
// refused and the last good file keeps serving.
func TestAuthFileRotation(t *testing.T) {
	f := startSecure(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list := func(sec client.Security) error {
		conn, err := client.Dial(f.srv.GRPCAddr().String(), sec)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = admissionv1.NewOperatorClient(conn).ListTenants(ctx, &admissionv1.ListTenantsRequest{})
		return err
	}
	newcomer := client.Security{CAFile: f.ca.File, Token: "newcomer-token"}
	if err := list(newcomer); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("before the rotation: %v", err)
	}
	// A bad file (no credential) is refused; the old one keeps serving.
	authtest.WriteFile(t, f.authFile, []byte("principals: [{name: x, roles: [viewer]}]"))
	testwait.Until(t, 10*time.Second, "the bad auth file refused", func() bool {
		return auth.AuditCount(f.srv.metrics.Registry, auth.ActionAuthReload, auth.OutcomeFailed) > 0
	})
	if err := list(f.caller("viewer")); err != nil {
		t.Fatalf("after a refused auth file: %v", err)
	}
	// A file truncated by a non-atomic rewrite names nobody: refused too,
	// rather than refusing every caller until it is written.
	authtest.WriteFile(t, f.authFile, nil)
	testwait.Until(t, 10*time.Second, "the empty auth file refused", func() bool {
		return auth.AuditCount(f.srv.metrics.Registry, auth.ActionAuthReload, auth.OutcomeFailed) > 1
	})
	if err := list(f.caller("viewer")); err != nil {
		t.Fatalf("after an empty auth file: %v", err)
	}
	authtest.WriteFile(t, f.authFile, []byte(`principals: [{name: newcomer, token_sha256: "`+authtest.TokenSHA256("newcomer-token")+`", roles: [viewer]}]`))
	testwait.Until(t, 10*time.Second, "the new auth file in force", func() bool { return list(newcomer) == nil })
	if err := list(f.caller("viewer")); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a principal removed from the file: %v", err)
	}
}

// Without --auth sluiced listens on loopback only: its default addresses
// are loopback, and a wider address is refused unless --insecure.
func TestLoopbackOnlyWithoutAuth(t *testing.T) {
	var o Options
	defaultAddrs(&o)
	if o.GRPCAddr != "127.0.0.1:7070" || o.HTTPAddr != "127.0.0.1:7071" {
		t.Errorf("defaults without --auth: %s %s", o.GRPCAddr, o.HTTPAddr)
	}
	o = Options{Security: SecurityOptions{AuthFile: "auth.yaml"}}
	defaultAddrs(&o)
	if o.GRPCAddr != ":7070" || o.HTTPAddr != ":7071" {
		t.Errorf("defaults with --auth: %s %s", o.GRPCAddr, o.HTTPAddr)
	}
	quiet := slog.New(slog.DiscardHandler)
	_, err := New(Options{GRPCAddr: "0.0.0.0:0", HTTPAddr: "127.0.0.1:0", Logger: quiet})
	if err == nil || !strings.Contains(err.Error(), "--grpc-addr") || !strings.Contains(err.Error(), "--auth") || !strings.Contains(err.Error(), "--insecure") {
		t.Fatalf("every interface without --auth: %v", err)
	}
	// New logs from the calling goroutine only: a plain buffer will do.
	var logs bytes.Buffer
	srv, err := New(Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: ":0", Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Security: SecurityOptions{Insecure: true, MaxConnections: 3}})
	if err != nil {
		t.Fatalf("--insecure: %v", err)
	}
	srv.grpcLis.Close()
	srv.httpLis.Close()
	if !strings.Contains(logs.String(), "--insecure") || !strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("no warning for --insecure:\n%s", logs.String())
	}
	logs.Reset()
	srv, err = New(Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv.grpcLis.Close()
	srv.httpLis.Close()
	if !strings.Contains(logs.String(), "loopback only") {
		t.Errorf("the start does not say it serves loopback only:\n%s", logs.String())
	}
	for _, bad := range []SecurityOptions{
		{ClientCA: "ca.pem"},
		{MetricsAuth: true},
		{TLSCert: "cert.pem"},
		{AuthFile: filepath.Join(t.TempDir(), "missing.yaml")},
	} {
		if _, err := New(Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Logger: quiet, Security: bad}); err == nil {
			t.Errorf("%+v: accepted", bad)
		}
	}
}

func TestConnectionsFor(t *testing.T) {
	for _, c := range []struct {
		nofile uint64
		want   int
	}{
		{0, minMaxConnections}, {256, minMaxConnections}, {1024, 384}, {1 << 20, (1<<20 - 256) / 2}, {^uint64(0), maxMaxConnections},
	} {
		if got := connectionsFor(c.nofile); got != c.want {
			t.Errorf("connectionsFor(%d) = %d, want %d", c.nofile, got, c.want)
		}
	}
	if n := defaultMaxConnections(); n < minMaxConnections || n > maxMaxConnections {
		t.Errorf("defaultMaxConnections() = %d", n)
	}
}

// A config reload (SIGHUP) is audited with its outcome.
func TestConfigReloadIsAudited(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	authtest.WriteFile(t, path, config.DefaultYAML())
	srv, _, _, _ := start(t, Options{ConfigPath: path})
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	authtest.WriteFile(t, path, []byte(strings.Replace(string(config.DefaultYAML()), "weight: 8", "weight: 0", 1)))
	if err := srv.Reload(); err == nil || !strings.Contains(err.Error(), "tiers.enterprise.weight") {
		t.Fatalf("a zero weight: %v", err)
	}
	reg := srv.metrics.Registry
	if ok, failed := auth.AuditCount(reg, auth.ActionConfigReload, auth.OutcomeOK), auth.AuditCount(reg, auth.ActionConfigReload, auth.OutcomeFailed); ok != 1 || failed != 1 {
		t.Errorf("config_reload audited ok %v, failed %v; want 1 and 1", ok, failed)
	}
}
