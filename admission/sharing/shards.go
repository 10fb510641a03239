package sharing

import (
	"slices"
	"strings"
	"time"
)

// shard is one shard of the store as batched rounds see it: its own
// breaker and fail state, and its part of the round being built. A store
// that is not Sharded is one shard, named "".
type shard struct {
	name string
	br   storeBreaker
	down bool // its breaker is open: the fail modes apply to its tenants
	// inflight: its call of an earlier round has not answered yet (a
	// master that stopped answering waits out the call's timeout); rounds
	// leave it be until it does.
	inflight bool

	// This round's part, under the engine's lock while it is built.
	used    bool // some tenant or domain here is on it
	send    bool // its breaker lets this round's call through
	req     ReconcileRequest
	tenants []tenantRound
	domains []domainRound
	engines []Domain // the domain of each entry of req.Engines
}

// ShardStatus is one shard's state, for metrics and GetConfigStatus.
type ShardStatus struct {
	Name string // the shard's name ("" for a store that is not sharded)
	Down bool   // its breaker is open
}

// shardSet is the shards this replica's rounds have met, and whether any
// of them is down.
type shardSet struct {
	byName map[string]*shard
	down   int // shards whose breaker is open
	// The time any shard was down: the replica's fallback time.
	downSince time.Time
	downTotal time.Duration
}

// shardOf names the shard of an engine key: "" unless the store is Sharded.
func (s *batchedState) shardOf(key string) string {
	if s.sharded == nil {
		return ""
	}
	return s.sharded.Shard(key)
}

// partLocked returns the shard named name, ready to take a bucket of this
// round (nil if its breaker holds this round's call back).
func (s *batchedState) partLocked(name string) *shard {
	sh := s.shards.byName[name]
	if sh == nil {
		sh = &shard{name: name, br: storeBreaker{limit: s.opts.Failures, cooldown: probeEvery(s.opts) / 2}}
		s.shards.byName[name] = sh
	}
	if !sh.used {
		sh.used = true
		// A call still out owns its request: this round leaves it be.
		sh.send = !sh.inflight && sh.br.allow(s.v.Wall())
		if sh.send {
			sh.req = ReconcileRequest{
				Shard:    name,
				Replica:  s.opts.Replica,
				Replicas: s.replicas,
				Stale:    staleRounds * s.opts.Interval,
				Rejoin:   rejoinRounds * s.opts.Interval,
				Buckets:  sh.req.Buckets[:0],
				Gauges:   sh.req.Gauges[:0],
				Engines:  sh.req.Engines[:0],
			}
			sh.tenants, sh.domains, sh.engines = sh.tenants[:0], sh.domains[:0], sh.engines[:0]
		}
	}
	if !sh.send {
		return nil
	}
	return sh
}

// beginRoundLocked clears every shard's part of the last round.
func (s *batchedState) beginRoundLocked() {
	for _, sh := range s.shards.byName {
		sh.used, sh.send = false, false
	}
}

// endRoundLocked returns the shards this round calls (in flight until
// they answer), and forgets those no tenant or domain here is on any
// more: a shard that lost its slots (a failover, a migration). A
// forgotten shard that was down is down no more: its buckets, if any come
// back to it, start from a closed breaker.
func (s *batchedState) endRoundLocked() (calls []*shard, held bool) {
	for name, sh := range s.shards.byName {
		switch {
		case sh.inflight:
			// Still out: neither called nor forgotten until it answers.
		case !sh.used:
			if sh.down {
				s.shardDownLocked(sh, false)
			}
			delete(s.shards.byName, name)
		case sh.send:
			sh.inflight = true
			calls = append(calls, sh)
		default:
			held = true
		}
	}
	return calls, held
}

// shardFailedLocked counts a failed call to sh; its breaker may open.
func (s *batchedState) shardFailedLocked(sh *shard) {
	s.failures.Add(1)
	if sh.br.failure(s.v.Wall()) {
		s.shardDownLocked(sh, true)
	}
}

// shardOKLocked counts a successful call to sh; its open breaker closes
// (a reconcile carries its own resume report).
func (s *batchedState) shardOKLocked(sh *shard) {
	wall := s.v.Wall()
	s.lastOK.Store(wall.UnixNano())
	if sh.br.recovered(wall) {
		s.shardDownLocked(sh, false)
	}
}

// shardDownLocked marks sh down or up; the replica is in fallback while
// any shard is down (Options.OnBreaker hears of the first down and the
// last up).
func (s *batchedState) shardDownLocked(sh *shard, down bool) {
	if sh.down == down {
		return
	}
	sh.down = down
	wall := s.v.Wall()
	if down {
		if s.shards.down == 0 {
			s.shards.downSince = wall
		}
		s.shards.down++
	} else {
		s.shards.down--
		if s.shards.down == 0 {
			s.shards.downTotal += wall.Sub(s.shards.downSince)
		}
	}
	s.setDownLocked(s.shards.down > 0)
}

// tenantDownLocked reports whether the shard holding t's buckets is down.
// One comparison while no shard is.
func (s *batchedState) tenantDownLocked(t Tenant) bool {
	if s.shards.down == 0 {
		return false
	}
	sh := s.shards.byName[s.shardOf(tenantKey(t.Name(), KindRPS))]
	return sh != nil && sh.down
}

// Status implements Strategy: the link's counters, with the breaker open
// while any shard's is, and each shard's state.
func (s *batchedState) Status() (Status, bool) {
	st, _ := s.storeLink.Status()
	wall := s.v.Wall()
	s.v.Lock()
	st.BreakerOpen = s.shards.down > 0
	fallback := s.shards.downTotal
	if st.BreakerOpen {
		fallback += wall.Sub(s.shards.downSince)
	}
	st.FallbackSeconds = fallback.Seconds()
	if s.sharded != nil {
		for _, sh := range s.shards.byName {
			st.Shards = append(st.Shards, ShardStatus{Name: sh.name, Down: sh.down})
		}
	}
	s.v.Unlock()
	slices.SortFunc(st.Shards, func(a, b ShardStatus) int { return strings.Compare(a.Name, b.Name) })
	return st, true
}
