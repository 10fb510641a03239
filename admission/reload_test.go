package admission

import (
	"context"
	"testing"
	"time"
)

// The reload and topology behaviours are scenarios (testdata/scenarios:
// reload-*, set-topology*, drain-across-topology). What stays here is what
// a script cannot say: the Go API's copies and a race between two
// goroutines.

// The engine keeps its own copy of a config: editing the maps of the
// config Config() returned, or of the one given to Apply, changes nothing
// live.
func TestConfigIsCopiedInAndOut(t *testing.T) {
	h := newHarness(t, testConfig(), hgxCluster(t, 1))
	c := h.e.Config()
	c.Tenants["x"] = TenantConfig{Tier: "gold"}
	if _, ok := h.e.Tenant("x"); ok {
		t.Fatal("editing the map Config() returned added a live tenant without Apply")
	}
	cfg := testConfig()
	if err := h.e.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Tenants["y"] = TenantConfig{Tier: "gold"}
	delete(cfg.Tenants, "a")
	if _, ok := h.e.Tenant("y"); ok {
		t.Error("editing the map given to Apply added a live tenant")
	}
	if _, ok := h.e.Tenant("a"); !ok {
		t.Error("editing the map given to Apply removed a live tenant")
	}
}

// A caller whose context ends just as its queued request is admitted gets
// either a refusal (and the admission is undone) or a lease it can
// release: never an admission whose lease is already gone. Which of the
// two is up to select, so the race is run many times.
func TestGivingUpAsTheAnswerArrivesLeavesNoDeadLease(t *testing.T) {
	for i := 0; i < 50; i++ {
		h := newHarness(t, testConfig(), hgxCluster(t, 1))
		ds := h.saturate("a", "large", 4000, 10)
		_, w := h.submit(req("b", "large", 4000, 10))
		if w == nil {
			t.Fatal("not queued")
		}
		for _, d := range ds {
			h.release(d.LeaseID, 4000, 10)
		}
		for k := 0; k < 50 && !answered(w); k++ {
			h.advance(100 * time.Millisecond)
		}
		if !answered(w) {
			t.Fatal("not dispatched")
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		d := h.e.wait(ctx, w) // both the answer and ctx.Done are ready
		switch d.Outcome {
		case Admitted:
			if _, err := h.e.Release(context.Background(), Release{LeaseID: d.LeaseID, OutputTokens: 10}); err != nil {
				t.Fatalf("wait returned ADMITTED lease %d but it is gone: %v", d.LeaseID, err)
			}
		case Rejected:
			if n := h.e.LeaseCount(); n != 0 {
				t.Fatalf("refused the caller who gave up, yet %d leases are held", n)
			}
		default:
			t.Fatalf("answer %+v", d)
		}
	}
}
