package redisbacklog

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-sched/sluice/admission/deferral"
)

var (
	//go:embed add.lua
	addLua string
	//go:embed claim.lua
	claimLua string
	//go:embed unclaim.lua
	unclaimLua string
	//go:embed finish.lua
	finishLua string
	//go:embed hold.lua
	holdLua string
	//go:embed reclaim.lua
	reclaimLua string

	addScript     = redis.NewScript(addLua)
	claimScript   = redis.NewScript(claimLua)
	unclaimScript = redis.NewScript(unclaimLua)
	finishScript  = redis.NewScript(finishLua)
	holdScript    = redis.NewScript(holdLua)
	reclaimScript = redis.NewScript(reclaimLua)
)

// Defaults of Options.
const (
	// DefaultPrefix starts every key of the backlog.
	DefaultPrefix = "sluice:dfr"
	// DefaultShards spreads the tickets over 16 streams: enough to use
	// every master of a usual Cluster, few enough that an Adopt's walk
	// over every shard stays cheap.
	DefaultShards = 16
	// DefaultReclaimIdle is how long a replica's holds may go unrefreshed
	// before another replica adopts its tickets: a stopped replica's
	// backlog waits that long, a replica stalled that long loses it.
	DefaultReclaimIdle = 30 * time.Second
	// DefaultRetention keeps a final ticket readable for a day.
	DefaultRetention = 24 * time.Hour
)

const (
	group = "sluice" // the one consumer group of every stream
	// page bounds the entries one script call or read handles, so that
	// no call blocks Redis for long.
	page = 1000
	// maxCached bounds the id → shard cache; past it the cache starts
	// again (it only saves a round trip).
	maxCached = 1 << 20
	seqBits   = 20 // Seq = ms<<seqBits | n
)

// Options configure a Store.
type Options struct {
	// Consumer names this replica in every stream's group: its replica
	// id, the same across its restarts, so that a restart takes back its
	// own tickets. Required.
	Consumer string
	// Prefix starts every key (default DefaultPrefix).
	Prefix string
	// Shards is the number of streams tickets are spread over by tenant
	// (default DefaultShards). Every replica must use the same.
	Shards int
	// ReclaimIdle is how long another consumer's entry must have been
	// idle before Adopt takes it (default DefaultReclaimIdle).
	ReclaimIdle time.Duration
	// HoldRefresh is how often this replica refreshes its holds (default
	// ReclaimIdle/3). It must be shorter than every replica's ReclaimIdle.
	HoldRefresh time.Duration
	// Retention is how long a final ticket stays readable (default
	// DefaultRetention).
	Retention time.Duration
	// Logger reports failed hold refreshes (default slog.Default()).
	Logger *slog.Logger
}

func (o Options) withDefaults() (Options, error) {
	if o.Consumer == "" {
		return o, errors.New("redisbacklog: Options.Consumer (the replica id) is required")
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.Shards <= 0 {
		o.Shards = DefaultShards
	}
	if o.ReclaimIdle <= 0 {
		o.ReclaimIdle = DefaultReclaimIdle
	}
	if o.HoldRefresh <= 0 {
		o.HoldRefresh = o.ReclaimIdle / 3
	}
	if o.HoldRefresh >= o.ReclaimIdle {
		return o, fmt.Errorf("redisbacklog: HoldRefresh %v must be shorter than ReclaimIdle %v, or other replicas adopt this one's tickets", o.HoldRefresh, o.ReclaimIdle)
	}
	if o.Retention <= 0 {
		o.Retention = DefaultRetention
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// Store is a deferral.Store on Redis Streams. It is safe for concurrent
// use.
type Store struct {
	rdb  redis.UniversalClient
	opts Options
	// atOpen is, per shard, the stream's last id when Open ran: entries
	// up to it in this consumer's PEL are an earlier run's.
	atOpen []streamID

	mu struct {
		sync.Mutex
		shardOf map[string]int // ticket id → shard, as far as known
	}
	adopt struct {
		sync.Mutex      // serialises Adopt
		done       bool // the first Adopt returned
		carry      []entry
	}

	stop      chan struct{}
	stopped   chan struct{}
	closeOnce sync.Once
}

var _ deferral.Store = (*Store)(nil)

// Open returns a store on rdb (which the caller keeps and closes): it
// creates the streams' group where missing, refreshes this consumer's
// holds once, and starts refreshing them every HoldRefresh until Close.
func Open(ctx context.Context, rdb redis.UniversalClient, opts Options) (*Store, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Store{rdb: rdb, opts: opts, atOpen: make([]streamID, opts.Shards),
		stop: make(chan struct{}), stopped: make(chan struct{})}
	s.mu.shardOf = make(map[string]int)
	for sh := range opts.Shards {
		key := s.streamKey(sh)
		err := rdb.XGroupCreateMkStream(ctx, key, group, "0").Err()
		if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
			return nil, fmt.Errorf("redisbacklog: create group of %s: %w", key, err)
		}
		info, err := rdb.XInfoStream(ctx, key).Result()
		if err != nil {
			return nil, fmt.Errorf("redisbacklog: xinfo stream %s: %w", key, err)
		}
		if s.atOpen[sh], err = parseID(info.LastGeneratedID); err != nil {
			return nil, fmt.Errorf("redisbacklog: %s: %w", key, err)
		}
	}
	if err := s.refresh(ctx); err != nil {
		return nil, err
	}
	go s.holdLoop()
	return s, nil
}

// Close stops the hold refresh; it leaves the tickets held under this
// consumer, for its restart or, after ReclaimIdle, another replica. A
// second Close does nothing.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.stopped
	})
	return nil
}

func (s *Store) streamKey(shard int) string {
	return s.opts.Prefix + ":{" + strconv.Itoa(shard) + "}:s"
}

func (s *Store) ticketKey(shard int, id string) string {
	return s.opts.Prefix + ":{" + strconv.Itoa(shard) + "}:t:" + id
}

// shard returns tenant's shard.
func (s *Store) shard(tenant string) int {
	h := fnv.New32a()
	h.Write([]byte(tenant))
	return int(h.Sum32() % uint32(s.opts.Shards))
}

// Add implements deferral.Store. The record is written pending, whatever
// its State. Adding an id the store holds already writes nothing and
// returns the Seq it has: a retried Add is not a second ticket.
func (s *Store) Add(ctx context.Context, rec deferral.Record) (uint64, error) {
	if rec.ID == "" {
		return 0, errors.New("redisbacklog: add: empty ticket id")
	}
	rec.Seq, rec.State, rec.Claim, rec.Reason, rec.Finished = 0, deferral.StatePending, deferral.Claim{}, "", time.Time{}
	v, err := json.Marshal(rec)
	if err != nil {
		return 0, fmt.Errorf("redisbacklog: add %s: encode: %w", rec.ID, err)
	}
	sh := s.shard(rec.Work.Tenant)
	sid, err := addScript.Run(ctx, s.rdb, []string{s.ticketKey(sh, rec.ID), s.streamKey(sh)},
		v, rec.ID, group, s.opts.Consumer).Text()
	if err != nil {
		return 0, fmt.Errorf("redisbacklog: add %s: %w", rec.ID, err)
	}
	seq, err := seqOf(sid)
	if err != nil {
		return 0, fmt.Errorf("redisbacklog: add %s: %w", rec.ID, err)
	}
	s.remember(rec.ID, sh)
	return seq, nil
}

// Claim implements deferral.Store; on success cur is the claimed record.
func (s *Store) Claim(ctx context.Context, id string, c deferral.Claim) (cur deferral.Record, ok bool, err error) {
	cv, err := json.Marshal(c)
	if err != nil {
		return deferral.Record{}, false, fmt.Errorf("redisbacklog: claim %s: encode: %w", id, err)
	}
	err = s.withTicket(ctx, id, func(sh int) (bool, error) {
		res, err := claimScript.Run(ctx, s.rdb, []string{s.ticketKey(sh, id)}, cv, strconv.FormatUint(c.LeaseID, 10)).Slice()
		if errors.Is(err, redis.Nil) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if len(res) != 2 {
			return false, fmt.Errorf("claim script answered %v", res)
		}
		ok = res[0] == int64(1)
		cur, err = recordOf(res[1])
		return true, err
	})
	if err != nil {
		return deferral.Record{}, false, fmt.Errorf("redisbacklog: claim %s: %w", id, err)
	}
	return cur, ok, nil
}

// Unclaim implements deferral.Store. A pending ticket is left as it is,
// and so is a final one: a lease that lapses after its ticket finished
// must not bring it back.
func (s *Store) Unclaim(ctx context.Context, id string, leaseID uint64) error {
	err := s.withTicket(ctx, id, func(sh int) (bool, error) {
		err := unclaimScript.Run(ctx, s.rdb, []string{s.ticketKey(sh, id)}, strconv.FormatUint(leaseID, 10)).Err()
		if errors.Is(err, redis.Nil) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("redisbacklog: unclaim %s: %w", id, err)
	}
	return nil
}

// Finish implements deferral.Store. A ticket already final keeps its
// first final state: the answer the submitter may have seen stands.
func (s *Store) Finish(ctx context.Context, id string, state deferral.State, reason string, at time.Time) error {
	if !state.Final() {
		return fmt.Errorf("redisbacklog: finish %s: state %s is not final", id, state)
	}
	finished := ""
	if !at.IsZero() {
		finished = at.Format(time.RFC3339Nano)
	}
	err := s.withTicket(ctx, id, func(sh int) (bool, error) {
		err := finishScript.Run(ctx, s.rdb, []string{s.ticketKey(sh, id), s.streamKey(sh)},
			int(state), reason, finished, s.opts.Retention.Milliseconds(), group).Err()
		if errors.Is(err, redis.Nil) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("redisbacklog: finish %s: %w", id, err)
	}
	s.forget(id)
	return nil
}

// Get implements deferral.Store: final tickets while retained.
func (s *Store) Get(ctx context.Context, id string) (deferral.Record, error) {
	var rec deferral.Record
	err := s.withTicket(ctx, id, func(sh int) (bool, error) {
		fields, err := s.rdb.HGetAll(ctx, s.ticketKey(sh, id)).Result()
		if err != nil || len(fields) == 0 {
			return false, err
		}
		rec, err = fromFields(fields)
		return true, err
	})
	if err != nil {
		return deferral.Record{}, fmt.Errorf("redisbacklog: get %s: %w", id, err)
	}
	return rec, nil
}

// withTicket runs fn on ticket id's shard, which it finds first if it
// does not know it; fn reports whether the ticket was there. A shard
// remembered but wrong (the ticket expired, and the id came back for
// another tenant) is forgotten and the shard looked up once more.
func (s *Store) withTicket(ctx context.Context, id string, fn func(shard int) (found bool, err error)) error {
	sh, known := s.known(id)
	if known {
		found, err := fn(sh)
		if err != nil || found {
			return err
		}
		s.forget(id)
	}
	sh, err := s.find(ctx, id)
	if err != nil {
		return err
	}
	found, err := fn(sh)
	if err == nil && !found {
		err = deferral.ErrNotFound
	}
	return err
}

// find asks every shard whether it holds ticket id, in one pipeline.
func (s *Store) find(ctx context.Context, id string) (int, error) {
	cmds := make([]*redis.IntCmd, s.opts.Shards)
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for sh := range cmds {
			cmds[sh] = p.Exists(ctx, s.ticketKey(sh, id))
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("find its shard: %w", err)
	}
	for sh, c := range cmds {
		if c.Val() == 1 {
			s.remember(id, sh)
			return sh, nil
		}
	}
	return 0, deferral.ErrNotFound
}

func (s *Store) known(id string) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sh, ok := s.mu.shardOf[id]
	return sh, ok
}

func (s *Store) remember(id string, sh int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.mu.shardOf) >= maxCached {
		clear(s.mu.shardOf)
	}
	s.mu.shardOf[id] = sh
}

func (s *Store) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mu.shardOf, id)
}

// entry is a stream entry Adopt took: a ticket's, unless its fields are
// gone (the entry was deleted).
type entry struct {
	shard int
	sid   string
	id    string // the ticket id; "" for a deleted entry
}

// Adopt implements deferral.Store (see the package doc). Entries it took
// but could not return (an error part way) are returned by the next call.
func (s *Store) Adopt(ctx context.Context) ([]deferral.Record, error) {
	s.adopt.Lock()
	defer s.adopt.Unlock()
	seen := make(map[string]bool, len(s.adopt.carry))
	for _, e := range s.adopt.carry {
		seen[e.sid+"/"+strconv.Itoa(e.shard)] = true
	}
	take := func(e entry) {
		if k := e.sid + "/" + strconv.Itoa(e.shard); !seen[k] {
			seen[k] = true
			s.adopt.carry = append(s.adopt.carry, e)
		}
	}
	for sh := range s.opts.Shards {
		if !s.adopt.done {
			if err := s.ownHistory(ctx, sh, take); err != nil {
				return nil, err
			}
		}
		if err := s.reclaim(ctx, sh, take); err != nil {
			return nil, err
		}
	}
	out, err := s.records(ctx, s.adopt.carry)
	if err != nil {
		return nil, err
	}
	s.adopt.done, s.adopt.carry = true, nil
	slices.SortFunc(out, func(a, b deferral.Record) int { return cmp.Compare(a.Seq, b.Seq) })
	return out, nil
}

// ownHistory reads this consumer's PEL of shard sh (XREADGROUP from id 0)
// up to the stream's last id at Open.
func (s *Store) ownHistory(ctx context.Context, sh int, take func(entry)) error {
	key := s.streamKey(sh)
	after := "0"
	for {
		res, err := s.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: group, Consumer: s.opts.Consumer, Streams: []string{key, after}, Count: page, Block: -1,
		}).Result()
		if errors.Is(err, redis.Nil) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("redisbacklog: adopt: read own entries of %s: %w", key, err)
		}
		var msgs []redis.XMessage
		for _, st := range res {
			msgs = append(msgs, st.Messages...)
		}
		for _, m := range msgs {
			id, err := parseID(m.ID)
			if err != nil {
				return fmt.Errorf("redisbacklog: adopt: %s: %w", key, err)
			}
			if s.atOpen[sh].less(id) {
				return nil // added through this Store
			}
			take(entryOf(sh, m))
		}
		if len(msgs) < page {
			return nil
		}
		after = msgs[len(msgs)-1].ID
	}
}

// reclaim takes, a page at a time, the entries of shard sh's PEL that
// other consumers let idle for ReclaimIdle.
func (s *Store) reclaim(ctx context.Context, sh int, take func(entry)) error {
	key := s.streamKey(sh)
	start := "-"
	for {
		res, err := reclaimScript.Run(ctx, s.rdb, []string{key},
			group, s.opts.Consumer, s.opts.ReclaimIdle.Milliseconds(), start, page).Slice()
		if err != nil {
			return fmt.Errorf("redisbacklog: adopt: reclaim from %s: %w", key, err)
		}
		if len(res) != 3 {
			return fmt.Errorf("redisbacklog: adopt: reclaim script answered %v", res)
		}
		got, _ := res[2].([]any)
		for _, g := range got {
			e, err := scriptEntry(sh, g)
			if err != nil {
				return fmt.Errorf("redisbacklog: adopt: reclaim from %s: %w", key, err)
			}
			take(e)
		}
		last, _ := res[0].(string)
		if n, _ := res[1].(int64); n < page {
			return nil
		}
		start = "(" + last
	}
}

// records reads the adopted entries' tickets, returns the unfinished ones
// and acknowledges and deletes the entries of the others. It reads a page
// a pipeline, so that a large backlog's reads fit a short call timeout.
func (s *Store) records(ctx context.Context, es []entry) ([]deferral.Record, error) {
	cmds := make([]*redis.MapStringStringCmd, len(es))
	for from := 0; from < len(es); from += page {
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, e := range es[from:min(from+page, len(es))] {
				if e.id != "" {
					cmds[from+i] = p.HGetAll(ctx, s.ticketKey(e.shard, e.id))
				}
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("redisbacklog: adopt: read tickets: %w", err)
		}
	}
	var out []deferral.Record
	var drop []entry
	for i, e := range es {
		if cmds[i] == nil || len(cmds[i].Val()) == 0 {
			drop = append(drop, e)
			continue
		}
		rec, err := fromFields(cmds[i].Val())
		if err != nil {
			return nil, fmt.Errorf("redisbacklog: adopt: ticket %s: %w", e.id, err)
		}
		if rec.State.Final() {
			drop = append(drop, e)
			continue
		}
		s.remember(rec.ID, e.shard)
		out = append(out, rec)
	}
	for from := 0; from < len(drop); from += page {
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, e := range drop[from:min(from+page, len(drop))] {
				p.XAck(ctx, s.streamKey(e.shard), group, e.sid)
				p.XDel(ctx, s.streamKey(e.shard), e.sid)
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("redisbacklog: adopt: drop the entries of finished tickets: %w", err)
		}
	}
	return out, nil
}

// holdLoop refreshes this consumer's holds every HoldRefresh until Close.
func (s *Store) holdLoop() {
	defer close(s.stopped)
	tick := time.NewTicker(s.opts.HoldRefresh)
	defer tick.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.stop
		cancel()
	}()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			if err := s.refresh(ctx); err != nil && ctx.Err() == nil {
				s.opts.Logger.Warn("deferral backlog: hold refresh failed; another replica may adopt this one's tickets if it keeps failing",
					"consumer", s.opts.Consumer, "err", err)
			}
		}
	}
}

// refresh re-claims every entry of this consumer's PEL, shard by shard,
// a page at a time.
func (s *Store) refresh(ctx context.Context) error {
	var errs []error
	for sh := range s.opts.Shards {
		key := s.streamKey(sh)
		start := "-"
		for {
			res, err := holdScript.Run(ctx, s.rdb, []string{key}, group, s.opts.Consumer, start, page).Slice()
			if err == nil && len(res) != 2 {
				err = fmt.Errorf("hold script answered %v", res)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("redisbacklog: refresh holds on %s: %w", key, err))
				break
			}
			if n, _ := res[1].(int64); n < page {
				break
			}
			last, _ := res[0].(string)
			start = "(" + last
		}
	}
	return errors.Join(errs...)
}

// streamID is a stream entry id, ms-n.
type streamID struct{ ms, n uint64 }

func parseID(s string) (streamID, error) {
	a, b, ok := strings.Cut(s, "-")
	ms, err1 := strconv.ParseUint(a, 10, 64)
	n, err2 := strconv.ParseUint(b, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return streamID{}, fmt.Errorf("malformed stream id %q", s)
	}
	return streamID{ms, n}, nil
}

func (a streamID) less(b streamID) bool { return a.ms < b.ms || a.ms == b.ms && a.n < b.n }

// seqOf maps a stream id to a Seq, ms<<20 | n.
func seqOf(sid string) (uint64, error) {
	id, err := parseID(sid)
	if err != nil {
		return 0, err
	}
	if id.n >= 1<<seqBits || id.ms >= 1<<(64-seqBits) {
		return 0, fmt.Errorf("stream id %s does not fit a Seq (ms<<%d | n)", sid, seqBits)
	}
	return id.ms<<seqBits | id.n, nil
}

func entryOf(sh int, m redis.XMessage) entry {
	id, _ := m.Values["id"].(string)
	return entry{shard: sh, sid: m.ID, id: id}
}

// scriptEntry reads an entry XCLAIM returned in a script: {sid, {field,
// value...}}, or a nil or field-less one for a deleted entry.
func scriptEntry(sh int, v any) (entry, error) {
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return entry{}, fmt.Errorf("malformed entry %v", v)
	}
	sid, _ := a[0].(string)
	e := entry{shard: sh, sid: sid}
	fields, _ := a[1].([]any)
	for i := 0; i+1 < len(fields); i += 2 {
		if fields[i] == "id" {
			e.id, _ = fields[i+1].(string)
		}
	}
	return e, nil
}

// recordOf reads a record from a script's HGETALL answer.
func recordOf(v any) (deferral.Record, error) {
	a, ok := v.([]any)
	if !ok || len(a)%2 != 0 {
		return deferral.Record{}, fmt.Errorf("malformed ticket fields %v", v)
	}
	fields := make(map[string]string, len(a)/2)
	for i := 0; i < len(a); i += 2 {
		k, _ := a[i].(string)
		fields[k], _ = a[i+1].(string)
	}
	return fromFields(fields)
}

// fromFields assembles a record from its hash: the record as added, then
// what changed since.
func fromFields(f map[string]string) (deferral.Record, error) {
	var rec deferral.Record
	if err := json.Unmarshal([]byte(f["rec"]), &rec); err != nil {
		return deferral.Record{}, fmt.Errorf("decode record: %w", err)
	}
	var err error
	if rec.Seq, err = seqOf(f["sid"]); err != nil {
		return deferral.Record{}, fmt.Errorf("ticket %s: %w", rec.ID, err)
	}
	st, err := strconv.Atoi(f["state"])
	if err != nil {
		return deferral.Record{}, fmt.Errorf("ticket %s: state %q: %w", rec.ID, f["state"], err)
	}
	rec.State = deferral.State(st)
	if c := f["claim"]; c != "" {
		if err := json.Unmarshal([]byte(c), &rec.Claim); err != nil {
			return deferral.Record{}, fmt.Errorf("ticket %s: decode claim: %w", rec.ID, err)
		}
	}
	rec.Reason = f["reason"]
	if t := f["finished"]; t != "" {
		if rec.Finished, err = time.Parse(time.RFC3339Nano, t); err != nil {
			return deferral.Record{}, fmt.Errorf("ticket %s: finished %q: %w", rec.ID, t, err)
		}
	}
	return rec, nil
}
