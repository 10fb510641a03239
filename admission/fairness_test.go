package admission

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-sched/sluice/topology"
)

// backlogShares queues n requests for each tenant (prompt sizes differ per
// tenant), then lets capacity refill in steps, releasing every lease at
// once, and returns each tenant's admitted weighted tokens counted while
// every tenant still had requests waiting.
func backlogShares(t *testing.T, cfg Config, prompts map[string]int64, n int) map[string]int64 {
	share, _ := backlogService(t, cfg, prompts, n)
	return share
}

// backlogService is backlogShares that also returns the largest difference
// between any two tenants' admitted weighted tokens, each divided by its
// weight, at any moment while every tenant was backlogged.
func backlogService(t *testing.T, cfg Config, prompts map[string]int64, n int) (map[string]int64, float64) {
	h := newHarness(t, cfg, hgxCluster(t, 1))
	h.saturate("c", "medium", 1000, 10)
	var waiters []*waiter
	for i := 0; i < n; i++ {
		for _, tenant := range sortedKeys(prompts) {
			d, w := h.submit(req(tenant, "medium", prompts[tenant], 10))
			if w == nil {
				t.Fatalf("%s not queued: %+v", tenant, d)
			}
			waiters = append(waiters, w)
		}
	}
	share := map[string]int64{}
	seen := map[*waiter]bool{}
	var maxDiff float64
	weight := func(tenant string) float64 { p, _ := cfg.Policy(tenant); return float64(p.Weight) }
	for step := 0; step < 100000; step++ {
		h.advance(20 * time.Millisecond)
		backlogged := true
		for tenant := range prompts {
			if h.tenant(tenant).Queued == 0 {
				backlogged = false
			}
		}
		for _, w := range waiters {
			if !answered(w) || seen[w] {
				continue
			}
			seen[w] = true
			if w.decision.Outcome != Admitted {
				t.Fatalf("queued request: %+v", w.decision)
			}
			if backlogged {
				share[w.p.tenant.name] += w.p.weighted
			}
			h.release(w.decision.LeaseID, w.p.prompt, 10)
		}
		if !backlogged {
			return share, maxDiff
		}
		for _, a := range sortedKeys(prompts) {
			for _, b := range sortedKeys(prompts) {
				maxDiff = max(maxDiff, float64(share[a])/weight(a)-float64(share[b])/weight(b))
			}
		}
	}
	t.Fatal("backlog never drained")
	return nil, 0
}

func TestFairnessEqualWeights(t *testing.T) {
	cfg := testConfig()
	cfg.Queue.DefaultWait = Duration{time.Hour}
	// b and c have equal weights; b's requests are three times c's size.
	share, diff := backlogService(t, cfg, map[string]int64{"b": 3000, "c": 1000}, 300)
	ratio := float64(share["b"]) / float64(share["c"])
	t.Logf("admitted while backlogged: %v (ratio %.4f), largest service difference %.0f", share, ratio, diff)
	if math.Abs(ratio-1) > 0.02 {
		t.Fatalf("equal weights: admitted %v, ratio %.4f, want within 2%% of 1", share, ratio)
	}
	// VTC's bound (Sheng et al., OSDI 2024): two backlogged equal-weight
	// tenants' service never differs by more than twice the largest
	// request's cost (b's: 3000 prompt + 4 × 10 output).
	if largest := float64(3000 + 4*10); diff > 2*largest {
		t.Fatalf("service difference reached %.0f weighted tokens, above VTC's bound of %.0f", diff, 2*largest)
	}
}

func TestFairnessWeightsOneToFour(t *testing.T) {
	cfg := testConfig()
	cfg.Queue.DefaultWait = Duration{time.Hour}
	// a has weight 4, b weight 1.
	share := backlogShares(t, cfg, map[string]int64{"a": 1000, "b": 2000}, 400)
	ratio := float64(share["a"]) / float64(share["b"])
	t.Logf("admitted while backlogged: %v (ratio %.4f)", share, ratio)
	if math.Abs(ratio/4-1) > 0.02 {
		t.Fatalf("weights 4:1: admitted %v, ratio %.4f, want within 2%% of 4", share, ratio)
	}
}

func TestFloorHeldUnderFifteenfoldBurst(t *testing.T) {
	cfg := testConfig()
	cfg.Tiers["standard"] = TierPolicy{RPS: Limit{Rate: 100, Burst: 100}, Tokens: Limit{Rate: 4000, Burst: 8000}, Floor: 2000, Weight: 1}
	cfg.Tiers["bursty"] = TierPolicy{RPS: Limit{Rate: 1e6, Burst: 1e6}, Tokens: Limit{Rate: 30000, Burst: 60000}, Weight: 8}
	cfg.Tiers["steady"] = TierPolicy{RPS: Limit{Rate: 100, Burst: 100}, Tokens: Limit{Rate: 4000, Burst: 8000}, Weight: 2}
	cfg.Tenants = map[string]TenantConfig{"initech": {Tier: "standard"}, "burst": {Tier: "bursty"}, "globex": {Tier: "steady"}}
	h := newHarness(t, cfg, hgxCluster(t, 1))
	var steady []*waiter // globex: within quota, no floor, through the fair queue

	const step = 50 * time.Millisecond
	floorPerSecond := map[int]int64{}
	burstQueued := 0
	var waiters []*waiter
	for i := 0; i < 20*20; i++ { // 20 s
		second := i / 20
		// The burst tenant asks 15× its token rate: 450k weighted tokens/s.
		for j := 0; j < 22; j++ {
			if _, w := h.submit(req("burst", "medium", 960, 10)); w != nil {
				burstQueued++
				waiters = append(waiters, w)
			}
		}
		// globex asks 2000 weighted tokens/s, half its quota, and has no floor.
		if i%10 == 5 {
			d, w := h.submit(req("globex", "medium", 960, 10))
			if w == nil {
				if d.Outcome != Admitted {
					t.Fatalf("globex within quota: %+v", d)
				}
				w = &waiter{done: make(chan struct{}), decision: d}
				close(w.done)
			}
			steady = append(steady, w)
		}
		// initech asks exactly its floor: 1000 weighted tokens every 500 ms.
		if i%10 == 0 {
			d, w := h.submit(req("initech", "medium", 960, 10))
			if w != nil || d.Outcome != Admitted || !d.Trace.Floor {
				t.Fatalf("t=%v: floor request not admitted from the floor at once: %+v", time.Duration(i)*step, d)
			}
			floorPerSecond[second] += d.Trace.WeightedTokens
			h.release(d.LeaseID, 960, 10)
		}
		h.advance(step)
		for _, ws := range [][]*waiter{waiters, steady} {
			for _, w := range ws {
				if answered(w) && w.decision.LeaseID != 0 {
					h.release(w.decision.LeaseID, 960, 10)
					w.decision.LeaseID = 0
				}
			}
		}
	}
	if burstQueued == 0 {
		t.Fatal("the burst never saturated capacity: the test proves nothing")
	}
	// Queue wait of the within-quota tenant: p99 under 2 s (Sluice's target).
	var waits []time.Duration
	for _, w := range steady {
		if !answered(w) || w.decision.Outcome != Admitted {
			t.Fatalf("globex request not admitted: %+v", w.decision)
		}
		waits = append(waits, w.decision.Queued)
	}
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	p99 := waits[len(waits)*99/100]
	t.Logf("globex queue wait p99 %v over %d requests", p99, len(waits))
	if p99 >= 2*time.Second {
		t.Fatalf("within-quota queue wait p99 %v, want < 2s", p99)
	}
	for s := 0; s < 20; s++ {
		if floorPerSecond[s] < 2000 {
			t.Fatalf("second %d: initech admitted %d weighted tokens, below its floor of 2000", s, floorPerSecond[s])
		}
	}
}

// TestPlacementProperties drives random clusters with random requests,
// releases, drains and time, and checks after every step that no lease is
// charged to two domains, nothing is placed on a drained domain, and no
// bucket or gauge leaves its bounds.
func TestPlacementProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		gpus := []string{"H200", "B200", "GB200", "H100"}
		var b strings.Builder
		b.WriteString("domains:\n")
		nd := rapid.IntRange(1, 4).Draw(rt, "domains")
		for i := 0; i < nd; i++ {
			fmt.Fprintf(&b, "  - {id: d%d, kind: k, gpu: %s, nodes: %d, gpus_per_node: 8, node_prefix: d%d-n}\n",
				i, rapid.SampledFrom(gpus).Draw(rt, "gpu"), rapid.IntRange(1, 3).Draw(rt, "nodes"), i)
		}
		cluster, err := topology.Parse([]byte(b.String()))
		if err != nil {
			rt.Fatalf("cluster: %v", err)
		}
		cfg := testConfig()
		cfg.DegradeHeadroom = ptr(rapid.Float64Range(0, 0.5).Draw(rt, "headroom"))
		h := newHarness(rt, cfg, cluster)
		drained := map[string]bool{}
		var leases []uint64
		var waiters []*waiter
		check := func(d Decision) {
			if d.LeaseID == 0 {
				return
			}
			if drained[d.Domain] {
				rt.Fatalf("placed on drained domain %s", d.Domain)
			}
			leases = append(leases, d.LeaseID)
		}
		for i := rapid.IntRange(1, 60).Draw(rt, "ops"); i > 0; i-- {
			switch rapid.IntRange(0, 9).Draw(rt, "op") {
			case 0, 1, 2, 3, 4:
				r := req(rapid.SampledFrom([]string{"a", "b", "c"}).Draw(rt, "tenant"),
					rapid.SampledFrom([]string{"large", "medium", "small"}).Draw(rt, "model"),
					rapid.Int64Range(1, 200000).Draw(rt, "prompt"), rapid.Int64Range(1, 20000).Draw(rt, "output"))
				if r.Model != "small" && rapid.Bool().Draw(rt, "degrade") {
					r.AcceptDowngrade = []string{"small"}
				}
				d, w := h.submit(r)
				if w != nil {
					waiters = append(waiters, w)
				}
				check(d)
			case 5, 6:
				if len(leases) > 0 {
					j := rapid.IntRange(0, len(leases)-1).Draw(rt, "lease")
					_, _ = h.e.Release(context.Background(), Release{LeaseID: leases[j], OutputTokens: rapid.Int64Range(0, 30000).Draw(rt, "used")})
					leases = append(leases[:j], leases[j+1:]...)
				}
			case 7:
				id := fmt.Sprintf("d%d", rapid.IntRange(0, nd-1).Draw(rt, "drain"))
				if drained[id] {
					_ = h.e.Undrain(id)
				} else {
					_ = h.e.Drain(id, "test")
				}
				drained[id] = !drained[id]
			default:
				h.advance(time.Duration(rapid.Int64Range(0, int64(3*time.Second)).Draw(rt, "advance")))
			}
			// Queued requests may be answered by any step: check them now,
			// against the drains in force when they were answered.
			var still []*waiter
			for _, w := range waiters {
				if answered(w) {
					check(w.decision)
				} else {
					still = append(still, w)
				}
			}
			waiters = still
			checkInvariants(rt, h)
		}
	})
}

func checkInvariants(t *rapid.T, h *harness) {
	e := h.e
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.nowLocked()
	kv := map[*domainState]int64{}
	inFlight := map[*domainState]int{}
	e.mu.leases.each(func(l *lease) {
		kv[l.dom] += l.cost.KVBytes
		inFlight[l.dom]++
	})
	for _, d := range e.mu.place.domains {
		p, dec := d.cap.Levels(now)
		if p > d.cap.PrefillBurst() || dec > d.cap.DecodeBurst() {
			t.Fatalf("%s: bucket above burst: prefill %d/%d decode %d/%d", d.ID(), p, d.cap.PrefillBurst(), dec, d.cap.DecodeBurst())
		}
		used, limit := d.cap.KV()
		if _, warming := d.cap.Warmup(now); warming != 0 {
			// A ramp may cut the limit below leases held from before the
			// drain; nothing new fits until it rises above them.
			limit = max(limit, used)
		}
		if used < 0 || used > limit {
			t.Fatalf("%s: KV %d outside [0, %d]", d.ID(), used, limit)
		}
		if used != kv[d] || d.inFlight != inFlight[d] {
			t.Fatalf("%s: KV %d and in flight %d, but its leases hold %d in %d", d.ID(), used, d.inFlight, kv[d], inFlight[d])
		}
	}
}

// TestUtilizationWhenBacklogged keeps the queue full for 10 s and checks
// that what is admitted uses at least 95% of the domain's soft prefill
// capacity (the binding resource for these requests) over that time.
func TestUtilizationWhenBacklogged(t *testing.T) {
	cfg := testConfig()
	cfg.Queue.DefaultWait = Duration{time.Hour}
	h := newHarness(t, cfg, hgxCluster(t, 1))
	h.saturate("a", "medium", 1000, 10) // start from an empty bucket
	rate := h.domain("d1").PrefillRate
	var waiters []*waiter
	for i := 0; i < 600; i++ {
		_, w := h.submit(req([]string{"a", "b", "c"}[i%3], "medium", 1000+int64(i%7)*300, 10))
		if w == nil {
			t.Fatal("not queued")
		}
		waiters = append(waiters, w)
	}
	var prefill int64
	const step, steps = 10 * time.Millisecond, 1000
	for i := 0; i < steps; i++ {
		h.advance(step)
		for _, w := range waiters {
			if answered(w) && w.decision.LeaseID != 0 {
				prefill += w.pl.cost.PrefillFLOP
				h.release(w.decision.LeaseID, w.p.prompt, 10)
				w.decision.LeaseID = 0
			}
		}
	}
	if h.e.QueueLen() == 0 {
		t.Fatal("the queue drained: not backlogged throughout")
	}
	util := float64(prefill) / (float64(rate) * (step * steps).Seconds())
	t.Logf("prefill utilization while backlogged: %.4f", util)
	if util < 0.95 {
		t.Fatalf("utilization %.4f, want ≥ 0.95", util)
	}
}
