// Package redisstate implements admission.SharedState on Redis (go-redis
// UniversalClient: standalone, Sentinel or Cluster). Each operation is one
// Lua script call, loaded once and run by EVALSHA (go-redis falls back to
// EVAL, which loads it again, on NOSCRIPT). The scripts use Redis server
// TIME as the clock, PEXPIRE every key they write, and every key of a call
// shares one hash tag, the prefix, so that a call runs on one Cluster slot.
package redisstate

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-sched/sluice/admission"
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
	rdb    redis.UniversalClient
	prefix string // "{prefix}:" starts every key
}

// New returns a store keeping its keys under the hash tag {prefix}
// (default "sluice").
func New(rdb redis.UniversalClient, prefix string) *Store {
	if prefix == "" {
		prefix = "sluice"
	}
	return &Store{rdb: rdb, prefix: "{" + prefix + "}:"}
}

// CommitSHA returns the SHA1 the strict commit script runs under (EVALSHA).
func CommitSHA() string { return commitScript.Hash() }

// Key returns the Redis key of an engine key.
func (s *Store) Key(k string) string { return s.prefix + k }

// Load loads the scripts (SCRIPT LOAD), so that the first decision does not
// pay for it; calls reload them by themselves after a flush or restart.
func (s *Store) Load(ctx context.Context) error {
	for _, sc := range []*redis.Script{reconcileScript, commitScript, settleScript} {
		if err := sc.Load(ctx, s.rdb).Err(); err != nil {
			return fmt.Errorf("redis: script load: %w", err)
		}
	}
	return nil
}

func micros(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) }
func itoa(v int64) string           { return strconv.FormatInt(v, 10) }

func resume(r bool) string {
	if r {
		return "1"
	}
	return "0"
}

// Reconcile implements admission.SharedState.
func (s *Store) Reconcile(ctx context.Context, req *admission.ReconcileRequest) (*admission.ReconcileReply, error) {
	keys := make([]string, 0, len(req.Buckets)+len(req.Gauges))
	args := make([]any, 0, 5+10*len(req.Buckets)+4*len(req.Gauges))
	args = append(args, req.Replica, micros(req.Stale), len(req.Buckets), req.Replicas, micros(req.Rejoin))
	for _, b := range req.Buckets {
		keys = append(keys, s.Key(b.Key))
		args = append(args, itoa(b.Rate), itoa(b.Burst), itoa(b.Cum), itoa(b.Unacked), itoa(b.Demand),
			strconv.FormatUint(b.Epoch, 10), micros(b.Age), resume(b.Resume), itoa(b.Held), micros(b.Span))
	}
	for _, g := range req.Gauges {
		keys = append(keys, s.Key(g.Key))
		args = append(args, itoa(g.Limit), itoa(g.Held), itoa(g.Share), micros(g.TTL))
	}
	if len(keys) == 0 {
		return &admission.ReconcileReply{}, nil
	}
	res, err := reconcileScript.Run(ctx, s.rdb, keys, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("redis: reconcile: %w", err)
	}
	if len(res) != len(keys) {
		return nil, fmt.Errorf("redis: reconcile: %d results for %d keys", len(res), len(keys))
	}
	rep := &admission.ReconcileReply{
		Buckets: make([]admission.BucketGrant, len(req.Buckets)),
		Gauges:  make([]int64, len(req.Gauges)),
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
		rep.Buckets[i] = admission.BucketGrant{RateMilli: rate, Level: level}
	}
	for i := range req.Gauges {
		v, ok := res[len(req.Buckets)+i].(int64)
		if !ok {
			return nil, fmt.Errorf("redis: reconcile: gauge %s: malformed reply %v", req.Gauges[i].Key, res[len(req.Buckets)+i])
		}
		rep.Gauges[i] = v
	}
	return rep, nil
}

// kvKeys returns the KV holds hash and expiry zset of a gauge key.
func (s *Store) kvKeys(k string) (string, string) {
	return s.Key(k + ":holds"), s.Key(k + ":expiry")
}

// Commit implements admission.SharedState.
func (s *Store) Commit(ctx context.Context, c *admission.StrictCharge) (admission.StrictVerdict, error) {
	keys := make([]string, 0, len(c.Takes)+2)
	args := make([]any, 0, 1+4*len(c.Takes)+4)
	args = append(args, len(c.Takes))
	for _, t := range c.Takes {
		keys = append(keys, s.Key(t.Key))
		args = append(args, itoa(t.Rate), itoa(t.Burst), itoa(t.Amount), itoa(t.Min))
	}
	hk, zk := s.kvKeys(c.KV.Key)
	keys = append(keys, hk, zk)
	args = append(args, c.KV.Lease, itoa(c.KV.Limit), itoa(c.KV.Bytes), micros(c.KV.TTL))
	res, err := commitScript.Run(ctx, s.rdb, keys, args...).Int64Slice()
	if err != nil {
		return admission.StrictVerdict{}, fmt.Errorf("redis: commit: %w", err)
	}
	switch {
	case len(res) == 1 && res[0] == 1: // committed by an earlier call
		return admission.StrictVerdict{Admitted: true}, nil
	case len(res) == 1+len(c.Takes) && res[0] == 1:
		return admission.StrictVerdict{Admitted: true, Levels: res[1:]}, nil
	case len(res) == 3 && res[0] == 0:
		return admission.StrictVerdict{Refused: int(res[1]), RetryAfter: time.Duration(res[2]) * time.Microsecond}, nil
	}
	return admission.StrictVerdict{}, fmt.Errorf("redis: commit: malformed reply %v", res)
}

// Ping implements admission.SharedState.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: ping: %w", err)
	}
	return nil
}

// Settle implements admission.SharedState.
func (s *Store) Settle(ctx context.Context, st *admission.StrictSettle) error {
	keys := make([]string, 0, len(st.Refunds)+2)
	args := make([]any, 0, 1+3*len(st.Refunds)+1)
	args = append(args, len(st.Refunds))
	for _, r := range st.Refunds {
		keys = append(keys, s.Key(r.Key))
		args = append(args, itoa(r.Rate), itoa(r.Burst), itoa(r.Amount))
	}
	hk, zk := s.kvKeys(st.KVKey)
	keys = append(keys, hk, zk)
	args = append(args, st.Lease)
	if err := settleScript.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
		return fmt.Errorf("redis: settle: %w", err)
	}
	return nil
}
