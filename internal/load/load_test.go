package load_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/load"
	"github.com/sluice-sched/sluice/internal/server"
)

// testConfig has a tenant whose quotas never bind (big) and one whose RPS
// bucket holds three requests and refills one every 1000 s (tiny), so that
// tiny's refusals are QUOTA_EXCEEDED from its fourth request on.
const testConfig = `
tiers:
  open:
    rps: {rate: 1e9, burst: 1e9}
    tokens: {rate: 1e12, burst: 1e12}
  tiny:
    rps: {rate: 0.001, burst: 3}
    tokens: {rate: 1e12, burst: 1e12}
tenants:
  big: {tier: open}
  tiny: {tier: tiny}
`

// startServer runs a real sluiced in-process on a free loopback port and
// returns it with a connection to its gRPC address.
func startServer(t *testing.T) (*server.Server, *grpc.ClientConn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(testConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	return serve(t, path, "simulated")
}

// serve runs a real sluiced in-process on free loopback ports, on the
// config file at configPath and the topology source topo, and returns it
// with a connection to its gRPC address; both end with the test.
func serve(t *testing.T, configPath, topo string) (*server.Server, *grpc.ClientConn) {
	t.Helper()
	srv, err := server.New(server.Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ConfigPath: configPath,
		Topology: topo, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx); close(done) }()
	conn, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); cancel(); <-done })
	return srv, conn
}

// counting is a Target that counts, by itself, what passes through it: the
// manual count the tool's figures are checked against.
type counting struct {
	next load.Target

	mu       sync.Mutex
	admits   map[string]int            // by tenant
	answers  map[string]map[string]int // by tenant, then decision and reason
	leases   map[string]bool           // granted and not yet released
	releases int
}

func newCounting(next load.Target) *counting {
	return &counting{next: next, admits: map[string]int{}, answers: map[string]map[string]int{}, leases: map[string]bool{}}
}

func (c *counting) Admit(ctx context.Context, req *admissionv1.AdmitRequest) (*admissionv1.AdmitResponse, error) {
	resp, err := c.next.Admit(ctx, req)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.admits[req.GetTenant()]++
	key := "error"
	if err == nil {
		key = resp.GetDecision().String()
		if resp.GetDecision() == admissionv1.Decision_REJECTED {
			key += " " + resp.GetReason().String()
		}
		if resp.GetLeaseId() != "" {
			c.leases[resp.GetLeaseId()] = true
		}
	}
	if c.answers[req.GetTenant()] == nil {
		c.answers[req.GetTenant()] = map[string]int{}
	}
	c.answers[req.GetTenant()][key]++
	return resp, err
}

func (c *counting) Release(ctx context.Context, req *admissionv1.ReleaseRequest) (*admissionv1.ReleaseResponse, error) {
	resp, err := c.next.Release(ctx, req)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		c.releases++
		delete(c.leases, req.GetLeaseId())
	}
	return resp, err
}

func closedOpts() load.Options {
	return load.Options{Mode: load.ModeClosed, Concurrency: 4, Duration: 300 * time.Millisecond, Deadline: 5 * time.Second,
		Tenants: []load.Mix{{Tenant: "big", Model: "small", Share: 0.5}, {Tenant: "tiny", Model: "small", Share: 0.5}},
		Prompt:  10, Output: 5, Release: true, RequestIDs: true, Seed: 1}
}

func tenantResult(t *testing.T, r *load.Result, name string) load.TenantResult {
	t.Helper()
	for _, tr := range r.Tenants {
		if tr.Tenant == name {
			return tr
		}
	}
	t.Fatalf("no tenant %q in %+v", name, r.Tenants)
	return load.TenantResult{}
}

// N Admits produce N answers; the figures match the manual count, tiny's
// refusals are QUOTA_EXCEEDED after its three requests, every lease is
// released, and the server holds none afterwards.
func TestClosedLoopCountsEveryAnswer(t *testing.T) {
	srv, conn := startServer(t)
	c := newCounting(load.NewTarget(conn))
	r, err := load.Run(context.Background(), closedOpts(), []load.Target{c})
	if err != nil {
		t.Fatal(err)
	}
	if r.Kind != load.KindAdmitRelease {
		t.Errorf("kind %q", r.Kind)
	}
	total := c.admits["big"] + c.admits["tiny"]
	if r.AdmitCalls != int64(total) || total == 0 {
		t.Fatalf("admits: tool %d, counted %d", r.AdmitCalls, total)
	}
	if r.Latency.Count != int64(total) {
		t.Errorf("admit latencies recorded: %d, want one per Admit (%d)", r.Latency.Count, total)
	}
	big, tiny := tenantResult(t, r, "big"), tenantResult(t, r, "tiny")
	if big.Requests != int64(c.admits["big"]) || big.Admitted != int64(c.answers["big"]["ADMITTED"]) || big.Rejected != 0 || big.Errors != 0 {
		t.Errorf("big: tool %+v, counted %v", big, c.answers["big"])
	}
	if tiny.Admitted != 3 || tiny.Requests != int64(c.admits["tiny"]) {
		t.Errorf("tiny: tool %+v, counted %v (its RPS bucket holds 3)", tiny, c.answers["tiny"])
	}
	wantRefused := int64(c.answers["tiny"]["REJECTED REASON_QUOTA_EXCEEDED"])
	if tiny.Rejected != wantRefused || tiny.Refusals["QUOTA_EXCEEDED"] != wantRefused || r.Refusals["QUOTA_EXCEEDED"] != wantRefused || wantRefused == 0 {
		t.Errorf("tiny refusals: tool %v (total %v), counted %d", tiny.Refusals, r.Refusals, wantRefused)
	}
	admitted := big.Admitted + tiny.Admitted
	if r.Released != admitted || c.releases != int(admitted) || len(c.leases) != 0 || r.Held != 0 {
		t.Errorf("released: tool %d, counted %d, of %d admitted; still held %d", r.Released, c.releases, admitted, len(c.leases))
	}
	if r.Calls != r.AdmitCalls+r.Released {
		t.Errorf("calls %d, want admits %d + releases %d", r.Calls, r.AdmitCalls, r.Released)
	}
	if r.Queued == nil || r.Queued.Count != admitted || r.ReleaseLatency == nil || r.ReleaseLatency.Count != admitted {
		t.Errorf("queued %+v, release latency %+v: want one per admission", r.Queued, r.ReleaseLatency)
	}
	if got := srv.Engine().LeaseCount(); got != 0 {
		t.Errorf("server holds %d leases after a releasing run", got)
	}
	if n, err := load.LeasesHeld(context.Background(), conn); err != nil || n != 0 {
		t.Errorf("LeasesHeld: %d, %v", n, err)
	}
}

// With Release off nothing is released: the leases the tool says it holds
// are the server's lease table, and ListDomains' in-flight sum says so.
func TestAdmitOnlyLeavesLeases(t *testing.T) {
	srv, conn := startServer(t)
	opts := closedOpts()
	opts.Release = false
	opts.Tenants = opts.Tenants[:1]
	c := newCounting(load.NewTarget(conn))
	r, err := load.Run(context.Background(), opts, []load.Target{c})
	if err != nil {
		t.Fatal(err)
	}
	if r.Kind != load.KindAdmitOnly || c.releases != 0 || r.Released != 0 || r.ReleaseLatency != nil {
		t.Errorf("kind %q, releases counted %d, tool %d", r.Kind, c.releases, r.Released)
	}
	if r.Held != int64(len(c.leases)) || r.Held == 0 || r.Calls != r.AdmitCalls {
		t.Errorf("held: tool %d, counted %d; calls %d, admits %d", r.Held, len(c.leases), r.Calls, r.AdmitCalls)
	}
	if got := srv.Engine().LeaseCount(); int64(got) != r.Held {
		t.Errorf("server holds %d leases, tool says %d", got, r.Held)
	}
	if n, err := load.LeasesHeld(context.Background(), conn); err != nil || n != r.Held {
		t.Errorf("LeasesHeld: %d, %v; want %d", n, err, r.Held)
	}
}

// A hold keeps each lease that long before its Release.
func TestHoldThenRelease(t *testing.T) {
	_, conn := startServer(t)
	opts := closedOpts()
	opts.Tenants = opts.Tenants[:1]
	opts.Concurrency, opts.Hold, opts.Duration = 2, 50*time.Millisecond, 120*time.Millisecond
	c := newCounting(load.NewTarget(conn))
	r, err := load.Run(context.Background(), opts, []load.Target{c})
	if err != nil {
		t.Fatal(err)
	}
	if r.Released == 0 || int(r.Released) != c.releases {
		t.Fatalf("released: tool %d, counted %d", r.Released, c.releases)
	}
	// Each caller holds one lease at a time: at most concurrency ×
	// ⌈duration / hold⌉ Admits, however fast the server answers.
	if maxAdmits := int64(opts.Concurrency * 3); r.AdmitCalls > maxAdmits {
		t.Errorf("%d admits by 2 callers holding 50 ms in 120 ms: the hold was not kept", r.AdmitCalls)
	}
}

// The open loop starts its arrivals at a fixed rate (each answered or
// dropped), and the trace mode starts exactly the trace's calls with their
// tenants and tokens.
func TestOpenLoopAndTrace(t *testing.T) {
	_, conn := startServer(t)
	opts := closedOpts()
	opts.Mode, opts.Rate, opts.Poisson, opts.Duration = load.ModeOpen, 200, false, 200*time.Millisecond
	opts.Tenants = opts.Tenants[:1]
	c := newCounting(load.NewTarget(conn))
	r, err := load.Run(context.Background(), opts, []load.Target{c})
	if err != nil {
		t.Fatal(err)
	}
	// Arrivals every 5 ms strictly before 200 ms: 39.
	if r.AdmitCalls+r.Dropped != 39 || r.AdmitCalls != int64(c.admits["big"]) {
		t.Errorf("open loop: %d admits + %d dropped, counted %d; want 39 arrivals", r.AdmitCalls, r.Dropped, c.admits["big"])
	}
	if r.StartLag == nil || r.StartLag.Count != r.AdmitCalls {
		t.Errorf("start lag %+v: want one per started call", r.StartLag)
	}

	trace := []load.Arrival{
		{At: 0, Tenant: "big", Model: "small", Prompt: 10, Output: 2},
		{At: 10 * time.Millisecond, Tenant: "tiny", Model: "small", Prompt: 20, Output: 3},
		{At: 20 * time.Millisecond, Tenant: "big", Model: "medium", Prompt: 30, Output: 4},
		{At: 30 * time.Millisecond, Tenant: "nobody", Model: "small", Prompt: 5, Output: 1},
	}
	c = newCounting(load.NewTarget(conn))
	r, err = load.Run(context.Background(), load.Options{Mode: load.ModeTrace, Arrivals: trace, Deadline: 5 * time.Second, Release: true}, []load.Target{c})
	if err != nil {
		t.Fatal(err)
	}
	if r.AdmitCalls != 4 || c.admits["big"] != 2 || c.admits["tiny"] != 1 || c.admits["nobody"] != 1 {
		t.Errorf("trace: %d admits, counted %v", r.AdmitCalls, c.admits)
	}
	if nb := tenantResult(t, r, "nobody"); nb.Refusals["UNKNOWN_TENANT"] != 1 {
		t.Errorf("an unknown tenant: %+v", nb)
	}
	if r.Released != 3 || c.releases != 3 {
		t.Errorf("trace releases: tool %d, counted %d; want 3", r.Released, c.releases)
	}
}

// A run that meets errors says why, not only how many: the first error's
// message (the earliest, over every caller and recorder), beside the counts
// by code. Admit calls and admissions are counted apart: a refused or
// failed call is a call, not an admission.
func TestRunKeepsTheFirstErrorMessage(t *testing.T) {
	_, conn := startServer(t)
	// Ten arrivals 5 ms apart, recorded by shard i%8: the unknown model
	// first (shard 0), a bad prompt later on the same shard (8) and on
	// another (9).
	var trace []load.Arrival
	for i := range 10 {
		a := load.Arrival{At: time.Duration(i) * 5 * time.Millisecond, Tenant: "big", Model: "small", Prompt: 10, Output: 2}
		switch i {
		case 0:
			a.Model = "no-such-model"
		case 8, 9:
			a.Prompt = -5
		}
		trace = append(trace, a)
	}
	r, err := load.Run(context.Background(), load.Options{Mode: load.ModeTrace, Arrivals: trace, Deadline: 5 * time.Second, Release: true}, []load.Target{load.NewTarget(conn)})
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors["InvalidArgument"] != 3 || !strings.Contains(r.FirstError, "no-such-model") || strings.Contains(r.FirstError, "prompt") {
		t.Errorf("errors %v, first %q: want three InvalidArguments, the first naming the unknown model", r.Errors, r.FirstError)
	}
	if r.AdmitCalls != 10 || r.Admissions != 7 || r.Calls != 10+7 {
		t.Errorf("%d Admit calls, %d admissions, %d calls: want 10 calls to Admit, 7 admissions and their 7 Releases", r.AdmitCalls, r.Admissions, r.Calls)
	}
	var table bytes.Buffer
	if err := (&load.Report{Mode: load.ModeTrace, Load: r}).WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "first Admit error: "+r.FirstError) || !strings.Contains(table.String(), "admissions/s") {
		t.Errorf("the table lacks the first error or the admissions column:\n%s", table.String())
	}
}

// Compare runs the reference and the load in alternating rounds; the
// report's JSON parses and carries both sides and the ratio.
func TestCompareWithReferenceAndJSON(t *testing.T) {
	_, conn := startServer(t)
	opts := closedOpts()
	opts.Duration = 150 * time.Millisecond
	opts.Tenants = opts.Tenants[:1]
	opts.ServerPID = os.Getpid() // the server runs in the test's process
	rep, err := load.Compare(context.Background(), opts, []load.Target{load.NewTarget(conn)}, []grpc.ClientConnInterface{conn}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Reference == nil || rep.Reference.Kind != load.KindHealth || rep.Reference.Calls == 0 || len(rep.Reference.Errors) != 0 {
		t.Fatalf("reference: %+v", rep.Reference)
	}
	if len(rep.Rounds) != 2 || !rep.Rounds[0].ReferenceFirst || rep.Rounds[1].ReferenceFirst {
		t.Errorf("rounds: %+v, want 2, reference first in the first only", rep.Rounds)
	}
	if rep.Ratio <= 0 || rep.RatioMedian <= 0 || rep.CPURatio <= 0 {
		t.Errorf("ratio %v, median %v, CPU ratio %v", rep.Ratio, rep.RatioMedian, rep.CPURatio)
	}
	if rep.Load.ClientCPUPerCallUs <= 0 || rep.Load.ServerCPUPerCallUs <= 0 {
		t.Errorf("CPU per call: client %v µs, server %v µs", rep.Load.ClientCPUPerCallUs, rep.Load.ServerCPUPerCallUs)
	}
	if rep.Load.Calls != rep.Load.AdmitCalls+rep.Load.Released {
		t.Errorf("merged rounds: calls %d, admits %d, released %d", rep.Load.Calls, rep.Load.AdmitCalls, rep.Load.Released)
	}
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Ratio     float64 `json:"ratio"`
		Load      load.Result
		Reference load.Result
		Rounds    []load.Round
	}
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatalf("JSON does not parse: %v\n%s", err, buf.String())
	}
	if back.Ratio != rep.Ratio || back.Load.AdmitCalls != rep.Load.AdmitCalls || back.Reference.Calls != rep.Reference.Calls ||
		len(back.Rounds) != 2 || back.Load.Latency.P99 <= 0 || back.Load.Tenants[0].Tenant != "big" {
		t.Errorf("JSON round trip: %+v", back)
	}
	buf.Reset()
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"health Check (reference)", "admit+release", "ratio admit+release ÷ health Check", "Admit latency", "big"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
}

// Prefill holds n leases on the server; ReleaseLeases gives them back.
func TestPrefillAndReleaseLeases(t *testing.T) {
	srv, conn := startServer(t)
	opts := closedOpts()
	opts.Tenants = opts.Tenants[:1]
	targets := []load.Target{load.NewTarget(conn)}
	leases, err := load.Prefill(context.Background(), opts, targets, 50)
	if err != nil || len(leases) != 50 {
		t.Fatalf("prefill: %d leases, %v", len(leases), err)
	}
	if got := srv.Engine().LeaseCount(); got != 50 {
		t.Errorf("server holds %d leases, want 50", got)
	}
	if failed, err := load.ReleaseLeases(context.Background(), targets, leases, 4); err != nil || failed != 0 {
		t.Fatalf("release: %d failed, %v", failed, err)
	}
	if got := srv.Engine().LeaseCount(); got != 0 {
		t.Errorf("server holds %d leases after ReleaseLeases", got)
	}
	// A tenant that is refused every time cannot be prefilled: an error
	// naming the refusal, not a loop.
	opts.Tenants = []load.Mix{{Tenant: "nobody", Model: "small", Share: 1}}
	if _, err := load.Prefill(context.Background(), opts, targets, 5); err == nil || !strings.Contains(err.Error(), "UNKNOWN_TENANT") {
		t.Errorf("prefill of an unknown tenant: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*load.Options)
		want string
	}{
		{"no callers", func(o *load.Options) { o.Concurrency = 0 }, "--concurrency"},
		{"no rate", func(o *load.Options) { o.Mode, o.Rate = load.ModeOpen, 0 }, "--rate"},
		{"empty trace", func(o *load.Options) { o.Mode = load.ModeTrace }, "--trace"},
		{"bad mode", func(o *load.Options) { o.Mode = "sideways" }, "mode"},
		{"no tenants", func(o *load.Options) { o.Tenants = nil }, "--tenants"},
		{"no tokens", func(o *load.Options) { o.Prompt = 0 }, "--prompt"},
		{"no duration", func(o *load.Options) { o.Duration = 0 }, "--duration"},
		{"negative hold", func(o *load.Options) { o.Hold = -time.Second }, "--hold"},
		{"negative deadline", func(o *load.Options) { o.Deadline = -time.Second }, "--deadline"},
		{"empty downgrade", func(o *load.Options) { o.AcceptDowngrade = []string{""} }, "--accept-downgrade"},
	} {
		o := closedOpts()
		tc.edit(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
	o := closedOpts()
	if err := o.Validate(); err != nil {
		t.Errorf("valid options: %v", err)
	}
	for _, bad := range []string{"", "acme", "acme:large", "acme:large:0", "acme:large:-1", ":large:1", "acme:large:x"} {
		if _, err := load.ParseTenants(bad); err == nil || !strings.Contains(err.Error(), "--tenants") {
			t.Errorf("ParseTenants(%q): %v", bad, err)
		}
	}
	m, err := load.ParseTenants("acme:large:3,globex:small:1")
	if err != nil || len(m) != 2 || m[0].Share != 0.75 || m[1].Model != "small" {
		t.Errorf("ParseTenants: %+v, %v", m, err)
	}
}
