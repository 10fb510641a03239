package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/internal/deployfiles"
	"github.com/sluice-sched/sluice/topology"
)

func TestBadFlagsAndEnvironmentAreRefused(t *testing.T) {
	if err := run([]string{"--log-format", "xml"}, io.Discard); err == nil || !strings.Contains(err.Error(), "--log-format") {
		t.Fatalf("bad --log-format: %v", err)
	}
	if err := run([]string{"--log-level", "loud"}, io.Discard); err == nil || !strings.Contains(err.Error(), "--log-level") {
		t.Fatalf("bad --log-level: %v", err)
	}
	t.Setenv("SLUICE_PRINT_DEFAULT_CONFIG", "yes please")
	if err := run(nil, io.Discard); err == nil || !strings.Contains(err.Error(), "SLUICE_PRINT_DEFAULT_CONFIG") {
		t.Fatalf("bad environment value: %v", err)
	}
}

func TestConfigFileErrorsNameTheFile(t *testing.T) {
	err := run([]string{"--config", "/nonexistent/sluice.yaml", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/sluice.yaml") {
		t.Fatalf("missing config: %v", err)
	}
}

// --print-topology prints what --topology resolves to, in either format,
// on the writer run is given, and exits without serving.
func TestPrintTopology(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"--print-topology", "--topology", "simulated", "--print-topology-format", "json"}, &out); err != nil {
		t.Fatal(err)
	}
	var r topology.Report
	dec := json.NewDecoder(&out)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("json: %v\n%s", err, out.String())
	}
	sim := topology.Simulated()
	if r.Source != "simulated" || len(r.Domains) != len(sim.Domains) || r.Domains[0].ID != sim.Domains[0].ID {
		t.Errorf("report: source %q, %d domains; want simulated, %d", r.Source, len(r.Domains), len(sim.Domains))
	}

	out.Reset()
	if err := run([]string{"--print-topology", "--topology", "simulated"}, &out); err != nil {
		t.Fatal(err)
	}
	if first, _, _ := strings.Cut(out.String(), "\n"); first != "source: simulated" {
		t.Errorf("table starts %q, want the source line", first)
	}

	t.Setenv("SLUICE_PRINT_TOPOLOGY_FORMAT", "yaml")
	if err := run([]string{"--print-topology", "--topology", "simulated"}, io.Discard); err == nil || !strings.Contains(err.Error(), `--print-topology-format "yaml"`) {
		t.Errorf("bad format: %v", err)
	}
}

// Without --auth sluiced refuses to listen beyond loopback unless
// --insecure; the security flags' mistakes are refused at start.
func TestSecurityFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--grpc-addr", ":0", "--http-addr", "127.0.0.1:0"}, "--insecure"},
		{[]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--auth", "/nonexistent/auth.yaml"}, "/nonexistent/auth.yaml"},
		{[]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--client-ca", "ca.pem"}, "--tls-cert"},
		{[]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--metrics-auth"}, "--auth"},
		{[]string{"--max-connections", "many"}, "max-connections"},
		{[]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--max-connections-per-peer", "-1"}, "--max-connections-per-peer"},
		{[]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--http-allowed-hosts", "sluice.internal,https://x"}, "--http-allowed-hosts"},
	} {
		if err := run(c.args, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}

// --version prints the build's version and --help the usage, both exiting 0.
func TestVersionAndHelp(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"--version"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "sluiced ") || !strings.Contains(out.String(), "revision") {
		t.Errorf("--version printed %q", out.String())
	}
	if err := run([]string{"--help"}, io.Discard); err != nil {
		t.Errorf("--help: %v, want no error (exit 0)", err)
	}
	if err := run([]string{"--metrics-max-tenant-series", "-1"}, io.Discard); err == nil || !strings.Contains(err.Error(), "--metrics-max-tenant-series") {
		t.Errorf("a bound of -1: %v", err)
	}
	if err := run([]string{"--engine-readers", "0"}, io.Discard); err == nil || !strings.Contains(err.Error(), "--engine-readers") {
		t.Errorf("no engine readers: %v, want a refusal naming --engine-readers", err)
	}
}

// The Deployment in deploy/k8s passes flags sluiced has, with values they
// parse: run parses them all, then --version returns before serving.
func TestDeploymentArgsAreSluicedFlags(t *testing.T) {
	args, err := deployfiles.ContainerArgs("Deployment", "sluiced")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(append(args, "--version"), &out); err != nil {
		t.Fatalf("deploy/k8s/sluiced.yaml args %v: %v", args, err)
	}
}

// --memory-limit sets the runtime's soft limit from a size, leaves it with
// off, and refuses anything else naming the flag.
func TestMemoryLimitFlag(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(before)
	logger := slog.New(slog.DiscardHandler)
	if err := setMemoryLimit("300MiB", logger); err != nil || debug.SetMemoryLimit(-1) != 300<<20 {
		t.Fatalf("300MiB: %v, limit %d", err, debug.SetMemoryLimit(-1))
	}
	if err := setMemoryLimit("off", logger); err != nil || debug.SetMemoryLimit(-1) != 300<<20 {
		t.Fatalf("off changed the limit: %v, %d", err, debug.SetMemoryLimit(-1))
	}
	for _, bad := range []string{"bogus", "0", "-5MiB"} {
		if err := setMemoryLimit(bad, logger); err == nil || !strings.Contains(err.Error(), "--memory-limit") {
			t.Errorf("%q: got %v, want a refusal naming --memory-limit", bad, err)
		}
	}
}
