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
// fields, and keeps the pointer to Remove it later; the queue links it into
// its flow without copying or allocating. An item may be enqueued again once
// it has been dequeued or removed. While it is queued, its exported fields
// must not change and the Item must not be copied or overwritten as a whole
// (its unexported fields hold the queue's links).
type Item struct {
	// The queue's fields come first, then Cost and Weight, which Enqueue
	// reads: 64 bytes, one cache line when the item is 64-byte aligned (a
	// lone Item is: 128-byte size class; and so is each Item of a slice, at
	// 128 bytes with the padding at the end).
	tag uint64 // finish tag, set by Enqueue
	// next's tag and seq, copied here when next is linked, so that serving
	// this item re-keys its lane without loading next (a cache miss).
	nextTag    uint64
	seq        uint32 // enqueue sequence number, unique per queue (see renumber)
	nextSeq    uint32
	lane       *lane // the lane holding the item; nil when not queued
	prev, next *Item // neighbours in the lane's FIFO

	Cost     uint64 // > 0; a cost of 0 is served at the current virtual time
	Weight   uint64 // ≥ 1; 0 is taken as 1
	Flow     FlowKey
	Critical bool // served in the critical band, before every normal item
	Value    any  // the caller's payload
	_        [8]byte
}

// FinishTag returns the item's finish tag, in TagUnit units, as set by its
// last Enqueue. It stays readable after the item leaves the queue.
func (it *Item) FinishTag() uint64 { return it.tag }

// Queued reports whether the item is in a queue.
func (it *Item) Queued() bool { return it.lane != nil }

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

// lane is one flow's FIFO in one band. Its head is in its heap entry, not
// here.
type lane struct {
	tail    *Item
	tailTag uint64 // tail.tag, kept here so Enqueue need not load tail
	n       int32
	band    int32
	id      int32  // the lane's id in its band (see band), while n > 0
	weight  uint32 // the weight of the tail item (for WorkAhead), at most MaxUint32
	flow    *Flow
}

// Flow is a handle on a flow of a Queue, for callers that want to skip the
// map lookup Enqueue does (see Queue.Flow and Queue.EnqueueFlow). A handle
// stays valid for the queue's life: once its flow has emptied and been
// forgotten, using the handle again looks the flow up by key.
//
// The fields an Enqueue and a Dequeue of a normal item touch (q, live, the
// normal lane) fill the first 56 bytes; the struct is 128 bytes, a size
// class whose objects are 64-byte aligned, so they share one cache line.
type Flow struct {
	q      *Queue
	live   bool // in q.flows
	normal lane
	key    FlowKey
	crit   lane
}

// lane returns f's lane in band b.
func (f *Flow) lane(b int) *lane {
	if b == critical {
		return &f.crit
	}
	return &f.normal
}

// n returns the number of items f has queued, both bands together.
func (f *Flow) n() int { return int(f.normal.n + f.crit.n) }

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
// Each non-empty lane has an id, an index into heap.pos, that it holds
// while it has items; ids are reused, most recent first.
type band struct {
	heap heap
	free []int32 // ids not in use
	v    uint64  // virtual time
	n    int     // items queued
}

// join gives lane l, whose only item is it, an id and a heap entry.
func (bd *band) join(l *lane, it *Item) {
	var id int32
	if k := len(bd.free); k > 0 {
		id, bd.free = bd.free[k-1], bd.free[:k-1]
	} else {
		id = int32(len(bd.heap.pos))
		bd.heap.pos = append(bd.heap.pos, 0)
	}
	l.id = id
	bd.heap.push(entry{tag: it.tag, seq: it.seq, id: id, l: l, head: it})
}

// leave drops the heap entry at index i, whose lane has emptied, and frees
// its id.
func (bd *band) leave(i int) {
	id := bd.heap.e[i].id
	bd.heap.remove(i)
	bd.free = append(bd.free, id)
}

// head returns the head item of the lane at heap index i.
func (bd *band) head(i int) *Item { return bd.heap.e[i].head }

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
	f := &Flow{q: q, key: k}
	for b := range nBands {
		f.lane(b).flow, f.lane(b).band = f, int32(b)
	}
	return f
}

// Enqueue adds it to its flow (it.Flow) in its band, tagging it with its
// finish tag. It returns ErrFlowFull or ErrQueueFull, changing nothing, if a
// bound is reached, and ErrQueued if it is already queued.
func (q *Queue) Enqueue(it *Item) error {
	if it.lane != nil {
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

// EnqueueFlow is Enqueue for an item of flow f, a handle from q.Flow; it sets
// it.Flow to f's key. While f's flow has queued items it does no map lookup.
func (q *Queue) EnqueueFlow(f *Flow, it *Item) error {
	if f.q != q {
		panic("wfq: EnqueueFlow with a Flow of another queue")
	}
	if it.lane != nil {
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
	if max := q.cfg.MaxPerFlow; max > 0 && f != nil && int(f.lane(b).n) >= max {
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
	bd, l := &q.bands[b], f.lane(b)
	start := bd.v
	if l.n > 0 && l.tailTag > start {
		start = l.tailTag
	}
	it.tag = satAdd(start, increment(it.Cost, it.Weight))
	if q.seq >= q.seqLimit {
		q.renumber()
	}
	it.seq = q.seq
	q.seq++
	it.lane, it.prev, it.next = l, l.tail, nil
	if l.n == 0 {
		bd.join(l, it)
	} else {
		t := l.tail
		t.next, t.nextTag, t.nextSeq = it, it.tag, it.seq
	}
	l.tail, l.tailTag = it, it.tag
	l.weight = uint32(min(max(it.Weight, 1), math.MaxUint32))
	l.n++
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
// own queued items count in full. WorkAhead reads the heap entries and the
// lanes, no item, in O(lanes in the bands it sums); it changes nothing.
func (q *Queue) WorkAhead(k FlowKey, cost, weight uint64, crit bool) uint64 {
	b := normal
	if crit {
		b = critical
	}
	f := q.bands[b].v
	if fl := q.flows[k]; fl != nil {
		if l := fl.lane(b); l.n > 0 && l.tailTag > f {
			f = l.tailTag
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

// bandWork sums, over band b's lanes, the work tagged between V and upTo.
func (q *Queue) bandWork(b int, upTo uint64) uint64 {
	bd := &q.bands[b]
	var sum uint64
	for _, e := range bd.heap.entries() {
		l := e.l
		span := min(l.tailTag, upTo)
		if span <= bd.v {
			continue
		}
		hi, lo := bits.Mul64(span-bd.v, uint64(l.weight))
		if hi >= TagUnit {
			return math.MaxUint64
		}
		work, _ := bits.Div64(hi, lo, TagUnit)
		sum = satAdd(sum, work)
	}
	return sum
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
		return q.pop(bd, i)
	}
	return nil
}

// pop dequeues the head of the lane at bd.heap.e[i]: unlink for a head,
// which re-keys the lane from it.nextTag, it.nextSeq without loading the next
// item.
func (q *Queue) pop(bd *band, i int) *Item {
	e := &bd.heap.e[i]
	l, it := e.l, e.head
	next := it.next
	it.lane, it.next = nil, nil
	l.n--
	bd.n--
	q.n--
	if it.tag > bd.v {
		bd.v = it.tag
	}
	if next == nil {
		l.tail = nil
		bd.leave(i)
		q.forgetIfEmpty(l.flow)
		return it
	}
	next.prev = nil
	e.head = next
	e.tag, e.seq = it.nextTag, it.nextSeq
	// The new head's key is larger, except where a Remove of an item whose
	// tag and increment saturated moved the items behind it up past the
	// head (see unlink): fix, not down, so that serving a head below the
	// root keeps the heap in order.
	bd.heap.fix(i)
	q.warm(bd)
	return it
}

// warm prefetches what the next two Dequeues will read, so that their cache
// misses overlap with the work in between instead of stalling them: the
// next head item (both of its cache lines: the queue's, and the caller's,
// which whoever dequeues it reads), its lane, and its successor, which pop
// writes to; and the item and lane of the head after it, the root's
// smallest child, which becomes the root when the root's lane is served.
// All are named by heap entries, except the successor, named by the next
// head item, which the last warm prefetched as the head after it.
// Prefetching does not wait for memory, so a guess that turns out wrong (an
// Enqueue or Remove reorders the heap) costs a little bandwidth, nothing
// else.
func (q *Queue) warm(bd *band) {
	es := bd.heap.e
	if bd.heap.len() == 0 {
		return
	}
	e := &es[root]
	prefetch(uintptr(unsafe.Pointer(e.head)))
	prefetch(uintptr(unsafe.Pointer(&e.head.Value)))
	prefetch(uintptr(unsafe.Pointer(e.l)))
	if y := e.head.next; y != nil {
		prefetch(uintptr(unsafe.Pointer(y)))
	}
	if c := firstChild(root); c+arity <= len(es) {
		s := (*[arity]entry)(es[c : c+arity])
		a := before(&s[1], &s[0])     // as in heap.down
		b := 2 + before(&s[3], &s[2]) // 2 or 3
		m := &s[a^((a^b)&-before(&s[b&3], &s[a&3]))]
		prefetch(uintptr(unsafe.Pointer(m.head)))
		prefetch(uintptr(unsafe.Pointer(m.l)))
	}
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
	if it.lane == nil || it.lane.flow.q != q {
		return false
	}
	q.unlink(it)
	return true
}

// unlink takes a queued item out of its lane, fixing the heap and forgetting
// the flow if it empties.
func (q *Queue) unlink(it *Item) {
	l := it.lane
	bd := &q.bands[l.band]
	prev, next := it.prev, it.next
	if next != nil {
		next.prev = prev
	} else {
		l.tail = prev
		if prev != nil {
			l.tailTag = prev.tag
		}
	}
	if prev != nil {
		prev.next, prev.nextTag, prev.nextSeq = next, it.nextTag, it.nextSeq
	}
	it.lane, it.prev, it.next = nil, nil, nil
	l.n--
	bd.n--
	q.n--
	if next != nil {
		// The items behind move up by the removed item's increment, as if
		// it had never come: a request that leaves unserved costs its flow
		// no virtual time.
		d := increment(it.Cost, it.Weight)
		for x := next; x != nil; x = x.next {
			x.tag = satSub(x.tag, d)
			if x.prev != nil {
				x.prev.nextTag = x.tag
			}
		}
		l.tailTag = l.tail.tag
	}
	switch i := int(bd.heap.pos[l.id]); {
	case l.n == 0:
		bd.leave(i)
		q.forgetIfEmpty(l.flow)
	case prev == nil:
		// The head left: re-key the lane's entry by the new head.
		e := &bd.heap.e[i]
		e.tag, e.seq, e.head = next.tag, next.seq, next
		bd.heap.fix(i)
	}
}

// renumber gives the queued items the sequence numbers 0, 1, … in the order
// of their present ones, and q.seq the next, when q.seq reaches q.seqLimit:
// a sequence number only orders items of equal tag, and this keeps the
// order while letting it fit 32 bits, and an entry 32 bytes. Once every
// 2³² Enqueues, it costs O(n log n) for n queued items.
func (q *Queue) renumber() {
	its := make([]*Item, 0, q.n)
	q.Each(func(it *Item) { its = append(its, it) })
	slices.SortFunc(its, func(a, b *Item) int { return cmp.Compare(a.seq, b.seq) })
	for i, it := range its {
		it.seq = uint32(i)
		if it.prev != nil {
			it.prev.nextSeq = it.seq
		}
	}
	for b := range q.bands {
		bd := &q.bands[b]
		for i := root; i < len(bd.heap.e); i++ {
			bd.heap.e[i].seq = bd.head(i).seq
		}
	}
	q.seq = uint32(len(its))
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
	if f.n() == 0 {
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
			for it := bd.head(i); it != nil; it = it.next {
				fn(it)
			}
		}
	}
}
