package redisstate_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/state/redisstate"
	"github.com/sluice-sched/sluice/internal/state/redistest"
	"github.com/sluice-sched/sluice/topology"
)

// BenchmarkDecision measures one Admit+Release in embedded, batched and
// strict mode against the same local redis-server, beside a go-redis PING
// round trip in the same run. Each reports its latency p50/p99 (µs, from an
// HDR histogram) and, for the shared modes, Redis calls per decision.
//
//	go test -run '^$' -bench BenchmarkDecision -benchtime 20000x ./internal/state/redisstate/
func BenchmarkDecision(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client()
	cfg, err := config.Parse("test.yaml", []byte(testConfig))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("ping", func(b *testing.B) {
		h := hdrhistogram.New(1, 10_000_000, 3)
		for b.Loop() {
			start := time.Now()
			if err := rdb.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			_ = h.RecordValue(time.Since(start).Nanoseconds())
		}
		report(b, h, 0, 0)
	})
	for _, mode := range []sharing.Mode{0, sharing.Batched, sharing.Strict} {
		b.Run(mode.String(), func(b *testing.B) {
			opts := []admission.Option{}
			if mode != 0 {
				opts = append(opts, admission.WithSharedState(redisstate.New(rdb, fmt.Sprintf("bench-%s-%d", mode, b.N)), sharing.Options{
					Mode: mode, Replica: "bench", Replicas: 1, Timeout: 100 * time.Millisecond,
				}))
			}
			e, err := admission.New(cfg, topology.Simulated(), opts...)
			if err != nil {
				b.Fatal(err)
			}
			runCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			go e.Run(runCtx) // batched: the reconciler runs every 100 ms
			h := hdrhistogram.New(1, 10_000_000, 3)
			// A tenant whose quota never binds: every decision is an
			// admission (placement, lease, and in strict mode the commit),
			// then a Release (in strict mode the settle).
			req := admission.Request{Tenant: "b1", Model: "small", PromptTokens: 1, MaxOutputTokens: 1}
			for b.Loop() {
				start := time.Now()
				d, err := e.Admit(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				if !admitted(d) {
					b.Fatalf("%s: refused (%v): the benchmark must measure admissions", mode, d.Reason)
				}
				if _, err := e.Release(ctx, admission.Release{LeaseID: d.LeaseID, OutputTokens: 1}); err != nil {
					b.Fatal(err)
				}
				_ = h.RecordValue(time.Since(start).Nanoseconds())
			}
			st, _ := e.SharedStatus()
			report(b, h, st.Calls, st.Decisions)
		})
	}
}

func report(b *testing.B, h *hdrhistogram.Histogram, calls, decisions uint64) {
	b.ReportMetric(float64(h.ValueAtQuantile(50))/1e3, "p50-µs")
	b.ReportMetric(float64(h.ValueAtQuantile(99))/1e3, "p99-µs")
	if decisions > 0 {
		b.ReportMetric(float64(calls)/float64(decisions), "redis-calls/decision")
	}
}

// BenchmarkReconcileReadings measures one replica's reconcile of 430
// domains (its round in the default fleet simulation: 859 domain bucket
// updates) on a local redis-server, with no engine readings held, with a
// reading held for every domain (each gauge's reply carries it), and with
// those and 3 readings published (a replica's share of the reads on a
// fleet of 1,000 over 1,400 domains, 2 readers each). Beside the time a
// call takes it reports the script's time by Redis's own clock.
//
//	go test -run '^$' -bench BenchmarkReconcileReadings -benchtime 2s ./internal/state/redisstate/
func BenchmarkReconcileReadings(b *testing.B) {
	rdb := redistest.Start(b).Client()
	ctx := context.Background()
	const domains = 430
	for _, c := range []struct {
		name            string
		held, published bool
	}{{"no-readings", false, false}, {"readings-held", true, false}, {"readings-held-3-published", true, true}} {
		b.Run(c.name, func(b *testing.B) {
			st := redisstate.New(rdb, "bench-"+c.name)
			bs, gs := domainReports(domains)
			req := &sharing.ReconcileRequest{Replica: "r0", Replicas: 1000, Stale: 300 * time.Millisecond, Rejoin: 3 * time.Second, Buckets: bs, Gauges: gs}
			if c.held { // another replica read every domain
				var pub []sharing.EngineReport
				for _, g := range gs {
					pub = append(pub, sharing.EngineReport{Key: g.Key, Reading: &sharing.EngineReading{Queue: 3, Running: 40, KVUsage: 0.61}})
				}
				if _, err := st.Reconcile(ctx, &sharing.ReconcileRequest{Replica: "reader", Replicas: 1000, Stale: time.Second, Engines: pub}); err != nil {
					b.Fatal(err)
				}
			}
			if c.published {
				for _, g := range gs[:3] {
					req.Engines = append(req.Engines, sharing.EngineReport{Key: g.Key, Reading: &sharing.EngineReading{Queue: 1, Running: 20, KVUsage: 0.4}})
				}
			}
			calls0, usec0 := scriptStats(b, rdb)
			for b.Loop() {
				for i := range req.Engines {
					req.Engines[i].Reading.Queue++ // a new reading each round
				}
				rep, err := st.Reconcile(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				if c.held && rep.Readings[domains-1] == nil { // the first 3 may be this replica's own
					b.Fatal("no reading came back with the gauge")
				}
			}
			calls, usec := scriptStats(b, rdb)
			b.ReportMetric(float64(usec-usec0)/float64(calls-calls0), "redis-µs/call")
		})
	}
}

// scriptStats is how many EVALSHA calls Redis has run and the
// microseconds they took, by its own clock (INFO commandstats).
func scriptStats(b *testing.B, rdb *redis.Client) (calls, usec int64) {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
			for _, f := range strings.Split(rest, ",") {
				k, v, _ := strings.Cut(f, "=")
				n, _ := strconv.ParseInt(v, 10, 64)
				switch k {
				case "calls":
					calls = n
				case "usec":
					usec = n
				}
			}
		}
	}
	return calls, usec
}
