// Package wfq is Sluice's weighted fair queue: self-clocked fair queueing
// (SCFQ, Golestani 1994) over flows, with a min-heap of flow heads. It knows
// nothing of GPUs; the dispatcher tells it what fits through a callback.
//
// # Model
//
// A flow f is a (tenant, model) pair, FlowKey. Each band b (critical and
// normal) is its own fair queue with its own virtual time V_b, a uint64 that
// starts at 0. An item i of flow f, with cost cᵢ > 0 and weight wᵢ ≥ 1,
// entering band b gets the finish tag
//
//	Fᵢ = max(F_last(f, b), V_b) + ⌈cᵢ · 2¹⁶ / wᵢ⌉
//
// where F_last(f, b) is the tag of f's last queued item in band b, or V_b if
// f has none queued there. Tags are fixed point: 2¹⁶ (TagUnit) is cost 1 at
// weight 1; rounding up costs at most 2⁻¹⁶ of a cost unit per item and keeps
// every increment ≥ 1. Sums that would pass 2⁶⁴−1 saturate; at 10⁶ cost
// units per second of weight-1 service V_b reaches 2⁶⁴ only after ~9 years.
//
// Service. Each flow is a FIFO per band. Dequeue serves the critical band
// first, then the normal band; within a band it takes, among flow heads in
// increasing (Fᵢ, sᵢ) order (sᵢ the enqueue sequence number, unique per
// queue), the first the caller's fits function accepts, examining at most
// maxScan heads. Heads passed over stay where they are. On dequeuing item i
// from band b:
//
//	V_b ← max(V_b, Fᵢ)
//
// (in SCFQ V is the tag of the item in service; the max keeps V monotone when
// fits makes Dequeue serve a head other than the smallest).
//
// Fairness. While flows f and g both stay backlogged in a band over an
// interval in which every Dequeue takes the smallest head, the service W
// (sum of costs dequeued) they receive satisfies the SCFQ bound
//
//	| W_f / w_f − W_g / w_g | ≤ c_max,f / w_f + c_max,g / w_g
//
// so shares converge to the weight ratio. A flow that was idle gets no credit
// for it: its first tag starts from V_b, not from where it left off.
//
// Removal. Remove takes an item out (a deadline expired, a client went
// away) without advancing V, and the items behind it in its lane move up by
// its increment ⌈cᵢ · 2¹⁶ / wᵢ⌉, as if it had never come: a request that
// leaves unserved costs its flow no virtual time. (Were the tags to stay,
// every expiry would push the flow's later requests back, more of them
// would expire, and the flow would fall below its share.) Remove is
// O(log flows + log items in its lane) for the lane's head or tail, and
// O(items behind it) more for an item in between: so a mass expiry of
// deadlines in arrival order, each flow's oldest first, costs
// O(log flows + log items) for each request it refuses (see Costs).
//
// Forgetting. A flow with no queued item in either band is deleted: each of
// its dequeued tags is ≤ V_b, so max(F_last, V_b) = V_b and remembering it
// would change nothing. Memory is proportional to the flows with queued
// items, but for each band's array of lanes, which keeps room for the most
// lanes the band has held at once (see Costs).
//
// # Costs
//
// Enqueue and Dequeue (when the first head examined fits) are
// O(log flows): the heap holds one entry per non-empty (flow, band), 4-ary,
// keyed by the head's (F, s). An entry is 16 bytes, the key and the lane's
// id, so four siblings share one cache line and sifting reads no lane and
// no item. Each band keeps its lanes in a dense array by id, and the heap
// index of each id in another, so sifting writes no lane either. A lane
// holds its items and a copy of their keys in a ring: in the lane itself up
// to four items, past that in a ring of its own, which doubles when full
// and halves when a quarter full. So Enqueue writes the lane and not the
// item before it, and Dequeue reads the next head's key from the lane, not
// from the next item. A Dequeue that passes over k heads costs
// O(k log k) more. Remove finds the item by a binary search of its
// lane's sequence numbers, which increase from the head, and moves the
// items behind it up by its increment one by one, except for the head of a
// lane past four items: there the lane's ring keeps a drop, which every
// tag in it is lowered by as it is read, so removing the head adds to the
// drop in O(1), and the drop comes out into the tags when the ring is next
// resized. Enqueue looks the flow up in a map; EnqueueFlow,
// with a *Flow handle from Queue.Flow, skips that lookup. Nothing is
// allocated per item: items are the caller's, and a lane allocates only as
// its length passes a power of two above four. A band's lane array is as
// long as the most lanes it has held at once, 128 bytes a lane. Sequence
// numbers are 32 bits: when they run out, the queued items are renumbered
// in their order, in O(n log n) once every 2³² Enqueues.
//
// Memory is laid out for the cache: a lane is two cache lines (keys, then
// items), a Flow one, and the queue's fields of an Item are in its first.
// At 100k flows these are cache misses all the same, so Dequeue prefetches
// (PREFETCHT0, PRFM: a hint that does not wait) the item and flow that the
// Dequeue after next serves, and the lane of the one after that, the heads
// next in order being the top of the heap; and a sift prefetches the heap
// level below the next.
//
// # Position
//
// WorkAhead estimates the work served before an item that would enter now,
// without a scan of items: a lane l of weight w_l with tail tag T_l holds
// about w_l·(T_l − V_b) of work tagged after V_b, so the work tagged before
// the new item's F is
//
//	⌊Σ_l w_l · (min(T_l, F) − V_b)⁺ / 2¹⁶⌋   (+ the whole critical band, for a normal item)
//
// in cost units, one floor over the exact sum, saturated at 2⁶⁴−1. A light
// flow behind a neighbour's burst has only the burst's weighted share of
// its own span ahead of it, not the burst: this is what lets the engine
// refuse a request for its deadline only when its own place in the fair
// order cannot be served in time. The estimate is off by at most one item
// per lane (a head partly served, an item straddling F), while V follows
// the served tags: a Dequeue that serves a head other than the smallest
// moves V past the lanes of the heads it passed over, and their work drops
// out of the estimate. FlowCost is exact whatever V does: the cost a flow
// has queued in both bands, all of it ahead of a normal item the flow
// enqueues next (a flow is a FIFO in each band, and the critical band goes
// first), kept as a sum per flow in O(1).
//
// Each band keeps its lanes in a treap ordered by T_l, each node with its
// subtree's Σ w and Σ w·T (128 bits: below 2³¹ lanes · 2³² · 2⁶⁴), so that
//
//	Σ_l w_l · (min(T_l, F) − V)⁺ = Σ_{V<T≤F} w·T − V · Σ_{V<T≤F} w + (F − V) · Σ_{T>F} w
//
// is read from two descents, towards V and towards F: O(log lanes) per
// band (expected: the depth of a treap), whatever the lanes' lengths. The
// tree follows the lanes lazily:
// serving a head leaves its lane's tail in place, and every other change
// of a tail or a weight (Enqueue, Remove, a lane that empties) sets a flag
// in the lane, which the change has in cache, and appends the lane to a
// list once until the next estimate. The estimate first moves each listed
// lane's node, in O(log lanes). So Enqueue and Dequeue pay a flag test (at
// 100k flows a tree update at each Enqueue would cost several times the
// Enqueue itself, every node on the path a cache miss), each change is
// paid for once, by the next estimate, and an estimate costs O((1 + lanes
// changed since the last) · log lanes). A band's tree is an array of 48
// bytes a lane, as long as the lane array.
//
// # Bounds
//
// Config bounds each flow's items per band (MaxPerFlow), the items in both
// bands together (MaxTotal) and the items in the critical band (MaxCritical);
// a bound ≤ 0 is no bound. An Enqueue over a bound returns ErrFlowFull or
// ErrQueueFull and changes nothing; Check answers what an Enqueue would,
// without it. SetConfig never drops queued items.
//
// A Queue is not safe for concurrent use: the admission engine holds its
// lock around every call.
package wfq
