package fleetsim

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/state/memstate"
)

// reduced is the fleet the tests run: 50 replicas, 20,000 tenants, 70
// domains, 3 shards, 3 virtual seconds (a few seconds of one core).
var reduced = Config{Replicas: 50, Tenants: 20_000, Domains: 70, Shards: 3, Duration: 3 * time.Second, Seed: 1, Rate: 10_000}

// The targets of batched shared state at fleet scale, held as behaviour
// of the real strategy on the real stores: one call per shard per
// replica per interval, no shard busier than 1.25 × the mean, and every
// tenant spread over several replicas admitted at most quota +
// (N_t−1)·R·W.
func TestFleetTargets(t *testing.T) {
	res := runLogged(t, reduced)
	oneCallPerRound(t, res)
	var buckets, keys int64
	for _, s := range res.Shards {
		buckets += s.Buckets()
		keys += int64(s.Keys)
	}
	mean := func(total int64) float64 { return float64(total) / float64(len(res.Shards)) }
	for _, s := range res.Shards {
		if got := float64(s.Buckets()); got > 1.25*mean(buckets) {
			t.Errorf("%s: %d bucket updates, %.2f × the mean %.0f: want at most 1.25", s.Name, s.Buckets(), got/mean(buckets), mean(buckets))
		}
		if got := float64(s.Keys); got > 1.25*mean(keys) {
			t.Errorf("%s: %d keys, %.2f × the mean %.0f: want at most 1.25", s.Name, s.Keys, got/mean(keys), mean(keys))
		}
	}

	if len(res.Hot) < 2 {
		t.Fatalf("%d tenants spread over several replicas, want at least 2: the workload does not exercise sharing", len(res.Hot))
	}
	for _, o := range res.Hot {
		if o.OverBound() {
			t.Errorf("%s on %d replicas admitted %d tokens: over the bound quota %d + (N_t−1)·R·W %d", o.Tenant, o.Replicas, o.Admitted, o.Quota, o.Allowed)
		}
	}
	if res.RefusedQuota == 0 || res.Admitted == 0 {
		t.Errorf("%d admitted, %d refused over quota: every tenant overloads its quota, want both", res.Admitted, res.RefusedQuota)
	}
	if len(res.Settle) != 2 {
		t.Errorf("%d mid-run changes, want a join and a leave", len(res.Settle))
	}
}

// With engines simulated, each domain's readers publish each reading once
// (domains × readers a read period), the replicas that weigh a domain
// take its readings well within feedback.stale, and the rounds stay one
// call per shard per replica per interval.
func TestFleetRelaysEngineReadings(t *testing.T) {
	// TestFleetDeterministic's fleet: the relay's counts need no more.
	cfg := Config{Replicas: 20, Tenants: 5_000, Domains: 30, Shards: 3, Duration: 2 * time.Second, Seed: 7, Rate: 4_000, EngineReaders: 2}
	res := runLogged(t, cfg)
	oneCallPerRound(t, res)
	var published int64
	for _, s := range res.Shards {
		published += s.Published
	}
	reads := int64(cfg.Domains*cfg.EngineReaders) * int64(cfg.Duration/EngineRead)
	if published > reads || float64(published) < 0.95*float64(reads) {
		t.Errorf("%d readings published, want each of the %d reads once (%d domains × %d readers × %d periods)", published, reads, cfg.Domains, cfg.EngineReaders, cfg.Duration/EngineRead)
	}
	if res.Relayed == 0 || res.RelayAgeMax >= 2*EngineRead {
		t.Errorf("%d readings relayed, the oldest %v old: want some, each younger than two read periods (%v)", res.Relayed, res.RelayAgeMax, 2*EngineRead)
	}
}

// runLogged runs cfg and logs its tables.
func runLogged(t *testing.T, cfg Config) *Result {
	t.Helper()
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", table.String())
	return res
}

// oneCallPerRound checks calls/s ≤ N × (1 s / Interval) on every shard:
// each replica's round calls a shard at most once, and a replica has
// Duration/Interval rounds.
func oneCallPerRound(t *testing.T, res *Result) {
	t.Helper()
	c := res.Config
	for _, s := range res.Shards {
		if s.Calls*int64(Interval) > int64(c.Replicas)*int64(c.Duration) {
			t.Errorf("%s: %d calls in %v from %d replicas: more than one per replica per %v", s.Name, s.Calls, c.Duration, c.Replicas, Interval)
		}
	}
}

// One seed, one result: two runs print the same tables. (A smaller fleet
// than reduced's, to keep the test short; the run has the same parts.)
func TestFleetDeterministic(t *testing.T) {
	cfg := Config{Replicas: 20, Tenants: 5_000, Domains: 30, Shards: 3, Duration: 2 * time.Second, Seed: 7, Rate: 4_000}
	var tables [2]bytes.Buffer
	var results [2]*Result
	for i := range tables {
		res, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := res.WriteTable(&tables[i]); err != nil {
			t.Fatal(err)
		}
		results[i] = res
	}
	if tables[0].String() != tables[1].String() || !reflect.DeepEqual(results[0], results[1]) {
		t.Errorf("two runs of one seed differ:\n%s\n%s", tables[0].String(), tables[1].String())
	}
	cfg.Seed++
	other, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if reflect.DeepEqual(other.Shards, results[0].Shards) {
		t.Errorf("seeds %d and %d gave the same shard counts: the seed does not reach the workload", cfg.Seed-1, cfg.Seed)
	}
}

// The slot is Redis Cluster's: CRC16-XMODEM of the hash tag, mod 16384,
// and every key of one owner shares it.
func TestSlot(t *testing.T) {
	if got := crc16(0, "123456789"); got != 0x31c3 {
		t.Errorf("crc16(123456789) = %#x, want 0x31c3 (the XMODEM check value)", got)
	}
	// CLUSTER KEYSLOT foo / bar / hello.
	for key, want := range map[string]int{"foo": 12182, "bar": 5061, "hello": 866} {
		if got := int(crc16(0, key) % Slots); got != want {
			t.Errorf("slot of %q = %d, want %d", key, got, want)
		}
	}
	want := int(crc16(0, "sluice/t/acme") % Slots) // {sluice/t/acme}/rps
	for _, k := range []string{"t/acme/rps", "t/acme/tok", "t/acme/floor"} {
		if got := Slot(k); got != want {
			t.Errorf("Slot(%q) = %d, want %d (its owner's)", k, got, want)
		}
	}
	if shardOfSlot(0, 3) != 0 || shardOfSlot(Slots-1, 3) != 2 || shardOfSlot(Slots/2, 2) != 1 {
		t.Error("slots are not split into contiguous ranges")
	}
}

// A request split over shards gets the grants one store would give, in
// its own order, and each shard counts its part.
func TestShardedStoreSplits(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_800_000_000, 0))
	sharded, whole := newShardedStore(3, clk), memstate.New(clk)
	req := &sharing.ReconcileRequest{Replica: "a", Replicas: 2, Stale: 300 * time.Millisecond, Rejoin: 3 * time.Second}
	shards := map[int]bool{}
	for i := range 12 {
		key := fmt.Sprintf("t/tenant-%d/tok", i)
		shards[sharded.shardOf(key)] = true
		req.Buckets = append(req.Buckets, sharing.BucketReport{Key: key, Rate: 1000, Burst: 2000, Epoch: 1, Cum: int64(10 * i), Unacked: int64(10 * i), Demand: 500})
		req.Gauges = append(req.Gauges, sharing.GaugeReport{Key: fmt.Sprintf("d/nvl72-%d/kv", i), Limit: 1 << 30, Held: int64(i), Share: 1, TTL: time.Second})
	}
	if len(shards) < 2 {
		t.Fatal("the keys all fell on one shard: the test splits nothing")
	}
	ctx := context.Background()
	for round := range 3 {
		clk.Advance(Interval)
		got, err := sharded.Reconcile(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		want, err := whole.Reconcile(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: sharded reply %+v, one store's %+v", round, got, want)
		}
	}
	var calls, buckets, gauges, keys int64
	for _, s := range sharded.stats() {
		calls += s.Calls
		buckets += s.Buckets()
		gauges += s.Gauges
		keys += int64(s.Keys)
	}
	if calls > 3*3 || buckets != 3*12 || gauges != 3*12 || keys != 24 {
		t.Errorf("counted %d calls, %d bucket and %d gauge updates, %d keys; want ≤ 9, 36, 36, 24", calls, buckets, gauges, keys)
	}
}

// respSize is the size of the EVALSHA call redisstate's reconcileOn
// builds, encoded in RESP2, and of its reply.
func TestRespSize(t *testing.T) {
	part := &sharing.ReconcileRequest{
		Replica: "host-1/9f3a", Replicas: 1000, Stale: 300 * time.Millisecond, Rejoin: 3 * time.Second,
		Buckets: []sharing.BucketReport{
			{Key: "t/acme/rps", Rate: 10_000, Burst: 20_000, Cum: 123_456, Unacked: 7, Epoch: 12, Demand: 999, Age: 1500 * time.Millisecond, Resume: true, Held: -42, Span: 100 * time.Millisecond},
			{Key: "d/nvl72-0001/pf", Rate: 1 << 31, Burst: 1 << 32, Cum: 1 << 51, Epoch: 3},
		},
		Gauges: []sharing.GaugeReport{{Key: "d/nvl72-0001/kv", Limit: 1 << 40, Held: 1 << 30, Share: 5, TTL: time.Minute}},
		Engines: []sharing.EngineReport{
			{Key: "d/nvl72-0002/kv", Reading: &sharing.EngineReading{Queue: 3, Running: 40, KVUsage: 0.61, Age: 50 * time.Millisecond}},
			{Key: "d/nvl72-0003/kv"},
		},
	}
	heard := &sharing.EngineReading{Queue: 2, Running: 7, KVUsage: 0.5, Age: 120 * time.Millisecond, Stamp: 9}
	rep := &sharing.ReconcileReply{Buckets: []sharing.BucketGrant{{RateMilli: 5_000_000, Level: -3}, {RateMilli: 0, Level: 1 << 40}}, Gauges: []int64{1 << 35},
		Readings: []*sharing.EngineReading{heard, nil, heard}}

	redisKey := func(k string) string { // redisstate.Store.Key with the default prefix
		i := len(k) - 1
		for k[i] != '/' {
			i--
		}
		return "{sluice/" + k[:i] + "}" + k[i:]
	}
	itoa := func(v int64) string { return strconv.FormatInt(v, 10) }
	us := func(d time.Duration) string { return itoa(d.Microseconds()) }
	args := []string{"EVALSHA", "0123456789012345678901234567890123456789", "1", redisKey(part.Buckets[0].Key),
		part.Replica, us(part.Stale), "2", "1000", us(part.Rejoin), "1", "2"}
	for _, b := range part.Buckets {
		args = append(args, redisKey(b.Key))
	}
	for _, g := range part.Gauges {
		args = append(args, redisKey(g.Key))
	}
	for _, e := range part.Engines {
		args = append(args, redisKey(e.Key))
	}
	for _, b := range part.Buckets {
		resume := "0"
		if b.Resume {
			resume = "1"
		}
		args = append(args, itoa(b.Rate), itoa(b.Burst), itoa(b.Cum), itoa(b.Unacked), itoa(b.Demand),
			strconv.FormatUint(b.Epoch, 10), us(b.Age), resume, itoa(b.Held), us(b.Span))
	}
	for _, g := range part.Gauges {
		args = append(args, itoa(g.Limit), itoa(g.Held), itoa(g.Share), us(g.TTL))
	}
	args = append(args, "1", "3", "40", "0.61", "50000", "0", "0", "0", "0", "0")
	var wantReq bytes.Buffer
	fmt.Fprintf(&wantReq, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&wantReq, "$%d\r\n%s\r\n", len(a), a)
	}
	var wantRep bytes.Buffer
	fmt.Fprintf(&wantRep, "*5\r\n")
	for _, g := range rep.Buckets {
		fmt.Fprintf(&wantRep, "*2\r\n:%d\r\n:%d\r\n", g.RateMilli, g.Level)
	}
	// The heard reading as the script answers it: the numbers as the
	// reader wrote them, the age and a Redis TIME stamp in µs.
	reading := fmt.Sprintf("*5\r\n$1\r\n2\r\n$1\r\n7\r\n$3\r\n0.5\r\n:120000\r\n:%d\r\n", redisStamp)
	fmt.Fprintf(&wantRep, "*2\r\n:%d\r\n%s", rep.Gauges[0], reading) // the gauge with its domain's reading
	fmt.Fprintf(&wantRep, ":0\r\n%s", reading)                       // the published entry (its own: none), the asked one

	gotReq, gotRep := respSize(part, rep)
	if gotReq != int64(wantReq.Len()) || gotRep != int64(wantRep.Len()) {
		t.Errorf("respSize = %d, %d bytes; the encoding is %d, %d", gotReq, gotRep, wantReq.Len(), wantRep.Len())
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	for _, c := range []Config{{Replicas: 1}, {Tenants: -1}, {Shards: Slots + 1}, {Duration: Interval}, {Rate: -5}, {EngineReaders: -1}, {Replicas: 4, EngineReaders: 4}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: valid, want an error", c)
		}
	}
}
