package fleetsim

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/state/memstate"
)

// ShardStats is what one shard served over a run.
type ShardStats struct {
	Name string `json:"name"`
	// Calls counts reconcile calls: one per request that had a key here.
	Calls int64 `json:"calls"`
	// TenantBuckets, DomainBuckets and Gauges count the updates: each
	// bucket or gauge report is one read-modify-write of its key.
	TenantBuckets int64 `json:"tenantBuckets"`
	DomainBuckets int64 `json:"domainBuckets"`
	Gauges        int64 `json:"gauges"`
	// EngineEntries counts the engine entries (Config.EngineReaders): a
	// reading published, or asked for apart from a gauge; Published
	// counts the first kind.
	EngineEntries int64 `json:"engineEntries,omitempty"`
	Published     int64 `json:"published,omitempty"`
	// RequestBytes and ReplyBytes estimate the traffic (see shardedStore).
	RequestBytes int64 `json:"requestBytes"`
	ReplyBytes   int64 `json:"replyBytes"`
	// Keys counts the distinct keys ever reported here.
	Keys int `json:"keys"`
}

// Buckets is the bucket updates of every kind.
func (s *ShardStats) Buckets() int64 { return s.TenantBuckets + s.DomainBuckets }

// shardedStore is a sharing.Sharded over S memstate stores, the shards,
// placed as a Redis Cluster would place redisstate's keys (Slot). A
// request is split by shard, one call per shard it has keys on, and the
// replies are put back in the request's order: what redisstate does
// with one script call per master.
//
// Bytes are the RESP2 encoding of the EVALSHA call reconcileOn sends for
// that part and of its reply, from the request's own values: a header of
// 7 arguments, every key once (the first twice: KEYS[1] and the argument
// list) in its Redis form ("{sluice/t/acme}/rps"), 10 numbers per bucket,
// 4 per gauge and 5 per engine entry; a reply of a pair of integers per
// bucket, per gauge an integer or {limit, reading}, per engine entry 0 or
// a reading (three numbers as written, two integers). TCP and IP framing
// are not counted.
type shardedStore struct {
	shards []*storeShard
}

type storeShard struct {
	name string
	mem  *memstate.Store

	mu    sync.Mutex // the strategy may call shards concurrently
	stats ShardStats
	keys  map[string]struct{}
}

func newShardedStore(n int, clk clock.Clock) *shardedStore {
	s := &shardedStore{}
	for i := range n {
		name := "shard-" + strconv.Itoa(i)
		s.shards = append(s.shards, &storeShard{name: name, mem: memstate.New(clk), stats: ShardStats{Name: name}, keys: make(map[string]struct{})})
	}
	return s
}

var _ sharing.Sharded = (*shardedStore)(nil)

func (s *shardedStore) shardOf(key string) int { return shardOfSlot(Slot(key), len(s.shards)) }

// Shard implements sharing.Sharded.
func (s *shardedStore) Shard(key string) string { return s.shards[s.shardOf(key)].name }

// Reconcile implements sharing.Store: one sub-call per shard the request
// has keys on. The simulation runs in virtual time, so the caller's
// wall-clock deadline (the strategy's 50 ms timeout) is dropped: a large
// request taking longer than that to simulate must not read as a store
// failure.
func (s *shardedStore) Reconcile(ctx context.Context, req *sharing.ReconcileRequest) (*sharing.ReconcileReply, error) {
	ctx = context.WithoutCancel(ctx)
	n := len(s.shards)
	bAt := make([][]int, n)
	gAt := make([][]int, n)
	eAt := make([][]int, n)
	for i := range req.Buckets {
		k := s.shardOf(req.Buckets[i].Key)
		bAt[k] = append(bAt[k], i)
	}
	for i := range req.Gauges {
		k := s.shardOf(req.Gauges[i].Key)
		gAt[k] = append(gAt[k], i)
	}
	for i := range req.Engines {
		k := s.shardOf(req.Engines[i].Key)
		eAt[k] = append(eAt[k], i)
	}
	ng := len(req.Gauges)
	rep := &sharing.ReconcileReply{Buckets: make([]sharing.BucketGrant, len(req.Buckets)), Gauges: make([]int64, ng),
		Readings: make([]*sharing.EngineReading, ng+len(req.Engines))}
	for k, sh := range s.shards {
		if len(bAt[k]) == 0 && len(gAt[k]) == 0 && len(eAt[k]) == 0 {
			continue
		}
		part := req
		if len(bAt[k]) != len(req.Buckets) || len(gAt[k]) != ng || len(eAt[k]) != len(req.Engines) {
			part = &sharing.ReconcileRequest{Replica: req.Replica, Replicas: req.Replicas, Stale: req.Stale, Rejoin: req.Rejoin,
				Buckets: make([]sharing.BucketReport, len(bAt[k])), Gauges: make([]sharing.GaugeReport, len(gAt[k])),
				Engines: make([]sharing.EngineReport, len(eAt[k]))}
			for j, i := range bAt[k] {
				part.Buckets[j] = req.Buckets[i]
			}
			for j, i := range gAt[k] {
				part.Gauges[j] = req.Gauges[i]
			}
			for j, i := range eAt[k] {
				part.Engines[j] = req.Engines[i]
			}
		}
		got, err := sh.reconcile(ctx, part)
		if err != nil {
			return nil, err
		}
		for j, i := range bAt[k] {
			rep.Buckets[i] = got.Buckets[j]
		}
		for j, i := range gAt[k] {
			rep.Gauges[i], rep.Readings[i] = got.Gauges[j], got.Readings[j]
		}
		for j, i := range eAt[k] {
			rep.Readings[ng+i] = got.Readings[len(part.Gauges)+j]
		}
	}
	return rep, nil
}

// reconcile forwards one part to the shard's memstate and counts it.
func (sh *storeShard) reconcile(ctx context.Context, part *sharing.ReconcileRequest) (*sharing.ReconcileReply, error) {
	rep, err := sh.mem.Reconcile(ctx, part)
	if err != nil {
		return nil, fmt.Errorf("fleetsim: %s: reconcile: %w", sh.name, err)
	}
	if len(rep.Buckets) != len(part.Buckets) || len(rep.Gauges) != len(part.Gauges) {
		return nil, fmt.Errorf("fleetsim: %s: reply has %d buckets and %d gauges for %d and %d", sh.name, len(rep.Buckets), len(rep.Gauges), len(part.Buckets), len(part.Gauges))
	}
	reqBytes, repBytes := respSize(part, rep)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st := &sh.stats
	st.Calls++
	st.Gauges += int64(len(part.Gauges))
	st.EngineEntries += int64(len(part.Engines))
	for i := range part.Engines {
		if part.Engines[i].Reading != nil {
			st.Published++
		}
	}
	st.RequestBytes += reqBytes
	st.ReplyBytes += repBytes
	for i := range part.Buckets {
		key := part.Buckets[i].Key
		if strings.HasPrefix(key, "d/") {
			st.DomainBuckets++
		} else {
			st.TenantBuckets++
		}
		sh.note(key)
	}
	for i := range part.Gauges {
		sh.note(part.Gauges[i].Key)
	}
	return rep, nil
}

// note remembers a key; a map lookup when it is known already.
func (sh *storeShard) note(key string) {
	if _, ok := sh.keys[key]; !ok {
		sh.keys[key] = struct{}{}
		sh.stats.Keys++
	}
}

// Commit implements sharing.Store; batched mode never calls it.
func (s *shardedStore) Commit(context.Context, *sharing.StrictCharge) (sharing.StrictVerdict, error) {
	return sharing.StrictVerdict{}, fmt.Errorf("fleetsim: commit: the simulation runs batched mode only")
}

// Settle implements sharing.Store; batched mode never calls it.
func (s *shardedStore) Settle(context.Context, *sharing.StrictSettle) error {
	return fmt.Errorf("fleetsim: settle: the simulation runs batched mode only")
}

// Ping implements sharing.Store: memory always answers.
func (s *shardedStore) Ping(ctx context.Context) error { return ctx.Err() }

// stats returns every shard's counters.
func (s *shardedStore) stats() []ShardStats {
	out := make([]ShardStats, len(s.shards))
	for i, sh := range s.shards {
		sh.mu.Lock()
		out[i] = sh.stats
		sh.mu.Unlock()
	}
	return out
}

// evalSHA is the command and script name a reconcile call starts with:
// EVALSHA, the script's 40-digit SHA1, and 1 (the number of KEYS).
var evalSHA = bulk(len("EVALSHA")) + bulk(40) + bulk(1)

// respSize is the RESP2 size of the EVALSHA call redisstate's
// reconcileOn sends for part, and of the reply it gets.
func respSize(part *sharing.ReconcileRequest, rep *sharing.ReconcileReply) (req, reply int64) {
	nb, ng, ne := len(part.Buckets), len(part.Gauges), len(part.Engines)
	args := 7 + nb + ng + ne + 10*nb + 4*ng + 5*ne
	req = arrayHeader(3+1+args) + evalSHA
	req += bulk(len(part.Replica)) + bulk(micros(part.Stale)) + bulk(digits(int64(nb))) +
		bulk(digits(int64(part.Replicas))) + bulk(micros(part.Rejoin)) + bulk(digits(int64(ng))) + bulk(digits(int64(ne)))
	first := true
	key := func(k string) {
		n := bulk(len(k) + len("{}") + len(keyPrefix))
		req += n
		if first { // KEYS[1], which routes the call, is sent twice
			req += n
			first = false
		}
	}
	for i := range part.Buckets {
		key(part.Buckets[i].Key)
	}
	for i := range part.Gauges {
		key(part.Gauges[i].Key)
	}
	for i := range part.Engines {
		key(part.Engines[i].Key)
	}
	for i := range part.Buckets {
		b := &part.Buckets[i]
		req += bulk(digits(b.Rate)) + bulk(digits(b.Burst)) + bulk(digits(b.Cum)) + bulk(digits(b.Unacked)) +
			bulk(digits(b.Demand)) + bulk(udigits(b.Epoch)) + bulk(micros(b.Age)) + bulk(1) +
			bulk(digits(b.Held)) + bulk(micros(b.Span))
	}
	for i := range part.Gauges {
		g := &part.Gauges[i]
		req += bulk(digits(g.Limit)) + bulk(digits(g.Held)) + bulk(digits(g.Share)) + bulk(micros(g.TTL))
	}
	for i := range part.Engines {
		if r := part.Engines[i].Reading; r != nil {
			req += bulk(1) + bulk(len(number(r.Queue))) + bulk(len(number(r.Running))) + bulk(len(number(r.KVUsage))) + bulk(micros(r.Age))
		} else {
			req += 5 * bulk(1)
		}
	}
	reply = arrayHeader(nb + ng + ne)
	for _, g := range rep.Buckets {
		reply += arrayHeader(2) + integer(g.RateMilli) + integer(g.Level)
	}
	for i, v := range rep.Gauges {
		if r := reading(rep, i); r != nil {
			reply += arrayHeader(2) + integer(v) + readingSize(r)
		} else {
			reply += integer(v)
		}
	}
	for i := range part.Engines {
		if r := reading(rep, ng+i); r != nil {
			reply += readingSize(r)
		} else {
			reply += integer(0)
		}
	}
	return req, reply
}

// reading is the i-th engine reading of a reply, if any.
func reading(rep *sharing.ReconcileReply, i int) *sharing.EngineReading {
	if i >= len(rep.Readings) {
		return nil
	}
	return rep.Readings[i]
}

// readingSize is a reading as the script answers it: queue, running and
// KV use as the reader wrote them, the age and the stamp as integers (the
// stamp a Redis time in microseconds, 16 digits, where memstate counts).
func readingSize(r *sharing.EngineReading) int64 {
	return arrayHeader(5) + bulk(len(number(r.Queue))) + bulk(len(number(r.Running))) + bulk(len(number(r.KVUsage))) +
		integer(r.Age.Microseconds()) + integer(redisStamp)
}

// redisStamp is a Redis TIME in microseconds, as a reading's stamp is.
var redisStamp = time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC).UnixMicro()

// number is v as redisstate writes it.
func number(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// bulk is the size of a RESP bulk string of n bytes: $n\r\n…\r\n.
func bulk(n int) int64 { return int64(1 + digits(int64(n)) + 2 + n + 2) }

// arrayHeader is the size of *n\r\n.
func arrayHeader(n int) int64 { return int64(1 + digits(int64(n)) + 2) }

// integer is the size of :v\r\n.
func integer(v int64) int64 { return int64(1 + digits(v) + 2) }

func micros(d time.Duration) int { return digits(d.Microseconds()) }

// digits is the length of v in decimal, its sign included.
func digits(v int64) int {
	if v < 0 {
		if v == -v { // math.MinInt64
			return 20
		}
		return 1 + udigits(uint64(-v))
	}
	return udigits(uint64(v))
}

func udigits(v uint64) int {
	n := 1
	for v >= 10 {
		v /= 10
		n++
	}
	return n
}
