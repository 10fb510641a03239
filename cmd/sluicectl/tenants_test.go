package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/server"
)

// startPlain runs a sluiced with the embedded demo config and no etcd.
func startPlain(t *testing.T) *server.Server {
	t.Helper()
	srv, err := server.New(server.Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Topology: "simulated",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return srv
}

// tenants lists sorted pages in either format; tenant shows one tenant's
// gates, levels, queue, leases and spend.
func TestTenantsAndTenant(t *testing.T) {
	srv := startPlain(t)
	addr := srv.GRPCAddr().String()
	if _, err := srv.Engine().Admit(context.Background(), admission.Request{Tenant: "acme", Model: "small", PromptTokens: 100, MaxOutputTokens: 10}); err != nil {
		t.Fatal(err)
	}

	code, out, errs := sluicectl("tenants", "--server", addr)
	if code != 0 {
		t.Fatalf("tenants: %d %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "TENANT") || !strings.HasPrefix(lines[1], "acme ") || !strings.HasPrefix(lines[4], "initech ") {
		t.Fatalf("tenants, sorted by name:\n%s", out)
	}

	// Sorted by in-flight leases, two a page: acme first; the second page
	// holds the rest by name.
	code, out, errs = sluicectl("tenants", "--server", addr, "--sort", "in-flight", "--page-size", "2", "--page", "2", "-o", "json")
	if code != 0 {
		t.Fatalf("tenants -o json: %d %s", code, errs)
	}
	var page struct {
		Total, Page, Pages int
		Tenants            []struct {
			Name     string `json:"name"`
			InFlight string `json:"inFlight"`
		}
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if page.Total != 4 || page.Page != 2 || page.Pages != 2 || len(page.Tenants) != 2 || page.Tenants[0].Name != "hooli" || page.Tenants[1].Name != "initech" {
		t.Fatalf("page 2 by in-flight: %+v", page)
	}
	if code, _, errs := sluicectl("tenants", "--server", addr, "--sort", "in-flight", "--page-size", "1"); code != 0 || !strings.Contains(errs, "page 1 of 4") {
		t.Fatalf("page footer: %d %q", code, errs)
	}
	if code, _, errs := sluicectl("tenants", "--server", addr, "--sort", "size"); code != 1 || !strings.Contains(errs, "--sort") {
		t.Fatalf("bad sort: %d %q", code, errs)
	}

	code, out, errs = sluicectl("tenant", "acme", "--server", addr)
	if code != 0 {
		t.Fatalf("tenant: %d %s", code, errs)
	}
	for _, want := range []string{"tier:", "enterprise (weight 8", "token bucket:", "burst credit:", "breaker:", "closed", "queued:", "leases:", "1 in flight", "spent:"} {
		if !strings.Contains(out, want) {
			t.Errorf("tenant acme lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = sluicectl("tenant", "acme", "--server", addr, "-o", "json")
	var one map[string]any
	if err := json.Unmarshal([]byte(out), &one); code != 0 || err != nil || one["name"] != "acme" || one["inFlight"] != "1" {
		t.Fatalf("tenant -o json: %d %v %v", code, err, one)
	}
	if code, _, errs := sluicectl("tenant", "nobody", "--server", addr); code != 1 || !strings.Contains(errs, "NotFound") {
		t.Fatalf("unknown tenant: %d %q", code, errs)
	}
}

// --version, version -o json and --help exit 0; the completion scripts
// (cobra's) are valid shell.
func TestVersionHelpAndCompletion(t *testing.T) {
	if code, out, _ := sluicectl("--version"); code != 0 || !strings.HasPrefix(out, "sluicectl ") || !strings.Contains(out, "revision") {
		t.Fatalf("--version: %d %q", code, out)
	}
	var v map[string]string
	if code, out, _ := sluicectl("version", "-o", "json"); code != 0 || json.Unmarshal([]byte(out), &v) != nil || !strings.HasPrefix(v["version"], "sluicectl ") {
		t.Fatalf("version -o json: %d %q", code, out)
	}
	if code, out, _ := sluicectl("--help"); code != 0 || !strings.Contains(out, "tenant") || strings.Contains(out, "__complete") {
		t.Fatalf("--help: %d %q", code, out)
	}
	for _, sh := range []string{"bash", "zsh", "fish"} {
		code, out, errs := sluicectl("completion", sh)
		if code != 0 || !strings.Contains(out, "__complete") {
			t.Fatalf("completion %s: %d %q", sh, code, errs)
		}
		bin, err := exec.LookPath(sh)
		if err != nil {
			t.Logf("%s not installed: its script's syntax is not checked", sh)
			continue
		}
		path := filepath.Join(t.TempDir(), "completion."+sh)
		if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
			t.Fatal(err)
		}
		if b, err := exec.Command(bin, "-n", path).CombinedOutput(); err != nil {
			t.Errorf("%s -n: %v\n%s", sh, err, b)
		}
	}
	if code, _, _ := sluicectl("completion", "tcsh"); code != 2 {
		t.Errorf("completion tcsh: exit %d, want 2 (no such shell: a usage error)", code)
	}
}

// -o json on the commands whose table is a sentence: drain and undrain on
// one server, config validate and config status.
func TestJSONOutputOfDrainAndConfig(t *testing.T) {
	srv := startPlain(t)
	addr := srv.GRPCAddr().String()
	var res map[string]any
	code, out, errs := sluicectl("drain", "hgx-h200-1", "--server", addr, "--reason", "test", "-o", "json")
	if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil || res["domain"] != "hgx-h200-1" || res["action"] != "drain" {
		t.Fatalf("drain -o json: %d %v %q %q", code, err, out, errs)
	}
	if d := srv.Engine().Domains(); !slices.ContainsFunc(d, func(d admission.DomainInfo) bool { return d.ID == "hgx-h200-1" && d.Draining }) {
		t.Fatal("not drained")
	}
	code, out, _ = sluicectl("undrain", "hgx-h200-1", "--server", addr, "-o", "json")
	if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil || res["action"] != "undrain" {
		t.Fatalf("undrain -o json: %d %v %q", code, err, out)
	}
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, []byte("tiers:\n  t: {rps: {rate: 1, burst: 1}, tokens: {rate: 100, burst: 100}}\ntenants:\n  a: {tier: t}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs = sluicectl("config", "validate", "-f", path, "-o", "json")
	if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil || res["valid"] != true || res["tenants"] != float64(1) {
		t.Fatalf("config validate -o json: %d %v %q %q", code, err, out, errs)
	}
	code, out, errs = sluicectl("config", "status", "--server", addr, "-o", "json")
	if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil || res["source"] == nil {
		t.Fatalf("config status -o json: %d %v %q %q", code, err, out, errs)
	}
}
