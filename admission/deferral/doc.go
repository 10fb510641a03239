// Package deferral is Sluice's backlog of deferrable work: requests that
// may wait minutes or hours (batch inference, evaluations, embeddings)
// and that, when they cannot run at once, are answered DEFERRED with a
// ticket instead of waiting in the in-memory queue or being refused.
//
// # A ticket's life
//
//	Admit ──engine admits now──▶ ADMITTED (no ticket; the router runs it)
//	  └── engine defers ──▶ Store.Add ──▶ PENDING ──▶ DEFERRED(ticket) answered
//	PENDING ──admitted from the backlog, Store.Claim──▶ CLAIMED ──Release──▶ DONE
//	PENDING ──defer_within passes──▶ EXPIRED
//	PENDING ──CancelTicket──▶ CANCELLED
//	CLAIMED ──lease ends unreleased, or the worker's stream breaks──▶ PENDING
//
// A final state (DONE, EXPIRED, CANCELLED) is never left; a claimed ticket
// is not cancelled (its worker runs it). The engine decides every
// admission (Engine.Admit with Deferrable): a deferrable request runs only
// on what interactive traffic leaves (nothing while an interactive request
// waits, shared capacity above the floors' reserve and the headroom, the
// tenant's own quota without burst credit), and is refused only for what
// waiting cannot mend (an unknown tenant, a request too large for its
// quota or for any domain).
//
// # Fair order
//
// Pending tickets wait in a wfq.Queue, one flow per tenant weighted by the
// tenant's weight, each ticket costing its weighted tokens. A grant pass
// takes, under the backlog's lock, the heads a waiting worker accepts (at
// most scanLimit a band) in increasing finish tag; asks the engine about
// them in that order without the lock (in strict mode each Admit is a
// round trip to Redis); and serves the first one admitted under the lock
// again, in the place it held (wfq.Queue.Serve: the virtual time moves to
// its tag, as Dequeue's would). A head held back by capacity holds the
// heads behind it (they would take every refill before it); one held back
// by its own tenant's quota is passed over. A head that left meanwhile
// (cancelled, expired) is not served and its admission is revoked. One
// grant pass runs at a time.
//
// # Durability
//
// A DEFERRED answer leaves only after Store.Add has returned. The store is
// a port (Store) with three adapters: memory (MemStore), a bbolt file
// (internal/state/boltbacklog) and Redis Streams
// (internal/state/redisbacklog). Start adopts the store's unfinished
// tickets: pending ones into the fair order, claimed ones once their lease
// would have ended (the process that held the lease is gone).
//
// # Redelivery and charging
//
// Delivery to workers is at least once; accounting is exactly once. A
// ticket's admission charges its tenant and domain when the engine grants
// it, as any admission does. A claim whose write or send fails is revoked
// (its charge cancelled, as if never made) and the ticket is pending
// again. A worker that dies holding a ticket lets its lease reach the TTL:
// the engine settles that lease as unused (OnDeferredLeaseExpired) and the
// ticket is delivered again, charged when it runs. Release settles the
// real usage and ends the ticket DONE.
package deferral
