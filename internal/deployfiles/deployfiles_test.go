package deployfiles

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/client"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/server"
	"github.com/sluice-sched/sluice/internal/testdep"
	"github.com/sluice-sched/sluice/topology"
)

// TestPrometheusRules runs promtool over the alerting rules and their unit
// tests. Without promtool the test skips, except in CI (CI=true), where
// .ci/run installs it (Debian's prometheus package) and a skip would hide
// broken rules.
func TestPrometheusRules(t *testing.T) {
	promtool := testdep.Binary(t, "apt-get install -y prometheus", "promtool")
	dir := filepath.Join(Dir(), "prometheus")
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestManifests checks the shape docs/deploy.md describes: sluiced a Deployment
// of 3 with a Service and a PodDisruptionBudget that select its pods,
// sluice-agent a DaemonSet on GPU nodes, TLS and auth mounted from secrets,
// KEDA scaling on the queue depth; and that the ConfigMap's fallback config
// and topology are ones sluiced accepts.
func TestManifests(t *testing.T) {
	objs, err := Manifests()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o["apiVersion"] == nil || o.Kind() == "" || o.Name() == "" {
			t.Errorf("object without apiVersion, kind or name: %v", o)
		}
	}
	must := func(kind, name string) Object {
		t.Helper()
		o, err := Find(objs, kind, name)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	dep := must("Deployment", "sluiced")
	if r := Lookup(dep, "spec", "replicas"); r != float64(3) {
		t.Errorf("sluiced replicas = %v, want 3", r)
	}
	podLabels, _ := Lookup(dep, "spec", "template", "metadata", "labels").(map[string]any)
	selects := func(what string, sel any) {
		t.Helper()
		m, _ := sel.(map[string]any)
		if len(m) == 0 {
			t.Errorf("%s has no selector", what)
		}
		for k, v := range m {
			if podLabels[k] != v {
				t.Errorf("%s selects %s=%v, which sluiced's pods do not carry", what, k, v)
			}
		}
	}
	selects("Deployment", Lookup(dep, "spec", "selector", "matchLabels"))
	selects("Service", Lookup(must("Service", "sluiced"), "spec", "selector"))
	pdb := must("PodDisruptionBudget", "sluiced")
	selects("PodDisruptionBudget", Lookup(pdb, "spec", "selector", "matchLabels"))
	if m := Lookup(pdb, "spec", "minAvailable"); m != float64(2) {
		t.Errorf("PodDisruptionBudget minAvailable = %v, want 2 of 3", m)
	}
	secrets := map[string]bool{}
	vols, _ := Lookup(dep, "spec", "template", "spec", "volumes").([]any)
	for _, v := range vols {
		if s, ok := Lookup(v, "secret", "secretName").(string); ok {
			secrets[s] = true
		}
	}
	for _, s := range []string{"sluice-tls", "sluice-auth", "sluice-etcd-tls"} {
		if !secrets[s] {
			t.Errorf("sluiced does not mount secret %s", s)
		}
	}
	args, err := ContainerArgs("Deployment", "sluiced")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--auth=", "--tls-cert=", "--tls-key=", "--client-ca=", "--etcd=", "--replicas=3"} {
		if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, want) }) {
			t.Errorf("sluiced args lack %s…", want)
		}
	}

	ds := must("DaemonSet", "sluice-agent")
	if Lookup(ds, "spec", "template", "spec", "nodeSelector", "nvidia.com/gpu.present") != "true" {
		t.Error("sluice-agent is not limited to GPU nodes")
	}
	tols, _ := Lookup(ds, "spec", "template", "spec", "tolerations").([]any)
	if !slices.ContainsFunc(tols, func(t any) bool { return Lookup(t, "key") == "nvidia.com/gpu" }) {
		t.Error("sluice-agent does not tolerate the nvidia.com/gpu taint")
	}
	if res := Lookup(ds, "spec", "template", "spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"); res != nil {
		t.Error("sluice-agent requests GPUs: it only queries NVML")
	}

	keda := 0
	for _, o := range objs {
		if o.Kind() != "ScaledObject" {
			continue
		}
		keda++
		if Lookup(o, "spec", "triggers", 0, "type") != "prometheus" {
			t.Errorf("ScaledObject %s: want a prometheus trigger", o.Name())
		}
		// Inference workers scale on the queue, deferred workers on the
		// backlog.
		if q, _ := Lookup(o, "spec", "triggers", 0, "metadata", "query").(string); !strings.Contains(q, "sluice_queue_depth") && !strings.Contains(q, "sluice_deferred_tickets") {
			t.Errorf("ScaledObject %s scales on %q, want sluice_queue_depth or sluice_deferred_tickets", o.Name(), q)
		}
	}
	if keda == 0 {
		t.Error("no KEDA ScaledObject")
	}

	cm := must("ConfigMap", "sluice-config")
	cfgText, _ := Lookup(cm, "data", "sluice.yaml").(string)
	cfg, err := config.Parse("sluice-config/sluice.yaml", []byte(cfgText))
	if err != nil {
		t.Fatalf("the ConfigMap's config: %v", err)
	}
	topoText, _ := Lookup(cm, "data", "cluster.yaml").(string)
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(path, []byte(topoText), 0o600); err != nil {
		t.Fatal(err)
	}
	cluster, err := topology.LoadFile(path)
	if err != nil {
		t.Fatalf("the ConfigMap's topology: %v", err)
	}
	if _, err := admission.New(cfg, cluster); err != nil {
		t.Fatalf("the ConfigMap's config on its topology: %v", err)
	}
}

// startSluiced serves the embedded default on loopback until the test
// ends, and returns it with an Admission client and the serving context.
func startSluiced(t *testing.T) (*server.Server, admissionv1.AdmissionClient, context.Context) {
	t.Helper()
	srv, err := server.New(server.Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx); close(done) }()
	conn, err := client.Dial(srv.GRPCAddr().String(), client.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); cancel(); <-done })
	return srv, admissionv1.NewAdmissionClient(conn), ctx
}

// metricName finds Sluice metric names in PromQL.
var metricName = regexp.MustCompile(`\bsluice_[a-z0-9_]+`)

// TestDeployedQueriesNameRealMetrics: every sluice_* metric the alerts, the
// dashboard and the KEDA trigger query is one a running sluiced exports.
func TestDeployedQueriesNameRealMetrics(t *testing.T) {
	srv, admissions, ctx := startSluiced(t)
	// Decide once over gRPC, so that the tenant-labelled families and the
	// Admit latency have a series.
	if _, err := admissions.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "acme", Model: "small", PromptTokens: 10, MaxOutputTokens: 1}); err != nil {
		t.Fatal(err)
	}
	r, err := http.Get("http://" + srv.HTTPAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r.Body)
	r.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for name, f := range fams {
		known[name] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_count", "_sum"} {
				known[name+s] = true
			}
		}
	}
	// Families with no series yet: the shared state's without Redis, the
	// control plane's without etcd, the queue depth while nothing waits,
	// the engines' signals while no topology names engines, the deferred
	// backlog's per-tenant series while it is empty.
	for _, f := range []string{"sluice_shared_breaker_open", "sluice_shared_fallback_seconds_total", "sluice_shared_reconcile_lag_seconds",
		"sluice_control_plane_connected", "sluice_queue_depth",
		"sluice_domain_engine_queue", "sluice_domain_engine_kv_usage_ratio", "sluice_domain_engine_metrics_age_seconds", "sluice_domain_engine_saturated",
		"sluice_deferred_backlog", "sluice_deferred_oldest_age_seconds"} {
		known[f] = true
	}
	var texts []string
	for _, f := range append([]string{"prometheus/alerts.yaml", "grafana/sluice.json"}, kedaFiles...) {
		b, err := os.ReadFile(filepath.Join(Dir(), f))
		if err != nil {
			t.Fatal(err)
		}
		texts = append(texts, string(b))
	}
	var dash map[string]any
	if err := json.Unmarshal([]byte(texts[1]), &dash); err != nil {
		t.Fatalf("grafana/sluice.json: %v", err)
	}
	seen := 0
	for _, text := range texts {
		for _, name := range metricName.FindAllString(text, -1) {
			seen++
			if !known[name] {
				t.Errorf("%s is queried but sluiced does not export it", name)
			}
		}
	}
	if seen < 20 {
		t.Errorf("only %d metric references found", seen)
	}
}
