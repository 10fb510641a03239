package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/auth/authtest"
	"github.com/sluice-sched/sluice/internal/server"
)

// sluicectl reaches a sluiced that serves TLS and requires a principal:
// with the CA and a token (flag or SLUICE_TOKEN) or a client certificate
// it acts; without a credential, or with the wrong role, it is refused and
// nothing changes.
func TestSluicectlWithTLSAndCredentials(t *testing.T) {
	ca := authtest.NewCA(t, "ctl")
	leaf := ca.Server(t, "server")
	sre := ca.Client(t, "sre", authtest.Identity{URIs: []string{"spiffe://test/sre"}})
	authFile := filepath.Join(t.TempDir(), "auth.yaml")
	authtest.WriteFile(t, authFile, fmt.Appendf(nil, `principals:
  - {name: viewer, token_sha256: %q, roles: [viewer]}
  - {name: sre, mtls_san: "spiffe://test/sre", roles: [operator]}
`, authtest.TokenSHA256("viewer-token")))
	srv, err := server.New(server.Options{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Topology: "simulated",
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Security: server.SecurityOptions{AuthFile: authFile, TLSCert: leaf.CertFile, TLSKey: leaf.KeyFile, ClientCA: ca.File},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	addr := srv.GRPCAddr().String()
	draining := func() bool {
		for _, d := range srv.Engine().Domains() {
			if d.ID == "nvl72-a" {
				return d.Draining
			}
		}
		return false
	}
	timeout := "--timeout=" + (10 * time.Second).String()

	if code, out, errs := sluicectl("domains", "--server", addr, "--tls-ca", ca.File, "--token", "viewer-token", "-o", "json", timeout); code != 0 || !strings.Contains(out, "nvl72-a") {
		t.Fatalf("domains with a viewer token: %d %s %s", code, out, errs)
	}
	if code, _, errs := sluicectl("domains", "--server", addr, "--tls-ca", ca.File, timeout); code == 0 || !strings.Contains(errs, "Unauthenticated") {
		t.Fatalf("domains without a credential: %d %s", code, errs)
	}
	t.Setenv("SLUICE_TOKEN", "viewer-token")
	if code, out, errs := sluicectl("config", "status", "--server", addr, "--tls-ca", ca.File); code != 0 || !strings.Contains(out, "source:") {
		t.Fatalf("config status with SLUICE_TOKEN: %d %s %s", code, out, errs)
	}
	if code, _, errs := sluicectl("drain", "nvl72-a", "--server", addr, "--tls-ca", ca.File, "--reason", "swap", timeout); code == 0 || !strings.Contains(errs, "PermissionDenied") || draining() {
		t.Fatalf("drain as a viewer: %d %s (draining %v)", code, errs, draining())
	}
	t.Setenv("SLUICE_TOKEN", "")
	if code, out, errs := sluicectl("drain", "nvl72-a", "--server", addr, "--tls-ca", ca.File, "--tls-cert", sre.CertFile, "--tls-key", sre.KeyFile, "--tls-server-name", "localhost", "--reason", "swap", timeout); code != 0 || !draining() {
		t.Fatalf("drain as the operator: %d %s %s", code, out, errs)
	}
	if code, _, errs := sluicectl("domains", "--server", addr, "--token", "viewer-token", timeout); code == 0 || !strings.Contains(errs, "plaintext") && !strings.Contains(errs, "Unavailable") {
		t.Fatalf("plaintext to a TLS server: %d %s", code, errs)
	}
}
