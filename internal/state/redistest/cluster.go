package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-sched/sluice/internal/testdep"
)

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// Cluster is a running Redis Cluster of redis-server processes on loopback:
// masters that share the slots, each with its replicas.
type Cluster struct {
	t      testing.TB
	nodes  []*Server
	admin  map[string]*redis.Client // per node, for the helpers' own commands
	ids    map[string]string        // node id per address
	killed map[string]bool
	// replicasOf holds, per killed master, its replicas at the kill: once
	// one is promoted, CLUSTER NODES no longer says whose replica it was.
	replicasOf map[string][]string
	slotsOf    map[string]int // per killed master, the slots it served
}

// StartShardedCluster starts masters × (1 + replicasPerMaster) redis-server
// processes, joins them with redis-cli --cluster create (masters must be
// at least 3, as redis-cli requires), waits until every node sees every
// slot served and every replica has synced, and stops them all when the
// test ends. The nodes run with a 1 s node timeout, so that a failover
// takes seconds, and without full coverage required, so that the masters
// still alive keep answering while a dead master's slots have no server
// (a sharded store's point: one shard's outage touches only its keys).
func StartShardedCluster(t testing.TB, masters, replicasPerMaster int) *Cluster {
	t.Helper()
	testdep.Binary(t, "apt-get install -y redis-server", "redis-server")
	testdep.Binary(t, "apt-get install -y redis-tools", "redis-cli")
	if masters < 3 || replicasPerMaster < 0 {
		t.Fatalf("redistest: a sharded cluster needs at least 3 masters (redis-cli's minimum), got %d masters with %d replicas each", masters, replicasPerMaster)
	}
	c := &Cluster{
		t: t, admin: make(map[string]*redis.Client), ids: make(map[string]string),
		killed: make(map[string]bool), replicasOf: make(map[string][]string), slotsOf: make(map[string]int),
	}
	n := masters * (1 + replicasPerMaster)
	for range n {
		s := &Server{t: t, port: clusterPort(t), dir: t.TempDir(), cluster: true, extra: []string{
			"--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no",
		}}
		s.start()
		t.Cleanup(s.Stop)
		c.nodes = append(c.nodes, s)
		a := redis.NewClient(&redis.Options{
			Addr: s.Addr(), DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
			MaxRetries: -1, // the helpers poll, and a dead node must not cost retries
		})
		t.Cleanup(func() { _ = a.Close() })
		c.admin[s.Addr()] = a
	}
	ctx := context.Background()
	for _, s := range c.nodes {
		id, err := c.admin[s.Addr()].Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatalf("redistest: cluster myid on %s: %v", s.Addr(), err)
		}
		c.ids[s.Addr()] = id
	}
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	out, err := redisCLI(ctx, 30*time.Second, args...)
	if err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if why := c.poll(20*time.Second, func() string { return c.formed(masters, replicasPerMaster) }); why != "" {
		t.Fatalf("redistest: cluster of %d masters × %d replicas not formed within 20s: %s\nredis-cli said:\n%s", masters, replicasPerMaster, why, out)
	}
	return c
}

// clusterPort returns a free port P whose cluster bus port, P+10000, is
// free too (hence P below 55535).
func clusterPort(t testing.TB) int {
	for range 200 {
		p := freePort(t)
		if p+10000 > 65535 {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		if err != nil {
			continue
		}
		_ = l.Close()
		return p
	}
	t.Fatalf("redistest: no free port P with P+10000 free in 200 tries")
	return 0
}

// redisCLI runs redis-cli with args, at most within, returning its output.
func redisCLI(ctx context.Context, within time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	return string(out), err
}

// poll calls cond every 50 ms until it returns "" (done) or within has
// passed, and returns its last answer: why it is not done.
func (c *Cluster) poll(within time.Duration, cond func() string) string {
	deadline := time.Now().Add(within)
	for {
		why := cond()
		if why == "" || time.Now().After(deadline) {
			return why
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// live returns the addresses of the nodes not killed.
func (c *Cluster) live() []string {
	var out []string
	for _, s := range c.nodes {
		if !c.killed[s.Addr()] {
			out = append(out, s.Addr())
		}
	}
	return out
}

// formed says why the cluster is not formed yet on every node ("" once it
// is): state ok, every node known, every slot served, the roles agreed
// (a master votes for a replica's promotion only if it knows it as one)
// and every replica synced.
func (c *Cluster) formed(masters, replicasPerMaster int) string {
	ctx := context.Background()
	for _, addr := range c.live() {
		a := c.admin[addr]
		info, err := a.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Sprintf("%s: cluster info: %v", addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d\r", len(c.nodes))) {
			return fmt.Sprintf("%s: cluster info: %q", addr, info)
		}
		if why := c.covered(addr, ""); why != "" {
			return why
		}
		nodes, err := c.clusterNodes(addr)
		if err != nil {
			return err.Error()
		}
		var m, r int
		for _, n := range nodes {
			switch {
			case n.flags["fail"] || n.flags["fail?"] || n.flags["handshake"] || n.flags["noaddr"]:
			case n.flags["master"]:
				m++
			case n.flags["slave"]:
				r++
			}
		}
		if m != masters || r != masters*replicasPerMaster {
			return fmt.Sprintf("%s sees %d masters and %d replicas, want %d and %d", addr, m, r, masters, masters*replicasPerMaster)
		}
		repl, err := a.Info(ctx, "replication").Result()
		if err != nil {
			return fmt.Sprintf("%s: info replication: %v", addr, err)
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return fmt.Sprintf("%s: replica not synced: %q", addr, repl)
		}
	}
	return ""
}

// slotRange is slots Start to End (inclusive), served by master Addr.
type slotRange struct {
	start, end int64
	addr       string
}

// slotMap returns node addr's view of who serves which slots (CLUSTER
// SHARDS: each shard's slots, and its master's address).
func (c *Cluster) slotMap(addr string) ([]slotRange, error) {
	shards, err := c.admin[addr].ClusterShards(context.Background()).Result()
	if err != nil {
		return nil, fmt.Errorf("%s: cluster shards: %w", addr, err)
	}
	var out []slotRange
	for _, sh := range shards {
		master := ""
		for _, n := range sh.Nodes {
			if n.Role == "master" {
				master = net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
			}
		}
		for _, r := range sh.Slots {
			if master == "" {
				return nil, fmt.Errorf("%s: cluster shards: slots %d-%d have no master", addr, r.Start, r.End)
			}
			out = append(out, slotRange{start: r.Start, end: r.End, addr: master})
		}
	}
	return out, nil
}

// covered says why node addr does not see all 16384 slots served by a
// master other than not ("" when it does).
func (c *Cluster) covered(addr, not string) string {
	ranges, err := c.slotMap(addr)
	if err != nil {
		return err.Error()
	}
	n := 0
	for _, r := range ranges {
		if r.addr == not {
			return fmt.Sprintf("%s: slots %d-%d still served by %s", addr, r.start, r.end, not)
		}
		n += int(r.end - r.start + 1)
	}
	if n != clusterSlots {
		return fmt.Sprintf("%s sees %d slots served", addr, n)
	}
	return ""
}

// node is one line of CLUSTER NODES.
type node struct {
	id, addr, master string
	flags            map[string]bool
	slots            int  // slots it serves
	open             bool // a slot migrating or importing
}

// clusterNodes returns node addr's CLUSTER NODES.
func (c *Cluster) clusterNodes(addr string) ([]node, error) {
	text, err := c.admin[addr].ClusterNodes(context.Background()).Result()
	if err != nil {
		return nil, fmt.Errorf("%s: cluster nodes: %w", addr, err)
	}
	var out []node
	for line := range strings.SplitSeq(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("%s: cluster nodes: malformed line %q", addr, line)
		}
		hostport, _, _ := strings.Cut(f[1], "@") // ip:port@cport[,hostname]
		n := node{id: f[0], addr: hostport, master: f[3], flags: make(map[string]bool)}
		for fl := range strings.SplitSeq(f[2], ",") {
			n.flags[fl] = true
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				n.open = true
				continue
			}
			lo, hi, isRange := strings.Cut(r, "-")
			a, err1 := strconv.Atoi(lo)
			b := a
			var err2 error
			if isRange {
				b, err2 = strconv.Atoi(hi)
			}
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("%s: cluster nodes: malformed slots %q", addr, r)
			}
			n.slots += b - a + 1
		}
		out = append(out, n)
	}
	return out, nil
}

// anyNodes returns CLUSTER NODES from the first live node that answers.
func (c *Cluster) anyNodes() []node {
	c.t.Helper()
	var errs []error
	for _, addr := range c.live() {
		nodes, err := c.clusterNodes(addr)
		if err == nil {
			return nodes
		}
		errs = append(errs, err)
	}
	c.t.Fatalf("redistest: no live node answers: %v", errors.Join(errs...))
	return nil
}

// Addrs returns the addresses of every node not killed: seeds for a
// cluster client.
func (c *Cluster) Addrs() []string { return c.live() }

// Client returns a new cluster client with millisecond timeouts, closed
// at the end of the test. Unlike Server.Client it keeps go-redis's
// redirects (MaxRedirects 3): following MOVED and ASK is how a cluster
// client learns of a failover or a migration. MaxRetries 0 means no
// retries within one node.
func (c *Cluster) Client() *redis.ClusterClient {
	c.t.Helper()
	cl := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:        c.Addrs(),
		DialTimeout:  200 * time.Millisecond,
		ReadTimeout:  200 * time.Millisecond,
		WriteTimeout: 200 * time.Millisecond,
	})
	c.t.Cleanup(func() { _ = cl.Close() })
	if err := cl.Ping(context.Background()).Err(); err != nil {
		c.t.Fatalf("redistest: cluster ping: %v", err)
	}
	return cl
}

// Masters returns the addresses of the masters now (neither killed nor
// flagged failing), sorted, as a live node's CLUSTER NODES has them.
func (c *Cluster) Masters() []string {
	c.t.Helper()
	var out []string
	for _, n := range c.anyNodes() {
		if n.flags["master"] && !n.flags["fail"] && !n.flags["fail?"] && !c.killed[n.addr] {
			out = append(out, n.addr)
		}
	}
	slices.Sort(out)
	return out
}

// MasterOf returns the address of the master serving key's slot now, as
// a live node sees it.
func (c *Cluster) MasterOf(key string) string {
	c.t.Helper()
	var errs []error
	for _, addr := range c.live() {
		slot, err := c.admin[addr].ClusterKeySlot(context.Background(), key).Result()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ranges, err := c.slotMap(addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, r := range ranges {
			if r.start <= slot && slot <= r.end {
				return r.addr
			}
		}
		c.t.Fatalf("redistest: slot %d of %q is served by no master (as %s sees it)", slot, key, addr)
	}
	c.t.Fatalf("redistest: no live node answers for the slot of %q: %v", key, errors.Join(errs...))
	return ""
}

// server returns the node at addr, failing the test if there is none.
func (c *Cluster) server(addr string) *Server {
	c.t.Helper()
	for _, s := range c.nodes {
		if s.Addr() == addr {
			return s
		}
	}
	c.t.Fatalf("redistest: no node at %s", addr)
	return nil
}

// Kill kills the node at addr (SIGKILL, as a crash would).
func (c *Cluster) Kill(addr string) {
	c.t.Helper()
	s := c.server(addr)
	if c.killed[addr] {
		c.t.Fatalf("redistest: %s already killed", addr)
	}
	for _, n := range c.anyNodes() {
		switch {
		case n.master == c.ids[addr]:
			c.replicasOf[addr] = append(c.replicasOf[addr], n.addr)
		case n.addr == addr:
			c.slotsOf[addr] = n.slots
		}
	}
	s.Stop()
	c.killed[addr] = true
}

// WaitFailover waits, at most timeout, until a replica of the killed
// master old is promoted in every live node's view, serving all the
// slots old did, with the cluster state ok and every slot served; it
// returns the new master's address.
func (c *Cluster) WaitFailover(old string, timeout time.Duration) string {
	c.t.Helper()
	if !c.killed[old] {
		c.t.Fatalf("redistest: wait failover of %s, which was not killed", old)
	}
	if len(c.replicasOf[old]) == 0 {
		c.t.Fatalf("redistest: wait failover of %s, which had no replica", old)
	}
	var promoted string
	why := c.poll(timeout, func() string {
		promoted = ""
		for _, addr := range c.live() {
			info, err := c.admin[addr].ClusterInfo(context.Background()).Result()
			if err != nil {
				return fmt.Sprintf("%s: cluster info: %v", addr, err)
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Sprintf("%s: cluster info: %q", addr, info)
			}
			if why := c.covered(addr, old); why != "" {
				return why
			}
			nodes, err := c.clusterNodes(addr)
			if err != nil {
				return err.Error()
			}
			seen := ""
			for _, n := range nodes {
				if slices.Contains(c.replicasOf[old], n.addr) && n.flags["master"] && !n.flags["fail"] && !n.flags["fail?"] && n.slots == c.slotsOf[old] {
					seen = n.addr
				}
			}
			if seen == "" || promoted != "" && seen != promoted {
				return fmt.Sprintf("%s does not see one of %v promoted with %d slots (saw %q, others %q)", addr, c.replicasOf[old], c.slotsOf[old], seen, promoted)
			}
			promoted = seen
		}
		return ""
	})
	if why != "" {
		c.t.Fatalf("redistest: no failover of %s within %v: %s", old, timeout, why)
	}
	return promoted
}

// Reshard moves slots slots from master from to master to, live, with
// redis-cli --cluster reshard, and waits until every live node agrees on
// the new owner with no slot left migrating. It returns what went wrong,
// with redis-cli's output, rather than failing the test: it may run while
// other goroutines load the cluster.
func (c *Cluster) Reshard(from, to string, slots int) error {
	fromID, toID := c.ids[from], c.ids[to]
	if fromID == "" || toID == "" {
		return fmt.Errorf("redistest: reshard %s → %s: not nodes of this cluster", from, to)
	}
	args := []string{"--cluster", "reshard", from, "--cluster-from", fromID, "--cluster-to", toID,
		"--cluster-slots", strconv.Itoa(slots), "--cluster-yes"}
	out, err := redisCLI(context.Background(), 60*time.Second, args...)
	if err != nil {
		return fmt.Errorf("redistest: redis-cli %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	why := c.poll(10*time.Second, func() string {
		want := -1
		for _, addr := range c.live() {
			nodes, err := c.clusterNodes(addr)
			if err != nil {
				return err.Error()
			}
			for _, n := range nodes {
				if n.open {
					return fmt.Sprintf("%s sees %s with a slot still migrating", addr, n.addr)
				}
				if n.addr == to {
					if want >= 0 && n.slots != want {
						return fmt.Sprintf("%s sees %d slots on %s, another node %d", addr, n.slots, to, want)
					}
					want = n.slots
				}
			}
		}
		return ""
	})
	if why != "" {
		return fmt.Errorf("redistest: after reshard of %d slots %s → %s the nodes disagree: %s\nredis-cli said:\n%s", slots, from, to, why, out)
	}
	return nil
}

// SlotsPerMaster returns how many slots each master serves now.
func (c *Cluster) SlotsPerMaster() map[string]int {
	c.t.Helper()
	out := make(map[string]int)
	for _, n := range c.anyNodes() {
		if n.flags["master"] && !n.flags["fail"] && !n.flags["fail?"] && !c.killed[n.addr] {
			out[n.addr] = n.slots
		}
	}
	return out
}

// KeysPerMaster returns each master's DBSIZE.
func (c *Cluster) KeysPerMaster() map[string]int64 {
	c.t.Helper()
	out := make(map[string]int64)
	for _, m := range c.Masters() {
		n, err := c.admin[m].DBSize(context.Background()).Result()
		if err != nil {
			c.t.Fatalf("redistest: dbsize on %s: %v", m, err)
		}
		out[m] = n
	}
	return out
}

// housekeeping are the commands that are not a client's load: the
// helpers' own, a client's discovery of the cluster, replication's.
var housekeeping = map[string]bool{
	"info": true, "cluster": true, "config": true, "dbsize": true, "ping": true, "hello": true,
	"client": true, "command": true, "asking": true, "readonly": true, "replconf": true, "psync": true, "sync": true,
}

// commandStats returns node addr's calls per command (INFO commandstats;
// a subcommand, "cluster|slots", under its command).
func (c *Cluster) commandStats(addr string) map[string]int64 {
	c.t.Helper()
	text, err := c.admin[addr].Info(context.Background(), "commandstats").Result()
	if err != nil {
		c.t.Fatalf("redistest: info commandstats on %s: %v", addr, err)
	}
	out := make(map[string]int64)
	for line := range strings.SplitSeq(text, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found {
			continue
		}
		name, _, _ = strings.Cut(name, "|")
		for kv := range strings.SplitSeq(stats, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					c.t.Fatalf("redistest: info commandstats on %s: %q", addr, line)
				}
				out[name] += n
			}
		}
	}
	return out
}

// CommandsPerMaster returns, per master, the commands it ran since the
// last ResetStats (INFO commandstats), less housekeeping (INFO, CLUSTER,
// CONFIG, PING, replication's REPLCONF...): the load the clients put on
// it. Unlike total_commands_processed it counts the commands a script
// runs, so a master running big scripts shows the work they do.
func (c *Cluster) CommandsPerMaster() map[string]int64 {
	c.t.Helper()
	out := make(map[string]int64)
	for _, m := range c.Masters() {
		var n int64
		for name, calls := range c.commandStats(m) {
			if !housekeeping[name] {
				n += calls
			}
		}
		out[m] = n
	}
	return out
}

// CallsPerMaster returns, per master, the calls of one command (lower
// case: "evalsha") since the last ResetStats, failed ones included.
func (c *Cluster) CallsPerMaster(command string) map[string]int64 {
	c.t.Helper()
	out := make(map[string]int64)
	for _, m := range c.Masters() {
		out[m] = c.commandStats(m)[command]
	}
	return out
}

// ResetStats zeroes every live node's statistics (CONFIG RESETSTAT), so
// that a test measures its own window.
func (c *Cluster) ResetStats() {
	c.t.Helper()
	for _, addr := range c.live() {
		if err := c.admin[addr].ConfigResetStat(context.Background()).Err(); err != nil {
			c.t.Fatalf("redistest: config resetstat on %s: %v", addr, err)
		}
	}
}
