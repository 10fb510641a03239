package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/controlplane"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
)

// syncBuffer is a log sink safe for the agent's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// The agent publishes its node (here from the simulated cluster) under a
// lease and revokes it when stopped; a node it cannot find fails at start.
func TestAgentPublishesAndLeaves(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--etcd", etcd.Endpoint(), "--node", "nvl72-a-tray03", "--topology", "simulated", "--ttl", "1s"}, &logs)
	}()
	key := controlplane.AgentKey(controlplane.DefaultPrefix, "nvl72-a-tray03")
	var rec controlplane.AgentRecord
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := cli.Get(context.Background(), key)
		if err == nil && len(resp.Kvs) == 1 {
			if resp.Kvs[0].Lease == 0 {
				t.Fatal("published without a lease")
			}
			if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
				t.Fatal(err)
			}
			break
		}
		select {
		case err := <-done:
			t.Fatalf("agent exited: %v\n%s", err, logs.String())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing published\n%s", logs.String())
		}
	}
	if rec.Node != "nvl72-a-tray03" || rec.Domain != "nvl72-a" || len(rec.GPUs) != 4 {
		t.Fatalf("record: %+v", rec)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("agent: %v", err)
	}
	if resp, err := cli.Get(context.Background(), key); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("after stop: %v, %v (want the lease revoked)", resp, err)
	}

	err := run(context.Background(), []string{"--etcd", etcd.Endpoint(), "--node", "nope", "--topology", "simulated"}, &logs)
	if err == nil || !strings.Contains(err.Error(), `node "nope"`) {
		t.Fatalf("unknown node: %v", err)
	}
	if err := run(context.Background(), []string{"--node", "x"}, &logs); err == nil || !strings.Contains(err.Error(), "--etcd") {
		t.Fatalf("without --etcd: %v", err)
	}
}

// Under auto without NVML the agent publishes its node from the fallback
// and says so once, although it discovers at start and again in RunAgent
// (and at every --rediscover). Where NVML works nothing is said.
func TestAgentLogsTheFallbackOnce(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--etcd", etcd.Endpoint(), "--node", "rack-a-tray02",
			"--topology", "auto:../../topology/testdata/cluster.yaml", "--ttl", "1s"}, &logs)
	}()
	key := controlplane.AgentKey(controlplane.DefaultPrefix, "rack-a-tray02")
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "published node") {
		select {
		case err := <-done:
			t.Fatalf("agent exited: %v\n%s", err, logs.String())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing published\n%s", logs.String())
		}
	}
	resp, err := cli.Get(context.Background(), key)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("agent: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	n := strings.Count(logs.String(), "using the fallback topology")
	if n > 1 || n == 0 && len(resp.Kvs) == 1 {
		t.Errorf("%d fallback lines (published from the file: %v), want 1\n%s", n, len(resp.Kvs) == 1, logs.String())
	}
	if n == 1 && !strings.Contains(logs.String(), "fallback=../../topology/testdata/cluster.yaml") {
		t.Errorf("the fallback line does not name the file\n%s", logs.String())
	}
}
