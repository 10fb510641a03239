package wfq

import (
	"cmp"
	"errors"
	"math"
	"math/bits"
	"slices"
	"unsafe"
)

// TagUnit is the finish-tag increment of an item of cost 1 at weight 1: tags
// are fixed point with 16 fractional bits.
const TagUnit uint64 = 1 << 16

// Errors returned by Enqueue. A rejected item is left untouched and the queue
// unchanged.
var (
	// ErrFlowFull: the item's flow already holds MaxPerFlow items in its band.
	ErrFlowFull = errors.New("wfq: flow queue full")
	// ErrQueueFull: the queue holds MaxTotal items, or the item is critical
	// and the critical band holds MaxCritical.
	ErrQueueFull = errors.New("wfq: queue full")
	// ErrQueued: the item is already in a queue.
	ErrQueued = errors.New("wfq: item already queued")
)

// FlowKey names a flow: a tenant's requests for one model tier.
type FlowKey struct{ Tenant, Model string }

// Item is one queued request. The caller allocates it, fills the exported
// fields, and keeps the pointer to Remove it later; the queue puts it into
// its flow without copying it, and allocates nothing per item (see Costs in
// the package doc). An item may be enqueued again once it has been
// dequeued or removed. While it is queued, its exported fields must not
// change and the Item must not be copied or overwritten as a whole (its
// unexported fields hold the queue's state).
type Item struct {
	// The queue's fields come first, then Cost and Weight, which Enqueue
	// reads: one cache line when the item is 64-byte aligned (a lone Item
	// is: 128-byte size class; and so is each Item of a slice, at 128 bytes
	// with the padding at the end).
	tag  uint64 // finish tag, set by Enqueue
	seq  uint32 // enqueue sequence number, unique per queue (see renumber)
	flow *Flow  // the flow holding the item; nil when not queued

	Cost     uint64 // > 0; a cost of 0 is served at the current virtual time
	Weight   uint64 // ≥ 1; 0 is taken as 1
	Flow     FlowKey
	Critical bool // served in the critical band, before every normal item
	Value    any  // the caller's payload
	_        [32]byte
}

// FinishTag returns the item's finish tag, in TagUnit units, as set by its
// last Enqueue and lowered by the Removes of items ahead of it in its flow
// (see Removal in the package doc). It stays readable after the item
// leaves the queue.
func (it *Item) FinishTag() uint64 {
	if f := it.flow; f != nil {
		b := bandOf(it)
		// While queued, tag is as its lane stores it (see lane).
		return satSub(it.tag, f.q.bands[b].lanes[f.lane[b]].drop())
	}
	return it.tag
}

// Queued reports whether the item is in a queue.
func (it *Item) Queued() bool { return it.flow != nil }

// Config holds the queue's bounds; a bound ≤ 0 is no bound.
type Config struct {
	MaxPerFlow  int // items of one flow in one band
	MaxTotal    int // items in both bands together
	MaxCritical int // items in the critical band
}

// Band indexes. Dequeue serves them in the order of serveOrder.
const (
	normal = iota
	critical
	nBands
)

var serveOrder = [nBands]int{critical, normal}

func bandOf(it *Item) int {
	if it.Critical {
		return critical
	}
	return normal
}

// noLane is Flow.lane's id for a band the flow has no item in.
const noLane = -1

// Flow is a handle on a flow of a Queue, for callers that want to skip the
// map lookup Enqueue does (see Queue.Flow and Queue.EnqueueFlow). A handle
// stays valid for the queue's life: once its flow has emptied and been
// forgotten, using the handle again looks the flow up by key.
//
// A Flow is what Enqueue reads before it finds the lane: 56 bytes, in a
// 64-byte size class, one cache line. Its lanes are in the bands' arrays.
type Flow struct {
	q    *Queue
	key  FlowKey
	lane [nBands]int32 // the flow's lane id in each band, or noLane
	// Σ Cost of its queued items, both bands: cost plus costHi·2⁶⁴, exact
	// (in the padding after live, so that a Flow stays one cache line).
	cost   uint64
	live   bool // in q.flows
	costHi uint32
}

// addCost adds c to the flow's queued cost.
func (f *Flow) addCost(c uint64) {
	var carry uint64
	f.cost, carry = bits.Add64(f.cost, c, 0)
	f.costHi += uint32(carry)
}

// subCost takes c, which it holds, out of the flow's queued cost.
func (f *Flow) subCost(c uint64) {
	var borrow uint64
	f.cost, borrow = bits.Sub64(f.cost, c, 0)
	f.costHi -= uint32(borrow)
}

// n returns the number of items f has queued, both bands together.
func (f *Flow) n() int {
	n := 0
	for b, id := range f.lane {
		if id != noLane {
			n += int(f.q.bands[b].lanes[id].n)
		}
	}
	return n
}

// Key returns the flow's key.
func (f *Flow) Key() FlowKey { return f.key }

// Len returns the number of items the flow has queued, both bands together.
func (f *Flow) Len() int {
	if !f.live {
		f = f.q.flows[f.key]
		if f == nil {
			return 0
		}
	}
	return f.n()
}

// band is one fair queue: a heap of non-empty lanes and a virtual time.
// Each non-empty lane has an id, its index in lanes and heap.pos, that it
// holds while it has items; ids are reused, most recent first, so the
// arrays are as long as the most lanes the band has held at once.
type band struct {
	heap  heap
	lanes []lane
	free  []int32 // ids not in use
	v     uint64  // virtual time
	n     int     // items queued
	tails tails   // the lanes by tail tag, for WorkAhead
}

// join gives flow f a new lane, whose only item is it with key (tag, seq),
// and a heap entry, and returns the lane's id.
func (bd *band) join(f *Flow, tag uint64, seq uint32, it *Item) int32 {
	var id int32
	if k := len(bd.free); k > 0 {
		id, bd.free = bd.free[k-1], bd.free[:k-1]
	} else {
		id = int32(len(bd.heap.pos))
		bd.heap.pos = append(bd.heap.pos, 0)
		bd.lanes = append(bd.lanes, lane{})
		bd.tails.grow(id)
	}
	l := &bd.lanes[id]
	l.flow = f
	l.push(tag, seq, it)
	bd.heap.push(entry{tag: tag, seq: seq, id: id})
	return id
}

// leave drops the heap entry at index i, whose lane has emptied, frees its
// id, and returns the lane's flow, which no longer holds the id.
func (bd *band) leave(b, i int) *Flow {
	id := bd.heap.e[i].id
	bd.heap.remove(i)
	bd.free = append(bd.free, id)
	l := &bd.lanes[id]
	bd.tails.mark(id, l)
	f := l.flow
	f.lane[b] = noLane
	*l = lane{marked: true} // drop the pointers; the mark stays until the tree sees the lane leave
	return f
}

// laneAt returns the lane of the heap entry at index i.
func (bd *band) laneAt(i int) *lane { return &bd.lanes[bd.heap.e[i].id] }

// head returns the head item of the lane at heap index i.
func (bd *band) head(i int) *Item { return bd.laneAt(i).at(0) }

// Queue is a weighted fair queue in two bands. It is not safe for concurrent
// use; its owner serialises calls.
type Queue struct {
	cfg   Config
	bands [nBands]band
	flows map[FlowKey]*Flow
	n     int
	seq   uint32 // the next item's sequence number
	// seqLimit is where seq wraps: New sets MaxUint32, tests less.
	seqLimit uint32
	scan     []int // Dequeue's scratch space for passing over heads
}

// New returns an empty queue with bounds cfg.
func New(cfg Config) *Queue {
	return &Queue{cfg: cfg, flows: make(map[FlowKey]*Flow), seqLimit: math.MaxUint32}
}

// SetConfig replaces the bounds. Items already queued stay, even above the
// new bounds; only later Enqueues are refused.
func (q *Queue) SetConfig(cfg Config) { q.cfg = cfg }

// Config returns the current bounds.
func (q *Queue) Config() Config { return q.cfg }

// Len returns the number of queued items.
func (q *Queue) Len() int { return q.n }

// CriticalLen returns the number of queued critical items.
func (q *Queue) CriticalLen() int { return q.bands[critical].n }

// Flows returns the number of flows with at least one queued item.
func (q *Queue) Flows() int { return len(q.flows) }

// FlowLen returns the number of items flow k has queued, both bands together.
func (q *Queue) FlowLen(k FlowKey) int {
	f := q.flows[k]
	if f == nil {
		return 0
	}
	return f.n()
}

// FlowCost returns the cost of the items flow k has queued, both bands
// together, saturated at MaxUint64: all of it is ahead of a normal item the
// flow enqueues next (see Position in the package doc), whatever the
// virtual time, which WorkAhead counts lanes from.
func (q *Queue) FlowCost(k FlowKey) uint64 {
	f := q.flows[k]
	switch {
	case f == nil:
		return 0
	case f.costHi > 0:
		return math.MaxUint64
	}
	return f.cost
}

// VirtualTime returns the normal band's virtual time V, in TagUnit units.
func (q *Queue) VirtualTime() uint64 { return q.bands[normal].v }

// CriticalVirtualTime returns the critical band's virtual time.
func (q *Queue) CriticalVirtualTime() uint64 { return q.bands[critical].v }

// Flow returns a handle on flow k for EnqueueFlow. It allocates a handle if
// the flow has no queued item, but registers the flow only when an item is
// enqueued through it.
func (q *Queue) Flow(k FlowKey) *Flow {
	if f := q.flows[k]; f != nil {
		return f
	}
	return q.newFlow(k)
}

func (q *Queue) newFlow(k FlowKey) *Flow {
	return &Flow{q: q, key: k, lane: [nBands]int32{noLane, noLane}}
}

// Enqueue adds it to its flow (it.Flow) in its band, tagging it with its
// finish tag. It returns ErrFlowFull or ErrQueueFull, changing nothing, if a
// bound is reached, and ErrQueued if it is already queued.
func (q *Queue) Enqueue(it *Item) error {
	if it.flow != nil {
		return ErrQueued
	}
	f := q.flows[it.Flow]
	if f == nil {
		// Checked here so that a rejected item allocates no Flow.
		if err := q.check(nil, it); err != nil {
			return err
		}
		f = q.newFlow(it.Flow)
	}
	return q.enqueue(f, it)
}

// Check returns the error Enqueue(it) would return now (nil: it would be
// queued) and changes nothing: a caller that must say whether a request
// would wait, without queueing it, asks the same bounds Enqueue does.
func (q *Queue) Check(it *Item) error {
	if it.flow != nil {
		return ErrQueued
	}
	return q.check(q.flows[it.Flow], it)
}

// EnqueueFlow is Enqueue for an item of flow f, a handle from q.Flow; it sets
// it.Flow to f's key. While f's flow has queued items it does no map lookup.
func (q *Queue) EnqueueFlow(f *Flow, it *Item) error {
	if f.q != q {
		panic("wfq: EnqueueFlow with a Flow of another queue")
	}
	if it.flow != nil {
		return ErrQueued
	}
	if !f.live {
		if g := q.flows[f.key]; g != nil {
			f = g // f is a stale handle of a flow registered since
		}
	}
	it.Flow = f.key
	return q.enqueue(f, it)
}

// check returns the bound, if any, that it would exceed in flow f (nil for a
// flow with no queued item).
func (q *Queue) check(f *Flow, it *Item) error {
	b := bandOf(it)
	if max := q.cfg.MaxPerFlow; max > 0 && f != nil && f.lane[b] != noLane && int(q.bands[b].lanes[f.lane[b]].n) >= max {
		return ErrFlowFull
	}
	if max := q.cfg.MaxTotal; max > 0 && q.n >= max {
		return ErrQueueFull
	}
	if max := q.cfg.MaxCritical; max > 0 && b == critical && q.bands[critical].n >= max {
		return ErrQueueFull
	}
	return nil
}

func (q *Queue) enqueue(f *Flow, it *Item) error {
	if err := q.check(f, it); err != nil {
		return err
	}
	if !f.live {
		q.flows[f.key] = f
		f.live = true
	}
	b := bandOf(it)
	bd, id := &q.bands[b], f.lane[b]
	start := bd.v
	if id != noLane {
		if t := bd.lanes[id].tailTag(); t > start {
			start = t
		}
	}
	tag := satAdd(start, increment(it.Cost, it.Weight))
	if q.seq >= q.seqLimit {
		q.renumber()
	}
	seq := q.seq
	q.seq++
	it.seq, it.flow = seq, f // and tag, in push
	f.addCost(it.Cost)
	if id == noLane {
		id = bd.join(f, tag, seq, it)
		f.lane[b] = id
	} else {
		bd.lanes[id].push(tag, seq, it)
	}
	l := &bd.lanes[id]
	l.weight = uint32(min(max(it.Weight, 1), math.MaxUint32))
	bd.tails.mark(id, l)
	bd.n++
	q.n++
	return nil
}

// WorkAhead estimates the queued work, in cost units, that the queue serves
// before an item of flow k with this cost, weight and band, were it
// enqueued now: the items with a smaller finish tag than the item's own
// F = max(F_last(k), V) + ⌈cost·TagUnit/weight⌉. A normal item has the whole
// critical band ahead of it as well. A lane l of weight w_l whose tail tag
// is T_l holds about w_l·(T_l − V) of work tagged after V (a backlogged
// lane's tags run on from about V), of which
//
//	w_l · (min(T_l, F) − V)
//
// is tagged before F: a light flow is served ahead of a neighbour's burst,
// which contributes only its weight's share of the span up to F. Flow k's
// own queued items count in full. The value is ⌊Σ_l w_l · (min(T_l, F) −
// V)⁺ / TagUnit⌋ per band, exactly, saturated at MaxUint64. WorkAhead reads
// no item: it descends each band's tree of tails (see position.go) in
// O(log lanes), after moving there the lanes changed since the last
// estimate; it changes nothing that Dequeue or Enqueue would see.
func (q *Queue) WorkAhead(k FlowKey, cost, weight uint64, crit bool) uint64 {
	b := normal
	if crit {
		b = critical
	}
	f := q.bands[b].v
	if fl := q.flows[k]; fl != nil && fl.lane[b] != noLane {
		if t := q.bands[b].lanes[fl.lane[b]].tailTag(); t > f {
			f = t
		}
	}
	return q.WorkBefore(satAdd(f, increment(cost, weight)), crit)
}

// WorkBefore estimates the queued work, in cost units, tagged before tag
// in the critical band (crit) or the normal band, which has the whole
// critical band before it too: a queued item's position is
// WorkBefore(it.FinishTag(), it.Critical). See WorkAhead.
func (q *Queue) WorkBefore(tag uint64, crit bool) uint64 {
	if crit {
		return q.bandWork(critical, tag)
	}
	return satAdd(q.bandWork(normal, tag), q.bandWork(critical, math.MaxUint64))
}

// bandWork returns the work in band b tagged between V and upTo:
// ⌊Σ_l w_l · (min(T_l, upTo) − V)⁺ / TagUnit⌋ over its lanes l, saturated
// at MaxUint64. It first brings the band's tree of tails up to date.
func (q *Queue) bandWork(b int, upTo uint64) uint64 {
	bd := &q.bands[b]
	bd.tails.update(bd.lanes)
	return bd.tails.work(bd.v, upTo)
}

// increment returns ⌈cost·TagUnit / weight⌉, saturating at MaxUint64.
func increment(cost, weight uint64) uint64 {
	weight = max(weight, 1)
	hi, lo := cost>>(64-16), cost<<16
	if hi >= weight {
		return math.MaxUint64
	}
	d, r := bits.Div64(hi, lo, weight)
	if r != 0 && d < math.MaxUint64 {
		d++
	}
	return d
}

func satAdd(a, b uint64) uint64 {
	s, c := bits.Add64(a, b, 0)
	if c != 0 {
		return math.MaxUint64
	}
	return s
}

// Peek returns the item Dequeue would consider first: the critical band's
// smallest head, else the normal band's; nil if the queue is empty.
func (q *Queue) Peek() *Item {
	for _, b := range serveOrder {
		if bd := &q.bands[b]; bd.heap.len() > 0 {
			return bd.head(root)
		}
	}
	return nil
}

// Dequeue removes and returns the queued item with the smallest (finish tag,
// sequence) among flow heads for which fits returns true, critical band
// first. In each band it examines at most maxScan heads (maxScan < 1 is taken
// as 1), in increasing tag order; heads that do not fit stay queued, in
// place. It returns nil if nothing examined fits. A nil fits fits everything.
// fits must not call the queue.
func (q *Queue) Dequeue(fits func(*Item) bool, maxScan int) *Item {
	for _, b := range serveOrder {
		bd := &q.bands[b]
		if bd.heap.len() == 0 {
			continue
		}
		i := root
		if fits != nil && !fits(bd.head(root)) {
			if i = q.search(bd, fits, maxScan); i < 0 {
				continue
			}
		}
		return q.pop(b, i)
	}
	return nil
}

// Serve dequeues it as Dequeue would have served it, had fits accepted it
// alone: the virtual time moves to its tag. It reports false, and changes
// nothing, unless it is queued here at the head of its flow in its band. It
// lets an owner choose heads under its lock, decide on them without it, and
// then serve the one it chose in the place it held (an item stays its
// flow's head until it leaves: later items queue behind it).
func (q *Queue) Serve(it *Item) bool {
	if it.flow == nil || it.flow.q != q {
		return false
	}
	b := bandOf(it)
	bd, id := &q.bands[b], it.flow.lane[b]
	if id == noLane || bd.lanes[id].at(0) != it {
		return false
	}
	q.pop(b, int(bd.heap.pos[id]))
	return true
}

// pop dequeues the head of the lane at heap index i of band b. The lane
// holds its next item's key, so re-keying its entry loads no other item.
func (q *Queue) pop(b, i int) *Item {
	bd := &q.bands[b]
	e := &bd.heap.e[i]
	l := &bd.lanes[e.id]
	tag, it := l.pop()
	it.flow.subCost(it.Cost)
	it.flow = nil
	bd.n--
	q.n--
	if tag > bd.v {
		bd.v = tag
	}
	if l.n == 0 {
		q.forgetIfEmpty(bd.leave(b, i))
		return it
	}
	e.tag, e.seq = l.key(0)
	// The new head's key is larger, except where a Remove of an item whose
	// tag and increment saturated moved the items behind it up past the
	// head (see unlink): fix, not down, so that serving a head below the
	// root keeps the heap in order.
	bd.heap.fix(i)
	q.warm(bd)
	return it
}

// warm prefetches what the next Dequeues will read, early enough that
// their cache misses overlap with the work in between instead of stalling
// them. A Dequeue serves the root; the root's smallest child, c, is the next
// root; and the root after that is, most likely, the smaller of the root's
// second-smallest child and c's smallest child, x. So warm prefetches the
// item that the Dequeue after next returns, c's head (both of its cache
// lines: the queue's, and the caller's, which whoever dequeues it reads),
// and c's flow, which the caller reads to enqueue to it again; and x's lane,
// so that the next warm can read its head. c's lane, which names the item,
// the last warm prefetched as its x. (Prefetching the next Dequeue's item
// now would be too late: it follows at once.) Prefetching does not wait for
// memory, so a guess that turns out wrong (an Enqueue or Remove reorders the
// heap) costs a little bandwidth, nothing else.
func (q *Queue) warm(bd *band) {
	es := bd.heap.e
	c := firstChild(root)
	if c+arity > len(es) {
		return // a heap this small stays in cache
	}
	s := (*[arity]entry)(es[c : c+arity])
	// The two smallest of four, without branches (as in heap.down): the
	// winners of two pairs, then the smaller winner is first; second is the
	// smaller of the other winner and first's partner, first^1.
	a := before(&s[1], &s[0])
	b := 2 + before(&s[3], &s[2])
	first := a ^ ((a ^ b) & -before(&s[b], &s[a]))
	other, partner := a^b^first, first^1
	second := other ^ ((other ^ partner) & -before(&s[partner], &s[other]))
	x := &s[second]
	if g := firstChild(c + first); g+arity <= len(es) {
		t := (*[arity]entry)(es[g : g+arity])
		p := before(&t[1], &t[0])
		r := 2 + before(&t[3], &t[2])
		m := &t[p^((p^r)&-before(&t[r&3], &t[p&3]))]
		if m.less(x) {
			x = m
		}
	}
	bd.lanes[x.id].warm()
	// The item's two lines from its address, which cover Value however
	// the item is aligned (see lane.warm for why not &it.Value).
	l := &bd.lanes[s[first].id]
	prefetchLines(uintptr(unsafe.Pointer(l.at(0))), 2)
	prefetch(uintptr(unsafe.Pointer(l.flow)))
}

// search returns the heap index of the first head after the root, in
// (tag, seq) order, that fits, examining at most maxScan heads in all; -1 if
// none does. It walks the heap best first: the next head in order is always
// a child of one already examined, so a small heap of candidate indexes
// (kept in q.scan) yields them in order without touching the queue.
func (q *Queue) search(bd *band, fits func(*Item) bool, maxScan int) int {
	cand := candidates{h: bd.heap.e, idx: q.scan[:0]}
	found := -1
	cand.pushChildren(root)
	for examined := 1; examined < maxScan && len(cand.idx) > 0; examined++ {
		i := cand.pop()
		if fits(bd.head(i)) {
			found = i
			break
		}
		cand.pushChildren(i)
	}
	q.scan = cand.idx[:0] // keep the grown buffer for the next search
	return found
}

// Remove takes it out of the queue without serving it (a deadline passed, a
// client left) and reports whether it was queued here. The virtual time does
// not move.
func (q *Queue) Remove(it *Item) bool {
	if it.flow == nil || it.flow.q != q {
		return false
	}
	q.unlink(it)
	return true
}

// unlink takes a queued item out of its lane, fixing the heap and forgetting
// the flow if it empties.
func (q *Queue) unlink(it *Item) {
	b := bandOf(it)
	bd, id := &q.bands[b], it.flow.lane[b]
	l := &bd.lanes[id]
	k := l.find(it)
	// The items behind move up by the removed item's increment, as if it
	// had never come: a request that leaves unserved costs its flow no
	// virtual time.
	l.cut(k, increment(it.Cost, it.Weight))
	it.flow.subCost(it.Cost)
	it.flow = nil
	bd.n--
	q.n--
	i := int(bd.heap.pos[id])
	if l.n == 0 {
		q.forgetIfEmpty(bd.leave(b, i))
		return
	}
	bd.tails.mark(id, l) // its tail moved up
	if k == 0 {
		// The head left: re-key the lane's entry by the new head.
		e := &bd.heap.e[i]
		e.tag, e.seq = l.key(0)
		bd.heap.fix(i)
	}
}

// renumber gives the queued items the sequence numbers 0, 1, … in the order
// of their present ones, and q.seq the next, when q.seq reaches q.seqLimit:
// a sequence number only orders items of equal tag, and this keeps the
// order while letting it fit 32 bits, and an entry 16 bytes. Once every
// 2³² Enqueues, it costs O(n log n) for n queued items.
func (q *Queue) renumber() {
	type queued struct {
		it  *Item
		seq *uint32 // the lane's copy
	}
	all := make([]queued, 0, q.n)
	for b := range q.bands {
		bd := &q.bands[b]
		for _, e := range bd.heap.entries() {
			l := &bd.lanes[e.id]
			for k := range l.n {
				all = append(all, queued{l.at(k), l.seqAt(k)})
			}
		}
	}
	slices.SortFunc(all, func(a, b queued) int { return cmp.Compare(a.it.seq, b.it.seq) })
	for i, x := range all {
		x.it.seq, *x.seq = uint32(i), uint32(i)
	}
	for b := range q.bands {
		bd := &q.bands[b]
		for i := root; i < len(bd.heap.e); i++ {
			_, bd.heap.e[i].seq = bd.laneAt(i).key(0)
		}
	}
	q.seq = uint32(len(all))
}

func satSub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// forgetIfEmpty deletes f if it has no queued item in either band. Its
// dequeued tags are all ≤ V, so remembering it would change no later tag.
func (q *Queue) forgetIfEmpty(f *Flow) {
	if f.lane == [nBands]int32{noLane, noLane} {
		delete(q.flows, f.key)
		f.live = false
	}
}

// Each calls fn for every queued item, in no particular order. fn must not
// call the queue.
func (q *Queue) Each(fn func(*Item)) {
	for b := range q.bands {
		bd := &q.bands[b]
		for i := root; i < len(bd.heap.e); i++ {
			l := bd.laneAt(i)
			for k := range l.n {
				fn(l.at(k))
			}
		}
	}
}
