package controlplane

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/internal/testwait"
	"github.com/sluice-sched/sluice/topology"
)

// waitFor bounds every wait on a condition. Generous: the machine is shared.
const waitFor = 30 * time.Second

// eventually polls cond until it holds or waitFor passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, waitFor, what, cond)
}

// testLogger discards unless SLUICE_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("SLUICE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newEngine returns an engine serving the embedded default on the simulated
// cluster, with its dispatcher running until the test ends.
func newEngine(t *testing.T) *admission.Engine {
	t.Helper()
	cfg, err := config.Default()
	if err != nil {
		t.Fatal(err)
	}
	eng, err := admission.New(cfg, topology.Simulated())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { eng.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return eng
}

// replica is a controller running over an engine, as one sluiced runs it.
type replica struct {
	eng    *admission.Engine
	ctl    *Controller
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	counts []int    // every replica count OnReplicas reported
	ids    []string // the last member set OnMembers reported
}

// startReplica runs a controller with opts (Client, Engine and the test
// defaults filled in) until stop or the end of the test.
func startReplica(t *testing.T, cli *clientv3.Client, opts Options) *replica {
	t.Helper()
	r := &replica{eng: newEngine(t), done: make(chan struct{})}
	if opts.Engine == nil {
		opts.Engine = r.eng
	}
	opts.Client = cli
	if opts.Logger == nil {
		opts.Logger = testLogger()
	}
	if opts.ProbeEvery == 0 {
		opts.ProbeEvery = 50 * time.Millisecond
	}
	if opts.RetryEvery == 0 {
		opts.RetryEvery = 20 * time.Millisecond
	}
	opts.OnReplicas = func(n int) { r.mu.Lock(); r.counts = append(r.counts, n); r.mu.Unlock() }
	opts.OnMembers = func(ids []string) { r.mu.Lock(); r.ids = ids; r.mu.Unlock() }
	ctl, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	r.ctl = ctl
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { ctl.Run(ctx); close(r.done) }()
	t.Cleanup(r.stop)
	return r
}

// stop ends the controller's Run and waits for it.
func (r *replica) stop() { r.cancel(); <-r.done }

// lastCount returns the last replica count reported, 0 if none.
func (r *replica) lastCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.counts) == 0 {
		return 0
	}
	return r.counts[len(r.counts)-1]
}

// members returns the last member set reported.
func (r *replica) members() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ids
}

// admit asks the engine for a small request of tenant on model.
func admit(t *testing.T, eng *admission.Engine, tenant, model string) admission.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := eng.Admit(ctx, admission.Request{Tenant: tenant, Model: model, PromptTokens: 100, MaxOutputTokens: 10,
		Deadline: time.Now().Add(2 * time.Second)})
	if err != nil {
		t.Fatalf("Admit(%s, %s): %v", tenant, model, err)
	}
	return d
}

// put writes key=value with the test's client.
func put(t *testing.T, cli *clientv3.Client, key, value string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Put(ctx, key, value)
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return resp.Header.Revision
}

// gauge returns the value of the metric name (a gauge or counter) whose
// labels include the given name/value pairs; it fails the test if there is
// none.
func gauge(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || (lp.GetName() == labels[i] && lp.GetValue() == labels[i+1])
				}
				if !found {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s%v", name, labels)
	return 0
}

// configDefault returns the embedded default config file.
func configDefault(t *testing.T) []byte {
	t.Helper()
	return config.DefaultYAML()
}

// newClient returns a client of etcd configured as sluiced's (NewClient),
// closed when the test ends.
func newClient(t *testing.T, etcd *etcdtest.Server) *clientv3.Client {
	t.Helper()
	cli, err := NewClient(ClientOptions{Endpoints: etcd.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// leaseLoss wraps a client's leases and notes when the client gives a
// lease up: a keepalive channel it returned closes while its context
// lives (etcd has not answered for the lease's TTL).
type leaseLoss struct {
	clientv3.Lease
	once sync.Once
	lost chan struct{}
}

// watchLeaseLoss puts a leaseLoss between cli and its leases.
func watchLeaseLoss(cli *clientv3.Client) *leaseLoss {
	l := &leaseLoss{Lease: cli.Lease, lost: make(chan struct{})}
	cli.Lease = l
	return l
}

// KeepAlive forwards the client's keepalives and notes their end.
func (l *leaseLoss) KeepAlive(ctx context.Context, id clientv3.LeaseID) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	in, err := l.Lease.KeepAlive(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make(chan *clientv3.LeaseKeepAliveResponse)
	go func() {
		defer close(out)
		for r := range in {
			select {
			case out <- r:
			case <-ctx.Done():
				return
			}
		}
		if ctx.Err() == nil {
			l.once.Do(func() { close(l.lost) })
		}
	}()
	return out, nil
}

// given waits until the client has given a lease up.
func (l *leaseLoss) given(t *testing.T) {
	t.Helper()
	select {
	case <-l.lost:
	case <-time.After(30 * time.Second):
		t.Fatal("the client did not give its lease up within 30 s of etcd's going")
	}
}

// rewrittenWithoutDelete fails the test unless key, after revision from, is
// written again before any delete: whoever watches it never sees it gone.
func rewrittenWithoutDelete(t *testing.T, cli *clientv3.Client, key string, from int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for wr := range cli.Watch(ctx, key, clientv3.WithRev(from+1)) {
		if len(wr.Events) == 0 {
			continue
		}
		if ev := wr.Events[0]; ev.Type == clientv3.EventTypeDelete {
			t.Fatalf("%s deleted at revision %d: its watchers lost it", key, ev.Kv.ModRevision)
		}
		return
	}
	t.Fatalf("%s not written again after revision %d", key, from)
}
