// Package redisstate implements sharing.Store on Redis (go-redis
// UniversalClient: standalone, Sentinel or Cluster; Redis 7 or later).
//
// Every key is under the hash tag of what it belongs to — a tenant's
// buckets under {prefix/t/TENANT}, a domain's buckets and KV under
// {prefix/d/DOMAIN} — so that a Cluster spreads tenants and domains over
// its masters. Each operation is one Lua script call per node that holds
// its keys, loaded once and run by EVALSHA (go-redis falls back to EVAL,
// which loads it again, on NOSCRIPT). The scripts declare one key, which
// routes the call to its node, take the others as arguments, and run with
// allow-cross-slot-keys: one call covers every slot the node serves. They
// use Redis server TIME as the clock and PEXPIRE every key they write.
package redisstate

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-sched/sluice/admission/sharing"
)

var (
	//go:embed reconcile.lua
	reconcileLua string
	//go:embed commit.lua
	commitLua string
	//go:embed settle.lua
	settleLua string

	reconcileScript = redis.NewScript(reconcileLua)
	commitScript    = redis.NewScript(commitLua)
	settleScript    = redis.NewScript(settleLua)
)

// Store is the Redis shared state. It is safe for concurrent use.
type Store struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // rdb, when it is a Cluster client
	prefix  string
	nodes   sync.Map // master address → its *redis.Client, as Shard found them
}

// New returns a store keeping its keys under hash tags that start with
// prefix (default "sluice").
func New(rdb redis.UniversalClient, prefix string) *Store {
	if prefix == "" {
		prefix = "sluice"
	}
	cluster, _ := rdb.(*redis.ClusterClient)
	return &Store{rdb: rdb, cluster: cluster, prefix: prefix}
}

// CommitSHA returns the SHA1 the strict commit script runs under (EVALSHA).
func CommitSHA() string { return commitScript.Hash() }

// Key returns the Redis key of an engine key ("t/acme/rps" is
// "{sluice/t/acme}/rps"): everything up to the key's last slash is its
// owner, and the owner is the hash tag.
func (s *Store) Key(k string) string {
	i := strings.LastIndexByte(k, '/')
	if i < 0 {
		return "{" + s.prefix + "}/" + k
	}
	return "{" + s.prefix + "/" + k[:i] + "}" + k[i:]
}

// Shard implements sharing.Sharded: the address of the master
// that serves the key now, or "" when Redis is not a Cluster.
func (s *Store) Shard(k string) string {
	if s.cluster == nil {
		return ""
	}
	c, err := s.cluster.MasterForKey(context.Background(), s.Key(k))
	if err != nil {
		return "" // no slot map yet: the call finds its node by itself
	}
	addr := c.Options().Addr
	if _, ok := s.nodes.Load(addr); !ok {
		s.nodes.Store(addr, c)
	}
	return addr
}

// Load loads the scripts (SCRIPT LOAD) on every master, so that the first
// decision does not pay for it; calls reload them by themselves after a
// flush, a restart or a failover.
func (s *Store) Load(ctx context.Context) error {
	load := func(ctx context.Context, c redis.Scripter) error {
		for _, sc := range []*redis.Script{reconcileScript, commitScript, settleScript} {
			if err := sc.Load(ctx, c).Err(); err != nil {
				return fmt.Errorf("redis: script load: %w", err)
			}
		}
		return nil
	}
	if s.cluster != nil {
		return s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) })
	}
	return load(ctx, s.rdb)
}

func micros(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) }
func itoa(v int64) string           { return strconv.FormatInt(v, 10) }
func float(v float64) string        { return strconv.FormatFloat(v, 'g', -1, 64) }

func resume(r bool) string {
	if r {
		return "1"
	}
	return "0"
}

// reloadSlots has a Cluster client read the slot map again, in the
// background: a call sent straight to a node (not through the client,
// which would follow MOVED itself) failed or found a key gone, after a
// failover or a slot migration.
func (s *Store) reloadSlots() {
	if s.cluster != nil {
		s.cluster.ReloadState(context.Background())
	}
}

// group is the part of a call that one node serves: the indices of its
// keys in the call.
type group struct {
	node redis.Scripter
	at   []int
}

// groups splits keys by the master that serves them: one group over
// every key for a store that is not a Cluster.
func (s *Store) groups(ctx context.Context, keys []string) ([]group, error) {
	if s.cluster == nil {
		at := make([]int, len(keys))
		for i := range at {
			at[i] = i
		}
		return []group{{node: s.rdb, at: at}}, nil
	}
	var out []group
	byNode := make(map[*redis.Client]int)
	for i, k := range keys {
		c, err := s.cluster.MasterForKey(ctx, k)
		if err != nil {
			return nil, fmt.Errorf("redis: slot of %s: %w", k, err)
		}
		g, ok := byNode[c]
		if !ok {
			g = len(out)
			byNode[c] = g
			out = append(out, group{node: c})
		}
		out[g].at = append(out[g].at, i)
	}
	return out, nil
}

// Reconcile implements sharing.Store: one script call per node,
// in parallel; a key whose node has changed since the slot map was read
// (a failover, a slot migration) is sent again on its own, through the
// client, which follows MOVED and ASK.
func (s *Store) Reconcile(ctx context.Context, req *sharing.ReconcileRequest) (*sharing.ReconcileReply, error) {
	nb, ng := len(req.Buckets), len(req.Gauges)
	keys := make([]string, 0, nb+ng+len(req.Engines))
	for _, b := range req.Buckets {
		keys = append(keys, s.Key(b.Key))
	}
	for _, g := range req.Gauges {
		keys = append(keys, s.Key(g.Key))
	}
	for _, e := range req.Engines {
		keys = append(keys, s.Key(e.Key))
	}
	if len(keys) == 0 {
		if err := s.pingShard(ctx, req.Shard); err != nil {
			return nil, fmt.Errorf("redis: reconcile: %w", err)
		}
		return &sharing.ReconcileReply{}, nil
	}
	groups, err := s.groups(ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("redis: reconcile: %w", err)
	}
	res := make([]any, len(keys))
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for gi, g := range groups {
		wg.Go(func() {
			err := s.reconcileOn(ctx, g.node, req, keys, g.at, res)
			if isRedirect(err) {
				err = nil // nothing ran: its keys go again through the client
			}
			errs[gi] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		s.reloadSlots()
		return nil, fmt.Errorf("redis: reconcile: %w", err)
	}
	if err := s.resend(ctx, req, keys, res); err != nil {
		return nil, fmt.Errorf("redis: reconcile: %w", err)
	}
	rep := &sharing.ReconcileReply{
		Buckets:  make([]sharing.BucketGrant, nb),
		Gauges:   make([]int64, ng),
		Readings: make([]*sharing.EngineReading, ng+len(req.Engines)),
	}
	for i := range req.Buckets {
		pair, ok := res[i].([]any)
		if !ok || len(pair) != 2 {
			return nil, fmt.Errorf("redis: reconcile: bucket %s: malformed reply %v", req.Buckets[i].Key, res[i])
		}
		rate, ok1 := pair[0].(int64)
		level, ok2 := pair[1].(int64)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("redis: reconcile: bucket %s: malformed reply %v", req.Buckets[i].Key, pair)
		}
		rep.Buckets[i] = sharing.BucketGrant{RateMilli: rate, Level: level}
	}
	for i := range req.Gauges {
		var ok bool
		if rep.Gauges[i], rep.Readings[i], ok = gaugeReply(res[nb+i]); !ok {
			return nil, fmt.Errorf("redis: reconcile: gauge %s: malformed reply %v", req.Gauges[i].Key, res[nb+i])
		}
	}
	for i := range req.Engines {
		var ok bool
		if rep.Readings[ng+i], ok = readingReply(res[nb+ng+i]); !ok {
			return nil, fmt.Errorf("redis: reconcile: engines of %s: malformed reply %v", req.Engines[i].Key, res[nb+ng+i])
		}
	}
	return rep, nil
}

// gaugeReply reads the script's answer for a gauge: the replica's limit,
// alone or with its domain's engine reading ({limit, reading}).
func gaugeReply(v any) (int64, *sharing.EngineReading, bool) {
	if limit, ok := v.(int64); ok {
		return limit, nil, true
	}
	pair, ok := v.([]any)
	if !ok || len(pair) != 2 {
		return 0, nil, false
	}
	limit, ok := pair[0].(int64)
	r, ok2 := readingReply(pair[1])
	return limit, r, ok && ok2 && r != nil
}

// readingReply reads an engine reading as the script answers it: 0 where
// the domain has none (or only the asking replica's), else {queue,
// running, kv usage, age_us, stamp}, the first three strings.
func readingReply(v any) (*sharing.EngineReading, bool) {
	if n, ok := v.(int64); ok {
		return nil, n == 0
	}
	f, ok := v.([]any)
	if !ok || len(f) != 5 {
		return nil, false
	}
	age, ok := f[3].(int64)
	stamp, ok2 := f[4].(int64)
	if !ok || !ok2 {
		return nil, false
	}
	var nums [3]float64
	for i := range nums {
		s, isStr := f[i].(string)
		n, err := strconv.ParseFloat(s, 64)
		if !isStr || err != nil {
			return nil, false
		}
		nums[i] = n
	}
	return &sharing.EngineReading{Queue: nums[0], Running: nums[1], KVUsage: nums[2], Age: time.Duration(age) * time.Microsecond, Stamp: stamp}, true
}

// isRedirect reports whether err is a Cluster redirection (MOVED, ASK):
// the script's routing key is elsewhere, and nothing ran.
func isRedirect(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ")
}

// resend sends the keys no node answered for (their slot moved since the
// slot map was read) through the client, which follows MOVED and ASK: one
// call for all of them, routed by the first, again for those its node did
// not serve either, while each call answers some.
func (s *Store) resend(ctx context.Context, req *sharing.ReconcileRequest, keys []string, res []any) error {
	var pending []int
	for i := range res {
		if res[i] == nil {
			pending = append(pending, i)
		}
	}
	if len(pending) > 0 {
		s.reloadSlots()
	}
	for len(pending) > 0 {
		if err := s.reconcileOn(ctx, s.rdb, req, keys, pending, res); err != nil {
			return fmt.Errorf("%s: %w", keys[pending[0]], err)
		}
		left := pending[:0]
		for _, i := range pending {
			if res[i] == nil {
				left = append(left, i)
			}
		}
		if len(left) == len(pending) {
			return fmt.Errorf("%s: not served by the node its slot maps to", keys[pending[0]])
		}
		pending = left
	}
	return nil
}

// reconcileOn runs the reconcile script on one node for the request's
// keys at the indices at (ascending: buckets first, then gauges, then
// engine readings), storing each
// answer at its index in res (nil where the node did not serve the key).
func (s *Store) reconcileOn(ctx context.Context, node redis.Scripter, req *sharing.ReconcileRequest, keys []string, at []int, res []any) error {
	nb, ng := len(req.Buckets), len(req.Gauges)
	var buckets, gauges, engines []int
	for _, i := range at {
		switch {
		case i < nb:
			buckets = append(buckets, i)
		case i < nb+ng:
			gauges = append(gauges, i-nb)
		default:
			engines = append(engines, i-nb-ng)
		}
	}
	args := make([]any, 0, 7+len(at)+10*len(buckets)+4*len(gauges)+5*len(engines))
	args = append(args, req.Replica, micros(req.Stale), len(buckets), req.Replicas, micros(req.Rejoin), len(gauges), len(engines))
	for _, i := range at {
		args = append(args, keys[i])
	}
	for _, i := range buckets {
		b := &req.Buckets[i]
		args = append(args, itoa(b.Rate), itoa(b.Burst), itoa(b.Cum), itoa(b.Unacked), itoa(b.Demand),
			strconv.FormatUint(b.Epoch, 10), micros(b.Age), resume(b.Resume), itoa(b.Held), micros(b.Span))
	}
	for _, i := range gauges {
		g := &req.Gauges[i]
		args = append(args, itoa(g.Limit), itoa(g.Held), itoa(g.Share), micros(g.TTL))
	}
	for _, i := range engines {
		if r := req.Engines[i].Reading; r != nil {
			args = append(args, "1", float(r.Queue), float(r.Running), float(r.KVUsage), micros(max(r.Age, 0)))
		} else {
			args = append(args, "0", "0", "0", "0", "0")
		}
	}
	out, err := reconcileScript.Run(ctx, node, keys[at[0]:at[0]+1], args...).Slice()
	if err != nil {
		return err
	}
	if len(out) != len(at) {
		return fmt.Errorf("%d results for %d keys", len(out), len(at))
	}
	for j, i := range at { // in order: buckets first, as the script answers
		res[i] = out[j]
	}
	return nil
}

// kvKeys returns the KV holds hash and expiry zset of a gauge key.
func (s *Store) kvKeys(k string) (string, string) {
	key := s.Key(k)
	return key + ":holds", key + ":expiry"
}

// kvAliveKey returns the hash of the replicas' liveness on a gauge key's
// holds (see sharing.KVHold.Alive).
func (s *Store) kvAliveKey(k string) string { return s.Key(k) + ":alive" }

// Commit implements sharing.Store. Where the decision's buckets
// and its KV are on one node (always, but on a Cluster whose tenant and
// domain slots fall on two masters), one script takes them all or none.
// Otherwise the buckets on other nodes than the KV's are taken first, one
// call per node, and the KV's node decides last; a refusal there gives
// back what the first calls took. Each node's part is atomic on its own:
// no bucket ever goes below its minimum.
func (s *Store) Commit(ctx context.Context, c *sharing.StrictCharge) (sharing.StrictVerdict, error) {
	hk, zk := s.kvKeys(c.KV.Key)
	keys := make([]string, 0, len(c.Takes)+1)
	for _, t := range c.Takes {
		keys = append(keys, s.Key(t.Key))
	}
	keys = append(keys, hk)
	groups, err := s.groups(ctx, keys)
	if err != nil {
		return sharing.StrictVerdict{}, fmt.Errorf("redis: commit: %w", err)
	}
	levels := make([]int64, len(c.Takes))
	var taken []group // committed parts on other nodes than the KV's
	for _, g := range kvLast(groups, len(keys)-1) {
		withKV := g.at[len(g.at)-1] == len(keys)-1
		takes := g.at
		if withKV {
			takes = g.at[:len(g.at)-1]
		}
		args := make([]any, 0, 1+len(takes)+2+4*len(takes)+7)
		args = append(args, len(takes))
		for _, i := range takes {
			args = append(args, keys[i])
		}
		lease, h, z, a := "", "", "", ""
		if withKV {
			lease, h, z, a = c.KV.Lease, hk, zk, s.kvAliveKey(c.KV.Key)
		}
		args = append(args, h, z)
		for _, i := range takes {
			t := &c.Takes[i]
			args = append(args, itoa(t.Rate), itoa(t.Burst), itoa(t.Amount), itoa(t.Min))
		}
		args = append(args, lease, itoa(c.KV.Limit), itoa(c.KV.Bytes), micros(c.KV.TTL), c.KV.Replica, micros(max(c.KV.Alive, 0)), a)
		res, err := commitScript.Run(ctx, g.node, keys[g.at[0]:g.at[0]+1], args...).Int64Slice()
		if err != nil {
			s.reloadSlots()
			return sharing.StrictVerdict{}, fmt.Errorf("redis: commit: %w", err)
		}
		switch {
		case len(res) == 1 && res[0] == 1 && withKV: // committed by an earlier call
			return sharing.StrictVerdict{Admitted: true}, nil
		case len(res) == 1+len(takes) && res[0] == 1:
			for j, i := range takes {
				levels[i] = res[1+j]
			}
			if !withKV {
				taken = append(taken, g)
			}
		case len(res) == 3 && res[0] == 0:
			refused := len(c.Takes) // the KV
			if int(res[1]) < len(takes) {
				refused = takes[res[1]]
			}
			s.giveBack(ctx, c, keys, taken)
			return sharing.StrictVerdict{Refused: refused, RetryAfter: time.Duration(res[2]) * time.Microsecond}, nil
		default:
			return sharing.StrictVerdict{}, fmt.Errorf("redis: commit: malformed reply %v", res)
		}
	}
	return sharing.StrictVerdict{Admitted: true, Levels: levels}, nil
}

// kvLast orders the groups so that the one holding key kv comes last.
func kvLast(groups []group, kv int) []group {
	for i, g := range groups {
		if g.at[len(g.at)-1] == kv {
			groups[i], groups[len(groups)-1] = groups[len(groups)-1], groups[i]
			break
		}
	}
	return groups
}

// giveBack returns what the parts of a refused commit already took on
// their nodes. A failure leaves it taken there: the decision is refused,
// and the bucket refills at its rate.
func (s *Store) giveBack(ctx context.Context, c *sharing.StrictCharge, keys []string, taken []group) {
	for _, g := range taken {
		_ = s.settleOn(ctx, g.node, keys, g.at, c.Takes, "", "", "")
	}
}

// pingShard checks that the master at addr answers (every master where
// addr is unknown, the store where it is not a Cluster).
func (s *Store) pingShard(ctx context.Context, addr string) error {
	if c, ok := s.nodes.Load(addr); ok && addr != "" {
		if err := c.(*redis.Client).Ping(ctx).Err(); err != nil {
			s.reloadSlots()
			return fmt.Errorf("ping %s: %w", addr, err)
		}
		return nil
	}
	return s.Ping(ctx)
}

// Ping implements sharing.Store.
func (s *Store) Ping(ctx context.Context) error {
	if s.cluster != nil {
		if err := s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() }); err != nil {
			return fmt.Errorf("redis: ping: %w", err)
		}
		return nil
	}
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: ping: %w", err)
	}
	return nil
}

// Settle implements sharing.Store: the KV's node settles the
// lease first, and only if it held it are the buckets on other nodes
// given back, so that a lease is settled once wherever its parts are.
func (s *Store) Settle(ctx context.Context, st *sharing.StrictSettle) error {
	hk, zk := s.kvKeys(st.KVKey)
	keys := make([]string, 0, len(st.Refunds)+1)
	for _, r := range st.Refunds {
		keys = append(keys, s.Key(r.Key))
	}
	keys = append(keys, hk)
	groups, err := s.groups(ctx, keys)
	if err != nil {
		return fmt.Errorf("redis: settle: %w", err)
	}
	groups = kvLast(groups, len(keys)-1)
	kv := groups[len(groups)-1]
	if err := s.settleOn(ctx, kv.node, keys, kv.at[:len(kv.at)-1], st.Refunds, st.Lease, hk, zk); err != nil {
		if errors.Is(err, errNotHeld) {
			return nil
		}
		return fmt.Errorf("redis: settle: %w", err)
	}
	for _, g := range groups[:len(groups)-1] {
		if err := s.settleOn(ctx, g.node, keys, g.at, st.Refunds, "", "", ""); err != nil {
			return fmt.Errorf("redis: settle: %w", err)
		}
	}
	return nil
}

// errNotHeld is a settle the store held no lease for: nothing to do.
var errNotHeld = errors.New("lease not held")

// settleOn runs the settle script on one node for the refunds at the
// indices at, with the lease and its KV keys (all empty: unchecked).
func (s *Store) settleOn(ctx context.Context, node redis.Scripter, keys []string, at []int, refunds []sharing.StrictTake, lease, hk, zk string) error {
	args := make([]any, 0, 1+len(at)+2+3*len(at)+1)
	args = append(args, len(at))
	for _, i := range at {
		args = append(args, keys[i])
	}
	args = append(args, hk, zk)
	for _, i := range at {
		r := &refunds[i]
		args = append(args, itoa(r.Rate), itoa(r.Burst), itoa(r.Amount))
	}
	args = append(args, lease)
	route := hk
	if len(at) > 0 {
		route = keys[at[0]]
	}
	held, err := settleScript.Run(ctx, node, []string{route}, args...).Int64()
	if err != nil {
		s.reloadSlots()
		return err
	}
	if held == 0 {
		return errNotHeld
	}
	return nil
}

var _ sharing.Sharded = (*Store)(nil)
