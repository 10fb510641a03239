// Package redisbacklog is the deferral.Store that replicas share: the
// deferred tickets in Redis Streams (go-redis UniversalClient: standalone,
// Sentinel or Cluster; Redis 7 or later), so that a ticket deferred
// through one replica is admitted by exactly one, and the tickets of a
// replica that stopped are adopted by another.
//
// # Keys
//
// A ticket belongs to a shard, FNV-1a(tenant) mod Options.Shards (16 by
// default), and its keys sit under the shard's hash tag:
//
//	<prefix>:{<shard>}:t:<id>   hash: rec (the record as added, JSON), sid
//	                            (its stream entry), state, claim (JSON),
//	                            reason, finished (RFC 3339)
//	<prefix>:{<shard>}:s        stream: one entry (field id) per unfinished
//	                            ticket, consumer group "sluice"
//
// so that every script touches one hash slot, a tenant's tickets share one
// stream (their order), and a Cluster spreads the shards over its masters.
// The prefix is Options.Prefix, "sluice:dfr" by default. Every replica must
// use the same Shards: it decides where a ticket is.
//
// # Seq
//
// A ticket's Seq is its entry's stream id ms-n mapped to ms<<20 | n: the
// ids of one stream increase (Redis keeps them so even when its clock
// steps back), so the Seqs of one tenant increase in submission order.
// Seqs of tenants in different shards come from different streams (on a
// Cluster, different servers' clocks): they order by time only roughly,
// and two may be equal. n stays below 2^20 (a million entries in one
// millisecond of one stream); Add fails otherwise.
//
// # Holds
//
// Each replica is a consumer of every stream's group, named
// Options.Consumer (its replica id, stable across restarts). Nobody reads
// the streams with ">": Add XCLAIMs the new entry to its own consumer with
// FORCE, which puts it in that consumer's pending entries list (PEL), in
// the script that XADDs it. An entry in a live replica's PEL is held: a
// goroutine started by Open re-XCLAIMs the replica's entries to itself
// (JUSTID, 1,000 a call) every Options.HoldRefresh, a third of
// Options.ReclaimIdle by default, so their idle time stays below
// ReclaimIdle. Finish XACKs and XDELs the entry (and keeps the hash for
// Options.Retention, 24 h by default, with EXPIRE); Claim and Unclaim
// change only the hash, in scripts that check its state, so that a cancel
// through another replica and a claim by the holder cannot both win.
//
// # Adopt
//
// The first Adopt of a Store returns its consumer's own PEL (a restart
// under the same name reads its history with XREADGROUP from id 0), up to
// the streams' last ids at Open: later entries were added through this
// Store, which holds them already. Every Adopt then reclaims, a page of
// the group's PEL at a time, the entries of other consumers idle for at
// least ReclaimIdle (a replica that stopped): a script reads the page with
// XPENDING and XCLAIMs them with that minimum idle time, so that of two
// adopters each entry goes to one. (XAUTOCLAIM would also take back this
// consumer's own entries whose refresh ran late, and return tickets it
// holds; the script refreshes those instead.) Each adopted entry's hash
// is read and the ticket returned unless it is final; entries whose hash
// is final or gone are acknowledged and deleted. The result is sorted by
// Seq, which orders each tenant's tickets.
//
// # Finding a ticket by id
//
// Claim, Unclaim, Finish and Get take only the id, and the shard comes
// from the tenant. The Store remembers the shard of the tickets it added,
// adopted or found; for another id (a GetTicket or CancelTicket through a
// replica that does not hold the ticket) it asks every shard at once
// (EXISTS, pipelined: one round trip per master).
package redisbacklog
