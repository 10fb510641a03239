package controlplane

import (
	"context"
	"fmt"
	"regexp"
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
		if d := admit(t, r.eng, "hooli", "large"); d.Domain != dom {
			t.Fatalf("replica %d: hooli after the undrain: %+v, want domain %s", i, d, dom)
		}
	}
}

// Membership: three replicas register; one leaves gracefully (its lease is
// revoked) and one dies (its lease expires); the others' count goes
// 3 → 2 → 1 as each happens.
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
	if a.ctl.Replicas() != 2 {
		t.Fatalf("Replicas() = %d", a.ctl.Replicas())
	}
	// c dies: its connection to etcd is gone, its lease expires.
	if err := cCli.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "c's lease expired", func() bool { return a.lastCount() == 1 })
	a.mu.Lock()
	counts := slices.Clone(a.counts)
	a.mu.Unlock()
	if !slices.Equal(counts, []int{1, 2, 3, 2, 1}) && !slices.Equal(counts, []int{1, 3, 2, 1}) && !slices.Equal(counts, []int{2, 3, 2, 1}) && !slices.Equal(counts, []int{3, 2, 1}) {
		// How quickly a's first read saw b and c varies; the tail does not.
		t.Fatalf("a counted %v; want it to end 3, 2, 1", counts)
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

// Node agents: while none has published, the replica keeps its own topology;
// then the agents' nodes are the cluster; an agent whose lease expires takes
// its GPUs out of capacity (its leases finish), and its return restores them,
// drained if a mark waits for it.
func TestAgentsMakeTheCluster(t *testing.T) {
	etcd := etcdtest.Start(t)
	// The default floors need more than two HGX boards; a config without
	// floors lets two of them be the whole cluster.
	noFloors := regexp.MustCompile(`floor: \d+`).ReplaceAll(configDefault(t), []byte("floor: 0"))
	if _, err := ApplyConfig(ctxT(t), etcd.Client(t), DefaultPrefix, "nofloors.yaml", noFloors); err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, etcd.Client(t), Options{})
	eventually(t, "synced", r.ctl.Synced)
	if n := len(r.eng.Domains()); n != len(topology.Simulated().Domains) {
		t.Fatalf("no agent yet: %d domains, want the local topology's %d", n, len(topology.Simulated().Domains))
	}
	ids := func() []string {
		var out []string
		for _, d := range r.eng.Domains() {
			out = append(out, d.ID)
		}
		return out
	}
	type agent struct {
		cli    *clientv3.Client
		cancel context.CancelFunc
		done   chan error
	}
	startAgent := func(node string) *agent {
		a := &agent{cli: etcd.Client(t), done: make(chan error, 1)}
		ctx, cancel := context.WithCancel(context.Background())
		a.cancel = cancel
		go func() {
			a.done <- RunAgent(ctx, AgentOptions{Client: a.cli, TTL: time.Second, Logger: testLogger(),
				Discover: func(context.Context) (topology.NodeDiscovery, error) {
					return NodeFromCluster(topology.Simulated(), node)
				}})
		}()
		t.Cleanup(func() { cancel(); <-a.done })
		return a
	}
	// A record that is not one is skipped; it does not block the others.
	put(t, etcd.Client(t), AgentKey(DefaultPrefix, "junk"), `{"node": "junk", "gpus": "many"}`)
	startAgent("hgx-h200-1")
	a2 := startAgent("hgx-h200-2")
	want := []string{"hgx-h200-1", "hgx-h200-2"}
	eventually(t, "the agents' cluster", func() bool { return slices.Equal(ids(), want) })

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
	eventually(t, "hgx-h200-2 gone", func() bool { return slices.Equal(ids(), want[:1]) })
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
	startAgent("hgx-h200-2")
	eventually(t, "hgx-h200-2 back, drained", func() bool {
		info, ok := domainInfo(r.eng, "hgx-h200-2")
		return ok && info.Draining && strings.Contains(info.DrainReason, "carol")
	})
	if info, _ := domainInfo(r.eng, "hgx-h200-2"); info.GPUs != 8 {
		t.Fatalf("hgx-h200-2 came back with %d GPUs", info.GPUs)
	}
}
