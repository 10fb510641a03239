package redisstate_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/state/redisstate"
	"github.com/sluice-sched/sluice/internal/state/redistest"
	"github.com/sluice-sched/sluice/internal/testwait"
	"github.com/sluice-sched/sluice/topology"
)

// clusterTenants is how many tenants the cluster fleet keeps active
// (SLUICE_CLUSTER_TENANTS, default 2,000: what six redis-servers, two
// replicas and their loaders sustain at ten rounds a second on a 2-core
// machine; the performance page has the 10k figures).
func clusterTenants(t *testing.T) int {
	v := os.Getenv("SLUICE_CLUSTER_TENANTS")
	if v == "" {
		return 2000
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 2 {
		t.Fatalf("SLUICE_CLUSTER_TENANTS=%q: want a number of tenants, at least 2", v)
	}
	return n
}

// clusterFleet is two batched replicas on a real Redis Cluster of three
// masters and three replicas, with clusterTenants tenants (fail-open
// "o…" and fail-closed "c…", each under its quota but using enough of
// its share to be reported every round) kept active by a loader per
// replica.
type clusterFleet struct {
	c        *redistest.Cluster
	store    *redisstate.Store
	engines  []*admission.Engine
	mu       sync.Mutex
	tenants  int
	refused  map[string]int // tenant → refusals since the last take
	reasons  map[admission.Reason]int
	admitted int
}

func startClusterFleet(t *testing.T) *clusterFleet {
	t.Helper()
	c := redistest.StartShardedCluster(t, 3, 1)
	f := &clusterFleet{c: c, refused: make(map[string]int), reasons: make(map[admission.Reason]int)}
	var b strings.Builder
	b.WriteString(`
output_token_weight: 1
leases: {ttl: 1m, idempotency_ttl: 1m}
tiers:
  open: {rps: {rate: 1000, burst: 1000}, tokens: {rate: 3000, burst: 3000}, weight: 1}
  closed: {rps: {rate: 1000, burst: 1000}, tokens: {rate: 3000, burst: 3000}, weight: 1, fail_mode: closed}
tenants:
`)
	f.tenants = clusterTenants(t)
	for i := range f.tenants / 2 {
		fmt.Fprintf(&b, "  o%d: {tier: open}\n  c%d: {tier: closed}\n", i, i)
	}
	cfg, err := config.Parse("cluster.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	f.store = redisstate.New(c.Client(), "")
	for i := range 2 {
		e, err := admission.New(cfg, topology.Simulated(), admission.WithSharedState(f.store, sharing.Options{
			Mode: sharing.Batched, Replica: fmt.Sprintf("r%d", i), Replicas: 2,
			// On a loaded 2-core machine a call can take past the default
			// 50 ms.
			Timeout: 150 * time.Millisecond, Failures: 3, Cooldown: 200 * time.Millisecond,
		}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		f.engines = append(f.engines, e)
	}
	run(t, f.engines...)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i, e := range f.engines {
		wg.Go(func() { f.load(ctx, e, i) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return f
}

// load admits one request for every tenant in turn, over and over (each
// tenant about once every half second at 2,000: active, under its quota).
func (f *clusterFleet) load(ctx context.Context, e *admission.Engine, offset int) {
	// Paced, to leave the cores to Redis and the rounds.
	pace := rate.NewLimiter(4000, 50)
	for i := offset; pace.Wait(ctx) == nil; i++ {
		name := fmt.Sprintf("o%d", i%(f.tenants/2))
		if i%2 == 1 {
			name = "c" + name[1:]
		}
		d, err := e.Admit(ctx, request(name))
		if err != nil {
			continue // ctx ended
		}
		f.mu.Lock()
		if admitted(d) {
			f.admitted++
		} else {
			f.refused[name]++
			f.reasons[d.Reason]++
		}
		f.mu.Unlock()
		if admitted(d) {
			_, _ = e.Release(ctx, admission.Release{LeaseID: d.LeaseID, PromptTokens: 50, OutputTokens: 50})
		}
	}
}

// take returns and clears the refusals and admissions so far.
func (f *clusterFleet) take() (map[string]int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, a := f.refused, f.admitted
	f.refused, f.admitted = make(map[string]int), 0
	return r, a
}

// rounds waits until every replica has reconciled n more rounds with
// every shard (3n store calls each).
func (f *clusterFleet) rounds(t *testing.T, n int) {
	t.Helper()
	want := f.calls() + uint64(3*n*len(f.engines))
	testwait.Until(t, time.Duration(n)*time.Second, fmt.Sprintf("%d rounds", n), func() bool { return f.calls() >= want })
}

// calls sums the replicas' store calls.
func (f *clusterFleet) calls() (n uint64) {
	for _, e := range f.engines {
		st, _ := e.SharedStatus()
		n += st.Calls
	}
	return n
}

// On a real three-master cluster under load from two replicas with 2,000
// active tenants (clusterTenants): the keys and the commands spread over the masters (the
// busiest within 1.25 of the mean), and the replicas' rounds stay one
// call per master per interval. Slots migrate under load: nobody is
// refused. Then a master is killed (its replica promoted): the tenants on
// the other masters are refused nothing, those on it fall back to their
// fail modes, and everything is served again after the failover.
func TestClusterFleet(t *testing.T) {
	f := startClusterFleet(t)
	testwait.Until(t, 30*time.Second, "every tenant's keys in Redis", func() bool {
		var n int64
		for _, k := range f.c.KeysPerMaster() {
			n += k
		}
		return 10*n >= 9*int64(f.tenants)
	})
	f.c.ResetStats()
	f.take()
	calls0, t0 := f.calls(), time.Now()
	f.rounds(t, 50)
	calls, secs := f.calls()-calls0, time.Since(t0).Seconds()
	keys, cmds := f.c.KeysPerMaster(), f.c.CommandsPerMaster()
	refused, admittedN := f.take()
	rounds := float64(calls) / 3 / float64(len(f.engines)) / secs
	t.Logf("keys per master %v; commands per master %v; %.1f rounds per replica per second; %d admitted, %d tenants refused", keys, cmds, rounds, admittedN, len(refused))
	for what, per := range map[string]map[string]int64{"keys": keys, "commands": cmds} {
		if r := busiestOverMean(per); r > 1.25 {
			t.Errorf("%s per master %v: busiest %.2f × the mean, want ≤ 1.25", what, per, r)
		}
	}
	if len(refused) != 0 {
		t.Errorf("%d tenants refused under their quotas before any fault: %v", len(refused), sample(refused))
	}

	// A live migration of 100 slots between the two masters that stayed.
	masters := f.c.Masters()
	from, to := masters[0], masters[1]
	failures := func() (n uint64) {
		for _, e := range f.engines {
			st, _ := e.SharedStatus()
			n += st.Failures
		}
		return n
	}
	before := failures()
	if err := f.c.Reshard(from, to, 100); err != nil {
		t.Fatal(err)
	}
	f.rounds(t, 10)
	refused, _ = f.take()
	t.Logf("resharded 100 slots %s → %s: %d failed store calls, %d tenants refused", from, to, failures()-before, len(refused))
	if len(refused) != 0 {
		t.Errorf("%d tenants refused during the migration: %v", len(refused), sample(refused))
	}
	for _, e := range f.engines {
		if st, _ := e.SharedStatus(); st.BreakerOpen {
			t.Errorf("a breaker is open after the migration: %+v", st.Shards)
		}
	}

	// Kill the master of the first fail-closed tenant's slots.
	victim := f.c.MasterOf(f.store.Key("t/c0/rps"))
	onVictim := func(tenant string) bool { return f.c.MasterOf(f.store.Key("t/"+tenant+"/rps")) == victim }
	f.c.Kill(victim)
	killed := time.Now()
	promoted := f.c.WaitFailover(victim, 15*time.Second)
	failover := time.Since(killed)
	// The replicas find the new master.
	testwait.Until(t, 10*time.Second, "every breaker closed after the failover", func() bool {
		for _, e := range f.engines {
			if st, _ := e.SharedStatus(); st.BreakerOpen {
				return false
			}
		}
		return true
	})
	f.rounds(t, 10)
	refused, _ = f.take()
	var others []string
	for name := range refused {
		if !onVictim(name) && f.c.MasterOf(f.store.Key("t/"+name+"/rps")) != promoted {
			others = append(others, name)
		}
	}
	t.Logf("refusals by reason %v", f.reasons)
	t.Logf("killed %s, %s promoted after %v; %d tenants refused, %d of them on other masters", victim, promoted, failover.Round(time.Millisecond), len(refused), len(others))
	if len(others) != 0 {
		t.Errorf("tenants on the masters that stayed up were refused during the failover: %v", others[:min(len(others), 10)])
	}
	f.rounds(t, 20)
	if refused, _ := f.take(); len(refused) != 0 {
		t.Errorf("%d tenants still refused 20 rounds after the failover: %v", len(refused), sample(refused))
	}
}

func busiestOverMean(per map[string]int64) float64 {
	var sum, most int64
	for _, v := range per {
		sum += v
		most = max(most, v)
	}
	if sum == 0 {
		return 0
	}
	return float64(most) * float64(len(per)) / float64(sum)
}

func sample(m map[string]int) map[string]int {
	out := make(map[string]int)
	for k, v := range m {
		if len(out) == 10 {
			break
		}
		out[k] = v
	}
	return out
}
