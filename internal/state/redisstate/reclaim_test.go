package redisstate_test

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/client"
	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/controlplane"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/internal/state/redistest"
	"github.com/sluice-sched/sluice/topology"
)

// A batched replica that dies holding a large part of a domain's KV (its
// leases, and its weight in the free part) gives it back to the others
// once it is known gone, not at the lease TTL (a minute here; ten by
// default): SilentHoldRounds intervals after its last report where there
// is no membership, or when its member lease expires where there is. Back
// again, its report replaces its holding: counted once.
func TestDeadReplicaCapacityReclaimed(t *testing.T) {
	t.Run("reports stop", func(t *testing.T) {
		f := startReclaimFleet(t, nil)
		f.load(t)
		killed := f.kill(t)
		hold := sharing.SilentHoldRounds * interval
		back := f.reclaimed(t, killed, hold+time.Second)
		t.Logf("a held %d of %d bytes (%.0f%%) on %s; b's limit was %d; whole %.2fs after the kill (hold %v)",
			f.held, f.full, 100*float64(f.held)/float64(f.full), f.dom, f.before, back.Sub(killed).Seconds(), hold)
		f.comesBack(t)
	})
	t.Run("member lease expires", func(t *testing.T) {
		const memberTTL = 5 * time.Second
		etcd := etcdtest.Start(t)
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		var ctl *controlplane.Controller
		f := startReclaimFleet(t, func() time.Time { return ctl.MemberExpiry() }, func(a *admission.Engine) {
			ctl, err = controlplane.New(controlplane.Options{Client: cli, Engine: a, Self: client.Member{ID: "a", Addr: "127.0.0.1:1"},
				LeaseTTL: memberTTL, ProbeEvery: 50 * time.Millisecond, RetryEvery: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { ctl.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		watcher := etcd.Client(t)
		key := controlplane.NormalizePrefix("") + "members/a"
		eventually(t, 10*time.Second, func() bool {
			r, err := watcher.Get(context.Background(), key, clientv3.WithCountOnly())
			return err == nil && r.Count == 1 && !ctl.MemberExpiry().IsZero()
		}, "a registers")
		f.load(t)
		// The crash: its engine stops reporting and its etcd client goes,
		// the member lease unrevoked, left to expire.
		killed := f.kill(t)
		_ = cli.Close()
		expiry := ctl.MemberExpiry()
		// The member lease outlives the kill by at least 2/3 of its TTL
		// (keepalives every third of it): a's capacity stays its own, which
		// the floor of SilentHoldRounds intervals alone would have given back.
		waitFor(time.Until(killed.Add(2 * time.Second)))
		if _, limit := kvOn(f.b, f.dom); limit > f.full-f.held {
			t.Errorf("b's limit %d two seconds after the kill, with a's member lease (until %.1fs after it) still live: want a's holding %d still counted (at most %d)",
				limit, expiry.Sub(killed).Seconds(), f.held, f.full-f.held)
		}
		// When etcd deletes a's member key: a watch from the revision read
		// now sees the deletion as it happens.
		gone := make(chan time.Time, 1)
		r, err := watcher.Get(context.Background(), key, clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if r.Count == 0 {
			gone <- time.Now()
		} else {
			wctx, wcancel := context.WithCancel(context.Background())
			t.Cleanup(wcancel)
			wch := watcher.Watch(wctx, key, clientv3.WithRev(r.Header.Revision+1))
			go func() {
				for wr := range wch {
					for _, ev := range wr.Events {
						if ev.Type == clientv3.EventTypeDelete {
							gone <- time.Now()
							return
						}
					}
				}
			}()
		}
		back := f.reclaimed(t, killed, memberTTL+2*time.Second)
		left := <-gone
		t.Logf("a held %d of %d bytes (%.0f%%) on %s; member lease until %.2fs after the kill, its key gone at %.2fs; b whole at %.2fs",
			f.held, f.full, 100*float64(f.held)/float64(f.full), f.dom, expiry.Sub(killed).Seconds(), left.Sub(killed).Seconds(), back.Sub(killed).Seconds())
		// Within a few reconcile intervals of the member lease's expiry,
		// when the store lets a's holding go (etcd deletes the key up to
		// half a second later, which b does not wait for): b reports the
		// domain, which it does not use, every SilentHoldRounds/2
		// intervals, on a round's tick, so its limit follows within that
		// and a round, plus two intervals of slack for the call on a
		// loaded machine.
		if late, most := back.Sub(expiry), (sharing.SilentHoldRounds/2+3)*interval; late > most {
			t.Errorf("b whole %v after a's member lease expired, want within %v (a few reconcile intervals)", late, most)
		}
		f.comesBack(t)
	})
}

// reclaimFleet is two batched replicas on one redis-server: a, which
// fills a domain's KV and is killed, and b, which survives.
type reclaimFleet struct {
	srv    *redistest.Server
	a, b   *admission.Engine
	stopA  func()
	dom    string
	full   int64 // the domain's whole KV limit
	held   int64 // what a holds there
	before int64 // b's limit there before the kill
}

func startReclaimFleet(t *testing.T, memberExpiry func() time.Time, withA ...func(*admission.Engine)) *reclaimFleet {
	srv := redistest.Start(t)
	rdb := srv.Client()
	f := &reclaimFleet{srv: srv}
	f.a = replica(t, rdb, sharing.Batched, "a", 2, func(o *sharing.Options) { o.MemberExpiry = memberExpiry })
	f.b = replica(t, rdb, sharing.Batched, "b", 2)
	for _, fn := range withA {
		fn(f.a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { f.a.Run(ctx) })
	f.stopA = func() { cancel(); wg.Wait() }
	t.Cleanup(f.stopA)
	run(t, f.b)
	return f
}

// load has a admit large requests until it holds 40% of a domain's KV.
func (f *reclaimFleet) load(t *testing.T) {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	whole, err := admission.New(cfg, topology.Simulated())
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	full := map[string]int64{}
	for _, d := range whole.Domains() {
		full[d.ID] = d.KVLimit
	}
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, err := f.a.Admit(ctx, admission.Request{Tenant: "b1", Model: "small", PromptTokens: 8000, MaxOutputTokens: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if admitted(d) {
			f.dom = d.Domain
			if inUse, _ := kvOn(f.a, f.dom); 10*inUse >= 4*full[f.dom] {
				f.held, f.full = inUse, full[f.dom]
				break
			}
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("a holds only %d of %s's %d bytes of KV after 20 s (last answer %v %v)", f.held, f.dom, full[f.dom], d.Outcome, d.Reason)
		}
		_ = f.a.Reconcile(ctx) // refused for now: the next grant brings more
	}
	// b sees a's holding counted before the kill.
	eventually(t, 10*time.Second, func() bool {
		_, limit := kvOn(f.b, f.dom)
		f.before = limit
		return limit > 0 && limit <= f.full-f.held
	}, "b's limit leaves out a's holding")
}

// kill stops a's reports (its leases stay held, as a crashed process's
// leases stay on the GPUs) and returns when.
func (f *reclaimFleet) kill(t *testing.T) time.Time {
	t.Helper()
	f.stopA()
	return time.Now()
}

// reclaimed waits until b's limit on the domain is the whole domain and
// returns when; it fails the test past within of the kill.
func (f *reclaimFleet) reclaimed(t *testing.T, killed time.Time, within time.Duration) time.Time {
	t.Helper()
	var at time.Time
	eventually(t, time.Until(killed.Add(within)), func() bool {
		_, limit := kvOn(f.b, f.dom)
		at = time.Now()
		return 1000*limit >= 999*f.full
	}, "b's limit is the whole domain again")
	return at
}

// comesBack has a report again (the same incarnation, its leases still
// held): its holding counts once, beside b's limit. b, which does not use
// the domain, reports it every half hold: its limit follows within that.
func (f *reclaimFleet) comesBack(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for range 2 {
		if err := f.a.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, sharing.SilentHoldRounds*interval, func() bool {
		_, lb := kvOn(f.b, f.dom)
		return lb <= f.full-f.held
	}, "b's limit leaves out a's holding again")
	if err := f.a.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	_, la := kvOn(f.a, f.dom)
	_, lb := kvOn(f.b, f.dom)
	h, err := f.srv.Client().HGet(ctx, "{sluice/d/"+f.dom+"}/kv", "h:a").Int64()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("back: a's limit %d, b's %d, sum %d of %d; the store holds %d for a", la, lb, la+lb, f.full, h)
	if h != f.held {
		t.Errorf("the store holds %d for a after its return, want its report's %d", h, f.held)
	}
	if sum := la + lb; 1000*sum < 999*f.full || sum > f.full {
		t.Errorf("a's limit %d + b's %d = %d, want the whole domain %d: a's holding counted once", la, lb, sum, f.full)
	}
	if lb > f.full-f.held {
		t.Errorf("b's limit %d after a's return, want at most %d: a's holding counted again", lb, f.full-f.held)
	}
}

// kvOn returns e's KV in use and limit on domain id.
func kvOn(e *admission.Engine, id string) (inUse, limit int64) {
	for _, d := range e.Domains() {
		if d.ID == id {
			return d.KVInUse, d.KVLimit
		}
	}
	return 0, 0
}
