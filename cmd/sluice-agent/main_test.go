package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/controlplane"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/internal/deployfiles"
	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/topology/nvml"
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
		done <- run(ctx, []string{"--etcd", etcd.Endpoint(), "--node", "nvl72-a-tray03", "--topology", "simulated", "--ttl", "1s"}, &logs, noNVML(t))
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

	err := run(context.Background(), []string{"--etcd", etcd.Endpoint(), "--node", "nope", "--topology", "simulated"}, &logs, noNVML(t))
	if err == nil || !strings.Contains(err.Error(), `node "nope"`) {
		t.Fatalf("unknown node: %v", err)
	}
	if err := run(context.Background(), []string{"--node", "x"}, &logs, noNVML(t)); err == nil || !strings.Contains(err.Error(), "--etcd") {
		t.Fatalf("without --etcd: %v", err)
	}
}

// fakeNVML is a node's NVML for the agent: it answers with eight healthy
// H200s for its first answers discoveries, then is unavailable for the
// reason lost. It counts its calls and closes reached at call until.
type fakeNVML struct {
	answers int32
	lost    error
	until   int32
	calls   atomic.Int32
	reached chan struct{}
}

func newFakeNVML(answers, until int32, lost error) *fakeNVML {
	return &fakeNVML{answers: answers, lost: lost, until: until, reached: make(chan struct{})}
}

func (f *fakeNVML) discover(node string) (topology.NodeDiscovery, error) {
	n := f.calls.Add(1)
	if n == f.until {
		close(f.reached)
	}
	if n > f.answers {
		return topology.NodeDiscovery{}, f.lost
	}
	p, _ := topology.LookupGPU("H200")
	nd := topology.NodeDiscovery{Node: node}
	for i := range 8 {
		nd.GPUs = append(nd.GPUs, topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", node, i), Name: "NVIDIA H200",
			Peaks: p, ActiveNVLinks: 18, Healthy: true})
	}
	return nd, nil
}

// noNVML fails the test if the agent asks NVML: its --topology says not to.
func noNVML(t *testing.T) func(string) (topology.NodeDiscovery, error) {
	return func(string) (topology.NodeDiscovery, error) {
		t.Error("NVML asked, though --topology does not name it")
		return topology.NodeDiscovery{}, errors.New("not NVML")
	}
}

// agentRun is an agent run in the background (startAgent).
type agentRun struct {
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned
	err    error         // run's result, once done
}

// startAgent runs the agent with args until stop or the end of the test.
func startAgent(t *testing.T, args []string, discover func(string) (topology.NodeDiscovery, error)) *agentRun {
	ctx, cancel := context.WithCancel(context.Background())
	a := &agentRun{logs: &syncBuffer{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.err = run(ctx, args, a.logs, discover)
	}()
	t.Cleanup(func() { _ = a.stop() })
	return a
}

// stop ends the agent and returns run's result.
func (a *agentRun) stop() error {
	a.cancel()
	<-a.done
	return a.err
}

// await waits for c to close, failing the test if the agent exits first or
// nothing happens in 30 s.
func (a *agentRun) await(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-a.done:
		t.Fatalf("agent exited before %s: %v\n%s", what, a.err, a.logs)
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s in 30 s\n%s", what, a.logs)
	}
}

// Under auto where NVML has never answered the agent publishes its node
// from the fallback file and says so once, although it discovers at start,
// again in RunAgent, and at every --rediscover.
func TestAgentLogsTheFallbackOnce(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	const file = "../../topology/testdata/cluster.yaml"
	// Calls 1 and 2 precede the publication; 3 and 4 are rediscoveries.
	fake := newFakeNVML(0, 4, fmt.Errorf("%w: nvml.Init: ERROR_DRIVER_NOT_LOADED", nvml.ErrUnavailable))
	agent := startAgent(t, []string{"--etcd", etcd.Endpoint(), "--node", "rack-a-tray02",
		"--topology", "auto:" + file, "--ttl", "1s", "--rediscover", "10ms"}, fake.discover)
	logs := agent.logs
	agent.await(t, fake.reached, "second rediscovery")
	resp, err := cli.Get(context.Background(), controlplane.AgentKey(controlplane.DefaultPrefix, "rack-a-tray02"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("record: %v, %v\n%s", resp, err, logs)
	}
	var rec controlplane.AgentRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Domain != "rack-a" || len(rec.GPUs) != 4 || !rec.GPUs[0].Healthy {
		t.Errorf("record = %+v, want the file's rack-a-tray02", rec)
	}
	if err := agent.stop(); err != nil {
		t.Fatalf("agent: %v", err)
	}
	if n := strings.Count(logs.String(), "using the fallback topology"); n != 1 {
		t.Errorf("%d fallback lines after %d discoveries, want 1\n%s", n, fake.calls.Load(), logs)
	}
	if !strings.Contains(logs.String(), "fallback="+file) {
		t.Errorf("the fallback line does not name the file\n%s", logs)
	}
}

// Once NVML has answered, its loss mid-run is published as the node's GPUs
// all unhealthy, not as the fallback file's healthy node, and logged once
// however often the agent rediscovers.
func TestAgentMarksItsGPUsUnhealthyWhenNVMLGoes(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	key := controlplane.AgentKey(controlplane.DefaultPrefix, "rack-a-tray02")
	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	puts := cli.Watch(watchCtx, key)
	lost := fmt.Errorf("%w: nvml.Init: ERROR_DRIVER_NOT_LOADED", nvml.ErrUnavailable)
	// NVML answers at start and for the first publication; from the first
	// rediscovery on (call 3) it is gone, and call 6 is the third since.
	fake := newFakeNVML(2, 6, lost)
	agent := startAgent(t, []string{"--etcd", etcd.Endpoint(), "--node", "rack-a-tray02",
		"--topology", "auto:../../topology/testdata/cluster.yaml", "--ttl", "1s", "--rediscover", "10ms"}, fake.discover)
	logs := agent.logs
	next := func() controlplane.AgentRecord {
		t.Helper()
		for {
			select {
			case wr := <-puts:
				for _, ev := range wr.Events {
					if ev.IsCreate() || ev.IsModify() {
						var rec controlplane.AgentRecord
						if err := json.Unmarshal(ev.Kv.Value, &rec); err != nil {
							t.Fatal(err)
						}
						return rec
					}
				}
			case <-agent.done:
				t.Fatalf("agent exited: %v\n%s", agent.err, logs)
			case <-time.After(30 * time.Second):
				t.Fatalf("nothing published in 30 s\n%s", logs)
			}
		}
	}
	for i, want := range []struct {
		healthy bool
		problem string
	}{{true, ""}, {false, lost.Error()}} {
		rec := next()
		if rec.Domain != "" || len(rec.GPUs) != 8 {
			t.Fatalf("record %d = %+v, want NVML's eight GPUs", i, rec)
		}
		for _, g := range rec.GPUs {
			if g.Name != "NVIDIA H200" || g.Healthy != want.healthy || g.Problem != want.problem {
				t.Errorf("record %d: gpu %d = %q healthy %v problem %q, want healthy %v problem %q",
					i, g.Index, g.Name, g.Healthy, g.Problem, want.healthy, want.problem)
			}
		}
	}
	agent.await(t, fake.reached, "third rediscovery without NVML")
	if err := agent.stop(); err != nil {
		t.Fatalf("agent: %v", err)
	}
	got := logs.String()
	if n := strings.Count(got, "NVML stopped working"); n != 1 || !strings.Contains(got, "level=WARN msg=\"NVML stopped working") {
		t.Errorf("%d lines on NVML's loss, want one WARN\n%s", n, got)
	}
	if strings.Contains(got, "using the fallback topology") {
		t.Errorf("the agent fell back after NVML had answered\n%s", got)
	}
}

// The agent's etcd TLS flags reach the etcd client: a client certificate
// without its key, or a CA file that does not exist, stops it at start.
func TestAgentUsesItsEtcdTLSFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--etcd-cert", "/nonexistent/client.pem"}, "--etcd-cert and --etcd-key go together"},
		{[]string{"--etcd-ca", "/nonexistent/ca.pem"}, "/nonexistent/ca.pem"},
	} {
		var logs syncBuffer
		args := append([]string{"--etcd", "https://127.0.0.1:1", "--node", "nvl72-a-tray03", "--topology", "simulated"}, c.args...)
		err := run(context.Background(), args, &logs, noNVML(t))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}

// --version prints the build's version to stdout; --help exits 0.
func TestAgentVersionAndHelp(t *testing.T) {
	var out, logs bytes.Buffer
	stdout = &out
	defer func() { stdout = os.Stdout }()
	if err := run(context.Background(), []string{"--version"}, &logs, noNVML(t)); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "sluice-agent ") || !strings.Contains(out.String(), "revision") {
		t.Errorf("--version printed %q", out.String())
	}
	if err := run(context.Background(), []string{"--help"}, &logs, noNVML(t)); err != nil || !strings.Contains(logs.String(), "-etcd") {
		t.Errorf("--help: %v, usage %q", err, logs.String())
	}
}

// The DaemonSet in deploy/k8s passes flags sluice-agent has, with values
// they parse: run parses them all, then --version returns before anything.
func TestDaemonSetArgsAreAgentFlags(t *testing.T) {
	args, err := deployfiles.ContainerArgs("DaemonSet", "sluice-agent")
	if err != nil {
		t.Fatal(err)
	}
	stdout = io.Discard
	defer func() { stdout = os.Stdout }()
	var logs bytes.Buffer
	if err := run(context.Background(), append(args, "--version"), &logs, noNVML(t)); err != nil {
		t.Fatalf("deploy/k8s/sluice-agent.yaml args %v: %v\n%s", args, err, logs.String())
	}
}
