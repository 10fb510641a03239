package boltbacklog

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/sluice-sched/sluice/admission/deferral"
)

// Defaults of Options.
const (
	// DefaultRetention keeps a final ticket readable for a day: long enough
	// for a batch client that polls GetTicket hourly to see how it ended.
	DefaultRetention = 24 * time.Hour
	// DefaultLockTimeout is how long Open waits for the file's lock: a
	// second sluiced on the same --data-dir fails within a second, with
	// the path in its error, instead of hanging.
	DefaultLockTimeout = time.Second
)

// sweepChunk bounds the records one Sweep transaction drops, so that a
// sweep after a long pause does not hold the writer lock (and every Add
// behind it) for one huge commit.
const sweepChunk = 10_000

var (
	ticketsBucket  = []byte("tickets")
	openBucket     = []byte("open")
	finishedBucket = []byte("finished")
)

// Options configure a Store; the zero value means every default.
type Options struct {
	// Retention is how long a final ticket stays readable after its
	// Finished time before Sweep drops it (default DefaultRetention).
	Retention time.Duration
	// LockTimeout bounds Open's wait for the file lock another process
	// holds (default DefaultLockTimeout).
	LockTimeout time.Duration
	// MaxBatchDelay is how long a group commit waits for more writes
	// after its first (bolt's DB.MaxBatchDelay; default bolt's, 10 ms):
	// a lone write waits that long, a burst shares one fsync.
	MaxBatchDelay time.Duration
	// MaxBatchSize starts a group commit at once when it holds that many
	// writes (bolt's DB.MaxBatchSize; default bolt's, 1000).
	MaxBatchSize int
	// Now is the clock of Close's last sweep and of the name a damaged
	// file is moved aside to (default time.Now). Sweep itself takes the
	// time as an argument.
	Now func() time.Time
	// MoveAsideDamaged renames a damaged file to
	// <path>.damaged-<UTC time> and starts an empty backlog, logging the
	// damage at error level; without it Open refuses a damaged file.
	MoveAsideDamaged bool
	// Logger takes the warnings of an empty file and of one moved aside
	// (default slog.Default()).
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Retention <= 0 {
		o.Retention = DefaultRetention
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Store is a deferral.Store in a bbolt file. It is safe for concurrent
// use; one process at a time may have the file open.
type Store struct {
	db   *bolt.DB
	path string
	opts Options
	// openSeq is the Seq counter at Open: tickets at or below it are an
	// earlier process's, which the first Adopt hands back.
	openSeq uint64

	mu struct {
		sync.Mutex
		adopted bool // the first Adopt has returned
	}
	closeOnce sync.Once
	closeErr  error

	// lastTx and commits count the write transactions committed (tests
	// check that concurrent writes share them).
	lastTx  atomic.Int64
	commits atomic.Int64
}

var _ deferral.Store = (*Store)(nil)

// Open opens (creating it if need be) the backlog file at path, e.g.
// <data-dir>/deferred.db. It fails, naming path, when another process
// holds the file for longer than opts.LockTimeout, and with a
// *DamagedError when the file is damaged (see the package doc), unless
// opts.MoveAsideDamaged. An empty (0-byte) file starts an empty backlog,
// with a warning.
func Open(path string, opts Options) (*Store, error) {
	opts = opts.withDefaults()
	s, err := openVerified(path, opts)
	var moved *movedAsideError
	if errors.As(err, &moved) {
		opts.Logger.Error("deferred backlog file is damaged: moved it aside and starting with an empty backlog; the tickets it held are lost",
			"path", path, "moved_to", moved.to, "damage", moved.damage.Err.Error())
		s, err = openVerified(path, opts)
	}
	return s, err
}

// movedAsideError is openVerified's answer when it moved a damaged file aside.
type movedAsideError struct {
	damage *DamagedError
	to     string
}

func (e *movedAsideError) Error() string {
	return fmt.Sprintf("%v; moved to %s", e.damage, e.to)
}

var errLockTimeout = errors.New("timed out waiting for the file lock")

// openVerified verifies the file under its lock, then opens it with bbolt.
func openVerified(path string, opts Options) (*Store, error) {
	_, statErr := os.Stat(path)
	existed := statErr == nil
	f, err := openLocked(path, opts.LockTimeout)
	if err != nil {
		return nil, err
	}
	info, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("boltbacklog: open %s: %w", path, err)
	}
	// damaged answers a damage found while the lock is held, so that a
	// file moved aside is one no other process is using.
	damaged := func(problem error) error {
		d := &DamagedError{Path: path, Err: problem}
		if !opts.MoveAsideDamaged {
			return d
		}
		to, err := asidePath(path, opts.Now())
		if err == nil {
			err = os.Rename(path, to)
		}
		if err != nil {
			return fmt.Errorf("%w; moving it aside failed: %w", d, err)
		}
		return &movedAsideError{damage: d, to: to}
	}
	if info.Size() == 0 {
		if existed {
			opts.Logger.Warn("deferred backlog file is empty (0 bytes): starting with an empty backlog", "path", path)
		}
	} else if err := verifyFile(f, info.Size()); err != nil {
		err = damaged(err)
		_ = f.Close()
		return nil, err
	}
	var db *bolt.DB
	err = guarded(func() (err error) {
		db, err = bolt.Open(path, 0o600, &bolt.Options{
			Timeout:  opts.LockTimeout,
			OpenFile: func(string, int, os.FileMode) (*os.File, error) { return f, nil },
		})
		return err
	})
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("boltbacklog: %s is locked by another process (is a second sluiced running on this data dir?); gave up after %v: %w", path, opts.LockTimeout, err)
	case errors.Is(err, errPanicked):
		err = damaged(err)
		_ = f.Close()
		return nil, err
	case err != nil:
		_ = f.Close()
		return nil, fmt.Errorf("boltbacklog: open %s: %w", path, err)
	}
	if err := guarded(func() error { return db.View(checkRecords) }); err != nil {
		err = damaged(err)
		_ = db.Close()
		return nil, err
	}
	if opts.MaxBatchDelay > 0 {
		db.MaxBatchDelay = opts.MaxBatchDelay
	}
	if opts.MaxBatchSize > 0 {
		db.MaxBatchSize = opts.MaxBatchSize
	}
	s := &Store{db: db, path: path, opts: opts}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{ticketsBucket, openBucket, finishedBucket} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		s.openSeq = tx.Bucket(ticketsBucket).Sequence()
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("boltbacklog: open %s: %w", path, err)
	}
	return s, nil
}

// openLocked opens (creating it if need be) the file at path and takes
// its lock. A file moved aside while this one waited for the lock is no
// longer the backlog: it opens the one now at path.
func openLocked(path string, timeout time.Duration) (*os.File, error) {
	for range 3 {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("boltbacklog: open %s: %w", path, err)
		}
		if err := lockFile(f, timeout); err != nil {
			_ = f.Close()
			if errors.Is(err, errLockTimeout) {
				return nil, fmt.Errorf("boltbacklog: %s is locked by another process (is a second sluiced running on this data dir?); gave up after %v: %w", path, timeout, berrors.ErrTimeout)
			}
			return nil, fmt.Errorf("boltbacklog: lock %s: %w", path, err)
		}
		held, err := f.Stat()
		if err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("boltbacklog: open %s: %w", path, err)
		}
		if now, err := os.Stat(path); err == nil && os.SameFile(held, now) {
			return f, nil
		}
		_ = f.Close()
	}
	return nil, fmt.Errorf("boltbacklog: open %s: the file kept being replaced while its lock was awaited", path)
}

// asidePath names where a damaged file goes: beside it, with the time
// (UTC) in its name, and a number after when that name is taken.
func asidePath(path string, now time.Time) (string, error) {
	base := path + ".damaged-" + now.UTC().Format("20060102T150405Z")
	for i := 1; i < 100; i++ {
		to := base
		if i > 1 {
			to = fmt.Sprintf("%s-%d", base, i)
		}
		if _, err := os.Lstat(to); errors.Is(err, os.ErrNotExist) {
			return to, nil
		}
	}
	return "", fmt.Errorf("no free name beside %s", base)
}

// Path returns the file's path.
func (s *Store) Path() string { return s.path }

// Add implements deferral.Store. The record is written pending, whatever
// its State. Adding an id the file holds already writes nothing and
// returns the Seq it has: a retried Add is not a second ticket.
func (s *Store) Add(ctx context.Context, rec deferral.Record) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("boltbacklog: add %s: %w", rec.ID, err)
	}
	if rec.ID == "" {
		return 0, errors.New("boltbacklog: add: empty ticket id")
	}
	rec.State, rec.Claim, rec.Reason, rec.Finished = deferral.StatePending, deferral.Claim{}, "", time.Time{}
	var seq uint64
	err := s.batch(func(tx *bolt.Tx) error {
		b := tx.Bucket(ticketsBucket)
		if v := b.Get([]byte(rec.ID)); v != nil {
			old, err := decode(v)
			seq = old.Seq
			return err
		}
		n, err := b.NextSequence()
		if err != nil {
			return err
		}
		rec.Seq = n
		if err := put(b, rec); err != nil {
			return err
		}
		seq = n
		return tx.Bucket(openBucket).Put(seqKey(n), []byte(rec.ID))
	})
	if err != nil {
		return 0, fmt.Errorf("boltbacklog: add %s: %w", rec.ID, err)
	}
	return seq, nil
}

// Claim implements deferral.Store; on success cur is the claimed record.
func (s *Store) Claim(ctx context.Context, id string, c deferral.Claim) (cur deferral.Record, ok bool, err error) {
	found := false
	err = s.update(ctx, func(tx *bolt.Tx) error {
		cur, ok, found = deferral.Record{}, false, false
		b := tx.Bucket(ticketsBucket)
		v := b.Get([]byte(id))
		if v == nil {
			return nil
		}
		found = true
		rec, err := decode(v)
		if err != nil || rec.State != deferral.StatePending {
			cur = rec
			return err
		}
		cur = rec
		cur.State, cur.Claim, ok = deferral.StateClaimed, c, true
		return put(b, cur)
	})
	switch {
	case err != nil:
		return deferral.Record{}, false, fmt.Errorf("boltbacklog: claim %s: %w", id, err)
	case !found:
		return deferral.Record{}, false, fmt.Errorf("boltbacklog: claim %s: %w", id, deferral.ErrNotFound)
	}
	return cur, ok, nil
}

// Unclaim implements deferral.Store. A pending ticket is left as it is,
// and so is a final one: a lease that lapses after its ticket finished
// (released, say, through another path) must not bring it back.
func (s *Store) Unclaim(ctx context.Context, id string, leaseID uint64) error {
	return s.change(ctx, "unclaim", id, func(tx *bolt.Tx, rec deferral.Record) error {
		if !rec.ClaimedWith(leaseID) {
			return nil
		}
		rec.State, rec.Claim = deferral.StatePending, deferral.Claim{}
		return put(tx.Bucket(ticketsBucket), rec)
	})
}

// Finish implements deferral.Store. A ticket already final keeps its
// first final state: the answer the submitter may have seen stands.
func (s *Store) Finish(ctx context.Context, id string, state deferral.State, reason string, at time.Time) error {
	if !state.Final() {
		return fmt.Errorf("boltbacklog: finish %s: state %s is not final", id, state)
	}
	return s.change(ctx, "finish", id, func(tx *bolt.Tx, rec deferral.Record) error {
		if !rec.State.Finishes(state) {
			return nil
		}
		if err := tx.Bucket(openBucket).Delete(seqKey(rec.Seq)); err != nil {
			return err
		}
		rec.State, rec.Reason, rec.Finished = state, reason, at
		if err := put(tx.Bucket(ticketsBucket), rec); err != nil {
			return err
		}
		return tx.Bucket(finishedBucket).Put(finishedKey(at, id), nil)
	})
}

// change runs fn on ticket id's record in a batched write, or returns
// ErrNotFound.
func (s *Store) change(ctx context.Context, op, id string, fn func(*bolt.Tx, deferral.Record) error) error {
	found := false
	err := s.update(ctx, func(tx *bolt.Tx) error {
		found = false
		v := tx.Bucket(ticketsBucket).Get([]byte(id))
		if v == nil {
			return nil
		}
		found = true
		rec, err := decode(v)
		if err != nil {
			return err
		}
		return fn(tx, rec)
	})
	switch {
	case err != nil:
		return fmt.Errorf("boltbacklog: %s %s: %w", op, id, err)
	case !found:
		return fmt.Errorf("boltbacklog: %s %s: %w", op, id, deferral.ErrNotFound)
	}
	return nil
}

// Get implements deferral.Store: final tickets until Sweep drops them.
func (s *Store) Get(ctx context.Context, id string) (deferral.Record, error) {
	if err := ctx.Err(); err != nil {
		return deferral.Record{}, fmt.Errorf("boltbacklog: get %s: %w", id, err)
	}
	var rec deferral.Record
	found := false
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(ticketsBucket).Get([]byte(id))
		if v == nil {
			return nil
		}
		found = true
		var err error
		rec, err = decode(v)
		return err
	})
	switch {
	case err != nil:
		return deferral.Record{}, fmt.Errorf("boltbacklog: get %s: %w", id, err)
	case !found:
		return deferral.Record{}, fmt.Errorf("boltbacklog: get %s: %w", id, deferral.ErrNotFound)
	}
	return rec, nil
}

// Adopt implements deferral.Store: the first call returns, in Seq order,
// the unfinished tickets an earlier process wrote; later calls nothing.
func (s *Store) Adopt(ctx context.Context) ([]deferral.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("boltbacklog: adopt: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.adopted {
		return nil, nil
	}
	var out []deferral.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		tickets := tx.Bucket(ticketsBucket)
		c := tx.Bucket(openBucket).Cursor()
		for k, id := c.First(); k != nil && binary.BigEndian.Uint64(k) <= s.openSeq; k, id = c.Next() {
			v := tickets.Get(id)
			if v == nil {
				return fmt.Errorf("open index holds seq %d for %s, which has no record", binary.BigEndian.Uint64(k), id)
			}
			rec, err := decode(v)
			if err != nil {
				return err
			}
			out = append(out, rec)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("boltbacklog: adopt from %s: %w", s.path, err)
	}
	s.mu.adopted = true
	return out, nil
}

// Sweep drops the final tickets that finished more than Options.Retention
// before now, and returns how many. The caller runs it periodically (and
// Close runs it once); until then Get still finds them.
func (s *Store) Sweep(now time.Time) (int, error) {
	cutoff := now.Add(-s.opts.Retention)
	dropped := 0
	for {
		n := 0
		err := s.db.Update(func(tx *bolt.Tx) error {
			n = 0
			fin := tx.Bucket(finishedBucket)
			var keys [][]byte
			c := fin.Cursor()
			for k, _ := c.First(); k != nil && len(keys) < sweepChunk; k, _ = c.Next() {
				if finishedTime(k).After(cutoff) {
					break
				}
				keys = append(keys, append([]byte(nil), k...))
			}
			tickets := tx.Bucket(ticketsBucket)
			for _, k := range keys {
				if err := tickets.Delete(k[8:]); err != nil {
					return err
				}
				if err := fin.Delete(k); err != nil {
					return err
				}
			}
			n = len(keys)
			return nil
		})
		if err != nil {
			return dropped, fmt.Errorf("boltbacklog: sweep %s: %w", s.path, err)
		}
		dropped += n
		if n < sweepChunk {
			return dropped, nil
		}
	}
}

// Close sweeps once more and closes the file, releasing its lock. A
// second Close returns the first one's answer.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		_, err := s.Sweep(s.opts.Now())
		if cerr := s.db.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("boltbacklog: close %s: %w", s.path, cerr))
		}
		s.closeErr = err
	})
	return s.closeErr
}

// update is a batched write (see the package doc: fn may run twice and
// must set its results from scratch).
func (s *Store) update(ctx context.Context, fn func(*bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.batch(fn)
}

func (s *Store) batch(fn func(*bolt.Tx) error) error {
	return s.db.Batch(func(tx *bolt.Tx) error {
		if id := int64(tx.ID()); s.lastTx.Swap(id) != id {
			tx.OnCommit(func() { s.commits.Add(1) })
		}
		return fn(tx)
	})
}

func put(b *bolt.Bucket, rec deferral.Record) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode %s: %w", rec.ID, err)
	}
	return b.Put([]byte(rec.ID), v)
}

func decode(v []byte) (deferral.Record, error) {
	var rec deferral.Record
	if err := json.Unmarshal(v, &rec); err != nil {
		return deferral.Record{}, fmt.Errorf("decode record: %w", err)
	}
	return rec, nil
}

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// finishedKey orders by time: Unix nanoseconds with the sign bit flipped,
// so that times before 1970 sort first; times outside what int64
// nanoseconds hold (a zero time, say) are clamped to its ends.
func finishedKey(at time.Time, id string) []byte {
	var ns int64
	switch {
	case at.Before(minNanos):
		ns = math.MinInt64
	case at.After(maxNanos):
		ns = math.MaxInt64
	default:
		ns = at.UnixNano()
	}
	k := binary.BigEndian.AppendUint64(nil, uint64(ns)^(1<<63))
	return append(k, id...)
}

var (
	minNanos = time.Unix(0, math.MinInt64)
	maxNanos = time.Unix(0, math.MaxInt64)
)

func finishedTime(k []byte) time.Time {
	return time.Unix(0, int64(binary.BigEndian.Uint64(k)^(1<<63)))
}
