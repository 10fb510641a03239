package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/client"
	"github.com/sluice-sched/sluice/admission/client/etcdmembers"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/topology"
)

// domainInfo returns the engine's view of one domain.
func domainInfo(eng *admission.Engine, id string) (admission.DomainInfo, bool) {
	for _, d := range eng.Domains() {
		if d.ID == id {
			return d, true
		}
	}
	return admission.DomainInfo{}, false
}

// Drain under load: once every replica's watch has delivered the mark, no
// Admit answer on any replica names the domain (every answer is checked,
// on every replica, while load runs throughout), the leases held there
// complete, and ListDomains' view says who drained it and why. Deleting the
// mark lets the domain take placements again.
func TestDrainUnderLoad(t *testing.T) {
	etcd := etcdtest.Start(t)
	var reps []*replica
	for range 3 {
		reps = append(reps, startReplica(t, newClient(t, etcd), Options{}))
	}
	for _, r := range reps {
		eventually(t, "synced", r.ctl.Synced)
	}
	// hooli's large requests go first to the same domain on every replica
	// (rendezvous hashing has no per-process seed); hold a lease there on
	// each. hooli stays out of the load below, so that its quota is intact
	// when the domain is undrained.
	var held []uint64
	var dom string
	for _, r := range reps {
		d := admit(t, r.eng, "hooli", "large")
		if d.Outcome != admission.Admitted || (dom != "" && d.Domain != dom) {
			t.Fatalf("hooli on replica: %+v (others went to %s)", d, dom)
		}
		dom = d.Domain
		held = append(held, d.LeaseID)
	}

	var fenced atomic.Bool // every replica has applied the mark
	var stopLoad atomic.Bool
	var afterFence [3]atomic.Int64
	var onDomBefore atomic.Int64 // load placed on dom before the mark
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	tenants := []string{"acme", "globex", "initech"}
	models := []string{"large", "medium", "small"}
	for i, r := range reps {
		for g := range 2 {
			wg.Go(func() {
				for n := 0; !stopLoad.Load(); n++ {
					after := fenced.Load()
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					d, err := r.eng.Admit(ctx, admission.Request{
						Tenant: tenants[(n+g)%3], Model: models[n%3], PromptTokens: 200, MaxOutputTokens: 20,
						Deadline: time.Now().Add(200 * time.Millisecond),
					})
					cancel()
					if err != nil {
						errs <- fmt.Errorf("replica %d: Admit: %w", i, err)
						return
					}
					if !after && d.Domain == dom {
						onDomBefore.Add(1)
					}
					if after && d.Domain == dom {
						errs <- fmt.Errorf("replica %d placed %s/%s on %s after the drain reached every replica", i, d.Trace.Tenant, d.Model, dom)
						return
					}
					if after {
						afterFence[i].Add(1)
					}
					if d.LeaseID != 0 {
						if _, err := r.eng.Release(context.Background(), admission.Release{LeaseID: d.LeaseID, OutputTokens: 20}); err != nil {
							errs <- fmt.Errorf("replica %d: Release: %w", i, err)
							return
						}
					}
				}
			})
		}
	}
	t.Cleanup(func() { stopLoad.Store(true); wg.Wait() })

	// The load does land on dom before the drain, so that "no answer names
	// dom" below is a change, not how the load always was.
	eventually(t, "load placed on the domain before the drain", func() bool { return onDomBefore.Load() > 0 })
	rev, err := PutDrain(ctxT(t), etcd.Client(t), DefaultPrefix, DrainMark{Domain: dom, Reason: "rack swap", By: "alice", At: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the mark applied on every replica", func() bool {
		for _, r := range reps {
			if r.ctl.Revision() < rev {
				return false
			}
		}
		return true
	})
	fenced.Store(true)
	eventually(t, "load answered on every replica after the drain", func() bool {
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		for i := range afterFence {
			if afterFence[i].Load() < 200 {
				return false
			}
		}
		return true
	})
	stopLoad.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	for i, r := range reps {
		info, _ := domainInfo(r.eng, dom)
		if !info.Draining || !strings.Contains(info.DrainReason, "alice") || !strings.Contains(info.DrainReason, "rack swap") {
			t.Fatalf("replica %d: %s: %+v", i, dom, info)
		}
		if info.InFlight != 1 {
			t.Fatalf("replica %d: %d in flight on %s, want the held lease", i, info.InFlight, dom)
		}
		// The lease held there runs to completion.
		if _, err := r.eng.Release(context.Background(), admission.Release{LeaseID: held[i], OutputTokens: 10}); err != nil {
			t.Fatalf("replica %d: release on the drained domain: %v", i, err)
		}
		if info, _ := domainInfo(r.eng, dom); info.InFlight != 0 {
			t.Fatalf("replica %d: %d in flight after release", i, info.InFlight)
		}
	}

	marks, err := ListDrains(ctxT(t), etcd.Client(t), DefaultPrefix)
	if err != nil || len(marks) != 1 || marks[0].Domain != dom || marks[0].By != "alice" {
		t.Fatalf("ListDrains = %+v, %v", marks, err)
	}
	if ok, err := DeleteDrain(ctxT(t), etcd.Client(t), DefaultPrefix, dom); !ok || err != nil {
		t.Fatalf("DeleteDrain = %v, %v", ok, err)
	}
	for i, r := range reps {
		eventually(t, fmt.Sprintf("replica %d undrained", i), func() bool {
			info, _ := domainInfo(r.eng, dom)
			return !info.Draining
		})
		// It takes placements again (once its warm-up has ramped it up,
		// where placement weighs it by its load): of the keys that
		// placement spreads over the domains, some land on it.
		landed := false
		eventually(t, fmt.Sprintf("replica %d placing on %s again", i, dom), func() bool {
			for n := 0; n < len(tenants)*len(models) && !landed; n++ {
				d := admit(t, r.eng, tenants[n%3], models[n/3])
				landed = d.Domain == dom
				if d.LeaseID != 0 {
					if _, err := r.eng.Release(context.Background(), admission.Release{LeaseID: d.LeaseID, OutputTokens: 10}); err != nil {
						t.Fatalf("replica %d: release: %v", i, err)
					}
				}
			}
			return landed
		})
	}
}

// Membership: three replicas register; one leaves gracefully (its lease is
// revoked) and one dies (its lease expires); the others' count goes
// 3 → 2 → 1 as each happens, and their member sets with it.
func TestMembershipCount(t *testing.T) {
	etcd := etcdtest.Start(t)
	start := func(id string, cli *clientv3.Client) *replica {
		return startReplica(t, cli, Options{Self: client.Member{ID: id, Addr: id + ":7070"}, LeaseTTL: time.Second})
	}
	a := start("a", etcd.Client(t))
	b := start("b", etcd.Client(t))
	cCli := etcd.Client(t)
	c := start("c", cCli)
	all := []*replica{a, b, c}
	eventually(t, "three replicas counted everywhere", func() bool {
		for _, r := range all {
			if r.lastCount() != 3 {
				return false
			}
		}
		return true
	})
	leaseB := b.ctl.LeaseID()
	if leaseB == 0 {
		t.Fatal("b holds no lease")
	}
	b.stop() // graceful: revokes its lease
	ttl, err := etcd.Client(t).TimeToLive(ctxT(t), leaseB)
	if err != nil || ttl.TTL != -1 {
		t.Fatalf("b's lease after b stopped: %+v, %v (want revoked)", ttl, err)
	}
	eventually(t, "two replicas counted", func() bool { return a.lastCount() == 2 && c.lastCount() == 2 })
	for _, r := range []*replica{a, c} {
		if ids := r.members(); !slices.Equal(ids, []string{"a", "c"}) {
			t.Errorf("members after b left: %v, want [a c]", ids)
		}
	}
	if a.ctl.Replicas() != 2 {
		t.Fatalf("Replicas() = %d", a.ctl.Replicas())
	}
	// c dies: its connection to etcd is gone, its lease expires.
	if err := cCli.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "c's lease expired", func() bool { return a.lastCount() == 1 })
	if ids := a.members(); !slices.Equal(ids, []string{"a"}) {
		t.Errorf("members after c's lease expired: %v, want [a]", ids)
	}
	a.mu.Lock()
	counts := slices.Clone(a.counts)
	a.mu.Unlock()
	if !slices.Equal(counts, []int{1, 2, 3, 2, 1}) && !slices.Equal(counts, []int{1, 3, 2, 1}) && !slices.Equal(counts, []int{2, 3, 2, 1}) && !slices.Equal(counts, []int{3, 2, 1}) {
		// How quickly a's first read saw b and c varies; the tail does not.
		t.Fatalf("a counted %v; want it to end 3, 2, 1", counts)
	}
}

// etcd gone for longer than the member lease: the replica's client gives
// the lease up, and the replica registers again once etcd is back. Its
// member key moves to the new lease before the old one is revoked, so the
// key is never deleted and a router watching the members never loses it.
func TestRegistrationSurvivesAnOutageWithoutAGap(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := newClient(t, etcd)
	loss := watchLeaseLoss(cli)
	r := startReplica(t, cli, Options{Self: client.Member{ID: "a", Addr: "a:7070"}, LeaseTTL: time.Second,
		RetryEvery: 50 * time.Millisecond})
	eventually(t, "registered", func() bool { return r.ctl.LeaseID() != 0 && !r.ctl.MemberExpiry().IsZero() })
	first := r.ctl.LeaseID()
	key := etcdmembers.Key(DefaultPrefix, "a")
	got, err := etcd.Client(t).Get(ctxT(t), key)
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("member key %s: %v, %v", key, got, err)
	}
	from := got.Header.Revision

	etcd.Stop()
	// The client gives the lease up a TTL after its last renewal; etcd
	// comes back at once, while a replica that revoked a lost lease at
	// once would still be trying to.
	loss.given(t)
	etcd.Restart()
	eventually(t, "registered again", func() bool { id := r.ctl.LeaseID(); return id != 0 && id != first })

	cli = etcd.Client(t)
	ttl, err := cli.TimeToLive(ctxT(t), first)
	if err != nil || ttl.TTL != -1 {
		t.Errorf("the lost lease after registering again: %+v, %v (want revoked)", ttl, err)
	}
	rewrittenWithoutDelete(t, cli, key, from)
}

// MemberExpiry is when the member lease expires unless renewed: about a
// TTL ahead of every keepalive, moving on with them; where etcd says the
// lease ends (its remaining TTL) within the keepalive period; zero once
// the replica has left.
func TestMemberExpiryFollowsTheKeepalives(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	const ttl = 3 * time.Second
	r := startReplica(t, cli, Options{Self: client.Member{ID: "a", Addr: "a:7070"}, LeaseTTL: ttl})
	eventually(t, "registered", func() bool { return r.ctl.LeaseID() != 0 && !r.ctl.MemberExpiry().IsZero() })
	first := r.ctl.MemberExpiry()
	if ahead := time.Until(first); ahead <= 0 || ahead > ttl {
		t.Fatalf("expiry %v ahead right after registering, want within (0, %v]", ahead, ttl)
	}
	// etcd's own view: the lease's remaining TTL, in whole seconds, from
	// an expiry at most a keepalive period (ttl/3) earlier than ours.
	resp, err := cli.TimeToLive(ctxT(t), r.ctl.LeaseID())
	if err != nil {
		t.Fatal(err)
	}
	etcdEnd := time.Now().Add(time.Duration(resp.TTL) * time.Second)
	if d := r.ctl.MemberExpiry().Sub(etcdEnd); d < -ttl/3-time.Second || d > ttl/3+time.Second {
		t.Errorf("expiry %v from etcd's (TTL %ds left), want within a keepalive period (and etcd's whole-second rounding)", d, resp.TTL)
	}
	eventually(t, "a keepalive moves it on", func() bool { return r.ctl.MemberExpiry().After(first) })
	r.stop() // leaves: its lease revoked
	if e := r.ctl.MemberExpiry(); !e.IsZero() {
		t.Errorf("expiry %v after the replica left, want none", e)
	}
}

// etcd stopped: the replica keeps admitting, reports the outage (status,
// metric), and after etcd returns picks up a change another client wrote.
func TestOutageAndReconnect(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	if _, err := ApplyConfig(ctxT(t), cli, DefaultPrefix, "sluice.yaml", []byte(defaultWith(t, ""))); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, newClient(t, etcd), Options{Status: NewStatus(SourceEmbedded, time.Now(), m), Metrics: m,
		Self: client.Member{ID: "r", Addr: "r:7070"}, LeaseTTL: time.Second})
	st := r.ctl.Status()
	eventually(t, "serving etcd's config", func() bool { return st.View().Source == SourceEtcd && r.lastCount() == 1 })

	// Admissions run throughout: every one is answered, without error, and
	// they keep being admitted (acme's RPS bucket refuses some).
	var stop atomic.Bool
	var served atomic.Int64
	errs := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			d, err := r.eng.Admit(ctx, admission.Request{Tenant: "acme", Model: "small", PromptTokens: 10, MaxOutputTokens: 5})
			cancel()
			if err == nil && d.Outcome != admission.Admitted && d.Reason != admission.ReasonQuotaExceeded {
				err = fmt.Errorf("answer %+v", d)
			}
			if err == nil && d.LeaseID != 0 {
				_, err = r.eng.Release(context.Background(), admission.Release{LeaseID: d.LeaseID, OutputTokens: 5})
				served.Add(1)
			}
			if err != nil {
				errs <- err
				return
			}
		}
	}()
	defer func() { stop.Store(true); <-done }()

	etcd.Stop() // takes etcd's request timeout (about 7 s): it waits for the open watches
	eventually(t, "the outage reported", func() bool { return !st.View().Connected })
	if got := gauge(t, reg, "sluice_control_plane_connected"); got != 0 {
		t.Fatalf("sluice_control_plane_connected = %v during the outage", got)
	}
	if v := st.View(); v.DisconnectedSince.IsZero() || v.Source != SourceEtcd {
		t.Fatalf("status during the outage: %+v", v)
	}
	n := served.Load()
	eventually(t, "admissions during the outage", func() bool { return served.Load() > n+100 })

	etcd.Restart()
	other := etcd.Client(t) // another client writes the change
	rev := put(t, other, TenantKey(DefaultPrefix, "newco"), "tier: premium\n")
	eventually(t, "the change picked up", func() bool { _, ok := r.eng.Tenant("newco"); return ok })
	eventually(t, "reconnected", func() bool { return st.View().Connected && r.ctl.Revision() >= rev })
	if got := gauge(t, reg, "sluice_control_plane_connected"); got != 1 {
		t.Fatalf("sluice_control_plane_connected = %v after the outage", got)
	}
	stop.Store(true)
	<-done
	select {
	case err := <-errs:
		t.Fatalf("serving stopped: %v", err)
	default:
	}
}

// defaultWith returns the default config file with extra YAML appended.
func defaultWith(t *testing.T, extra string) string {
	t.Helper()
	return string(configDefault(t)) + extra
}

// A watch whose revision was compacted away is answered by a full re-read.
func TestCompactionForcesFullRead(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	if _, err := ApplyConfig(ctxT(t), cli, DefaultPrefix, "sluice.yaml", configDefault(t)); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	eng := newEngine(t)
	ctl, err := New(Options{Client: cli, Engine: eng, Metrics: m, Logger: testLogger(), RetryEvery: 20 * time.Millisecond, ProbeEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Sync(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// Changes the controller has not watched, then compaction past them.
	put(t, cli, TenantKey(DefaultPrefix, "newco"), "tier: free\n")
	if _, err := PutDrain(ctxT(t), cli, DefaultPrefix, DrainMark{Domain: "hgx-h200-1", By: "bob"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctxT(t), TenantKey(DefaultPrefix, "hooli")); err != nil {
		t.Fatal(err)
	}
	rev := put(t, cli, "/unrelated", "x")
	if _, err := cli.Compact(ctxT(t), rev); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { ctl.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	eventually(t, "the changes applied", func() bool {
		_, newco := eng.Tenant("newco")
		_, hooli := eng.Tenant("hooli")
		info, _ := domainInfo(eng, "hgx-h200-1")
		return newco && !hooli && info.Draining
	})
	if got := gauge(t, reg, "sluice_control_plane_resyncs_total"); got != 2 {
		t.Fatalf("resyncs = %v, want 2 (start, compaction)", got)
	}
}

// testAgent is a node agent (RunAgent) publishing one node of the simulated
// cluster with a 1 s lease, on a client of its own.
type testAgent struct {
	cli    *clientv3.Client
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// startAgent runs an agent for node until stop or the end of the test.
func startAgent(t *testing.T, etcd *etcdtest.Server, node string) *testAgent {
	t.Helper()
	a := &testAgent{cli: etcd.Client(t), done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go func() {
		a.done <- RunAgent(ctx, AgentOptions{Client: a.cli, TTL: time.Second, Logger: testLogger(),
			Discover: func(context.Context) (topology.NodeDiscovery, error) {
				return topology.Simulated().NodeDiscovery(node)
			}})
	}()
	t.Cleanup(func() { a.stop() })
	return a
}

// stop ends the agent (which revokes its lease) and returns RunAgent's error.
func (a *testAgent) stop() error {
	a.once.Do(func() { a.cancel(); a.err = <-a.done })
	return a.err
}

// domainIDs returns the engine's domain ids in cluster order.
func domainIDs(eng *admission.Engine) []string {
	var out []string
	for _, d := range eng.Domains() {
		out = append(out, d.ID)
	}
	return out
}

// Node agents: while none has published, the replica keeps its own topology;
// then the agents' nodes are the cluster; an agent whose lease expires takes
// its GPUs out of capacity (its leases finish) even when what remains cannot
// hold the config's floors, and its return restores them, drained if a mark
// waits for it. When every agent is gone nothing new is placed (the last
// cluster stays, every GPU unhealthy); when one returns, admissions resume.
func TestAgentsMakeTheCluster(t *testing.T) {
	etcd := etcdtest.Start(t)
	// The replica serves the embedded default, whose floors need more than
	// one HGX board.
	r := startReplica(t, etcd.Client(t), Options{})
	eventually(t, "synced", r.ctl.Synced)
	if n := len(r.eng.Domains()); n != len(topology.Simulated().Domains) {
		t.Fatalf("no agent yet: %d domains, want the local topology's %d", n, len(topology.Simulated().Domains))
	}
	// A record that is not one is skipped; it does not block the others.
	put(t, etcd.Client(t), AgentKey(DefaultPrefix, "junk"), `{"node": "junk", "gpus": "many"}`)
	a1 := startAgent(t, etcd, "hgx-h200-1")
	a2 := startAgent(t, etcd, "hgx-h200-2")
	want := []string{"hgx-h200-1", "hgx-h200-2"}
	eventually(t, "the agents' cluster", func() bool { return slices.Equal(domainIDs(r.eng), want) })

	// Hold a lease on each domain, then let agent 2's lease expire.
	var leases []uint64
	for _, tenant := range []string{"acme", "globex", "initech", "hooli"} {
		d := admit(t, r.eng, tenant, "small")
		if d.Outcome == admission.Admitted {
			leases = append(leases, d.LeaseID)
		}
	}
	if info, _ := domainInfo(r.eng, "hgx-h200-2"); info.InFlight == 0 {
		t.Fatal("no lease landed on hgx-h200-2; pick other tenants")
	}
	if err := a2.cli.Close(); err != nil { // the agent dies: keepalives stop
		t.Fatal(err)
	}
	eventually(t, "hgx-h200-2 gone", func() bool { return slices.Equal(domainIDs(r.eng), want[:1]) })
	// What remains cannot hold the floors: the engine refuses its own config
	// on it, yet the lost board left.
	if err := r.eng.Apply(r.eng.Config()); err == nil || !strings.Contains(err.Error(), "floors") {
		t.Fatalf("the config on one HGX board: %v; want it refused for its floors", err)
	}
	for range 20 {
		if d := admit(t, r.eng, "acme", "small"); d.Domain == "hgx-h200-2" {
			t.Fatalf("placed on a domain whose agent died: %+v", d)
		}
	}
	for _, l := range leases { // leases on the departed domain finish
		if _, err := r.eng.Release(context.Background(), admission.Release{LeaseID: l, OutputTokens: 5}); err != nil {
			t.Fatalf("release: %v", err)
		}
	}

	// A drain mark written while the domain is away applies when it returns.
	if _, err := PutDrain(ctxT(t), etcd.Client(t), DefaultPrefix, DrainMark{Domain: "hgx-h200-2", By: "carol", Reason: "burn-in"}); err != nil {
		t.Fatal(err)
	}
	a2 = startAgent(t, etcd, "hgx-h200-2")
	eventually(t, "hgx-h200-2 back, drained", func() bool {
		info, ok := domainInfo(r.eng, "hgx-h200-2")
		return ok && info.Draining && strings.Contains(info.DrainReason, "carol")
	})
	if info, _ := domainInfo(r.eng, "hgx-h200-2"); info.GPUs != 8 {
		t.Fatalf("hgx-h200-2 came back with %d GPUs", info.GPUs)
	}

	// Every agent gone: a lease held on hgx-h200-1 finishes, nothing new is
	// placed anywhere, and no answer names a domain.
	// (One board is short of the floors, so each floor tenant has its
	// share of it: acme waits for its floor to refill.)
	var held admission.Decision
	eventually(t, "acme placed on hgx-h200-1", func() bool {
		held = admit(t, r.eng, "acme", "small")
		return held.LeaseID != 0
	})
	if held.Domain != "hgx-h200-1" {
		t.Fatalf("acme before the agents left: %+v", held)
	}
	// hgx-h200-2 (drained) leaves first, so that the last cluster the agents
	// built is hgx-h200-1 alone, which would take placements if it counted.
	if err := a2.stop(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "hgx-h200-2 gone again", func() bool { return slices.Equal(domainIDs(r.eng), want[:1]) })
	if err := a1.stop(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the agents gone", func() bool {
		resp, err := etcd.Client(t).Get(ctxT(t), DefaultPrefix+agentsDir+"hgx", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 0 && r.ctl.Revision() >= resp.Header.Revision
	})
	if got := domainIDs(r.eng); !slices.Equal(got, want[:1]) {
		t.Fatalf("domains with every agent gone: %v, want the last cluster %v", got, want[:1])
	}
	for _, tenant := range []string{"acme", "globex", "initech", "hooli", "acme"} {
		if d := admit(t, r.eng, tenant, "small"); d.Outcome != admission.Rejected || d.Domain != "" {
			t.Fatalf("%s with every agent gone: %+v; want a rejection naming no domain", tenant, d)
		}
	}
	if _, err := r.eng.Release(context.Background(), admission.Release{LeaseID: held.LeaseID, OutputTokens: 5}); err != nil {
		t.Fatalf("release with every agent gone: %v", err)
	}
	startAgent(t, etcd, "hgx-h200-1")
	eventually(t, "admissions again", func() bool {
		return admit(t, r.eng, "acme", "small").Domain == "hgx-h200-1"
	})
}

// recordingEngine is an engine that logs the controller's config, topology
// and drain calls in order, and refuses every config with applyErr when it
// is set (a test that changes applyErr drives the controller with Sync, on
// its own goroutine).
type recordingEngine struct {
	*admission.Engine
	applyErr error

	mu    sync.Mutex
	calls []string
}

func (e *recordingEngine) record(s string) { e.mu.Lock(); e.calls = append(e.calls, s); e.mu.Unlock() }

func (e *recordingEngine) log() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.calls)
}

func (e *recordingEngine) Apply(cfg admission.Config) error {
	e.record("apply")
	if e.applyErr != nil {
		return e.applyErr
	}
	return e.Engine.Apply(cfg)
}

func (e *recordingEngine) UpdateTenants(updates []admission.TenantUpdate) error {
	var names []string
	for _, u := range updates {
		names = append(names, u.Name)
	}
	e.record("update " + strings.Join(names, ","))
	return e.Engine.UpdateTenants(updates)
}

func (e *recordingEngine) SetTopology(c topology.Cluster) error {
	var ids []string
	for _, d := range c.Domains {
		ids = append(ids, d.ID)
	}
	e.record("topology " + strings.Join(ids, ","))
	return e.Engine.SetTopology(c)
}

// SetStartupTopology records as SetTopology does: the tests follow which
// cluster the engine serves; whether it warms up is the engine's.
func (e *recordingEngine) SetStartupTopology(c topology.Cluster) error {
	var ids []string
	for _, d := range c.Domains {
		ids = append(ids, d.ID)
	}
	e.record("topology " + strings.Join(ids, ","))
	return e.Engine.SetStartupTopology(c)
}

func (e *recordingEngine) DrainAhead(domain, reason string) {
	e.record("drain " + domain)
	e.Engine.DrainAhead(domain, reason)
}

func (e *recordingEngine) Undrain(domain string) error {
	e.record("undrain " + domain)
	return e.Engine.Undrain(domain)
}

// putRecords publishes the simulated cluster's nodes as agent records, in
// one transaction (without a lease: the test plays the agents).
func putRecords(t *testing.T, cli *clientv3.Client, nodes ...string) int64 {
	t.Helper()
	var ops []clientv3.Op
	for _, n := range nodes {
		nd, err := topology.Simulated().NodeDiscovery(n)
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(RecordOf(nd))
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, clientv3.OpPut(AgentKey(DefaultPrefix, n), string(b)))
	}
	resp, err := cli.Txn(ctxT(t)).Then(ops...).Commit()
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// syncBuffer is a log sink safe for the controller's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// Drains are applied before the topology: a domain that returns in the same
// write as its drain mark is drained before the cluster that holds it is
// set, so it never takes a placement. A drain of the Operator RPC is not
// undone when another domain's mark goes, and a mark for a domain the
// replica does not have is logged once.
func TestDrainOrderAndOperatorDrains(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	var logs syncBuffer
	eng := &recordingEngine{Engine: newEngine(t)}
	ctl, err := New(Options{Client: cli, Engine: eng, RetryEvery: 20 * time.Millisecond, ProbeEvery: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { ctl.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	putRecords(t, cli, "hgx-h200-1", "hgx-h200-2")
	eventually(t, "the agents' cluster", func() bool {
		return slices.Equal(domainIDs(eng.Engine), []string{"hgx-h200-1", "hgx-h200-2"})
	})
	if _, err := cli.Delete(ctxT(t), AgentKey(DefaultPrefix, "hgx-h200-2")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "hgx-h200-2 gone", func() bool { return slices.Equal(domainIDs(eng.Engine), []string{"hgx-h200-1"}) })

	// One write brings hgx-h200-2 back and marks it.
	nd, err := topology.Simulated().NodeDiscovery("hgx-h200-2")
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(RecordOf(nd))
	mark, _ := json.Marshal(DrainMark{Domain: "hgx-h200-2", By: "dave", Reason: "memory errors"})
	resp, err := cli.Txn(ctxT(t)).Then(
		clientv3.OpPut(AgentKey(DefaultPrefix, "hgx-h200-2"), string(rec)),
		clientv3.OpPut(DrainKey(DefaultPrefix, "hgx-h200-2"), string(mark)),
	).Commit()
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the write applied", func() bool { return ctl.Revision() >= resp.Header.Revision })
	calls := eng.log()
	left := slices.Index(calls, "topology hgx-h200-1")
	if left < 0 {
		t.Fatalf("calls %q: hgx-h200-2 never left", calls)
	}
	after := calls[left+1:]
	if drainAt, backAt := slices.Index(after, "drain hgx-h200-2"), slices.Index(after, "topology hgx-h200-1,hgx-h200-2"); drainAt < 0 || backAt < drainAt {
		t.Fatalf("calls %q: want the drain of hgx-h200-2 after it left and before the topology that brings it back", calls)
	}
	if info, _ := domainInfo(eng.Engine, "hgx-h200-2"); !info.Draining || !strings.Contains(info.DrainReason, "dave") {
		t.Fatalf("hgx-h200-2: %+v", info)
	}

	// An operator drains hgx-h200-1 on this replica only (the Operator RPC
	// calls the engine); deleting hgx-h200-2's mark leaves it drained.
	if err := eng.Drain("hgx-h200-1", "fan failure (rpc)"); err != nil {
		t.Fatal(err)
	}
	if _, err := DeleteDrain(ctxT(t), cli, DefaultPrefix, "hgx-h200-2"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "hgx-h200-2 undrained", func() bool { info, _ := domainInfo(eng.Engine, "hgx-h200-2"); return !info.Draining })
	if info, _ := domainInfo(eng.Engine, "hgx-h200-1"); !info.Draining || info.DrainReason != "fan failure (rpc)" {
		t.Fatalf("the operator's drain of hgx-h200-1 after an unrelated mark went: %+v", info)
	}
	if slices.Contains(eng.log(), "undrain hgx-h200-1") {
		t.Fatalf("the controller undrained a domain it did not drain: %q", eng.log())
	}

	// A mark for a domain the replica lacks is logged once, however often
	// the drains and the topology are reconciled after it.
	if _, err := PutDrain(ctxT(t), cli, DefaultPrefix, DrainMark{Domain: "hgx-h300-9", By: "erin"}); err != nil {
		t.Fatal(err)
	}
	if _, err := PutDrain(ctxT(t), cli, DefaultPrefix, DrainMark{Domain: "hgx-h200-2", By: "erin"}); err != nil {
		t.Fatal(err)
	}
	rev := putRecords(t, cli, "hgx-h200-3")
	eventually(t, "the writes applied", func() bool { return ctl.Revision() >= rev })
	const unknown = `does not have; it applies if the domain appears" domain=`
	if n := strings.Count(logs.String(), unknown+"hgx-h300-9"); n != 1 {
		t.Fatalf("the unknown domain's mark logged %d times, want once:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), unknown+"hgx-h200-2") {
		t.Fatalf("a known domain's mark reported unknown:\n%s", logs.String())
	}
}

// A config the engine refused for floors the cluster cannot hold is tried
// again when the agents add capacity, and then serves.
func TestRefusedConfigRetriedWhenCapacityGrows(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	r := startReplica(t, cli, Options{})
	eventually(t, "synced", r.ctl.Synced)
	rev := putRecords(t, cli, "hgx-h200-1", "hgx-h200-2")
	eventually(t, "the agents' cluster", func() bool { return r.ctl.Revision() >= rev && len(r.eng.Domains()) == 2 })

	res, err := ApplyConfig(ctxT(t), cli, DefaultPrefix, "sluice.yaml", configDefault(t))
	if err != nil {
		t.Fatal(err)
	}
	st := r.ctl.Status()
	eventually(t, "the config processed", func() bool { return r.ctl.Revision() >= res.Revision })
	if v := st.View(); v.LastRefusal == nil || !strings.Contains(v.LastRefusal.Reason, "floors") || v.Source == SourceEtcd {
		t.Fatalf("status on two HGX boards: %+v; want etcd's config refused for its floors", v)
	}

	var rest []string
	for _, d := range topology.Simulated().Domains {
		for _, n := range d.Nodes {
			if n.Name != "hgx-h200-1" && n.Name != "hgx-h200-2" {
				rest = append(rest, n.Name)
			}
		}
	}
	putRecords(t, cli, rest...)
	eventually(t, "the refused config applied once capacity grew", func() bool {
		v := st.View()
		return v.Source == SourceEtcd && v.LastRefusal == nil && v.Revision == res.Revision
	})
	if n := len(r.eng.Domains()); n != len(topology.Simulated().Domains) {
		t.Fatalf("%d domains, want %d", n, len(topology.Simulated().Domains))
	}
}

// A refusal of the engine's Apply is attributed to the tenant document it
// points into, the longest tenant name that matches ("a.b" over "a").
func TestApplyRefusalAttributed(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	if _, err := ApplyConfig(ctxT(t), cli, DefaultPrefix, "sluice.yaml", configDefault(t)); err != nil {
		t.Fatal(err)
	}
	put(t, cli, TenantKey(DefaultPrefix, "a"), "tier: free\n")
	rev := put(t, cli, TenantKey(DefaultPrefix, "a.b"), "tier: free\n")
	eng := &recordingEngine{Engine: newEngine(t), applyErr: &admission.ConfigError{Key: "tenants.a.b.floor", Reason: "too large"}}
	ctl, err := New(Options{Client: cli, Engine: eng, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Sync(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	ref := ctl.Status().View().LastRefusal
	if ref == nil || ref.Source != TenantKey(DefaultPrefix, "a.b") || ref.Key != "tenants.a.b.floor" || ref.Revision != rev {
		t.Fatalf("refusal %+v; want it on %s, key tenants.a.b.floor, revision %d", ref, TenantKey(DefaultPrefix, "a.b"), rev)
	}
}

// count returns how many times call is in the engine's log.
func (e *recordingEngine) count(call string) int {
	n := 0
	for _, c := range e.log() {
		if c == call {
			n++
		}
	}
	return n
}

// A config the engine refuses is tried again at each topology change, but
// its refusal is recorded (log line, status, sluice_config_refusals_total)
// once per reason: topology changes that do not change the reason count
// nothing. A config refused before the engine saw it (a document that does
// not parse, no policy document) is not retried at all, even after an
// engine refusal of the config before it.
func TestRefusalsNotRecountedOnTopologyChanges(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	if _, err := ApplyConfig(ctxT(t), cli, DefaultPrefix, "sluice.yaml", configDefault(t)); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	eng := &recordingEngine{Engine: newEngine(t),
		applyErr: &admission.ConfigError{Key: "tiers.premium.floor", Reason: "floors need 40 GPUs; the cluster has 8"}}
	ctl, err := New(Options{Client: cli, Engine: eng, Metrics: metrics, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	// step writes nothing or the agent records of nodes, syncs, and checks
	// the engine's Apply calls and the refusals counted so far.
	step := func(what string, applies int, refusals float64, nodes ...string) {
		t.Helper()
		if len(nodes) > 0 {
			putRecords(t, cli, nodes...)
		}
		if err := ctl.Sync(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if n := eng.count("apply"); n != applies {
			t.Fatalf("%s: %d Apply calls, want %d", what, n, applies)
		}
		if n := gauge(t, reg, "sluice_config_refusals_total", "source", SourceEtcd); n != refusals {
			t.Fatalf("%s: sluice_config_refusals_total{source=etcd} = %v, want %v", what, n, refusals)
		}
	}
	step("the first read", 1, 1)
	step("a read with nothing new", 1, 1)
	step("a topology change", 2, 1, "hgx-h200-1")
	step("another topology change", 3, 1, "hgx-h200-2")
	if r := ctl.Status().View().LastRefusal; r == nil || !strings.Contains(r.Reason, "the cluster has 8") {
		t.Fatalf("last refusal %+v; want the engine's", r)
	}

	eng.applyErr = &admission.ConfigError{Key: "tiers.premium.floor", Reason: "floors need 40 GPUs; the cluster has 24"}
	step("a topology change with a new reason", 4, 2, "hgx-h200-3")
	if r := ctl.Status().View().LastRefusal; r == nil || !strings.Contains(r.Reason, "the cluster has 24") {
		t.Fatalf("last refusal %+v; want the new reason", r)
	}

	put(t, cli, ConfigKey(DefaultPrefix), "tiers: [")
	step("a policy document that does not parse", 4, 3)
	step("a topology change after it", 4, 3, "hgx-h200-4")
	if _, err := cli.Delete(ctxT(t), ConfigKey(DefaultPrefix)); err != nil {
		t.Fatal(err)
	}
	step("the policy document deleted", 4, 4)
	step("a topology change after that", 4, 4, "hgx-h200-1", "hgx-h200-2")
	if r := ctl.Status().View().LastRefusal; r == nil || !strings.Contains(r.Reason, "no policy document") {
		t.Fatalf("last refusal %+v; want the missing policy document", r)
	}
}

// Drain marks are authoritative for the domains they name, and a drain
// that predates its mark is left as it was: a mark on a domain the Operator
// RPC drained takes it over while it lasts, and its removal gives the
// domain back the Operator's drain (unless the Operator undrained it
// meanwhile); an Operator undrain of a domain a mark drained lasts until
// the marks next change, when every mark is applied again; a domain the
// mark drained is undrained when it goes.
func TestDrainMarksOverOperatorDrains(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	r := startReplica(t, cli, Options{})
	eventually(t, "synced", r.ctl.Synced)
	rev := putRecords(t, cli, "hgx-h200-1", "hgx-h200-2", "hgx-h200-3")
	eventually(t, "the agents' cluster", func() bool { return r.ctl.Revision() >= rev && len(r.eng.Domains()) == 3 })
	applied := func(rev int64) {
		t.Helper()
		eventually(t, fmt.Sprintf("revision %d applied", rev), func() bool { return r.ctl.Revision() >= rev })
	}
	mark := func(domain, by string) {
		t.Helper()
		rev, err := PutDrain(ctxT(t), cli, DefaultPrefix, DrainMark{Domain: domain, By: by})
		if err != nil {
			t.Fatal(err)
		}
		applied(rev)
	}
	unmark := func(domain string) {
		t.Helper()
		if _, err := DeleteDrain(ctxT(t), cli, DefaultPrefix, domain); err != nil {
			t.Fatal(err)
		}
		resp, err := cli.Get(ctxT(t), DrainKey(DefaultPrefix, domain))
		if err != nil {
			t.Fatal(err)
		}
		applied(resp.Header.Revision)
	}
	expect := func(what, domain string, draining bool, reason string) {
		t.Helper()
		info, ok := domainInfo(r.eng, domain)
		if !ok || info.Draining != draining || !strings.Contains(info.DrainReason, reason) {
			t.Fatalf("%s: %s is %+v; want draining %t, reason with %q", what, domain, info, draining, reason)
		}
	}

	// A mark on a domain the Operator RPC drained, then removed.
	if err := r.eng.Drain("hgx-h200-1", "fan failure (rpc)"); err != nil {
		t.Fatal(err)
	}
	mark("hgx-h200-1", "dave")
	expect("marked after an Operator drain", "hgx-h200-1", true, "dave")
	unmark("hgx-h200-1")
	expect("its mark removed", "hgx-h200-1", true, "fan failure (rpc)")

	// An Operator undrain of a marked domain holds until the marks change;
	// then the mark drains it again, and its removal undrains it.
	mark("hgx-h200-2", "erin")
	expect("marked", "hgx-h200-2", true, "erin")
	if err := r.eng.Undrain("hgx-h200-2"); err != nil {
		t.Fatal(err)
	}
	mark("hgx-h200-3", "frank")
	expect("another mark written after an Operator undrain", "hgx-h200-2", true, "erin")
	unmark("hgx-h200-2")
	expect("its mark removed", "hgx-h200-2", false, "")
	expect("the other mark", "hgx-h200-3", true, "frank")

	// The Operator undrains a domain it had drained before its mark: the
	// mark's removal leaves it undrained.
	mark("hgx-h200-1", "grace")
	expect("marked again", "hgx-h200-1", true, "grace")
	if err := r.eng.Undrain("hgx-h200-1"); err != nil {
		t.Fatal(err)
	}
	unmark("hgx-h200-1")
	expect("its mark removed after an Operator undrain", "hgx-h200-1", false, "")
}
