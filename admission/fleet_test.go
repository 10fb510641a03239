package admission

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/topology/topologytest"
)

// fleetDomains is the size of the fleet the scale tests place on: a 100k-GPU
// fleet of NVL72 racks.
const fleetDomains = 1400

var fleet = sync.OnceValue(func() topology.Cluster { return topologytest.NVL72(fatalT{}, fleetDomains) })

// fatalT panics: for fixtures built outside a test's own T.
type fatalT struct{}

func (fatalT) Helper()                           {}
func (fatalT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// TestPlacementPropertiesAtFleetScale drives 1,400 NVL72 domains with
// random admissions, releases (some failed, which cut a domain's health
// weight), drains, undrains and time, and checks after every step that:
// nothing is placed on a drained domain; a request that fits its tenant's
// first choice goes there, the first choice being the rendezvous tree's
// over the domains' current weights (the health weight of an eligible
// domain, 0 for a drained one); a (tenant, model) stays on its domain
// while no weight changes; and no bucket, gauge or lease count drifts.
func TestPlacementPropertiesAtFleetScale(t *testing.T) {
	cluster := fleet()
	rapid.Check(t, func(rt *rapid.T) {
		cfg := testConfig()
		cfg.Health.MinSamples = 1 // a failed release cuts the weight at once
		// Load never moves a request (a margin of the whole load): the
		// properties are the tree's. A few requests load a domain past
		// the default margin (TestTheSpreadMarginIsRelativeToTheLoad).
		cfg.Feedback.SpreadMargin = 1
		cfg.Tenants = map[string]TenantConfig{}
		for i := 0; i < 200; i++ {
			cfg.Tenants[fmt.Sprintf("t%d", i)] = TenantConfig{Tier: []string{"gold", "bronze"}[i%2]}
		}
		h := newHarness(rt, cfg, cluster)
		drained := map[string]bool{}
		type flow struct{ tenant, model string }
		last := map[flow]string{} // domain of the flow's last admission since the last weight change
		var leases []Decision
		for i := rapid.IntRange(1, 80).Draw(rt, "ops"); i > 0; i-- {
			switch op := rapid.IntRange(0, 9).Draw(rt, "op"); {
			case op < 5:
				f := flow{fmt.Sprintf("t%d", rapid.IntRange(0, 199).Draw(rt, "tenant")), rapid.SampledFrom([]string{"large", "medium", "small"}).Draw(rt, "model")}
				d := h.admit(req(f.tenant, f.model, rapid.Int64Range(1, 4000).Draw(rt, "prompt"), rapid.Int64Range(1, 400).Draw(rt, "output")))
				if d.LeaseID == 0 {
					rt.Fatalf("a small request on an idle fleet was not admitted: %+v", d)
				}
				if drained[d.Domain] {
					rt.Fatalf("placed on drained domain %s", d.Domain)
				}
				if want := firstChoiceOf(h, f.tenant, f.model); d.Domain != want {
					rt.Fatalf("%v placed on %s, its first choice is %s", f, d.Domain, want)
				}
				if prev, ok := last[f]; ok && prev != d.Domain {
					rt.Fatalf("%v moved from %s to %s with no weight changed", f, prev, d.Domain)
				}
				last[f] = d.Domain
				leases = append(leases, d)
			case op < 7:
				if len(leases) == 0 {
					continue
				}
				j := rapid.IntRange(0, len(leases)-1).Draw(rt, "lease")
				outcome := ReleaseOK
				if rapid.IntRange(0, 3).Draw(rt, "failed") == 0 {
					outcome = ReleaseError
					clear(last) // the domain's health weight may be cut
				}
				if _, err := h.e.Release(context.Background(), Release{LeaseID: leases[j].LeaseID, Outcome: outcome}); err != nil {
					rt.Fatalf("Release: %v", err)
				}
				leases = append(leases[:j], leases[j+1:]...)
			case op < 9:
				id := fmt.Sprintf("rack-%d", rapid.IntRange(1, fleetDomains).Draw(rt, "drain"))
				var err error
				if drained[id] {
					err = h.e.Undrain(id)
				} else {
					err = h.e.Drain(id, "test")
				}
				if err != nil {
					rt.Fatalf("drain %s: %v", id, err)
				}
				drained[id] = !drained[id]
				clear(last)
			default:
				h.advance(time.Duration(rapid.Int64Range(0, int64(time.Minute)).Draw(rt, "advance")))
				clear(last) // health weights step back up
			}
			checkTreeWeights(rt, h)
		}
		checkInvariants(rt, h)
	})
}

// firstChoiceOf is the domain the rendezvous tree ranks first for (tenant,
// model) over the domains' current weights.
func firstChoiceOf(h *harness, tenant, model string) string {
	e := h.e
	e.mu.Lock()
	defer e.mu.Unlock()
	t, _ := e.mu.gates.lookupLocked(tenant, e.nowLocked(), e.mu.place.modelList)
	d, _ := e.mu.place.firstTwo(t, e.mu.place.models[model])
	if d == nil {
		return ""
	}
	return d.ID()
}

// checkTreeWeights checks that every domain's weight in the rendezvous
// tree is its health weight times its size (its model prefill rate in
// PFLOP/s) while it is eligible and 0 while it is not.
func checkTreeWeights(t *rapid.T, h *harness) {
	e := h.e
	e.mu.Lock()
	defer e.mu.Unlock()
	p := &e.mu.place
	for _, d := range p.domains {
		want := 0.0
		if d.eligible() {
			prefill, _ := d.cap.PriorRates()
			want = d.health.weight * max(float64(prefill)/1e15, minPlaceSize)
		}
		if got := p.tree.Weight(d.idx); got != want {
			t.Fatalf("%s: tree weight %v, want %v (draining %v, health %v)", d.ID(), got, want, d.draining, d.health.weight)
		}
	}
}

// BenchmarkAdmitFleet measures Admit+Release in-process on 1,400 NVL72
// domains with 100k configured tenants, each call a tenant drawn at random
// (so most calls build the tenant's state: from cold), beside the same
// calls on the default cluster with 100 tenants in the same run; churn
// drains or undrains a domain every 100 calls, which makes every tenant's
// cached first choice stale. It reports ns per call of each and their
// ratio.
func BenchmarkAdmitFleet(b *testing.B) {
	run := func(b *testing.B, cluster topology.Cluster, tenants int, churn bool, choices int) float64 {
		cfg := testConfig()
		cfg.Feedback.SpreadChoices = choices
		cfg.Tenants = make(map[string]TenantConfig, tenants)
		names := make([]string, tenants)
		for i := range names {
			names[i] = fmt.Sprintf("tenant-%d", i)
			cfg.Tenants[names[i]] = TenantConfig{Tier: "bronze"}
		}
		e, err := New(cfg, cluster)
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(1, 2))
		n, drained := b.N, ""
		start := time.Now()
		for i := 0; i < n; i++ {
			if churn && i%100 == 0 { // drain a domain, and undrain it 100 calls later
				if i%200 == 0 {
					drained = cluster.Domains[rng.IntN(len(cluster.Domains))].ID
					_ = e.Drain(drained, "bench")
				} else {
					_ = e.Undrain(drained)
				}
			}
			d, err := e.Admit(ctx, req(names[rng.IntN(tenants)], "small", 1, 1))
			if err != nil || d.LeaseID == 0 {
				b.Fatalf("%+v %v", d, err)
			}
			if _, err := e.Release(ctx, Release{LeaseID: d.LeaseID, OutputTokens: 1}); err != nil {
				b.Fatal(err)
			}
		}
		return float64(time.Since(start).Nanoseconds()) / float64(n)
	}
	for _, churn := range []bool{false, true} {
		name := "cold"
		if churn {
			name = "cold-churn"
		}
		b.Run(name, func(b *testing.B) {
			fleetNs := run(b, fleet(), 100_000, churn, 2)
			defNs := run(b, topology.Simulated(), 100, churn, 2)
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(fleetNs, "ns/fleet")
			b.ReportMetric(defNs, "ns/default")
			b.ReportMetric(fleetNs/defNs, "fleet/default")
		})
	}
	// Four spread choices, walked for each placement, against the two
	// cached, on the fleet in the same run.
	b.Run("cold-4-choices", func(b *testing.B) {
		four := run(b, fleet(), 100_000, false, 4)
		two := run(b, fleet(), 100_000, false, 2)
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(four, "ns/fleet-4")
		b.ReportMetric(two, "ns/fleet-2")
		b.ReportMetric(four/two, "4/2")
	})
}

// BenchmarkSaturatedAdmitFleet measures an Admit that finds every domain
// full and queues (then gives up, so the queue keeps its size), on 1,400
// NVL72 domains beside the default cluster's 6 in the same run: the
// saturated path walks every domain, O(D).
func BenchmarkSaturatedAdmitFleet(b *testing.B) {
	run := func(b *testing.B, cluster topology.Cluster) float64 {
		cfg := testConfig()
		cfg.Queue.DefaultWait = Duration{time.Hour}
		h := newHarness(b, cfg, cluster)
		for {
			_, w := h.submit(req("a", "large", 100_000, 2_000))
			if w != nil {
				h.cancel(w)
				break
			}
		}
		n := b.N
		start := time.Now()
		for i := 0; i < n; i++ {
			_, w := h.submit(req([]string{"a", "b", "c"}[i%3], "large", 100_000, 2_000))
			if w == nil {
				b.Fatal("not queued")
			}
			h.cancel(w)
		}
		return float64(time.Since(start).Nanoseconds()) / float64(n)
	}
	fleetNs := run(b, fleet())
	defNs := run(b, topology.Simulated())
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(fleetNs, "ns/fleet")
	b.ReportMetric(defNs, "ns/default")
	b.ReportMetric(fleetNs/defNs, "fleet/default")
}

// The idle sweep visits the active tenants a slice per tick, one pass per
// sweepEvery: a tenth of the way through, about a tenth of the idle
// tenants are gone; after a whole pass, all of them, while a tenant holding
// a lease stays.
func TestIdleSweepGoesInSlices(t *testing.T) {
	cfg := testConfig()
	cfg.Tenants = map[string]TenantConfig{}
	const n = 2000
	for i := 0; i < n; i++ {
		cfg.Tenants[fmt.Sprintf("t%d", i)] = TenantConfig{Tier: "bronze"}
	}
	h := newHarness(t, cfg, hgxCluster(t, 2))
	// Active tenants with nothing held or spent: looked up, as a first
	// request does before its gates (a request would spend, and a tenant
	// that spent this month is not idle).
	h.e.mu.Lock()
	for i := 0; i < n; i++ {
		h.e.mu.gates.lookupLocked(fmt.Sprintf("t%d", i), h.e.nowLocked(), h.e.mu.place.modelList)
	}
	h.e.mu.Unlock()
	held := h.admit(req("t7", "small", 1, 1))
	active := func() int {
		h.e.mu.Lock()
		defer h.e.mu.Unlock()
		if len(h.e.mu.gates.active) != len(h.e.mu.gates.tenants) {
			t.Fatalf("%d tenants in slots, %d by name", len(h.e.mu.gates.active), len(h.e.mu.gates.tenants))
		}
		for i, ts := range h.e.mu.gates.active {
			if ts.slot != i || h.e.mu.gates.tenants[ts.name] != ts {
				t.Fatalf("slot %d holds %s, whose slot is %d", i, ts.name, ts.slot)
			}
		}
		return len(h.e.mu.gates.active)
	}
	h.advance(time.Millisecond) // a pass begins
	h.advance(sweepEvery / 10)
	if got := n - active(); got < n/20 || got > n/5 {
		t.Fatalf("a tenth of a pass dropped %d of %d idle tenants", got, n-1)
	}
	for i := 0; i < 10; i++ {
		h.advance(sweepEvery / 10)
	}
	if got := active(); got != 1 {
		t.Fatalf("after a whole pass %d tenants are active, want only the one that spent and holds a lease", got)
	}
	if _, ok := h.e.mu.gates.tenants["t7"]; !ok {
		t.Fatal("the tenant holding a lease was dropped")
	}
	h.release(held.LeaseID, 1, 1)
	if got := active(); got != 1 {
		t.Fatalf("%d active after the release, want t7", got)
	}
}
