// Package admissiontest holds fakes of sharing.Store for tests:
// a store that can be taken down (Flaky), one that holds commits until the
// test lets them through (Gated), and one that counts the calls and
// reports that reach it (Counting). Each wraps another sharing.Store (in
// tests, usually internal/state/memstate) and stacks with the others.
package admissiontest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/sluice-sched/sluice/admission/sharing"
)

// ErrDown is what a Flaky store's calls fail with while it is down.
var ErrDown = errors.New("admissiontest: store down")

// Flaky is a store that can be taken down: while it is down every call
// fails with ErrDown without reaching the store it wraps; once up again
// calls pass through. It is safe for concurrent use.
type Flaky struct {
	sharing.Store
	down atomic.Bool

	mu     sync.Mutex
	hang   chan struct{} // non-nil while hung; closed to let the held calls go
	waited atomic.Int64
}

// NewFlaky returns an up store in front of s.
func NewFlaky(s sharing.Store) *Flaky { return &Flaky{Store: s} }

// SetDown takes the store down (true) or brings it back up (false).
func (f *Flaky) SetDown(down bool) { f.down.Store(down) }

// Down reports whether the store is down.
func (f *Flaky) Down() bool { return f.down.Load() }

// SetHung makes every Reconcile wait, as a master that stopped answering
// does, until its context ends or SetHung(false) lets it through.
func (f *Flaky) SetHung(hung bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case hung && f.hang == nil:
		f.hang = make(chan struct{})
	case !hung && f.hang != nil:
		close(f.hang)
		f.hang = nil
	}
}

// Hung counts the calls that have waited on a hang.
func (f *Flaky) Hung() int64 { return f.waited.Load() }

func (f *Flaky) waitHang(ctx context.Context) error {
	f.mu.Lock()
	hang := f.hang
	f.mu.Unlock()
	if hang == nil {
		return nil
	}
	f.waited.Add(1)
	select {
	case <-hang:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Reconcile implements sharing.Store.
func (f *Flaky) Reconcile(ctx context.Context, r *sharing.ReconcileRequest) (*sharing.ReconcileReply, error) {
	if err := f.waitHang(ctx); err != nil {
		return nil, err
	}
	if f.Down() {
		return nil, ErrDown
	}
	return f.Store.Reconcile(ctx, r)
}

// Commit implements sharing.Store.
func (f *Flaky) Commit(ctx context.Context, c *sharing.StrictCharge) (sharing.StrictVerdict, error) {
	if f.Down() {
		return sharing.StrictVerdict{}, ErrDown
	}
	return f.Store.Commit(ctx, c)
}

// Settle implements sharing.Store.
func (f *Flaky) Settle(ctx context.Context, s *sharing.StrictSettle) error {
	if f.Down() {
		return ErrDown
	}
	return f.Store.Settle(ctx, s)
}

// Ping implements sharing.Store.
func (f *Flaky) Ping(ctx context.Context) error {
	if f.Down() {
		return ErrDown
	}
	return f.Store.Ping(ctx)
}

// Gated holds every Commit until the test decides it: each arriving
// commit is announced on Entered and then waits for Pass (the wrapped
// store decides it) or Refuse (refused without reaching the store), or
// for its context to end. Reconcile, Settle and Ping pass through.
type Gated struct {
	sharing.Store
	entered chan struct{}
	gate    chan func(context.Context, *sharing.StrictCharge) (sharing.StrictVerdict, error)
}

// NewGated returns a gate in front of s. Up to buffer commits may be
// announced on Entered before anyone receives them.
func NewGated(s sharing.Store, buffer int) *Gated {
	return &Gated{
		Store:   s,
		entered: make(chan struct{}, buffer),
		gate:    make(chan func(context.Context, *sharing.StrictCharge) (sharing.StrictVerdict, error)),
	}
}

// Entered receives once for every commit that arrives at the gate.
func (g *Gated) Entered() <-chan struct{} { return g.entered }

// Pass lets one held commit through to the wrapped store; it blocks
// until a commit takes it.
func (g *Gated) Pass() {
	g.gate <- g.Store.Commit
}

// Refuse answers one held commit with v, a refusal (v.Admitted is
// ignored): v.Refused is the index of the refusing take, len(Takes) for
// the KV gauge. It blocks until a commit takes it.
func (g *Gated) Refuse(v sharing.StrictVerdict) {
	v.Admitted = false
	g.gate <- func(context.Context, *sharing.StrictCharge) (sharing.StrictVerdict, error) { return v, nil }
}

// Commit implements sharing.Store: it announces itself and waits
// for the test's decision.
func (g *Gated) Commit(ctx context.Context, c *sharing.StrictCharge) (sharing.StrictVerdict, error) {
	g.entered <- struct{}{}
	select {
	case decide := <-g.gate:
		return decide(ctx, c)
	case <-ctx.Done():
		return sharing.StrictVerdict{}, ctx.Err()
	}
}

// Report is what one Reconcile call reported.
type Report struct {
	TenantBuckets int // buckets of tenants ("t/…" keys)
	DomainBuckets int // buckets of domains ("d/…" keys)
	Gauges        int
}

// Counting counts the calls that reach it and what each reconcile
// reports, then passes them to the store it wraps. It is safe for
// concurrent use.
type Counting struct {
	sharing.Store
	mu      sync.Mutex
	reports []Report
	commits int
	settles int
}

// NewCounting returns a counter in front of s.
func NewCounting(s sharing.Store) *Counting { return &Counting{Store: s} }

// Reconcile implements sharing.Store.
func (c *Counting) Reconcile(ctx context.Context, r *sharing.ReconcileRequest) (*sharing.ReconcileReply, error) {
	var rep Report
	for _, b := range r.Buckets {
		switch {
		case strings.HasPrefix(b.Key, "t/"):
			rep.TenantBuckets++
		case strings.HasPrefix(b.Key, "d/"):
			rep.DomainBuckets++
		}
	}
	rep.Gauges = len(r.Gauges)
	c.mu.Lock()
	c.reports = append(c.reports, rep)
	c.mu.Unlock()
	return c.Store.Reconcile(ctx, r)
}

// Commit implements sharing.Store.
func (c *Counting) Commit(ctx context.Context, ch *sharing.StrictCharge) (sharing.StrictVerdict, error) {
	c.mu.Lock()
	c.commits++
	c.mu.Unlock()
	return c.Store.Commit(ctx, ch)
}

// Settle implements sharing.Store.
func (c *Counting) Settle(ctx context.Context, s *sharing.StrictSettle) error {
	c.mu.Lock()
	c.settles++
	c.mu.Unlock()
	return c.Store.Settle(ctx, s)
}

// Reports returns what every reconcile so far reported, in call order.
func (c *Counting) Reports() []Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Report(nil), c.reports...)
}

// Commits returns how many Commit calls arrived.
func (c *Counting) Commits() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.commits
}

// Settles returns how many Settle calls arrived.
func (c *Counting) Settles() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.settles
}

// Sharded spreads keys over several stores, as a Redis Cluster spreads
// them over its masters: a key's shard follows its owner (everything up
// to its last slash: "t/acme" of "t/acme/rps"), by a hash. Each shard is
// a Flaky in front of its own store, so a test takes one shard down. It
// implements sharing.Sharded; Commit and Settle must stay on one
// shard (strict mode's split across shards is redisstate's, tested
// there).
type Sharded struct {
	names  []string
	shards map[string]*Flaky
}

// NewSharded returns a store over the named shards, each in front of the
// store new makes for it.
func NewSharded(names []string, new func(name string) sharing.Store) *Sharded {
	s := &Sharded{names: names, shards: make(map[string]*Flaky, len(names))}
	for _, n := range names {
		s.shards[n] = NewFlaky(new(n))
	}
	return s
}

// Of returns the named shard, to take down or bring up.
func (s *Sharded) Of(name string) *Flaky { return s.shards[name] }

// Shard implements sharing.Sharded.
func (s *Sharded) Shard(key string) string {
	owner := key
	if i := strings.LastIndexByte(key, '/'); i >= 0 {
		owner = key[:i]
	}
	h := uint32(2166136261) // FNV-1a
	for i := 0; i < len(owner); i++ {
		h = (h ^ uint32(owner[i])) * 16777619
	}
	return s.names[h%uint32(len(s.names))]
}

// Reconcile implements sharing.Store: one call per shard the
// request's keys are on (an empty request checks its Shard).
func (s *Sharded) Reconcile(ctx context.Context, r *sharing.ReconcileRequest) (*sharing.ReconcileReply, error) {
	if len(r.Buckets) == 0 && len(r.Gauges) == 0 && len(r.Engines) == 0 {
		if sh := s.shards[r.Shard]; sh != nil {
			return sh.Reconcile(ctx, r)
		}
		return &sharing.ReconcileReply{}, s.Ping(ctx)
	}
	parts := make(map[string]*sharing.ReconcileRequest)
	type at struct {
		shard string
		i     int
	}
	var buckets, gauges, engines []at
	part := func(key string) (string, *sharing.ReconcileRequest) {
		name := s.Shard(key)
		p := parts[name]
		if p == nil {
			c := *r
			c.Shard, c.Buckets, c.Gauges, c.Engines = name, nil, nil, nil
			p = &c
			parts[name] = p
		}
		return name, p
	}
	for _, b := range r.Buckets {
		name, p := part(b.Key)
		buckets = append(buckets, at{name, len(p.Buckets)})
		p.Buckets = append(p.Buckets, b)
	}
	for _, g := range r.Gauges {
		name, p := part(g.Key)
		gauges = append(gauges, at{name, len(p.Gauges)})
		p.Gauges = append(p.Gauges, g)
	}
	for _, e := range r.Engines {
		name, p := part(e.Key)
		engines = append(engines, at{name, len(p.Engines)})
		p.Engines = append(p.Engines, e)
	}
	replies := make(map[string]*sharing.ReconcileReply, len(parts))
	for name, p := range parts {
		rep, err := s.shards[name].Reconcile(ctx, p)
		if err != nil {
			return nil, err
		}
		replies[name] = rep
	}
	out := &sharing.ReconcileReply{}
	for _, a := range buckets {
		out.Buckets = append(out.Buckets, replies[a.shard].Buckets[a.i])
	}
	for _, a := range gauges {
		out.Gauges = append(out.Gauges, replies[a.shard].Gauges[a.i])
		out.Readings = append(out.Readings, reading(replies[a.shard], a.i))
	}
	for _, a := range engines {
		p := parts[a.shard]
		out.Readings = append(out.Readings, reading(replies[a.shard], len(p.Gauges)+a.i))
	}
	return out, nil
}

// reading is the i-th engine reading of a shard's reply (nil from a store
// that relays none).
func reading(rep *sharing.ReconcileReply, i int) *sharing.EngineReading {
	if rep.Readings == nil {
		return nil
	}
	return rep.Readings[i]
}

// errAcrossShards is a strict call whose keys are on several shards.
var errAcrossShards = errors.New("admissiontest: a strict call across shards")

// one returns the shard every key is on.
func (s *Sharded) one(keys ...string) (*Flaky, error) {
	name := s.Shard(keys[0])
	for _, k := range keys[1:] {
		if s.Shard(k) != name {
			return nil, errAcrossShards
		}
	}
	return s.shards[name], nil
}

// Commit implements sharing.Store (on one shard).
func (s *Sharded) Commit(ctx context.Context, c *sharing.StrictCharge) (sharing.StrictVerdict, error) {
	keys := []string{c.KV.Key}
	for _, t := range c.Takes {
		keys = append(keys, t.Key)
	}
	sh, err := s.one(keys...)
	if err != nil {
		return sharing.StrictVerdict{}, err
	}
	return sh.Commit(ctx, c)
}

// Settle implements sharing.Store (on one shard).
func (s *Sharded) Settle(ctx context.Context, st *sharing.StrictSettle) error {
	keys := []string{st.KVKey}
	for _, t := range st.Refunds {
		keys = append(keys, t.Key)
	}
	sh, err := s.one(keys...)
	if err != nil {
		return err
	}
	return sh.Settle(ctx, st)
}

// Ping implements sharing.Store: every shard answers.
func (s *Sharded) Ping(ctx context.Context) error {
	for _, n := range s.names {
		if err := s.shards[n].Ping(ctx); err != nil {
			return err
		}
	}
	return nil
}

var _ sharing.Sharded = (*Sharded)(nil)
