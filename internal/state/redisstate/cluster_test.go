package redisstate_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/state/redisstate"
	"github.com/sluice-sched/sluice/internal/state/redistest"
	"github.com/sluice-sched/sluice/internal/testwait"
)

// shardedStore starts a Redis Cluster and returns it with a store on a
// cluster client, its scripts loaded on every master.
func shardedStore(t *testing.T, masters, replicas int) (*redistest.Cluster, *redisstate.Store, *redis.ClusterClient) {
	t.Helper()
	c := redistest.StartShardedCluster(t, masters, replicas)
	rdb := c.Client()
	st := redisstate.New(rdb, "")
	if err := st.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c, st, rdb
}

// tenantReports returns the reports of tenants from..to-1 ("t/tenant-N/rps"),
// each with its own rate and burst, from the only replica, asking for more
// than the rate: the store grants it the whole rate, and a bucket's level
// share is its burst less what it took since (its Unacked at the first
// report, no more than the burst after).
func tenantReports(from, to int) []sharing.BucketReport {
	var out []sharing.BucketReport
	for i := from; i < to; i++ {
		out = append(out, sharing.BucketReport{
			Key: fmt.Sprintf("t/tenant-%d/rps", i), Rate: int64(1000 + i), Burst: int64(10000 + i),
			Cum: int64(i % 7), Unacked: int64(i % 7), Epoch: 1, Demand: 1 << 40,
		})
	}
	return out
}

// domainReports returns n domains' buckets (pf and dc) and KV gauges;
// each gauge's limit is distinct, and the only replica's limit is all of it.
func domainReports(n int) ([]sharing.BucketReport, []sharing.GaugeReport) {
	var bs []sharing.BucketReport
	var gs []sharing.GaugeReport
	for i := range n {
		for _, kind := range []string{"pf", "dc"} {
			bs = append(bs, sharing.BucketReport{
				Key: fmt.Sprintf("d/dom-%d/%s", i, kind), Rate: int64(500 + i), Burst: int64(5000 + i), Epoch: 1, Demand: 1 << 40,
			})
		}
		gs = append(gs, sharing.GaugeReport{Key: fmt.Sprintf("d/dom-%d/kv", i), Limit: int64(1<<20 + i), Held: int64(i), Share: 1, TTL: time.Minute})
	}
	return bs, gs
}

// reconcileRequest reports buckets and gauges, and for each gauge's domain
// publishes an engine reading whose queue is the gauge's index.
func reconcileRequest(buckets []sharing.BucketReport, gauges []sharing.GaugeReport) *sharing.ReconcileRequest {
	var engines []sharing.EngineReport
	for i, g := range gauges {
		engines = append(engines, sharing.EngineReport{Key: g.Key, Reading: &sharing.EngineReading{Queue: float64(i), KVUsage: 0.5}})
	}
	return &sharing.ReconcileRequest{
		Replica: "r0", Replicas: 1, Stale: 10 * time.Second, Rejoin: time.Second,
		Buckets: buckets, Gauges: gauges, Engines: engines,
	}
}

// checkReply says how rep is not the answer to req ("" when it is): in the
// request's order, each bucket granted its whole rate with a level share
// within [burst − unacked, burst], each gauge its whole limit, and no
// engine reading (the only replica's own).
// reconcileLoop reconciles next(i), i = 0, 1, …, in the background until
// end, counting the rounds and what went wrong in each.
type reconcileLoop struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	rounds   atomic.Int64
	mu       sync.Mutex
	failures []string
}

func startReconcileLoop(ctx context.Context, st *redisstate.Store, next func(i int) *sharing.ReconcileRequest) *reconcileLoop {
	l := &reconcileLoop{stop: make(chan struct{})}
	l.wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			default:
			}
			if why := reconcileOnce(ctx, st, next(i)); why != "" {
				l.mu.Lock()
				l.failures = append(l.failures, why)
				l.mu.Unlock()
			}
			l.rounds.Add(1)
		}
	})
	return l
}

// end stops the loop and returns its rounds and failures.
func (l *reconcileLoop) end() (rounds int64, failures []string) {
	close(l.stop)
	l.wg.Wait()
	return l.rounds.Load(), l.failures
}

// reconcileOnce sends req and says what is wrong with the answer ("" if
// nothing is).
func reconcileOnce(ctx context.Context, st *redisstate.Store, req *sharing.ReconcileRequest) string {
	rep, err := st.Reconcile(ctx, req)
	if err != nil {
		return err.Error()
	}
	return checkReply(req, rep)
}

func checkReply(req *sharing.ReconcileRequest, rep *sharing.ReconcileReply) string {
	if len(rep.Buckets) != len(req.Buckets) || len(rep.Gauges) != len(req.Gauges) {
		return fmt.Sprintf("%d grants and %d gauges for %d buckets and %d gauges", len(rep.Buckets), len(rep.Gauges), len(req.Buckets), len(req.Gauges))
	}
	for i, b := range req.Buckets {
		g := rep.Buckets[i]
		if g.RateMilli != 1000*b.Rate || g.Level < b.Burst-b.Unacked || g.Level > b.Burst {
			return fmt.Sprintf("bucket %d (%s, rate %d, burst %d, unacked %d): granted %+v", i, b.Key, b.Rate, b.Burst, b.Unacked, g)
		}
	}
	for i, g := range req.Gauges {
		if rep.Gauges[i] != g.Limit {
			return fmt.Sprintf("gauge %d (%s): limit %d, want %d", i, g.Key, rep.Gauges[i], g.Limit)
		}
	}
	if len(rep.Readings) != len(req.Gauges)+len(req.Engines) {
		return fmt.Sprintf("%d engine readings for %d gauges and %d entries", len(rep.Readings), len(req.Gauges), len(req.Engines))
	}
	for i, r := range rep.Readings {
		if r != nil {
			return fmt.Sprintf("reading %d: %+v, want none (the only replica's own)", i, *r)
		}
	}
	return ""
}

// One Reconcile over three masters is one script call on each, and its
// grants come back in the request's order; tenants spread evenly.
func TestClusterReconcileOneCallPerMaster(t *testing.T) {
	c, st, _ := shardedStore(t, 3, 0)
	ctx := context.Background()
	db, dg := domainReports(5)
	req := reconcileRequest(append(tenantReports(0, 300), db...), dg)
	c.ResetStats()
	rep, err := st.Reconcile(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if why := checkReply(req, rep); why != "" {
		t.Fatal(why)
	}
	evalsha, eval := c.CallsPerMaster("evalsha"), c.CallsPerMaster("eval")
	// Another replica asking for the five domains' engine readings gets
	// r0's, each from its own master.
	ask := &sharing.ReconcileRequest{Replica: "r1", Replicas: 2, Stale: 10 * time.Second, Rejoin: time.Second}
	for _, g := range dg {
		ask.Engines = append(ask.Engines, sharing.EngineReport{Key: g.Key})
	}
	heard, err := st.Reconcile(ctx, ask)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range heard.Readings {
		if r == nil || r.Queue != float64(i) || r.KVUsage != 0.5 {
			t.Errorf("r1 asking for %s's engines: %+v, want r0's reading (queue %d, kv 0.5)", dg[i].Key, r, i)
		}
	}
	for _, m := range c.Masters() {
		if evalsha[m] != 1 || eval[m] != 0 {
			t.Errorf("master %s ran EVALSHA %d and EVAL %d times for one Reconcile, want once and never (all: %v %v)", m, evalsha[m], eval[m], evalsha, eval)
		}
	}
	for _, b := range req.Buckets[:20] {
		if got, want := st.Shard(b.Key), c.MasterOf(st.Key(b.Key)); got != want {
			t.Errorf("Shard(%s) = %s, the cluster serves it on %s", b.Key, got, want)
		}
	}
	keys := c.KeysPerMaster()
	for m, n := range keys {
		if n == 0 {
			t.Errorf("master %s holds no keys: %v", m, keys)
		}
	}

	// 3,000 tenants in all, 300 a call.
	for from := 300; from < 3000; from += 300 {
		req := reconcileRequest(tenantReports(from, from+300), nil)
		rep, err := st.Reconcile(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if why := checkReply(req, rep); why != "" {
			t.Fatal(why)
		}
	}
	keys = c.KeysPerMaster()
	var total, busiest int64
	for _, n := range keys {
		total += n
		busiest = max(busiest, n)
	}
	if want := int64(3000 + 3*5); total != want {
		t.Errorf("%d keys in all (%v), want %d", total, keys, want)
	}
	mean := float64(total) / 3
	t.Logf("keys per master %v: busiest ÷ mean %.3f", keys, float64(busiest)/mean)
	if len(keys) != 3 || float64(busiest)/mean > 1.25 {
		t.Errorf("keys per master %v: busiest ÷ mean = %.3f, want 3 masters within 1.25", keys, float64(busiest)/mean)
	}
}

// Reconciles running while redis-cli migrates 500 slots, their keys with
// them, all answer, correctly: go-redis follows MOVED and ASK, and the
// store sends again the keys a node no longer serves. Each round starts
// the request at another tenant, so that the keys being moved come at
// every place in it, first included. And a store idle during the
// migration, its slot map from before it, answers its first request
// after it, whose first key (the one its call to the old master is
// routed by) has moved.
func TestClusterReconcileDuringReshard(t *testing.T) {
	c, st, _ := shardedStore(t, 3, 0)
	idle := redisstate.New(c.Client(), "")
	ctx := context.Background()
	all := tenantReports(0, 1000)
	for _, s := range []*redisstate.Store{st, idle} {
		if rep, err := s.Reconcile(ctx, reconcileRequest(all, nil)); err != nil {
			t.Fatal(err)
		} else if why := checkReply(reconcileRequest(all, nil), rep); why != "" {
			t.Fatal(why)
		}
	}
	masters := c.Masters()
	from, to := masters[0], masters[1]
	before := make(map[string]string)
	for _, b := range all {
		before[b.Key] = c.MasterOf(st.Key(b.Key))
	}

	loop := startReconcileLoop(ctx, st, func(i int) *sharing.ReconcileRequest {
		at := (i * 37) % len(all)
		return reconcileRequest(append(slices.Clone(all[at:]), all[:at]...), nil)
	})
	err := c.Reshard(from, to, 500)
	rounds, failures := loop.end()
	if err != nil {
		t.Fatal(err)
	}
	var moved, stayed []sharing.BucketReport
	for _, b := range all {
		if before[b.Key] == from && c.MasterOf(st.Key(b.Key)) == to {
			moved = append(moved, b)
		} else {
			stayed = append(stayed, b)
		}
	}
	t.Logf("%d rounds during the reshard; %d of %d tenants moved from %s to %s", rounds, len(moved), len(all), from, to)
	if len(moved) == 0 || rounds < 3 {
		t.Fatalf("%d tenants moved, %d rounds ran during the reshard: it tested nothing", len(moved), rounds)
	}
	if len(failures) > 0 {
		t.Errorf("%d of %d Reconciles failed during the reshard; first: %s", len(failures), rounds, failures[0])
	}
	// The idle store's first request, the moved tenants first: its slot
	// map still puts them on the old master, and its call there is routed
	// by one of them.
	req := reconcileRequest(append(slices.Clone(moved), stayed...), nil)
	if rep, err := idle.Reconcile(ctx, req); err != nil {
		t.Errorf("a store idle during the reshard, first request after it: %v", err)
	} else if why := checkReply(req, rep); why != "" {
		t.Errorf("a store idle during the reshard, first request after it: %s", why)
	}
	// And after it, through the store that ran during it.
	req = reconcileRequest(all, nil)
	rep, err := st.Reconcile(ctx, req)
	if err != nil {
		t.Fatalf("after the reshard: %v", err)
	}
	if why := checkReply(req, rep); why != "" {
		t.Fatalf("after the reshard: %s", why)
	}
}

// level returns a bucket hash's level field ("l", see commit.lua), or -1
// for no bucket.
func level(t *testing.T, rdb *redis.ClusterClient, key string) float64 {
	t.Helper()
	f, err := rdb.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if f["l"] == "" {
		return -1
	}
	l, err := strconv.ParseFloat(f["l"], 64)
	if err != nil {
		t.Fatalf("%s: level %q", key, f["l"])
	}
	return l
}

// strictNames returns a tenant and a domain whose keys are on different
// masters (apart) or on the same one.
func strictNames(t *testing.T, st *redisstate.Store, apart bool) (string, string) {
	t.Helper()
	for i := range 1000 {
		tenant, domain := fmt.Sprintf("st%d", i), fmt.Sprintf("sd%d", i)
		if (st.Shard("t/"+tenant+"/tok") != st.Shard("d/"+domain+"/kv")) == apart {
			return tenant, domain
		}
	}
	t.Fatalf("no tenant and domain with apart=%v in 1000 tries", apart)
	return "", ""
}

// Strict mode with the tenant's keys on one master and the domain's on
// another: an admission takes from both, a refusal by the domain's KV
// gives the tenant's take back, and a settle refunds both once.
func TestClusterStrictAcrossMasters(t *testing.T) {
	c, st, rdb := shardedStore(t, 3, 0)
	for _, apart := range []bool{true, false} {
		t.Run(map[bool]string{true: "apart", false: "together"}[apart], func(t *testing.T) {
			strictCase(t, c, st, rdb, apart)
		})
	}
}

func strictCase(t *testing.T, c *redistest.Cluster, st *redisstate.Store, rdb *redis.ClusterClient, apart bool) {
	ctx := context.Background()
	tenant, domain := strictNames(t, st, apart)
	tok, pf, kv := "t/"+tenant+"/tok", "d/"+domain+"/pf", "d/"+domain+"/kv"
	holds := st.Key(kv) + ":holds"
	// Rate 0: no refill, so that every level is exact.
	takes := func(tokens, prefill int64) []sharing.StrictTake {
		return []sharing.StrictTake{
			{Key: tok, Rate: 0, Burst: 100_000, Amount: tokens},
			{Key: pf, Rate: 0, Burst: 50_000, Amount: prefill},
		}
	}
	calls := func() int64 {
		var n int64
		for _, v := range c.CallsPerMaster("evalsha") {
			n += v
		}
		return n
	}
	// One call per master the decision touches.
	perDecision := int64(1)
	if apart {
		perDecision = 2
	}

	c.ResetStats()
	v, err := st.Commit(ctx, &sharing.StrictCharge{Takes: takes(700, 300), KV: sharing.KVHold{Key: kv, Lease: "L1", Limit: 1000, Bytes: 600, TTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	if !v.Admitted || !slices.Equal(v.Levels, []int64{100_000 - 700, 50_000 - 300}) {
		t.Fatalf("commit: %+v, want admitted at levels [99300 49700]", v)
	}
	if n := calls(); n != perDecision {
		t.Errorf("commit ran %d script calls, want %d", n, perDecision)
	}
	if l, p := level(t, rdb, st.Key(tok)), level(t, rdb, st.Key(pf)); l != 99_300 || p != 49_700 {
		t.Errorf("after the commit: tenant level %v, domain level %v, want 99300 and 49700", l, p)
	}
	if h, err := rdb.HGetAll(ctx, holds).Result(); err != nil || h["L1"] != "600" || h["_sum"] != "600" {
		t.Errorf("KV holds after the commit: %v %v, want L1 and _sum 600", h, err)
	}

	// The KV cannot hold 600 more: refused by the domain's node, and the
	// tenant's part, taken first where it is elsewhere, given back.
	c.ResetStats()
	v, err = st.Commit(ctx, &sharing.StrictCharge{Takes: takes(900, 100), KV: sharing.KVHold{Key: kv, Lease: "L2", Limit: 1000, Bytes: 600, TTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	if v.Admitted || v.Refused != 2 {
		t.Fatalf("commit beyond the KV limit: %+v, want refused by the KV (index 2)", v)
	}
	if n, want := calls(), map[bool]int64{true: 3, false: 1}[apart]; n != want {
		t.Errorf("refused commit ran %d script calls, want %d", n, want)
	}
	if l, p := level(t, rdb, st.Key(tok)), level(t, rdb, st.Key(pf)); l != 99_300 || p != 49_700 {
		t.Errorf("after the refusal: tenant level %v, domain level %v, want unchanged 99300 and 49700", l, p)
	}
	if h, err := rdb.HGetAll(ctx, holds).Result(); err != nil || h["L2"] != "" || h["_sum"] != "600" {
		t.Errorf("KV holds after the refusal: %v %v, want no L2 and _sum 600", h, err)
	}

	// Settled twice: refunded once.
	settle := &sharing.StrictSettle{Refunds: takes(500, 200), KVKey: kv, Lease: "L1"}
	for i := range 2 {
		c.ResetStats()
		if err := st.Settle(ctx, settle); err != nil {
			t.Fatalf("settle %d: %v", i+1, err)
		}
		if l, p := level(t, rdb, st.Key(tok)), level(t, rdb, st.Key(pf)); l != 99_800 || p != 49_900 {
			t.Errorf("after settle %d: tenant level %v, domain level %v, want 99800 and 49900", i+1, l, p)
		}
		if h, err := rdb.HGetAll(ctx, holds).Result(); err != nil || h["L1"] != "" || h["_sum"] != "0" {
			t.Errorf("KV holds after settle %d: %v %v, want no L1 and _sum 0", i+1, h, err)
		}
		// The second settle stops at the KV's node, which held no lease.
		if n, want := calls(), []int64{perDecision, 1}[i]; n != want {
			t.Errorf("settle %d ran %d script calls, want %d", i+1, n, want)
		}
	}
}

// A master killed: tenants on the other masters are answered throughout
// its failover, and once its replica serves its slots, every tenant is
// answered again within seconds.
func TestClusterReconcileDuringFailover(t *testing.T) {
	c, st, _ := shardedStore(t, 3, 1)
	ctx := context.Background()
	all := tenantReports(0, 300)
	if rep, err := st.Reconcile(ctx, reconcileRequest(all, nil)); err != nil {
		t.Fatal(err)
	} else if why := checkReply(reconcileRequest(all, nil), rep); why != "" {
		t.Fatal(why)
	}
	victim := st.Shard(all[0].Key)
	if victim == "" || victim != c.MasterOf(st.Key(all[0].Key)) {
		t.Fatalf("Shard(%s) = %q, the cluster serves it on %s", all[0].Key, victim, c.MasterOf(st.Key(all[0].Key)))
	}
	var others []sharing.BucketReport
	for _, b := range all {
		if st.Shard(b.Key) != victim {
			others = append(others, b)
		}
	}
	if len(others) == 0 || len(others) == len(all) {
		t.Fatalf("%d of %d tenants off the victim %s", len(others), len(all), victim)
	}

	loop := startReconcileLoop(ctx, st, func(int) *sharing.ReconcileRequest { return reconcileRequest(others, nil) })
	killed := time.Now()
	c.Kill(victim)
	promoted := c.WaitFailover(victim, 15*time.Second)
	failedOver := time.Since(killed)

	// Every tenant again, the victim's included, within a few seconds.
	var lastErr, firstErr string
	tries := 0
	testwait.Until(t, 5*time.Second, "every tenant answered after the failover", func() bool {
		tries++
		lastErr = reconcileOnce(ctx, st, reconcileRequest(all, nil))
		if firstErr == "" {
			firstErr = lastErr
		}
		return lastErr == ""
	})
	rounds, failures := loop.end()
	t.Logf("every tenant answered after %d tries (first: %q)", tries, firstErr)
	t.Logf("failover to %s took %v; %d rounds for the other masters' tenants meanwhile", promoted, failedOver, rounds)
	if rounds < 3 {
		t.Errorf("only %d rounds ran during the failover", rounds)
	}
	if len(failures) > 0 {
		t.Errorf("%d of %d Reconciles of the other masters' tenants failed during the failover; first: %s", len(failures), rounds, failures[0])
	}
	if got := st.Shard(all[0].Key); got != promoted {
		t.Errorf("after the failover Shard(%s) = %q, want the promoted %s", all[0].Key, got, promoted)
	}
}
