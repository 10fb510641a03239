package admission

import (
	"context"
	"time"

	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/topology/topologytest"
)

// epoch is the manual clock's start: a fixed wall time, mid-day UTC.
var epoch = time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)

// hgxCluster returns n HGX H200 domains of one node each: d1, d2, ...
func hgxCluster(t tb, n int) topology.Cluster { return topologytest.HGX(t, n) }

// testConfig has two tiers with generous quotas and no floors; tests
// override what they exercise.
func testConfig() Config {
	big := Limit{Rate: 1e9, Burst: 1e9}
	return Config{
		Tiers: map[string]TierPolicy{
			"gold":   {RPS: big, Tokens: big, Weight: 4},
			"bronze": {RPS: big, Tokens: big, Weight: 1},
		},
		Tenants: map[string]TenantConfig{
			"a": {Tier: "gold"},
			"b": {Tier: "bronze"},
			"c": {Tier: "bronze"},
		},
	}
}

// tb is what the harness needs of *testing.T, *testing.B and *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

type harness struct {
	t   tb
	clk *clock.Manual
	e   *Engine
}

func newHarness(t tb, cfg Config, cluster topology.Cluster) *harness {
	t.Helper()
	clk := clock.NewManual(epoch)
	e, err := New(cfg, cluster, WithClock(clk))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &harness{t: t, clk: clk, e: e}
}

func req(tenant, model string, prompt, output int64) Request {
	return Request{Tenant: tenant, Model: model, PromptTokens: prompt, MaxOutputTokens: output}
}

// admit calls Admit and fails the test on an error.
func (h *harness) admit(r Request) Decision {
	h.t.Helper()
	d, err := h.e.Admit(context.Background(), r)
	if err != nil {
		h.t.Fatalf("Admit(%+v): %v", r, err)
	}
	return d
}

// submit starts a request without blocking: it returns the decision, or the
// waiter when the request was queued.
func (h *harness) submit(r Request) (Decision, *waiter) {
	h.t.Helper()
	if err := validateRequest(&r); err != nil {
		h.t.Fatalf("submit(%+v): %v", r, err)
	}
	d, w, err := h.e.admit(context.Background(), &r)
	if err != nil {
		h.t.Fatalf("submit(%+v): %v", r, err)
	}
	return d, w
}

// advance moves the clock and runs the engine's timed work.
func (h *harness) advance(d time.Duration) {
	h.clk.Advance(d)
	h.e.Tick()
}

func (h *harness) release(id uint64, prompt, output int64) ReleaseResult {
	h.t.Helper()
	res, err := h.e.Release(context.Background(), Release{LeaseID: id, PromptTokens: prompt, OutputTokens: output, Outcome: ReleaseOK})
	if err != nil {
		h.t.Fatalf("Release(%d): %v", id, err)
	}
	return res
}

func (h *harness) domain(id string) DomainInfo {
	h.t.Helper()
	for _, d := range h.e.Domains() {
		if d.ID == id {
			return d
		}
	}
	h.t.Fatalf("no domain %s", id)
	return DomainInfo{}
}

func (h *harness) tenant(name string) TenantInfo {
	h.t.Helper()
	ti, ok := h.e.Tenant(name)
	if !ok {
		h.t.Fatalf("no tenant %s", name)
	}
	return ti
}

// saturate admits requests of the given shape for tenant until one does
// not fit at once and returns the admitted decisions; a request queued at
// the end is taken back out of the queue, as a caller giving up would.
func (h *harness) saturate(tenant, model string, prompt, output int64) []Decision {
	h.t.Helper()
	var out []Decision
	for i := 0; i < 100000; i++ {
		d, w := h.submit(req(tenant, model, prompt, output))
		if w != nil {
			h.cancel(w)
			return out
		}
		if d.Outcome == Rejected {
			return out
		}
		out = append(out, d)
	}
	h.t.Fatalf("saturate: never saturated")
	return nil
}

// cancel takes a queued waiter back out, as a caller giving up would.
func (h *harness) cancel(w *waiter) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h.e.wait(ctx, w)
}

// answered reports whether the waiter has its answer.
func answered(w *waiter) bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

func ptr[T any](v T) *T { return &v }
