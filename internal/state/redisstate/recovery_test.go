package redisstate_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/state/redistest"
)

// The recovery promise (docs/shared-state.md): after a store outage of any length, with the
// store's data kept or lost, the replicas resume admitting at their share
// within two reconcile intervals of the store's return, and a tenant
// driven above its quota is admitted over [outage start, return + 10 s]
// within [99% of the quota, quota + (N−1)·R·W], and over the outage's
// first second within quota + (N−1)·R·W as well (the admissions in flight
// when the store goes away, decided before the breaker opened, count
// against the slices). Each case runs two replicas against a real
// redis-server for 1 s, takes the store away for outageLen, and runs on
// for 10 s after its return. The load is open, as a router's is: requests
// arrive at twice the rate whatever the answers, each on its own
// goroutine, so that many are in flight when the store goes away, and at
// random times (see openLoad).
//
// The tenant (rc) refills 20000 tokens/s with a burst of one second's:
// the refusal window this guards against lasts about the outage less
// burst/rate (2 s here), and the burst lets a test process starved for
// well under a second on a loaded machine catch up, as a real bucket does.

const (
	outageLen = 3 * time.Second // short enough that kept keys have not expired (their TTL is 4 s here)
	afterLen  = 10 * time.Second
	interval  = 100 * time.Millisecond // W, the default reconcile interval
	recRate   = 20000
	recBurst  = 20000
	// arrivalEvery is each replica's mean time between arrivals: together
	// the replicas are offered twice the rate.
	arrivalEvery = time.Second * reqTokens / recRate
)

// outage takes the store away at the call and returns it when the
// returned function is called.
type outage func(t *testing.T, srv *redistest.Server) (back func())

// The breaker closes once a probe reaches the store, and the client must
// connect first: after a restart go-redis, whose dials failed PoolSize
// times in a row during the outage, dials again only once a second
// (redial). A paused server keeps the connections.
var outages = []struct {
	name   string
	take   outage
	redial time.Duration
}{
	{"pause", func(t *testing.T, srv *redistest.Server) func() {
		// CLIENT PAUSE ALL: Redis keeps everything and answers nothing.
		c := srv.Client()
		if err := c.Do(context.Background(), "CLIENT", "PAUSE", outageLen.Milliseconds(), "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		return func() {}
	}, 0},
	{"restart-kept", func(t *testing.T, srv *redistest.Server) func() {
		// Saved, killed, restarted from the dump: the data at the kill.
		if err := srv.Client().Save(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		srv.Stop()
		return srv.Restart
	}, time.Second},
	{"restart-lost", func(t *testing.T, srv *redistest.Server) func() {
		srv.Stop() // no persistence: it comes back empty
		return srv.Restart
	}, time.Second},
}

func TestOutageRecovery(t *testing.T) {
	for _, mode := range []sharing.Mode{sharing.Batched, sharing.Strict} {
		for _, o := range outages {
			t.Run(mode.String()+"/"+o.name, func(t *testing.T) { outageRecovery(t, mode, o.take, o.redial) })
		}
	}
}

// admissions records when each replica admitted.
type admissions struct {
	mu sync.Mutex
	at [][]time.Time // per replica
}

func (a *admissions) add(r int, at time.Time) {
	a.mu.Lock()
	a.at[r] = append(a.at[r], at)
	a.mu.Unlock()
}

// count returns the admissions of all replicas in [from, to).
func (a *admissions) count(from, to time.Time) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for _, ts := range a.at {
		for _, at := range ts {
			if !at.Before(from) && at.Before(to) {
				n++
			}
		}
	}
	return n
}

// longestGap returns, per replica, the longest time without an admission
// in [from, to].
func (a *admissions) longestGap(from, to time.Time) []time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]time.Duration, len(a.at))
	for r, ts := range a.at {
		ts = append([]time.Time(nil), ts...)
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		last := from
		for _, at := range ts {
			if at.Before(from) || at.After(to) {
				continue
			}
			out[r] = max(out[r], at.Sub(last))
			last = at
		}
		out[r] = max(out[r], to.Sub(last))
	}
	return out
}

// closings records when each replica's breaker closed.
type closings struct {
	mu sync.Mutex
	at [][]time.Time // per replica
}

// first returns, per replica, the first close at or after from (zero if
// none).
func (c *closings) first(from time.Time) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]time.Time, len(c.at))
	for r, ts := range c.at {
		for _, at := range ts {
			if !at.Before(from) {
				out[r] = at
				break
			}
		}
	}
	return out
}

func outageRecovery(t *testing.T, mode sharing.Mode, take outage, redial time.Duration) {
	const n = 2
	srv := redistest.Start(t)
	rdb := srv.Client()
	closed := &closings{at: make([][]time.Time, n)}
	var engines []*admission.Engine
	for i := range n {
		// Only noted: OnBreaker runs under the engine's lock.
		note := func(o *sharing.Options) {
			o.OnBreaker = func(open bool) {
				if !open {
					closed.mu.Lock()
					closed.at[i] = append(closed.at[i], time.Now())
					closed.mu.Unlock()
				}
			}
		}
		engines = append(engines, replica(t, rdb, mode, fmt.Sprintf("r%d", i), n, note))
	}
	run(t, engines...)
	rec := &admissions{at: make([][]time.Time, n)}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var unexpected atomic.Int64
	start := time.Now()
	for i, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			openLoad(e, "rc", stop, &wg, func(d admission.Decision) {
				if admitted(d) {
					rec.add(i, time.Now())
					if _, err := e.Release(context.Background(), admission.Release{LeaseID: d.LeaseID, PromptTokens: 50, OutputTokens: 50}); err != nil {
						unexpected.Add(1)
					}
				} else if d.Reason != admission.ReasonQuotaExceeded {
					unexpected.Add(1)
				}
			})
		}()
	}
	waitFor(time.Second)
	outageAt := time.Now()
	back := take(t, srv)
	waitFor(outageLen)
	back()
	returned := time.Now()
	waitFor(afterLen)
	end := time.Now()
	close(stop)
	wg.Wait()

	// The whole run: the bucket starts full.
	bound := int64((n - 1) * recRate * interval.Seconds()) // (N−1)·R·W
	total := reqTokens * rec.count(start, end)
	quota := recBurst + int64(recRate*end.Sub(start).Seconds())
	// The window [outage start, return + 10 s]: the quota is what the
	// tenant was owed at its start (the run's quota so far less what it
	// was admitted, about 0 for a tenant held at its limit) plus the rate.
	before := reqTokens * rec.count(start, outageAt)
	owed := max(recBurst+int64(recRate*outageAt.Sub(start).Seconds())-before, 0)
	window := reqTokens * rec.count(outageAt, end)
	wquota := owed + int64(recRate*end.Sub(outageAt).Seconds())
	// The outage's first second: what was owed at its start plus a
	// second's rate.
	first := reqTokens * rec.count(outageAt, outageAt.Add(time.Second))
	fquota := owed + recRate
	gaps := rec.longestGap(returned, end)
	closedAt := closed.first(outageAt)
	resumed := make([]time.Duration, n) // each breaker's close after the return
	for r, at := range closedAt {
		resumed[r] = at.Sub(returned).Round(time.Millisecond)
	}
	t.Logf("%v outage of %v: run admitted %d of quota %d (%.2f%%); window admitted %d of quota %d (%.2f%%); first second admitted %d of quota %d; bound +%d; breakers closed after the return %v; longest gap per replica after the return %v",
		mode, returned.Sub(outageAt).Round(time.Millisecond), total, quota, 100*float64(total)/float64(quota),
		window, wquota, 100*float64(window)/float64(wquota), first, fquota, bound, resumed, gaps)
	if first > fquota+bound {
		t.Errorf("the outage's first second admitted %d > quota %d + (N−1)·R·W = %d", first, fquota, fquota+bound)
	}
	if n := unexpected.Load(); n > 0 {
		t.Errorf("%d answers were neither admissions nor QUOTA_EXCEEDED, or releases failed", n)
	}
	const least = 0.99
	for what, c := range map[string][2]int64{"the run": {total, quota}, "the window": {window, wquota}} {
		got, q := c[0], c[1]
		if got > q+bound {
			t.Errorf("%s admitted %d > quota %d + (N−1)·R·W = %d", what, got, q, q+bound)
		}
		if float64(got) < least*float64(q) {
			t.Errorf("%s admitted %d < %.0f%% of its quota %d", what, got, 100*least, q)
		}
	}
	// Resumed within two intervals: every breaker closed, and no replica
	// went longer without an admission, after the return (plus slack for
	// a loaded machine: the refusal window this guards against lasts about
	// 2 s here).
	const within = 2*interval + 500*time.Millisecond
	for r, at := range closedAt {
		if at.IsZero() {
			t.Errorf("replica %d's breaker did not close after the outage", r)
		} else if late := at.Sub(returned); late > redial+within {
			t.Errorf("replica %d's breaker closed %v after the store returned, want ≤ 2 intervals (after a redial of %v)", r, late, redial)
		}
	}
	for r, g := range gaps {
		if g > within {
			t.Errorf("replica %d went %v without an admission after the store returned, want ≤ 2 intervals", r, g)
		}
	}
}

// openLoad offers e requests for tenant, one every arrivalEvery on
// average, until stop closes, each on its own goroutine (counted in wg),
// whatever the answers; each answer goes to each. The arrivals are a
// Poisson process, as independent clients' are, not a ticker per replica:
// with the tenant held at its limit the store admits whichever request
// reaches it first after each refill, and lock-step arrivals at the
// refill rate hand every refill to the replica whose ticks fall just
// ahead of the other's, refusing the other for as long as that lasts
// (most of a second, with no outage at all) while the store and both
// breakers are as they should be.
func openLoad(e *admission.Engine, tenant string, stop <-chan struct{}, wg *sync.WaitGroup, each func(admission.Decision)) {
	// Each arrival is due a random time after the last one was due, not
	// after the timer fired (late under load, which would lower the rate);
	// arrivals a stalled process missed are dropped, as a ticker drops them.
	due := time.Now()
	next := time.NewTimer(0)
	defer next.Stop()
	for {
		if now := time.Now(); now.Sub(due) > arrivalEvery {
			due = now
		}
		due = due.Add(time.Duration(rand.ExpFloat64() * float64(arrivalEvery)))
		next.Reset(time.Until(due))
		select {
		case <-stop:
			return
		case <-next.C:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := e.Admit(context.Background(), request(tenant))
			if err != nil {
				panic(err)
			}
			each(d)
		}()
	}
}
