package dashboard_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/server"
	"github.com/sluice-sched/sluice/internal/testdep"
	"github.com/sluice-sched/sluice/internal/testwait"
)

// browserTopology is the simulated cluster's shape written as a file, with
// one GPU unhealthy and one short of NVLinks, so that the page has every
// slot state to draw.
func browserTopology() string {
	var b strings.Builder
	b.WriteString("domains:\n")
	for _, rack := range []string{"nvl72-a", "nvl72-b"} {
		fmt.Fprintf(&b, "  - id: %s\n    kind: nvl72\n    gpu: NVIDIA GB200\n    gpus_per_node: 4\n    nodes:\n", rack)
		for tray := 1; tray <= 18; tray++ {
			fmt.Fprintf(&b, "      - name: %s-tray%02d\n", rack, tray)
			switch {
			case rack == "nvl72-a" && tray == 7:
				b.WriteString("        gpus: [{}, {}, {healthy: false, active_nvlinks: 0}, {}]\n")
			case rack == "nvl72-b" && tray == 12:
				b.WriteString("        gpus: [{}, {active_nvlinks: 12}, {}, {}]\n")
			}
		}
	}
	for i := 1; i <= 4; i++ {
		fmt.Fprintf(&b, "  - id: hgx-h200-%d\n    kind: hgx\n    nodes:\n      - {name: hgx-h200-%d, gpu: NVIDIA H200, count: 8}\n", i, i)
	}
	return b.String()
}

// chromium finds Debian's chromium (or another Chrome). Without one the
// test is skipped, except in CI (CI=true), where .ci/run installs it and a
// missing browser must not pass silently.
func chromium(t *testing.T) string {
	t.Helper()
	return testdep.Binary(t, "apt-get install -y chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
}

// artifactDir is where the test leaves its screenshot: $SLUICE_ARTIFACTS
// when set (CI collects it), else the test's temporary directory.
func artifactDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("SLUICE_ARTIFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// TestDashboardInChromium drives the page in headless Chromium against a
// real sluiced: every GPU slot is drawn in its domain's shape, a drain made
// through the Operator API shows within a second without a reload, and a
// tenant's row follows its load. It saves a screenshot.
func TestDashboardInChromium(t *testing.T) {
	browser := chromium(t)
	topoFile := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(topoFile, []byte(browserTopology()), 0o644); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Options{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Topology: topoFile,
		Logger: slog.New(slog.DiscardHandler),
		// The page's refresh: the default (500 ms) halved, to leave the
		// browser half of the second on two shared cores.
		Dashboard: server.DashboardOptions{Every: 250 * time.Millisecond, SampleEvery: 250 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	srvCtx, stopSrv := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { _ = srv.Serve(srvCtx); close(served) }()
	t.Cleanup(func() { stopSrv(); <-served })

	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.WindowSize(1500, 1300),
		chromedp.Flag("disable-dev-shm-usage", true))...)
	defer cancelAlloc()
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	defer cancelCtx()
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelTimeout()
	eval := func(js string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("evaluate %s: %v", js, err)
		}
		return v
	}

	if _, err := chromedp.Run(ctx, chromedp.Navigate("http://"+srv.HTTPAddr().String()+"/")); err != nil {
		t.Fatalf("navigate: %v", err)
	}
	// A mark on the window: a reload would wipe it.
	eval(`window.sluiceTestMark = "no reload"; "ok"`)
	notReloaded := func() {
		t.Helper()
		if got := eval(`String(window.sluiceTestMark)`); got != "no reload" {
			t.Fatalf("the page was reloaded (mark %q)", got)
		}
	}
	testwait.Until(t, 30*time.Second, "the page draws 176 GPU slots", func() bool {
		return eval(`String(document.querySelectorAll("[data-gpu]").length)`) == "176"
	})

	// Every NVL72 domain has 72 slots on 18 trays of 4; every HGX 8 slots.
	counts := eval(`JSON.stringify([...document.querySelectorAll(".domain")].map(d => [d.dataset.domain, d.dataset.kind,
		d.querySelectorAll("[data-gpu]").length, d.querySelectorAll(".tray").length,
		[...d.querySelectorAll("[data-gpu]")].every(s => s.dataset.gpu.startsWith(d.dataset.domain + "/"))]))`)
	want := `[["nvl72-a","nvl72",72,18,true],["nvl72-b","nvl72",72,18,true],` +
		`["hgx-h200-1","hgx",8,0,true],["hgx-h200-2","hgx",8,0,true],["hgx-h200-3","hgx",8,0,true],["hgx-h200-4","hgx",8,0,true]]`
	if counts != want {
		t.Fatalf("slots per domain (id, kind, slots, trays, all named in it):\n got %s\nwant %s", counts, want)
	}
	if got := eval(`document.querySelector('[data-gpu="nvl72-a/nvl72-a-tray07/2"]').dataset.health + "/" +
		document.querySelector('[data-gpu="nvl72-b/nvl72-b-tray12/1"]').dataset.nvlink`); got != "unhealthy/degraded" {
		t.Errorf("the sick GPUs are drawn as %s, want unhealthy/degraded", got)
	}

	// A drain through the Operator API shows within a second.
	conn, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := admissionv1.NewOperatorClient(conn).DrainDomain(ctx, &admissionv1.DrainDomainRequest{Domain: "hgx-h200-2", Reason: "swap the fans"}); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, time.Second, "the drained domain marked on the page", func() bool {
		return eval(`(() => { const d = document.querySelector('[data-domain="hgx-h200-2"]');
			return d.dataset.draining + "|" + d.querySelector(".drain-mark").textContent })()`) == "true|swap the fans"
	})
	if got := eval(`document.querySelector('[data-domain="hgx-h200-2"]').textContent`); !strings.Contains(got, "drained: no new placements") || strings.Contains(got, "capacity full") {
		t.Errorf("the drained domain's panel: %q, want its capacity shown as drained", got)
	}
	notReloaded()

	// Under load, acme's row moves.
	row := func() string {
		return eval(`(() => { const r = document.querySelector('tr[data-tenant="acme"]');
			return r ? r.querySelector("td.admitted").textContent + "|" + r.querySelector("td.floor").textContent : "" })()`)
	}
	testwait.Until(t, 10*time.Second, "acme's row", func() bool { return row() != "" })
	before := row()
	if !strings.HasPrefix(before, "0.00|") {
		t.Fatalf("acme's row before any load: %q", before)
	}
	// Leases held, for the picture: prefill, decode and KV in use.
	for i := range 12 {
		d, err := srv.Engine().Admit(ctx, admission.Request{Tenant: []string{"globex", "initech"}[i%2], Model: "large", PromptTokens: 6000, MaxOutputTokens: 1500})
		if err != nil || d.LeaseID == 0 {
			t.Fatalf("admit for the picture: %v %v", d, err)
		}
	}
	stop := load(t, srv.Engine(), map[string]int{"acme": 4, "globex": 1, "hooli": 1})
	defer stop()
	testwait.Until(t, 20*time.Second, "acme's row to show its admissions", func() bool {
		r := row()
		return r != before && !strings.HasPrefix(r, "0.00|")
	})
	notReloaded()
	testwait.Until(t, 10*time.Second, "the fleet strip to show the admissions", func() bool {
		v, err := strconv.ParseFloat(eval(`document.querySelector("#t-admitted").textContent`), 64)
		return err == nil && v > 0
	})

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(artifactDir(t), "dashboard.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
	if docs := os.Getenv("SLUICE_DOCS_SCREENSHOT"); docs != "" { // refresh docs/dashboard.png
		if err := os.WriteFile(docs, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
