package redisstate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/state/memstate"
	"github.com/sluice-sched/sluice/internal/state/redisstate"
	"github.com/sluice-sched/sluice/internal/state/redistest"
)

// The Lua scripts and the in-memory store agree: random sequences of
// reports, commits and settles give the same grants, levels and verdicts
// from both. Buckets refill at 1 unit/s, so the time a run takes moves a
// level by at most a unit or two.
func TestScriptsMatchMemory(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	run := 0
	rapid.Check(t, func(t *rapid.T) {
		run++
		lua := redisstate.New(rdb, fmt.Sprintf("diff%d", run))
		mem := memstate.New(nil)
		replicas := []string{"a", "b", "c"}
		keys := []string{"k1", "k2"}
		cums := map[string]int64{}
		leases := 0
		for i := range rapid.IntRange(1, 30).Draw(t, "ops") {
			switch rapid.IntRange(0, 2).Draw(t, fmt.Sprintf("op%d", i)) {
			case 0:
				r := rapid.SampledFrom(replicas).Draw(t, "replica")
				k := rapid.SampledFrom(keys).Draw(t, "key")
				took := rapid.Int64Range(-50, 500).Draw(t, "took")
				cums[r+k] += took
				req := &sharing.ReconcileRequest{Replica: r, Replicas: 3, Stale: time.Minute, Buckets: []sharing.BucketReport{{
					Key: k, Rate: 1, Burst: 10_000,
					Epoch:   uint64(rapid.IntRange(1, 2).Draw(t, "epoch")),
					Cum:     ((cums[r+k] % sharing.CumModulus) + sharing.CumModulus) % sharing.CumModulus,
					Unacked: rapid.Int64Range(0, 500).Draw(t, "unacked"),
					Demand:  rapid.Int64Range(0, 100).Draw(t, "demand"),
				}}, Gauges: []sharing.GaugeReport{{
					Key: "kv", Limit: 1000, Held: rapid.Int64Range(0, 600).Draw(t, "held"),
					Share: rapid.Int64Range(0, 10).Draw(t, "share"), TTL: time.Minute,
				}}}
				got, err1 := lua.Reconcile(ctx, req)
				want, err2 := mem.Reconcile(ctx, req)
				if err1 != nil || err2 != nil {
					t.Fatalf("reconcile: %v / %v", err1, err2)
				}
				g, w := got.Buckets[0], want.Buckets[0]
				if diff(g.RateMilli, w.RateMilli) > 1 || diff(g.Level, w.Level) > 3 || diff(got.Gauges[0], want.Gauges[0]) > 1 {
					t.Fatalf("reconcile %+v: lua %+v %v, memory %+v %v", req.Buckets[0], g, got.Gauges, w, want.Gauges)
				}
			case 1:
				leases++
				c := &sharing.StrictCharge{KV: sharing.KVHold{
					Key: "skv", Lease: fmt.Sprint(leases), Limit: 1000,
					Bytes: rapid.Int64Range(1, 400).Draw(t, "bytes"), TTL: time.Minute,
				}}
				for _, k := range keys {
					if rapid.Bool().Draw(t, "takes "+k) {
						c.Takes = append(c.Takes, sharing.StrictTake{Key: "s" + k, Rate: 1, Burst: 1000,
							Amount: rapid.Int64Range(0, 600).Draw(t, "amount"), Min: -rapid.Int64Range(0, 100).Draw(t, "credit")})
					}
				}
				got, err1 := lua.Commit(ctx, c)
				want, err2 := mem.Commit(ctx, c)
				if err1 != nil || err2 != nil {
					t.Fatalf("commit: %v / %v", err1, err2)
				}
				if got.Admitted != want.Admitted || got.Refused != want.Refused || (got.RetryAfter-want.RetryAfter).Abs() > 3*time.Second {
					t.Fatalf("commit %+v: lua %+v, memory %+v", c, got, want)
				}
			case 2:
				if leases == 0 {
					continue
				}
				st := &sharing.StrictSettle{KVKey: "skv", Lease: fmt.Sprint(rapid.IntRange(1, leases).Draw(t, "lease"))}
				for _, k := range keys {
					st.Refunds = append(st.Refunds, sharing.StrictTake{Key: "s" + k, Rate: 1, Burst: 1000, Amount: rapid.Int64Range(-300, 300).Draw(t, "refund")})
				}
				if err1, err2 := lua.Settle(ctx, st), mem.Settle(ctx, st); err1 != nil || err2 != nil {
					t.Fatalf("settle: %v / %v", err1, err2)
				}
			}
		}
	})
}

func diff(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}
