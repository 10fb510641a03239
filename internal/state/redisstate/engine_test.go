package redisstate_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/state/redisstate"
	"github.com/sluice-sched/sluice/internal/state/redistest"
	"github.com/sluice-sched/sluice/internal/testwait"
	"github.com/sluice-sched/sluice/topology"
)

// Token rates and bursts, in weighted tokens (output weight 1); each test
// request is prompt 50 + output 50 = 100 weighted tokens.
const (
	quotaRate  = 20000
	quotaBurst = 10000
	reqTokens  = 100
)

const testConfig = `
output_token_weight: 1
leases: {ttl: 1m, idempotency_ttl: 1m}
tiers:
  open:
    rps: {rate: 1000000, burst: 1000000}
    tokens: {rate: 20000, burst: 10000}
    weight: 1
  closed:
    rps: {rate: 1000000, burst: 1000000}
    tokens: {rate: 20000, burst: 10000}
    weight: 1
    fail_mode: closed
  strict:
    rps: {rate: 1000000, burst: 1000000}
    tokens: {rate: 1, burst: 1000}
    weight: 1
  bench:
    rps: {rate: 100000000, burst: 100000000}
    tokens: {rate: 1000000000, burst: 1000000000}
    weight: 1
  recover:
    rps: {rate: 1000000, burst: 1000000}
    tokens: {rate: 20000, burst: 20000}
    weight: 1
tenants:
  rc: {tier: recover}
  t1: {tier: open}
  t2: {tier: closed}
  s1: {tier: strict}
  b1: {tier: bench}
`

func replica(t *testing.T, rdb redis.UniversalClient, mode sharing.Mode, id string, n int, tweak ...func(*sharing.Options)) *admission.Engine {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	o := sharing.Options{
		Mode: mode, Replica: id, Replicas: n, Timeout: 100 * time.Millisecond, Failures: 2, Cooldown: 200 * time.Millisecond,
	}
	for _, f := range tweak {
		f(&o)
	}
	e, err := admission.New(cfg, topology.Simulated(), admission.WithSharedState(redisstate.New(rdb, ""), o))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func run(t *testing.T, engines ...*admission.Engine) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, e := range engines {
		wg.Add(1)
		go func() { defer wg.Done(); e.Run(ctx) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func request(tenant string) admission.Request {
	return admission.Request{Tenant: tenant, Model: "small", PromptTokens: 50, MaxOutputTokens: 50}
}

func admitted(d admission.Decision) bool {
	return d.Outcome == admission.Admitted || d.Outcome == admission.Degraded
}

// Strict mode: 3 replicas × 50 goroutines on one tenant never admit more
// than the bucket allows, exactly.
func TestStrictAtomicity(t *testing.T) {
	rdb := redistest.Start(t).Client()
	var engines []*admission.Engine
	// Generous store timeouts: 150 callers on two shared cores can hold a
	// script call past 100 ms, and a timeout would open the breaker and let
	// fail-open admit from local slices, which is not what this tests.
	patient := func(o *sharing.Options) { o.Timeout, o.Failures = 10*time.Second, 1000 }
	for i := range 3 {
		engines = append(engines, replica(t, rdb, sharing.Strict, fmt.Sprintf("r%d", i), 3, patient))
	}
	start := time.Now()
	var n atomic.Int64
	var wg sync.WaitGroup
	for _, e := range engines {
		for range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 4 {
					d, err := e.Admit(context.Background(), admission.Request{Tenant: "s1", Model: "small", PromptTokens: 5, MaxOutputTokens: 5})
					switch {
					case err != nil:
						t.Error(err)
					case admitted(d):
						n.Add(1)
					case d.Reason != admission.ReasonQuotaExceeded:
						t.Errorf("rejected with %v, want QUOTA_EXCEEDED", d.Reason)
					}
				}
			}()
		}
	}
	wg.Wait()
	// Burst 1000 at 10 tokens each is 100 admissions; the rate (1/s) adds
	// one per 10 s of the test.
	most := int64(100 + time.Since(start)/(10*time.Second))
	if got := n.Load(); got < 100 || got > most {
		t.Errorf("admitted %d of 600 against a bucket of 100 (at most %d with refill)", got, most)
	}
}

// load admits on e for tenant until stop closes, adding admitted weighted
// tokens to *sum.
func load(e *admission.Engine, tenant string, stop <-chan struct{}, sum *atomic.Int64, each func(admission.Decision)) {
	tick := time.NewTicker(500 * time.Microsecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		d, err := e.Admit(context.Background(), request(tenant))
		if err != nil {
			panic(err)
		}
		if admitted(d) {
			sum.Add(reqTokens)
		}
		if each != nil {
			each(d)
		}
	}
}

// Batched mode: 3 replicas driving one tenant far above its quota admit
// at most quota + (N−1)·R·W and at least 99% of the quota.
func TestBatchedAccuracy(t *testing.T) {
	rdb := redistest.Start(t).Client()
	var engines []*admission.Engine
	for i := range 3 {
		engines = append(engines, replica(t, rdb, sharing.Batched, fmt.Sprintf("r%d", i), 3))
	}
	run(t, engines...)
	var sum atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for _, e := range engines {
		for range 2 {
			wg.Add(1)
			go func() { defer wg.Done(); load(e, "t1", stop, &sum, nil) }()
		}
	}
	waitFor(3 * time.Second)
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	quota := quotaBurst + int64(quotaRate*elapsed.Seconds())
	bound := quota + 2*quotaRate/10 // (N−1)·R·W with W = 100ms
	got := sum.Load()
	t.Logf("admitted %d weighted tokens in %v; quota %d, bound %d (%.2f%% of quota)", got, elapsed, quota, bound, 100*float64(got)/float64(quota))
	if got > bound {
		t.Errorf("admitted %d > quota %d + (N−1)·R·W = %d", got, quota, bound)
	}
	if float64(got) < 0.99*float64(quota) {
		t.Errorf("admitted %d < 99%% of the quota %d", got, quota)
	}
}

// Batched mode: a tenant whose traffic all reaches one replica gets ≥ 90%
// of its quota there from the second second on, not 1/N of it.
func TestBatchedOneReplicaGetsTheQuota(t *testing.T) {
	rdb := redistest.Start(t).Client()
	var engines []*admission.Engine
	for i := range 3 {
		e := replica(t, rdb, sharing.Batched, fmt.Sprintf("r%d", i), 3)
		engines = append(engines, e)
		if i > 0 { // the others know the tenant but see none of its load
			if _, err := e.Admit(context.Background(), request("t1")); err != nil {
				t.Fatal(err)
			}
		}
	}
	run(t, engines...)
	var sum atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() { defer wg.Done(); load(engines[0], "t1", stop, &sum, nil) }()
	}
	waitFor(time.Second)
	before, from := sum.Load(), time.Now()
	waitFor(2 * time.Second)
	got, elapsed := sum.Load()-before, time.Since(from)
	close(stop)
	wg.Wait()
	want := 0.9 * quotaRate * elapsed.Seconds()
	t.Logf("one replica admitted %d weighted tokens in %v after the first second (%.1f%% of the rate)", got, elapsed, 100*float64(got)/(quotaRate*elapsed.Seconds()))
	if float64(got) < want {
		t.Errorf("one replica admitted %d in %v, want ≥ 90%% of the quota = %.0f", got, elapsed, want)
	}
}

// Redis killed mid-load, then restarted: every request is answered,
// fail-open tiers keep admitting within their slice, fail-closed tiers are
// refused with STATE_UNAVAILABLE, and after the restart the store holds
// what was taken during the outage, charged once.
func TestRedisKilledMidLoad(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	var engines []*admission.Engine
	for i := range 3 {
		engines = append(engines, replica(t, rdb, sharing.Batched, fmt.Sprintf("r%d", i), 3))
	}
	run(t, engines...)

	phase := func(d time.Duration, each func(e *admission.Engine, tenant string, d admission.Decision)) (open, closed int64) {
		var sumOpen, sumClosed atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for _, e := range engines {
			for _, tc := range []struct {
				tenant string
				sum    *atomic.Int64
			}{{"t1", &sumOpen}, {"t2", &sumClosed}} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					load(e, tc.tenant, stop, tc.sum, func(d admission.Decision) {
						if each != nil {
							each(e, tc.tenant, d)
						}
					})
				}()
			}
		}
		waitFor(d)
		close(stop)
		wg.Wait()
		return sumOpen.Load(), sumClosed.Load()
	}
	phase(time.Second, nil)
	for _, e := range engines { // everything taken so far acknowledged
		if err := e.Reconcile(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	before, err := rdb.HGet(context.Background(), "{sluice/t/t1}/tok", "l").Float64()
	if err != nil {
		t.Fatal(err)
	}

	srv.Stop()
	outage := time.Now()
	var unavailable, closedAfterOpen atomic.Int64
	open, _ := phase(time.Second, func(e *admission.Engine, tenant string, d admission.Decision) {
		st, _ := e.SharedStatus()
		if tenant != "t2" {
			return
		}
		if d.Reason == admission.ReasonStateUnavailable {
			unavailable.Add(1)
		}
		if st.BreakerOpen && admitted(d) {
			closedAfterOpen.Add(1)
		}
	})
	outageLen := time.Since(outage)
	for i, e := range engines {
		if st, _ := e.SharedStatus(); !st.BreakerOpen {
			t.Errorf("replica %d: breaker closed after %v without Redis", i, outageLen)
		}
	}
	if unavailable.Load() == 0 {
		t.Error("the fail-closed tier was never refused with STATE_UNAVAILABLE")
	}
	if n := closedAfterOpen.Load(); n > 0 {
		t.Errorf("the fail-closed tier was admitted %d times while the breaker was open", n)
	}
	// Fail-open: still admitting, within the replicas' slices (together
	// the rate, plus what the slices held).
	if most := quotaBurst + int64(quotaRate*outageLen.Seconds()*1.05); open == 0 || open > most {
		t.Errorf("fail-open tier admitted %d during a %v outage, want > 0 and ≤ %d", open, outageLen, most)
	}

	srv.Restart()
	restarted := time.Now()
	eventually(t, 5*time.Second, func() bool {
		for _, e := range engines {
			if st, _ := e.SharedStatus(); st.BreakerOpen {
				return false
			}
		}
		return true
	}, "breakers close after Redis returns")
	// The restarted Redis knew nothing; the replicas' first reports carried
	// their levels, which refilled at their grants during the outage while
	// the takes went: the store is rebuilt from them, so its level is what
	// it held before, plus the outage's refill, less the outage's take
	// (charged once, against a refill not capped at the burst), plus
	// refill since the restart. (Slack: the replicas' grants refilled from
	// their last grant, a round or two before the outage, to their first
	// report after it.)
	level, err := rdb.HGet(context.Background(), "{sluice/t/t1}/tok", "l").Float64()
	if err != nil {
		t.Fatal(err)
	}
	since := time.Since(restarted).Seconds()
	truth := before + quotaRate*time.Since(outage).Seconds() - float64(open)
	slack := quotaRate * 0.3
	low, high := truth-quotaRate*since-slack, min(quotaBurst, truth+slack)
	t.Logf("level before %.0f, outage take %d; store level %.0f, want in [%.0f, %.0f]", before, open, level, low, high)
	if level < low || level > high {
		t.Errorf("after the restart the store level is %.0f, want about %.0f (the level before plus the outage's refill less its take): charged %s",
			level, truth, map[bool]string{true: "twice", false: "not at all"}[level < low])
	}
}

// Every key is under its owner's hash tag: both modes run through a
// Cluster client against a Redis in cluster mode, and every key written is
// checked with the CRC16 slot function: a tenant's or a domain's keys
// share one slot, and the owners spread over many.
func TestKeysFollowTheirOwner(t *testing.T) {
	if got := crc16("123456789"); got != 0x31C3 {
		t.Fatalf("CRC16 of the reference string = %#x, want 0x31c3", got)
	}
	srv := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr()}})
	t.Cleanup(func() { rdb.Close() })
	b := replica(t, rdb, sharing.Batched, "b", 2)
	s := replica(t, rdb, sharing.Strict, "s", 2)
	ctx := context.Background()
	for _, e := range []*admission.Engine{b, s} {
		for _, tenant := range []string{"t1", "s1"} {
			d, err := e.Admit(ctx, request(tenant))
			if err != nil {
				t.Fatal(err)
			}
			if !admitted(d) {
				t.Fatalf("%s refused: %v", tenant, d.Reason)
			}
			if _, err := e.Release(ctx, admission.Release{LeaseID: d.LeaseID, OutputTokens: 10}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := b.Reconcile(ctx); err != nil {
		t.Fatalf("batched reconcile on a cluster: %v", err)
	}
	if st, _ := s.SharedStatus(); st.Failures != 0 || st.Calls < 4 {
		t.Fatalf("strict mode on a cluster: %+v, want its commits and settles to have run", st)
	}
	var keys []string
	err := rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		k, err := c.Keys(ctx, "*").Result()
		keys = append(keys, k...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) < 10 {
		t.Fatalf("only %d keys written: %v", len(keys), keys)
	}
	owners := make(map[string]uint16) // the hash tag's text: its slot
	slots := make(map[uint16]bool)
	for _, k := range keys {
		i, j := indexByte(k, '{'), indexByte(k, '}')
		if i != 0 || j < 0 || !strings.HasPrefix(k[1:j], "sluice/t/") && !strings.HasPrefix(k[1:j], "sluice/d/") {
			t.Errorf("key %q is not under a tenant's or a domain's hash tag", k)
			continue
		}
		if want, ok := owners[k[1:j]]; ok && slot(k) != want {
			t.Errorf("key %q is in slot %d, its owner's other keys in %d", k, slot(k), want)
		}
		owners[k[1:j]] = slot(k)
		slots[slot(k)] = true
	}
	if len(owners) < 4 || len(slots) < len(owners)/2 {
		t.Errorf("%d owners in %d slots: want them spread", len(owners), len(slots))
	}
}

// slot is Redis Cluster's key slot: CRC16 of the hash tag (or the whole
// key) modulo 16384.
func slot(key string) uint16 {
	if i := indexByte(key, '{'); i >= 0 {
		if j := indexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return crc16(key) % 16384
}

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster uses.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// waitFor lets load run for d.
func waitFor(d time.Duration) { <-time.After(d) }

func eventually(t *testing.T, within time.Duration, cond func() bool, what string) {
	t.Helper()
	testwait.Until(t, within, what, cond)
}

// Strict mode with Redis killed and restarted: every request is answered;
// once the breaker opens, the fail-closed tier is refused with
// STATE_UNAVAILABLE and the fail-open tier admits from a 1/N slice of its
// burst, no more; after the restart a probe closes the breaker and the
// store confirms admissions again.
func TestStrictRedisKilled(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	e := replica(t, rdb, sharing.Strict, "r0", 2)
	run(t, e) // its prober closes the breaker once Redis answers
	ctx := context.Background()
	admit := func(tenant string) admission.Decision {
		t.Helper()
		d, err := e.Admit(ctx, request(tenant))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, tenant := range []string{"t1", "t2"} {
		if d := admit(tenant); !admitted(d) {
			t.Fatalf("%s before the outage: %v", tenant, d.Reason)
		}
	}
	srv.Stop()
	eventually(t, 5*time.Second, func() bool {
		admit("t2")
		st, _ := e.SharedStatus()
		return st.BreakerOpen
	}, "the breaker opens without Redis")
	if d := admit("t2"); d.Reason != admission.ReasonStateUnavailable {
		t.Errorf("fail-closed tier with the breaker open: %v %v", d.Outcome, d.Reason)
	}
	open := 0
	for range 200 {
		if admitted(admit("t1")) {
			open++
		}
	}
	// The slice: burst/N = 5000 tokens, 50 requests of 100 (one was
	// admitted before the outage; refill adds a few).
	if open == 0 || open > 60 {
		t.Errorf("fail-open tier admitted %d of 200 with the breaker open, want its 1/2 slice (about 50)", open)
	}
	srv.Restart()
	eventually(t, 5*time.Second, func() bool {
		return admitted(admit("t2"))
	}, "the fail-closed tier is admitted again after Redis returns")
	if st, _ := e.SharedStatus(); st.BreakerOpen || st.FallbackSeconds <= 0 {
		t.Errorf("after recovery: %+v, want the breaker closed and the fallback time counted", st)
	}
}
