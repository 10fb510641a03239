package controlplane

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/topology"
)

// A record is one JSON value: anything after it is refused.
func TestDecodeAgentRefusesTrailingData(t *testing.T) {
	nd, err := NodeFromCluster(topology.Simulated(), "hgx-h200-1")
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
			return NodeFromCluster(topology.Simulated(), "hgx-h200-1")
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
			return NodeFromCluster(topology.Simulated(), "hgx-h200-2")
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
				nd, err := NodeFromCluster(topology.Simulated(), "hgx-h200-1")
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
