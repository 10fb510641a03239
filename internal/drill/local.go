package drill

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"google.golang.org/grpc"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/client"
	"github.com/sluice-sched/sluice/admission/client/etcdmembers"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/etcdembed"
)

// FleetConfig is the self-contained fleet's config: tenants gold and silver
// with floors, bronze limited by its quota, spiky with a short burst-credit
// window for credit-exhaustion.
//
//go:embed fleet-config.yaml
var FleetConfig []byte

// FleetTopology is the self-contained fleet's cluster: four HGX H200 nodes,
// hgx-1 … hgx-4, each its own domain and its own agent.
//
//go:embed fleet-topology.yaml
var FleetTopology []byte

// FleetPolicy is FleetConfig parsed: the drills read the tenants' floors,
// quotas and breaker from it.
func FleetPolicy() (*admission.Config, error) {
	c, err := config.Parse("fleet-config.yaml", FleetConfig)
	if err != nil {
		return nil, fmt.Errorf("the self-contained fleet's config: %w", err)
	}
	return &c, nil
}

// FleetNodes are FleetTopology's nodes, one agent each.
var FleetNodes = []string{"hgx-1", "hgx-2", "hgx-3", "hgx-4"}

// Self-contained fleet settings: TTLs shorter than the defaults (10 s) so
// that a killed agent or replica leaves within a drill's phase, yet longer
// than the etcd client's redial backoff (capped at 2 s): with 2 s, an etcd
// restart let every agent's lease lapse before the agents reconnected, and
// the replicas refused CAPACITY_EXCEEDED everywhere until they republished.
const (
	localTTL      = 5 * time.Second
	localInterval = 100 * time.Millisecond
	localPrefix   = "/sluice/"
	rogueSuffix   = "-rogue/"
	startTimeout  = 60 * time.Second
)

// LocalOptions say what fleet to start.
type LocalOptions struct {
	// Replicas is the number of sluiced replicas (default 2).
	Replicas int
	// Sluiced and Agent are the binaries; empty: next to this executable,
	// else built with `go build` from the module (into Dir).
	Sluiced, Agent string
	// RedisServer is the redis-server binary (default: from PATH).
	RedisServer string
	// Dir holds the fleet's files; empty: a temporary directory, removed
	// at Close.
	Dir string
	// Log receives the children's output (nil: discarded).
	Log io.Writer
	// IgnoreDrains starts replica 1 on a control-plane prefix of its own, so
	// that it never sees a drain mark, and registers it in the fleet's
	// membership by hand: a replica that ignores drains, for the test that
	// shows the drain drill catches one.
	IgnoreDrains bool
}

// Local is a fleet the drill started: redis-server, an embedded etcd, node
// agents and sluiced replicas, all on free loopback ports.
type Local struct {
	opts     LocalOptions
	dir      string
	redis    *proc
	redisURL string
	etcd     *localEtcd
	agents   map[string]*proc
	replicas map[string]*proc
	ids      []string
}

// StartLocal starts a self-contained fleet and returns it as a Fleet ready
// for load (every replica registered, every agent published). On error
// everything started is stopped again.
func StartLocal(ctx context.Context, opts LocalOptions) (f *Fleet, err error) {
	if opts.Replicas == 0 {
		opts.Replicas = 2
	}
	if opts.Replicas < 1 {
		return nil, fmt.Errorf("--replicas %d: want at least 1", opts.Replicas)
	}
	l := &Local{opts: opts, agents: map[string]*proc{}, replicas: map[string]*proc{}}
	f = &Fleet{Prefix: localPrefix, Replicas: opts.Replicas, Interval: localInterval, MemberTTL: localTTL, Faults: l, Local: l}
	defer func() {
		if err != nil {
			f.Close()
			f = nil
		}
	}()
	if l.dir = opts.Dir; l.dir == "" {
		if l.dir, err = os.MkdirTemp("", "sluice-drill-"); err != nil {
			return f, fmt.Errorf("fleet dir: %w", err)
		}
		f.onClose(func() { _ = os.RemoveAll(l.dir) })
	}
	cfgPath, topoPath := filepath.Join(l.dir, "config.yaml"), filepath.Join(l.dir, "topology.yaml")
	if err := os.WriteFile(cfgPath, FleetConfig, 0o644); err != nil {
		return f, fmt.Errorf("fleet config: %w", err)
	}
	if err := os.WriteFile(topoPath, FleetTopology, 0o644); err != nil {
		return f, fmt.Errorf("fleet topology: %w", err)
	}
	sluiced, agent, err := l.binaries(ctx)
	if err != nil {
		return f, err
	}
	// Redis.
	redisBin := opts.RedisServer
	if redisBin == "" {
		if redisBin, err = exec.LookPath("redis-server"); err != nil {
			return f, errors.New("redis-server not found on PATH (apt-get install -y redis-server): the self-contained fleet shares its quotas through it")
		}
	}
	port, err := freePort()
	if err != nil {
		return f, err
	}
	l.redisURL = "redis://127.0.0.1:" + strconv.Itoa(port)
	l.redis = &proc{name: "redis", path: redisBin, ready: "Ready to accept connections", logw: nil,
		args: []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", l.dir, "--protected-mode", "no"}}
	f.onClose(func() { _ = l.redis.stop(true, 0) })
	if err := l.redis.start(ctx, startTimeout); err != nil {
		return f, err
	}
	// etcd, in this process.
	if l.etcd, err = newLocalEtcd(filepath.Join(l.dir, "etcd")); err != nil {
		return f, err
	}
	f.onClose(l.etcd.stop)
	if err := l.etcd.start(ctx); err != nil {
		return f, err
	}
	if f.Etcd, err = clientv3.New(clientv3.Config{Endpoints: []string{l.etcd.endpoint()}, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop()}); err != nil {
		return f, fmt.Errorf("etcd client: %w", err)
	}
	f.onClose(func() { _ = f.Etcd.Close() })
	// Agents: one per node, each publishing its node of the drill topology.
	for _, node := range FleetNodes {
		p := &proc{name: "agent " + node, path: agent, logw: opts.Log, args: []string{"--etcd", l.etcd.endpoint(),
			"--etcd-prefix", localPrefix, "--node", node, "--topology", topoPath, "--ttl", localTTL.String(),
			"--rediscover", "0", "--log-level", "warn"}}
		l.agents[node] = p
		f.onClose(func() { _ = p.stop(false, 3*time.Second) })
		if err := l.Start(ctx, Part{Kind: "agent", Name: node}); err != nil {
			return f, err
		}
	}
	// Replicas.
	for i := 1; i <= opts.Replicas; i++ {
		id := "replica-" + strconv.Itoa(i)
		gport, err := freePort()
		if err != nil {
			return f, err
		}
		hport, err := freePort()
		if err != nil {
			return f, err
		}
		addr := "127.0.0.1:" + strconv.Itoa(gport)
		prefix := localPrefix
		if opts.IgnoreDrains && i == 1 {
			prefix = "/sluice" + rogueSuffix
		}
		p := &proc{name: id, path: sluiced, logw: opts.Log, args: []string{"--grpc-addr", addr,
			"--http-addr", "127.0.0.1:" + strconv.Itoa(hport), "--redis", l.redisURL, "--redis-mode", "batched",
			"--replicas", strconv.Itoa(opts.Replicas), "--redis-interval", localInterval.String(),
			"--etcd", l.etcd.endpoint(), "--etcd-prefix", prefix, "--replica-id", id, "--advertise-addr", addr,
			"--member-ttl", localTTL.String(), "--config", cfgPath, "--topology", topoPath, "--log-level", "warn",
			"--data-dir", filepath.Join(l.dir, id)}}
		// --data-dir is each replica's own, under the fleet's directory:
		// with --redis its deferred backlog is in Redis Streams, and the
		// directory is where its embedded durable state would go.
		l.replicas[id] = p
		l.ids = append(l.ids, id)
		f.onClose(func() { _ = p.stop(false, 5*time.Second) })
		if err := l.Start(ctx, Part{Kind: "replica", Name: id}); err != nil {
			return f, err
		}
		if prefix != localPrefix {
			// The rogue registers under its own prefix; the drill enters it
			// in the fleet's membership so that routers send it tenants.
			if err := l.registerRogue(ctx, f, client.Member{ID: id, Addr: addr}); err != nil {
				return f, err
			}
		}
	}
	f.Router = client.NewRouter(etcdmembers.NewSource(f.Etcd, localPrefix, slog.New(slog.DiscardHandler)),
		client.Security{}.Dialer())
	f.onClose(func() { _ = f.Router.Close() })
	if err := waitFor(ctx, startTimeout, func() bool { return len(f.Router.Members()) == opts.Replicas }); err != nil {
		return f, fmt.Errorf("router: %d of %d replicas registered: %w", len(f.Router.Members()), opts.Replicas, err)
	}
	return f, nil
}

// binaries finds sluiced and sluice-agent: the options, else beside this
// executable (an installed sluicectl), else built from the module.
func (l *Local) binaries(ctx context.Context) (sluiced, agent string, err error) {
	sluiced, agent = l.opts.Sluiced, l.opts.Agent
	if exe, err := os.Executable(); err == nil {
		for _, b := range []*string{&sluiced, &agent} {
			name := map[*string]string{&sluiced: "sluiced", &agent: "sluice-agent"}[b]
			if p := filepath.Join(filepath.Dir(exe), name); *b == "" && isFile(p) {
				*b = p
			}
		}
	}
	for _, b := range []struct {
		path *string
		pkg  string
	}{{&sluiced, "github.com/sluice-sched/sluice/cmd/sluiced"}, {&agent, "github.com/sluice-sched/sluice/cmd/sluice-agent"}} {
		if *b.path != "" {
			continue
		}
		out := filepath.Join(l.dir, filepath.Base(b.pkg))
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, b.pkg)
		if msg, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("build %s (give --sluiced and --agent, or run inside the sluice module): %w: %s", b.pkg, err, msg)
		}
		*b.path = out
	}
	return sluiced, agent, nil
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// registerRogue writes the rogue replica's member entry under the fleet's
// prefix, on a lease the drill keeps alive until Close.
func (l *Local) registerRogue(ctx context.Context, f *Fleet, m client.Member) error {
	lease, err := f.Etcd.Grant(ctx, int64(localTTL/time.Second))
	if err != nil {
		return fmt.Errorf("rogue member lease: %w", err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	f.onClose(cancel)
	ka, err := f.Etcd.KeepAlive(kctx, lease.ID)
	if err != nil {
		return fmt.Errorf("rogue member keepalive: %w", err)
	}
	go func() {
		for range ka {
		}
	}()
	v, err := etcdmembers.Encode(m)
	if err != nil {
		return err
	}
	if _, err := f.Etcd.Put(ctx, etcdmembers.Key(localPrefix, m.ID), string(v), clientv3.WithLease(lease.ID)); err != nil {
		return fmt.Errorf("rogue member: %w", err)
	}
	return nil
}

// Replicas are the replicas' ids, in start order.
func (l *Local) Replicas() []string { return l.ids }

// Stop implements Faults: redis-server and replicas are killed (SIGKILL, a
// crash: Redis loses its data, a replica its leases), etcd is closed, an
// agent is killed (its lease then expires, as a dead node's does).
func (l *Local) Stop(ctx context.Context, p Part) error {
	switch p.Kind {
	case "redis":
		return l.redis.stop(true, 0)
	case "etcd":
		l.etcd.stop()
		return nil
	case "agent":
		a, ok := l.agents[p.Name]
		if !ok {
			return fmt.Errorf("agent %q: the fleet's nodes are %v", p.Name, FleetNodes)
		}
		return a.stop(true, 0)
	case "replica":
		r, ok := l.replicas[p.Name]
		if !ok {
			return fmt.Errorf("replica %q: the fleet's replicas are %v", p.Name, l.ids)
		}
		return r.stop(true, 0)
	}
	return fmt.Errorf("part %q: want redis, etcd, agent or replica", p.Kind)
}

// Start implements Faults: it starts the part again with its arguments and
// waits until it serves (redis answers, etcd is ready, the agent's record or
// the replica's membership is in etcd).
func (l *Local) Start(ctx context.Context, p Part) error {
	switch p.Kind {
	case "redis":
		return l.redis.start(ctx, startTimeout)
	case "etcd":
		return l.etcd.start(ctx)
	case "agent":
		a, ok := l.agents[p.Name]
		if !ok {
			return fmt.Errorf("agent %q: the fleet's nodes are %v", p.Name, FleetNodes)
		}
		if err := a.start(ctx, startTimeout); err != nil {
			return err
		}
		return l.waitKey(ctx, localPrefix+"agents/"+p.Name)
	case "replica":
		r, ok := l.replicas[p.Name]
		if !ok {
			return fmt.Errorf("replica %q: the fleet's replicas are %v", p.Name, l.ids)
		}
		if err := r.start(ctx, startTimeout); err != nil {
			return err
		}
		return waitServing(ctx, r)
	}
	return fmt.Errorf("part %q: want redis, etcd, agent or replica", p.Kind)
}

// waitKey waits until key exists in etcd.
func (l *Local) waitKey(ctx context.Context, key string) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{l.etcd.endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	defer cli.Close()
	err = waitFor(ctx, startTimeout, func() bool {
		gctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		resp, err := cli.Get(gctx, key, clientv3.WithCountOnly())
		return err == nil && resp.Count > 0
	})
	if err != nil {
		return fmt.Errorf("%s not in etcd: %w", key, err)
	}
	return nil
}

// waitServing waits until the replica's gRPC server answers health
// SERVING; a replica that exits meanwhile is an error at once.
func waitServing(ctx context.Context, p *proc) error {
	addr := p.args[1] // --grpc-addr's value
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("replica %s: %w", addr, err)
	}
	defer cc.Close()
	h := healthpb.NewHealthClient(cc)
	err = waitFor(ctx, startTimeout, func() bool {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		r, err := h.Check(cctx, &healthpb.HealthCheckRequest{})
		return p.exited() || err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	if err == nil && p.exited() {
		return fmt.Errorf("%s exited at start (--fleet-log shows why)", p.name)
	}
	if err != nil {
		return fmt.Errorf("replica %s not serving: %w", addr, err)
	}
	return nil
}

// waitFor polls cond every 20 ms until it holds, ctx ends or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// localEtcd is an etcd server in this process (embed), on fixed ports and a
// kept data directory, so that a stop and start is an outage, not a new
// cluster. The fleet dials it through a TCP relay (front): a stop closes
// the relay and every connection through it first, so the fleet sees etcd
// gone at once and the server's close does not wait for their open
// watches (its request timeout, 7 s), and the outage is as long as the
// drill holds it.
type localEtcd struct {
	dir                   string
	client, backend, peer url.URL // client: the relay's, which the fleet dials
	mu                    sync.Mutex
	e                     *embed.Etcd
	front                 *relay
}

func newLocalEtcd(dir string) (*localEtcd, error) {
	var ports [3]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	at := func(p int) url.URL { return url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(p)} }
	return &localEtcd{dir: dir, client: at(ports[0]), backend: at(ports[1]), peer: at(ports[2])}, nil
}

func (s *localEtcd) endpoint() string { return s.client.String() }

// start starts etcd, retrying while its ports are still held by the last
// run's sockets, then opens the relay to it.
func (s *localEtcd) start(ctx context.Context) error {
	var err error
	for range 100 {
		if err = s.startOnce(); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcd: start: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err != nil {
		return err
	}
	front, err := openRelay(s.client.Host, s.backend.Host)
	if err != nil {
		return fmt.Errorf("etcd: relay: %w", err)
	}
	s.mu.Lock()
	s.front = front
	s.mu.Unlock()
	return nil
}

func (s *localEtcd) startOnce() error {
	e, err := etcdembed.Start(etcdembed.Options{Name: "drill", Dir: s.dir, Listen: s.backend, Advertise: s.client, Peer: s.peer,
		Ready: startTimeout})
	if err != nil {
		return err // it names etcd's start
	}
	s.mu.Lock()
	s.e = e
	s.mu.Unlock()
	return nil
}

// stop closes the relay and its connections (the fleet sees etcd gone at
// once), then etcd.
func (s *localEtcd) stop() {
	s.mu.Lock()
	e, front := s.e, s.front
	s.e, s.front = nil, nil
	s.mu.Unlock()
	if front != nil {
		front.close()
	}
	if e != nil {
		e.Close()
	}
}

// relay is a TCP relay from a listening address to another: every
// connection accepted is piped to a new one to the target, until close
// ends them all.
type relay struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// openRelay listens on from and relays to to.
func openRelay(from, to string) (*relay, error) {
	ln, err := net.Listen("tcp", from)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", from, err)
	}
	r := &relay{ln: ln, conns: map[net.Conn]struct{}{}}
	r.wg.Go(func() { r.accept(to) })
	return r, nil
}

func (r *relay) accept(to string) {
	for {
		in, err := r.ln.Accept()
		if err != nil {
			return // closed
		}
		out, err := net.Dial("tcp", to)
		if err != nil {
			_ = in.Close()
			continue
		}
		if !r.track(in, out) {
			return
		}
		r.wg.Go(func() { r.pipe(in, out) })
		r.wg.Go(func() { r.pipe(out, in) })
	}
}

// track records a connection pair; false (both closed) once the relay is
// closed.
func (r *relay) track(in, out net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns == nil {
		_, _ = in.Close(), out.Close()
		return false
	}
	r.conns[in], r.conns[out] = struct{}{}, struct{}{}
	return true
}

// pipe copies src to dst, and closes and forgets both when either side
// ends.
func (r *relay) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	_, _ = dst.Close(), src.Close()
	r.mu.Lock()
	delete(r.conns, dst) // a no-op on the nil map of a closed relay
	delete(r.conns, src)
	r.mu.Unlock()
}

// close stops accepting and ends every connection through the relay, and
// waits for its goroutines.
func (r *relay) close() {
	_ = r.ln.Close()
	r.mu.Lock()
	for c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
	r.mu.Unlock()
	r.wg.Wait()
}

// String describes the fleet for the report.
func (l *Local) String() string {
	b, _ := json.Marshal(map[string]any{"redis": l.redisURL, "etcd": l.etcd.endpoint(), "replicas": l.ids, "agents": FleetNodes})
	return string(b)
}
