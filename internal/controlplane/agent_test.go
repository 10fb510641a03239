package controlplane

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/topology"
)

// A record is one JSON value: anything after it is refused.
func TestDecodeAgentRefusesTrailingData(t *testing.T) {
	nd, err := topology.Simulated().NodeDiscovery("hgx-h200-1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(RecordOf(nd))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decodeAgent("hgx-h200-1", b); err != nil {
		t.Fatalf("the record alone: %v", err)
	}
	if _, err := decodeAgent("hgx-h200-1", append(b, "\n \t"...)); err != nil {
		t.Fatalf("the record and white space: %v", err)
	}
	for _, tail := range []string{"{}", `"x"`, "garbage", "]"} {
		if _, err := decodeAgent("hgx-h200-1", append(append([]byte{}, b...), tail...)); err == nil {
			t.Errorf("the record followed by %q decoded", tail)
		}
	}
}

// A node's engines travel in its record and join its domain; a record
// with an engine that is not an http(s) URL is refused.
func TestAgentRecordCarriesEngines(t *testing.T) {
	nd, err := topology.Simulated().NodeDiscovery("hgx-h200-1")
	if err != nil {
		t.Fatal(err)
	}
	nd.Engines = []topology.Engine{{Metrics: "http://127.0.0.1:8000/metrics", Kind: "vllm"}}
	b, err := json.Marshal(RecordOf(nd))
	if err != nil {
		t.Fatal(err)
	}
	r, err := decodeAgent("hgx-h200-1", b)
	if err != nil {
		t.Fatal(err)
	}
	c, err := topology.Merge([]topology.NodeDiscovery{r.Discovery()})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Domains[0].Engines; !reflect.DeepEqual(got, nd.Engines) {
		t.Errorf("merged domain's engines %+v, want %+v", got, nd.Engines)
	}
	nd.Engines[0].Metrics = "file:///etc/passwd"
	b, _ = json.Marshal(RecordOf(nd))
	if _, err := decodeAgent("hgx-h200-1", b); err == nil || !strings.Contains(err.Error(), "engines[0].metrics") {
		t.Errorf("an engine with a file URL: %v, want refused naming engines[0].metrics", err)
	}
}

// agentGet returns the value and lease of node's agent key ("" when absent).
func agentGet(t *testing.T, cli *clientv3.Client, node string) (string, clientv3.LeaseID) {
	t.Helper()
	resp, err := cli.Get(ctxT(t), AgentKey(DefaultPrefix, node))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return "", 0
	}
	return string(resp.Kvs[0].Value), clientv3.LeaseID(resp.Kvs[0].Lease)
}

// Two live agents with one node name: the second does not overwrite the
// first's record; it fails, naming the key, once the first's lease has
// outlived its TTL. A key without a lease fails at once.
func TestAgentDuplicateNodeName(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	first := startAgent(t, etcd, "hgx-h200-1")
	eventually(t, "the first agent published", func() bool { v, _ := agentGet(t, cli, "hgx-h200-1"); return v != "" })
	_, lease := agentGet(t, cli, "hgx-h200-1")

	err := RunAgent(ctxT(t), AgentOptions{Client: etcd.Client(t), TTL: time.Second, Logger: testLogger(),
		Discover: func(context.Context) (topology.NodeDiscovery, error) {
			return topology.Simulated().NodeDiscovery("hgx-h200-1")
		}})
	if err == nil || !strings.Contains(err.Error(), AgentKey(DefaultPrefix, "hgx-h200-1")) || !strings.Contains(err.Error(), "same --node") {
		t.Fatalf("a second agent for the node: %v; want an error naming the key", err)
	}
	if _, now := agentGet(t, cli, "hgx-h200-1"); now != lease {
		t.Fatalf("the record's lease is %x, want the first agent's %x", now, lease)
	}
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}

	put(t, cli, AgentKey(DefaultPrefix, "hgx-h200-2"), "{}")
	err = RunAgent(ctxT(t), AgentOptions{Client: cli, TTL: time.Second, Logger: testLogger(),
		Discover: func(context.Context) (topology.NodeDiscovery, error) {
			return topology.Simulated().NodeDiscovery("hgx-h200-2")
		}})
	if err == nil || !strings.Contains(err.Error(), "without a lease") {
		t.Fatalf("an agent whose key exists without a lease: %v", err)
	}
}

// An agent that restarts before its previous run's lease expired (a crash:
// no revoke) waits for that lease and then publishes.
func TestAgentRestartAfterCrash(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	crashed := startAgent(t, etcd, "hgx-h200-1")
	eventually(t, "published", func() bool { v, _ := agentGet(t, cli, "hgx-h200-1"); return v != "" })
	_, old := agentGet(t, cli, "hgx-h200-1")
	if err := crashed.cli.Close(); err != nil { // keepalives stop; the lease lingers
		t.Fatal(err)
	}
	startAgent(t, etcd, "hgx-h200-1")
	eventually(t, "the restarted agent published", func() bool {
		v, lease := agentGet(t, cli, "hgx-h200-1")
		return v != "" && lease != old
	})
}

// etcd gone for longer than the node's lease: the agent's client gives the
// lease up, and the agent publishes again once etcd is back. The record
// moves to the new lease before the old one is revoked, so the node never
// leaves the replicas' topology for an outage it outlived.
func TestAgentOutlivesAnOutageWithoutLeaving(t *testing.T) {
	etcd := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	agentCli := newClient(t, etcd) // it reconnects as sluice-agent's does
	loss := watchLeaseLoss(agentCli)
	go func() {
		done <- RunAgent(ctx, AgentOptions{Client: agentCli, TTL: time.Second, Logger: testLogger(),
			Discover: func(context.Context) (topology.NodeDiscovery, error) {
				return topology.Simulated().NodeDiscovery("hgx-h200-1")
			}})
	}()
	defer func() { cancel(); <-done }()
	cli := etcd.Client(t)
	eventually(t, "published", func() bool { v, _ := agentGet(t, cli, "hgx-h200-1"); return v != "" })
	_, first := agentGet(t, cli, "hgx-h200-1")
	key := AgentKey(DefaultPrefix, "hgx-h200-1")
	resp, err := cli.Get(ctxT(t), key)
	if err != nil {
		t.Fatal(err)
	}

	etcd.Stop()
	// The client gives the lease up a TTL after its last renewal; etcd
	// comes back at once, while an agent that revoked a lost lease at once
	// would still be trying to.
	loss.given(t)
	etcd.Restart()
	cli = etcd.Client(t)
	eventually(t, "published again", func() bool { _, l := agentGet(t, cli, "hgx-h200-1"); return l != 0 && l != first })
	eventually(t, "the lost lease revoked once the record left it", func() bool {
		left, err := cli.TimeToLive(ctxT(t), first)
		return err == nil && left.TTL == -1
	})
	rewrittenWithoutDelete(t, cli, key, resp.Header.Revision)
}

// A published agent discovers its node again every RediscoverEvery and
// rewrites a changed record under the same lease: a GPU that turns
// unhealthy reaches the replicas.
func TestAgentRepublishesChanges(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	var sick atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RunAgent(ctx, AgentOptions{Client: etcd.Client(t), TTL: time.Second, Logger: testLogger(),
			RediscoverEvery: 20 * time.Millisecond,
			Discover: func(context.Context) (topology.NodeDiscovery, error) {
				nd, err := topology.Simulated().NodeDiscovery("hgx-h200-1")
				if err == nil && sick.Load() {
					nd.GPUs[3].Healthy, nd.GPUs[3].Problem = false, "XID 79"
				}
				return nd, err
			}})
	}()
	defer func() { cancel(); <-done }()
	record := func() (AgentRecord, clientv3.LeaseID) {
		v, lease := agentGet(t, cli, "hgx-h200-1")
		if v == "" {
			return AgentRecord{}, 0
		}
		r, err := decodeAgent("hgx-h200-1", []byte(v))
		if err != nil {
			t.Fatal(err)
		}
		return r, lease
	}
	eventually(t, "published", func() bool { _, l := record(); return l != 0 })
	r, lease := record()
	if !r.GPUs[3].Healthy {
		t.Fatalf("GPU 3 published unhealthy: %+v", r.GPUs[3])
	}
	sick.Store(true)
	eventually(t, "GPU 3 republished unhealthy", func() bool { r, _ := record(); return !r.GPUs[3].Healthy })
	if r, now := record(); now != lease || r.GPUs[3].Problem != "XID 79" {
		t.Fatalf("republished under lease %x (was %x): %+v", now, lease, r.GPUs[3])
	}
}

// keepAliveSpy records the contexts KeepAlive was called with.
type keepAliveSpy struct {
	clientv3.Lease
	mu   sync.Mutex
	ctxs []context.Context
}

func (s *keepAliveSpy) KeepAlive(ctx context.Context, id clientv3.LeaseID) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	s.mu.Lock()
	s.ctxs = append(s.ctxs, ctx)
	s.mu.Unlock()
	return s.Lease.KeepAlive(ctx, id)
}

// A publication that ends because its key left its lease (another writer
// took the key) stops keeping that lease alive, although the agent's
// context lives on: the keepalive is scoped to the publication, not left to
// the revoke (which fails while etcd is unreachable).
func TestPublishEndsItsKeepAlive(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := newClient(t, etcd)
	spy := &keepAliveSpy{Lease: cli.Lease}
	cli.Lease = spy
	var sick, published atomic.Bool
	discover := func(context.Context) (topology.NodeDiscovery, error) {
		nd, err := topology.Simulated().NodeDiscovery("hgx-h200-1")
		if err == nil && sick.Load() {
			nd.GPUs[0].Healthy, nd.GPUs[0].Problem = false, "XID 79"
		}
		return nd, err
	}
	nd, err := discover(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := AgentKey(DefaultPrefix, "hgx-h200-1")
	done := make(chan error, 1)
	go func() {
		_, err := publish(ctx, AgentOptions{Client: cli, TTL: time.Second, Logger: testLogger(),
			RediscoverEvery: 20 * time.Millisecond, Discover: discover}, key, nd, 0, func() { published.Store(true) })
		done <- err
	}()
	eventually(t, "published", published.Load)
	put(t, etcd.Client(t), key, "{}") // another writer takes the key, without a lease
	sick.Store(true)                  // the next rediscovery rewrites the record, on condition
	if err := <-done; err == nil || !strings.Contains(err.Error(), "no longer under lease") {
		t.Fatalf("publish: %v; want it to end, the key no longer under its lease", err)
	}
	spy.mu.Lock()
	defer spy.mu.Unlock()
	if len(spy.ctxs) != 1 {
		t.Fatalf("%d KeepAlive calls, want 1", len(spy.ctxs))
	}
	if ctx.Err() != nil || spy.ctxs[0].Err() == nil {
		t.Fatalf("after publish returned: the agent's context ended: %v; the keepalive's: %v; want only the keepalive's ended",
			ctx.Err(), spy.ctxs[0].Err())
	}
}

// What an agent discovers reaches the replicas whole: NVML's readings and
// each peak figure's source survive the record's round trip.
func TestAgentRecordRoundTrip(t *testing.T) {
	nd, err := topology.Simulated().NodeDiscovery("hgx-h200-1")
	if err != nil {
		t.Fatal(err)
	}
	g := &nd.GPUs[0]
	g.MemoryBytes, g.MaxSMClockMHz, g.MaxMemClockMHz, g.MemoryBusWidthBits = 150_000_000_000, 1980, 3201, 6144
	g.Peaks.Source = topology.SourceNVMLEstimate
	g.Peaks.Figures = topology.PeakSources{HBMBytes: topology.SourceNVML, SMs: topology.SourceNVML}
	b, err := json.Marshal(RecordOf(nd))
	if err != nil {
		t.Fatal(err)
	}
	r, err := decodeAgent(nd.Node, b)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	got := r.Discovery()
	if !reflect.DeepEqual(got, nd) {
		t.Errorf("round trip changed the discovery:\n got %+v\nwant %+v", got.GPUs[0], nd.GPUs[0])
	}
}
