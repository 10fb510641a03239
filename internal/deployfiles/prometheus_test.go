package deployfiles

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/testdep"
	"github.com/sluice-sched/sluice/internal/testwait"
)

// TestEveryDeployedExpressionEvaluates scrapes a running sluiced into a
// real Prometheus (Debian's package, as promtool is) and evaluates every
// expression the alerts, the Grafana dashboard and the KEDA triggers hold:
// one Prometheus refuses fails the test. (That each names a series sluiced
// exports is TestDeployedQueriesNameRealMetrics.)
func TestEveryDeployedExpressionEvaluates(t *testing.T) {
	prom := testdep.Binary(t, "apt-get install -y prometheus", "prometheus")
	srv, admissions, ctx := startSluiced(t)
	admit := func() {
		for _, tenant := range []string{"acme", "globex", "nobody"} {
			_, _ = admissions.Admit(ctx, &admissionv1.AdmitRequest{Tenant: tenant, Model: "small", PromptTokens: 10, MaxOutputTokens: 1})
		}
	}
	admit()

	dir := t.TempDir()
	cfg := fmt.Sprintf("global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n  - job_name: sluiced\n    static_configs: [{targets: [%q]}]\n", srv.HTTPAddr().String())
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cmd := exec.Command(prom, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	query := func(expr string) (result []json.RawMessage, err error) {
		resp, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(expr))
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var body struct {
			Status string `json:"status"`
			Error  string `json:"error"`
			Data   struct {
				Result []json.RawMessage `json:"result"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			return nil, err
		}
		if body.Status != "success" {
			return nil, fmt.Errorf("%s", body.Error)
		}
		return body.Data.Result, nil
	}
	// Enough scrapes for the rates: a few seconds of answers.
	testwait.Until(t, 60*time.Second, "Prometheus to scrape sluiced's decisions over 4 s", func() bool {
		admit()
		r, err := query(`count_over_time(sluice_decisions_total{decision="ADMITTED"}[1m])`)
		if err != nil || len(r) == 0 {
			return false
		}
		var s struct {
			Value [2]any `json:"value"`
		}
		_ = json.Unmarshal(r[0], &s)
		n, _ := s.Value[1].(string)
		v, err := strconv.ParseFloat(n, 64)
		return err == nil && v >= 4
	})

	exprs := deployedExpressions(t)
	if len(exprs) < 25 {
		t.Fatalf("only %d expressions found", len(exprs))
	}
	for _, e := range exprs {
		if _, err := query(e.expr); err != nil {
			t.Errorf("%s: %s: %v", e.from, e.expr, err)
		}
	}
}

// expression is one PromQL expression of the deployed files, and where.
type expression struct{ from, expr string }

// deployedExpressions reads every expression of the alerts, the Grafana
// dashboard (its variables filled in to match everything) and the KEDA
// triggers.
func deployedExpressions(t *testing.T) []expression {
	t.Helper()
	var out []expression
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	b, err := os.ReadFile(filepath.Join(Dir(), "prometheus/alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out = append(out, expression{"alerts.yaml " + r.Alert, r.Expr})
		}
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if b, err = os.ReadFile(filepath.Join(Dir(), "grafana/sluice.json")); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	fill := strings.NewReplacer("$__rate_interval", "1m", "$instance", ".*", "$tenant", ".*", "$domain", ".*", "$model", ".*")
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			if tg.Expr != "" {
				out = append(out, expression{"grafana " + p.Title, fill.Replace(tg.Expr)})
			}
		}
	}
	for _, f := range kedaFiles {
		if b, err = os.ReadFile(filepath.Join(Dir(), f)); err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`(?m)^\s*query:\s*(.+)$`).FindAllStringSubmatch(string(b), -1) {
			out = append(out, expression{"keda " + f, strings.Trim(m[1], `'"`)})
		}
	}
	return out
}

// kedaFiles hold the KEDA triggers: the inference workers' on the queue,
// the deferred workers' on the backlog.
var kedaFiles = []string{"k8s/keda-scaledobject.yaml", "k8s/deferred-workers.yaml"}

// freeAddr returns a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
