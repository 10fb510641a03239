package admission

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/cputime"
	"github.com/sluice-sched/sluice/topology"
)

// BenchmarkAdmit measures one in-process decision that admits at once
// (real clock, default cluster, every gate on), beside golang.org/x/time/rate
// in the same run. Leases are released in batches outside the timer so the
// lease table stays bounded.
func BenchmarkAdmit(b *testing.B) {
	cfg := testConfig()
	p := cfg.Tiers["gold"]
	p.MaxConcurrency = 1 << 30
	p.Budget = Budget{DailyUSD: 1e9}
	cfg.Tiers["gold"] = p
	e, err := New(cfg, topology.Simulated())
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.Run(ctx) // never needed if every request admits at once, but nothing may hang
	// A tiny request on the smallest model, so that the simulated cluster's
	// capacity (millions of these per second) never binds: every decision
	// runs all gates and placement and admits.
	r := req("a", "small", 1, 1)
	leases := make([]uint64, 0, 1024)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d, err := e.Admit(ctx, r)
		if err != nil || d.Outcome != Admitted {
			b.Fatalf("%+v %v", d, err)
		}
		leases = append(leases, d.LeaseID)
		if len(leases) == cap(leases) {
			b.StopTimer()
			for _, id := range leases {
				_, _ = e.Release(ctx, Release{LeaseID: id, OutputTokens: 1})
			}
			leases = leases[:0]
			b.StartTimer()
		}
	}
}

// BenchmarkQueuedAdmit measures a queued Admit behind 1k and behind 100k
// backlogged flows (one request queued for each of as many tenants), in one
// run: Submit of a request that fits nowhere and waits, and its removal as
// a caller giving up (Await with a cancelled context), so that the backlog
// stays at size. Both estimate the request's place in the fair queue (its
// wait at Submit, its Retry-After when it leaves). The two sizes run in
// alternating blocks timed by the thread's CPU time, as
// wfq.BenchmarkEnqueueDequeueRatio does, and the first ops of each block,
// which bring the engine back into cache, are not timed. It reports each
// size's ns per op and their ratio, whose target is ≤ 2.
func BenchmarkQueuedAdmit(b *testing.B) {
	const (
		block  = 1 << 12 // ops per block
		warmup = 1 << 9  // of which untimed
	)
	engines := [2]*Engine{backlogged(b, 1000), backlogged(b, 100_000)}
	ctx := context.Background()
	gone, cancel := context.WithCancel(ctx)
	cancel()
	r := req("b", "large", 4000, 500) // its finish tag amid the backlog's tails
	b.ReportAllocs()
	cputime.Ratio(b, block, warmup, "ns/op-1k", "ns/op-100k", func(which int) {
		e := engines[which]
		d, tk, err := e.Submit(ctx, r)
		if err != nil || tk == nil {
			b.Fatalf("not queued: %+v %v", d, err)
		}
		if d := e.Await(gone, tk); d.Reason != ReasonDeadlineUnmeetable {
			b.Fatalf("given up: %+v", d)
		}
	})
}

// backlogged returns an engine on one HGX domain that tenant a fills, with
// one request queued for each of flows bronze tenants: flows backlogged
// flows of the fair queue, of assorted sizes, so that their tail tags
// spread over a span of the virtual time. Tenant b, not among them, is
// left for the benchmark.
func backlogged(b *testing.B, flows int) *Engine {
	cfg := testConfig()
	cfg.Queue.MaxTotal = flows + 1
	cfg.Queue.DefaultWait = Duration{24 * time.Hour} // no estimate behind the backlog passes it
	for i := range flows {
		cfg.Tenants[fmt.Sprintf("tenant-%06d", i)] = TenantConfig{Tier: "bronze"}
	}
	h := newHarness(b, cfg, hgxCluster(b, 1))
	h.saturate("a", "large", 4000, 10)
	for i := range flows {
		if d, w := h.submit(req(fmt.Sprintf("tenant-%06d", i), "large", 4000, 10+int64(i*7919%1000))); w == nil {
			b.Fatalf("backlog request %d not queued: %+v", i, d)
		}
	}
	return h.e
}

// BenchmarkMassExpiry measures a mass expiry: n requests of one tenant
// queued a microsecond apart (its flow n deep, its deadlines in the same
// order, oldest first), whose deadlines all pass before one Tick,
// which refuses each with its Retry-After from its place in the queue. It
// reports the Tick's ns per expired request, which stays flat from 1k to
// 10k when the expiry is O(n log n).
func BenchmarkMassExpiry(b *testing.B) {
	for _, n := range []int{1000, 10_000} {
		b.Run(fmt.Sprintf("expiring=%d", n), func(b *testing.B) {
			cfg := testConfig()
			cfg.Queue.MaxPerFlow, cfg.Queue.MaxTotal = n, n
			cfg.Queue.DefaultWait = Duration{time.Hour}
			r := req("b", "large", 4000, 10)
			for b.Loop() {
				b.StopTimer()
				h := newHarness(b, cfg, hgxCluster(b, 1))
				h.saturate("a", "large", 4000, 10)
				waiters := make([]*waiter, n)
				for i := range waiters {
					if d, w := h.submit(r); w == nil {
						b.Fatalf("request %d not queued: %+v", i, d)
					} else {
						waiters[i] = w
					}
					h.clk.Advance(time.Microsecond) // deadlines in arrival order
				}
				h.clk.Advance(time.Hour)
				b.StartTimer()
				h.e.Tick()
				b.StopTimer()
				for _, w := range waiters {
					if !answered(w) || w.decision.Reason != ReasonDeadlineUnmeetable {
						b.Fatalf("not refused at its deadline: %+v", w.decision)
					}
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/expired")
		})
	}
}

// BenchmarkXTimeRate is the yardstick: x/time/rate's AllowN at a fixed time
// and Allow with the real clock.
func BenchmarkXTimeRate(b *testing.B) {
	b.Run("AllowN", func(b *testing.B) {
		l := rate.NewLimiter(rate.Inf, 1)
		now := time.Now()
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			l.AllowN(now, 1)
		}
	})
	b.Run("AllowN-limited", func(b *testing.B) {
		l := rate.NewLimiter(1e12, 1e9)
		now := time.Now()
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			l.AllowN(now, 1)
		}
	})
	b.Run("Allow", func(b *testing.B) {
		l := rate.NewLimiter(1e12, 1e9)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			l.Allow()
		}
	})
}

// BenchmarkIdleTenantMemory reports the heap bytes each configured but idle
// tenant costs the engine (its config entry; the engine builds state only
// for active tenants), at 100k tenants. The parsed config the engine was
// built from is garbage afterwards, as in sluiced, and is not counted.
func BenchmarkIdleTenantMemory(b *testing.B) {
	const n = 100000
	for i := 0; i < b.N; i++ {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		e := engineWithTenants(b, n)
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/tenant")
		runtime.KeepAlive(e)
	}
}

func engineWithTenants(b *testing.B, n int) *Engine {
	cfg := testConfig()
	cfg.Tenants = make(map[string]TenantConfig, n)
	for j := 0; j < n; j++ {
		cfg.Tenants[fmt.Sprintf("tenant-%06d", j)] = TenantConfig{Tier: "bronze"}
	}
	e, err := New(cfg, topology.Simulated())
	if err != nil {
		b.Fatal(err)
	}
	return e
}

// BenchmarkLeaseMemory holds 200k leases (long generations: admitted,
// not yet released) and reports the heap each costs the engine — the lease
// table's slot, its id's map entry and its expiry heap entry (target: ≤ 256
// B per lease).
func BenchmarkLeaseMemory(b *testing.B) {
	const n = 200_000
	for i := 0; i < b.N; i++ {
		cfg := testConfig()
		p := cfg.Tiers["gold"]
		p.MaxConcurrency = 1 << 30
		p.Budget = Budget{DailyUSD: 1e9}
		cfg.Tiers["gold"] = p
		h := newHarness(b, cfg, topology.Simulated())
		r := req("a", "small", 1, 1)
		h.admit(r) // the tenant's state and the tables' first allocations are not the leases'
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range n {
			if d := h.admit(r); d.Outcome != Admitted {
				b.Fatalf("lease %d: %+v", h.e.LeaseCount(), d)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if got := h.e.LeaseCount(); got != n+1 {
			b.Fatalf("%d leases held, want %d", got, n+1)
		}
		b.ReportMetric((float64(after.HeapAlloc)-float64(before.HeapAlloc))/n, "bytes/lease")
	}
}

// BenchmarkIdempotencyMemory admits (and releases) 1M requests with unique
// request ids on a manual clock and reports the heap the remembered ids
// hold (target: ≤ 96 MB for 1M, ≤ 96 B per record), then moves past the
// TTL and reports what is left.
func BenchmarkIdempotencyMemory(b *testing.B) {
	const n = 1_000_000
	for i := 0; i < b.N; i++ {
		h := newHarness(b, testConfig(), topology.Simulated())
		ctx := context.Background()
		r := req("a", "small", 1, 1)
		var before, full, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		buf := make([]byte, 0, 16)
		for j := 0; j < n; j++ {
			buf = strconv.AppendInt(buf[:0], int64(j), 36)
			r.RequestID = string(buf)
			d, err := h.e.Admit(ctx, r)
			if err != nil || d.Outcome != Admitted {
				b.Fatalf("%+v %v", d, err)
			}
			_, _ = h.e.Release(ctx, Release{LeaseID: d.LeaseID, OutputTokens: 1})
		}
		runtime.GC()
		runtime.ReadMemStats(&full)
		if got, _ := h.e.IdempotencyRecords(); got != n {
			b.Fatalf("%d records, want %d", got, n)
		}
		h.advance(h.e.Config().Leases.IdempotencyTTL.Duration + time.Minute)
		runtime.GC()
		runtime.ReadMemStats(&after)
		if got, _ := h.e.IdempotencyRecords(); got != 0 {
			b.Fatalf("%d records after the TTL, want 0", got)
		}
		held := float64(full.HeapAlloc) - float64(before.HeapAlloc)
		b.ReportMetric(held/n, "bytes/record")
		b.ReportMetric(held/1e6, "MB/1M-ids")
		b.ReportMetric((float64(after.HeapAlloc)-float64(before.HeapAlloc))/1e6, "MB-after-TTL")
	}
}

// BenchmarkAdmitWithinFloor measures an Admit and its Release for a tenant
// within its floor against the same for a tenant without one, in one run
// on the simulated cluster (alternating blocks timed by the thread's CPU
// time, as BenchmarkQueuedAdmit): a floor request runs the floor bucket
// and the count of what its tenant is served in the second, and its
// placement's first look passes over the domains the capacity guard holds
// and those a queued head awaits (findFloor). The clock moves a
// millisecond an op, so the floor bucket stays full and every floor
// request is admitted within it.
func BenchmarkAdmitWithinFloor(b *testing.B) {
	cfg := testConfig()
	p := cfg.Tiers["gold"]
	p.MaxConcurrency = 1 << 30
	cfg.Tiers["gold"] = p
	p.Floor = 100_000
	cfg.Tiers["floored"] = p
	cfg.Tenants["f"] = TenantConfig{Tier: "floored"}
	clk := clock.NewManual(epoch)
	e, err := New(cfg, topology.Simulated(), WithClock(clk))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	reqs := [2]Request{req("a", "small", 1, 1), req("f", "small", 1, 1)}
	b.ReportAllocs()
	cputime.Ratio(b, 1<<12, 1<<9, "ns/op-shared", "ns/op-floor", func(which int) {
		d, err := e.Admit(ctx, reqs[which])
		if err != nil || d.Outcome != Admitted || d.Trace.Floor != (which == 1) {
			b.Fatalf("%s: %+v %v, want admitted, within the floor for f", reqs[which].Tenant, d, err)
		}
		if _, err := e.Release(ctx, Release{LeaseID: d.LeaseID, OutputTokens: 1}); err != nil {
			b.Fatal(err)
		}
		clk.Advance(time.Millisecond)
	})
}
