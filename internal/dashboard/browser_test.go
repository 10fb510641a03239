package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/cli"
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
// through the Operator API shows within a second without a reload, a
// tenant's row follows its load, the fleet strip shows the answers per
// second, the Admit p99 and the commonest refusal reasons of a load sent
// over gRPC, each tenant its own reasons, the header what answers (replica,
// build, config), every time is in UTC though the browser's zone is not, and
// at 1280×800 the tenant table starts on the first screen. It saves a
// screenshot.
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
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.WindowSize(1280, 800),
		// India's zone, 5 h 30 ahead of UTC: a time drawn in the local
		// zone would differ from UTC in its hours and its minutes.
		chromedp.Env("TZ=Asia/Kolkata"),
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

	if _, err := chromedp.Run(ctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatalf("viewport: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Navigate("http://"+srv.HTTPAddr().String()+"/")); err != nil {
		t.Fatalf("navigate: %v", err)
	}
	if got := eval(`String(new Date(Date.UTC(2026, 0, 1)).getTimezoneOffset())`); got != "-330" {
		t.Fatalf("the browser's zone is %s minutes from UTC, want -330 (TZ=Asia/Kolkata)", got)
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
	stop := grpcLoad(t, conn)
	defer stop()
	testwait.Until(t, 20*time.Second, "acme's row to show its admissions", func() bool {
		r := row()
		return r != before && !strings.HasPrefix(r, "0.00|")
	})
	notReloaded()

	// The fleet strip: answers per second, the Admit p99 of the gRPC calls,
	// the commonest refusal reasons (hooli's over its quota first, once its
	// burst is spent: the load's first seconds may show initech's first).
	var strip fleetStrip
	testwait.Until(t, 20*time.Second, "the fleet strip to show the load, hooli's QUOTA_EXCEEDED first", func() bool {
		strip = readStrip(t, eval)
		return strip.admitted > 0 && strip.refused > 0 && strip.p99 > 0 && len(strip.reasons) == 2 && strip.reasons[0].name == "QUOTA_EXCEEDED"
	})
	if strip.degraded < 0 || strip.reasons[0].name != "QUOTA_EXCEEDED" || strip.reasons[1].name != "REQUEST_TOO_LARGE" ||
		strip.reasons[0].perSecond < strip.reasons[1].perSecond || strip.reasons[1].perSecond <= 0 {
		t.Errorf("the fleet strip: %+v, want QUOTA_EXCEEDED then REQUEST_TOO_LARGE, each at a rate", strip)
	}
	if strip.p99 > 10*time.Second {
		t.Errorf("Admit p99 %v: more than the longest a call of this load took", strip.p99)
	}
	// Each tenant's row: its own reason at its own rate.
	reasonCell := func(tenant string) string {
		return eval(`(() => { const r = document.querySelector('tr[data-tenant="` + tenant + `"] td.reasons');
			return r ? [...r.querySelectorAll(".reason")].map(s => s.dataset.reason + "=" + s.querySelector("b").textContent).join(" ") || r.textContent : "" })()`)
	}
	testwait.Until(t, 10*time.Second, "hooli's and initech's refusal reasons in their rows", func() bool {
		return strings.HasPrefix(reasonCell("hooli"), "QUOTA_EXCEEDED=") && strings.HasPrefix(reasonCell("initech"), "REQUEST_TOO_LARGE=")
	})
	for _, tenant := range []string{"hooli", "initech"} {
		cell := reasonCell(tenant)
		_, perSecond, _ := strings.Cut(cell, "=")
		if v, err := strconv.ParseFloat(strings.TrimSuffix(perSecond, "/s"), 64); err != nil || v <= 0 || strings.Contains(cell, " ") {
			t.Errorf("%s's refusal reasons %q, want one reason at a rate above 0", tenant, cell)
		}
	}
	if got := reasonCell("acme"); got != "–" {
		t.Errorf("acme, never refused, shows reasons %q", got)
	}

	// The header names what answers.
	host, _ := os.Hostname()
	build := cli.ReadBuild()
	if got := eval(`document.querySelector("#s-replica").textContent`); got != host {
		t.Errorf("replica %q, want the host name %q", got, host)
	}
	if got := eval(`document.querySelector("#s-build").textContent`); !strings.HasPrefix(got, build.Version+" ") || !strings.Contains(build.Revision, strings.TrimSuffix(strings.TrimPrefix(got, build.Version+" "), " (modified)")) {
		t.Errorf("build %q, want version %s and revision %s", got, build.Version, build.Revision)
	}
	if got := eval(`document.querySelector("#s-config").textContent`); !regexp.MustCompile(`^embedded applied \d\d:\d\d:\d\d UTC$`).MatchString(got) {
		t.Errorf("config %q, want the embedded config and when it was applied", got)
	}

	// Every time on the page is UTC: each <time> says its instant's UTC
	// clock, and no clock time is shown outside one. A credit freeze adds
	// the freeze's end to the header.
	if _, err := admissionv1.NewOperatorClient(conn).FreezeBurstCredit(ctx, &admissionv1.FreezeBurstCreditRequest{Duration: durationpb.New(time.Hour), Reason: "incident"}); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 5*time.Second, "the freeze in the header", func() bool {
		return eval(`document.querySelector("#t-freeze time") ? "yes" : ""`) == "yes"
	})
	times := eval(`JSON.stringify([...document.querySelectorAll("time")].map(e => [e.textContent, e.dateTime,
		new Date(e.dateTime).toISOString().slice(11, 19) + " UTC"]))`)
	var shown [][3]string
	if err := json.Unmarshal([]byte(times), &shown); err != nil {
		t.Fatal(err)
	}
	if len(shown) < 3 {
		t.Errorf("times shown: %v, want at least the update, the config's and the freeze's", shown)
	}
	for _, tm := range shown {
		if tm[0] != tm[2] || !strings.HasSuffix(tm[1], "Z") {
			t.Errorf("time %q of %s: want %q", tm[0], tm[1], tm[2])
		}
	}
	clock := regexp.MustCompile(`\d{1,2}:\d\d(:\d\d)?( UTC| ?[AP]M)?`)
	for _, m := range clock.FindAllString(eval(`document.body.innerText`), -1) {
		if !strings.HasSuffix(m, " UTC") {
			t.Errorf("the page shows the time %q, not in UTC", m)
		}
	}

	// At 1280×800 the tenant table starts on the first screen, its first
	// rows with it, and the page is no wider than the window.
	fold := eval(`(() => { window.scrollTo(0, 0); const t = document.querySelector("#tenants").getBoundingClientRect();
		const r = document.querySelector("#tenants tbody tr").getBoundingClientRect();
		return [innerWidth, innerHeight, Math.round(t.top), Math.round(r.bottom), document.documentElement.scrollWidth].join(" ") })()`)
	var vw, vh, tableTop, rowBottom, pageWidth int
	if _, err := fmt.Sscan(fold, &vw, &vh, &tableTop, &rowBottom, &pageWidth); err != nil {
		t.Fatalf("fold %q: %v", fold, err)
	}
	if vw != 1280 || vh != 800 || tableTop >= vh || rowBottom > vh || pageWidth > vw {
		t.Errorf("at %d×%d the tenant table's top is at %d px, its first row's bottom at %d px, the page %d px wide: want the table on the first screen",
			vw, vh, tableTop, rowBottom, pageWidth)
	}

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

// grpcLoad sends Admits (and the Releases of admitted ones) over gRPC until
// the returned stop is called: acme 4 at a time, globex 1, hooli (free:
// 4,000 tokens/s) 2 of 3,000 prompt tokens (all but about one a second
// refused QUOTA_EXCEEDED, however slowly the rounds go on a loaded
// machine: more often than initech's), and every fourth round an initech
// request larger than its tier's burst (REQUEST_TOO_LARGE). Over gRPC, as
// routers call, so that the server times each Admit.
func grpcLoad(t *testing.T, conn *grpc.ClientConn) (stop func()) {
	t.Helper()
	admit := admissionv1.NewAdmissionClient(conn)
	return steadyLoad(func(ctx context.Context, round int) {
		reqs := []*admissionv1.AdmitRequest{}
		for tenant, n := range map[string]int{"acme": 4, "globex": 1, "hooli": 2} {
			prompt := int64(10)
			if tenant == "hooli" {
				prompt = 3000
			}
			for range n {
				reqs = append(reqs, &admissionv1.AdmitRequest{Tenant: tenant, Model: "small", PromptTokens: prompt, MaxOutputTokens: 10})
			}
		}
		if round%4 == 0 {
			reqs = append(reqs, &admissionv1.AdmitRequest{Tenant: "initech", Model: "small", PromptTokens: 900000, MaxOutputTokens: 10})
		}
		for _, req := range reqs {
			resp, err := admit.Admit(ctx, req)
			if err == nil && resp.GetLeaseId() != "" {
				_, _ = admit.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: resp.GetLeaseId(), PromptTokens: 10, OutputTokens: 10, Outcome: admissionv1.Outcome_OUTCOME_OK})
			}
		}
	})
}

// fleetStrip is what the page's fleet strip shows.
type fleetStrip struct {
	admitted, degraded, refused float64
	p99                         time.Duration
	reasons                     []stripReason
}

// stripReason is a refusal reason in the fleet strip and its rate.
type stripReason struct {
	name      string
	perSecond float64
}

// readStrip reads the fleet strip off the page: numbers as drawn, the p99
// parsed from its unit, the reasons in their order.
func readStrip(t *testing.T, eval func(string) string) fleetStrip {
	t.Helper()
	var raw struct {
		Admitted, Degraded, Refused, P99 string
		Reasons                          [][2]string
	}
	js := `JSON.stringify({admitted: $("#t-admitted").textContent, degraded: $("#t-degraded").textContent,
		refused: $("#t-refused").textContent, p99: $("#t-p99").textContent,
		reasons: [...document.querySelectorAll("#t-reason-list .reason")].map(s => [s.dataset.reason, s.querySelector("b").textContent])})`
	if err := json.Unmarshal([]byte(eval(js)), &raw); err != nil {
		t.Fatal(err)
	}
	var s fleetStrip
	s.admitted, _ = strconv.ParseFloat(raw.Admitted, 64)
	s.degraded, _ = strconv.ParseFloat(raw.Degraded, 64)
	s.refused, _ = strconv.ParseFloat(raw.Refused, 64)
	if v, unit, ok := strings.Cut(raw.P99, " "); ok {
		if d, err := time.ParseDuration(v + map[string]string{"µs": "us", "ms": "ms", "s": "s"}[unit]); err == nil {
			s.p99 = d
		}
	}
	for _, r := range raw.Reasons {
		v, err := strconv.ParseFloat(strings.TrimSuffix(r[1], "/s"), 64)
		if err != nil {
			t.Errorf("reason %s's rate %q", r[0], r[1])
		}
		s.reasons = append(s.reasons, stripReason{r[0], v})
	}
	return s
}
