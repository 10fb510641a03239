package wfq

import (
	"errors"
	"math"
	"math/big"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// refQueue is the reference model: no heap, no links, no handles. Each
// (flow, band) is a slice in enqueue order; Dequeue sorts the heads by
// (tag, seq). Tags are computed in big integers straight from doc.go's
// formula.
type refQueue struct {
	cfg   Config
	v     [nBands]uint64
	lanes map[refLane][]*refItem
	seq   uint64
}

type refLane struct {
	k    FlowKey
	band int
}

type refItem struct {
	it       *Item
	tag, seq uint64
}

func (m *refQueue) count(match func(refLane) bool) int {
	n := 0
	for l, its := range m.lanes {
		if match(l) {
			n += len(its)
		}
	}
	return n
}

func (m *refQueue) len() int { return m.count(func(refLane) bool { return true }) }

func (m *refQueue) flowLen(k FlowKey) int {
	return m.count(func(l refLane) bool { return l.k == k })
}

// flowCost sums the costs of flow k's queued items, saturated at
// MaxUint64 (the sum in big integers).
func (m *refQueue) flowCost(k FlowKey) uint64 {
	c := new(big.Int)
	for l, its := range m.lanes {
		if l.k == k {
			for _, r := range its {
				c.Add(c, new(big.Int).SetUint64(r.it.Cost))
			}
		}
	}
	if !c.IsUint64() {
		return math.MaxUint64
	}
	return c.Uint64()
}

func (m *refQueue) flows() int {
	keys := map[FlowKey]bool{}
	for l, its := range m.lanes {
		if len(its) > 0 {
			keys[l.k] = true
		}
	}
	return len(keys)
}

func (m *refQueue) enqueue(it *Item) (uint64, error) {
	for _, its := range m.lanes {
		for _, r := range its {
			if r.it == it {
				return 0, ErrQueued
			}
		}
	}
	l := refLane{it.Flow, bandOf(it)}
	if m.cfg.MaxPerFlow > 0 && len(m.lanes[l]) >= m.cfg.MaxPerFlow {
		return 0, ErrFlowFull
	}
	if m.cfg.MaxTotal > 0 && m.len() >= m.cfg.MaxTotal {
		return 0, ErrQueueFull
	}
	if m.cfg.MaxCritical > 0 && l.band == critical &&
		m.count(func(l refLane) bool { return l.band == critical }) >= m.cfg.MaxCritical {
		return 0, ErrQueueFull
	}
	start := m.v[l.band]
	if its := m.lanes[l]; len(its) > 0 {
		start = max(start, its[len(its)-1].tag)
	}
	// start + ⌈cost·2¹⁶/max(weight,1)⌉, saturating at 2⁶⁴−1.
	tag := refIncrementBig(it)
	tag.Add(tag, new(big.Int).SetUint64(start))
	if tag.Cmp(new(big.Int).SetUint64(math.MaxUint64)) > 0 {
		tag.SetUint64(math.MaxUint64)
	}
	r := &refItem{it: it, tag: tag.Uint64(), seq: m.seq}
	m.seq++
	m.lanes[l] = append(m.lanes[l], r)
	return r.tag, nil
}

// refIncrementBig is ⌈cost·2¹⁶/max(weight,1)⌉ in a big integer.
func refIncrementBig(it *Item) *big.Int {
	w := new(big.Int).SetUint64(max(it.Weight, 1))
	inc := new(big.Int).Lsh(new(big.Int).SetUint64(it.Cost), 16)
	return inc.Add(inc, w).Sub(inc, big.NewInt(1)).Quo(inc, w)
}

// refIncrement is refIncrementBig saturated to 2⁶⁴−1.
func refIncrement(it *Item) uint64 {
	inc := refIncrementBig(it)
	if inc.Cmp(new(big.Int).SetUint64(math.MaxUint64)) > 0 {
		return math.MaxUint64
	}
	return inc.Uint64()
}

func (m *refQueue) heads(band int) []*refItem {
	var hs []*refItem
	for l, its := range m.lanes {
		if l.band == band && len(its) > 0 {
			hs = append(hs, its[0])
		}
	}
	slices.SortFunc(hs, func(a, b *refItem) int {
		if a.tag != b.tag {
			return cmpU(a.tag, b.tag)
		}
		return cmpU(a.seq, b.seq)
	})
	return hs
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (m *refQueue) peek() *Item {
	for _, b := range []int{critical, normal} {
		if hs := m.heads(b); len(hs) > 0 {
			return hs[0].it
		}
	}
	return nil
}

func (m *refQueue) dequeue(fits func(*Item) bool, maxScan int) *Item {
	for _, b := range []int{critical, normal} {
		hs := m.heads(b)
		for i, h := range hs {
			if i >= max(maxScan, 1) {
				break
			}
			if fits == nil || fits(h.it) {
				m.take(h.it, false)
				m.v[b] = max(m.v[b], h.tag)
				return h.it
			}
		}
	}
	return nil
}

// remove takes out an item that leaves unserved: the items behind it move
// up by its increment.
func (m *refQueue) remove(it *Item) bool { return m.take(it, true) }

// take deletes it from its lane, moving the items behind it up by its
// increment when it leaves unserved (shift).
func (m *refQueue) take(it *Item, shift bool) bool {
	for l, its := range m.lanes {
		for i, r := range its {
			if r.it == it {
				d := uint64(0)
				if shift {
					d = refIncrement(it)
				}
				for _, later := range its[i+1:] {
					if later.tag < d {
						later.tag = 0
					} else {
						later.tag -= d
					}
				}
				m.lanes[l] = slices.Delete(its, i, i+1)
				if len(m.lanes[l]) == 0 {
					delete(m.lanes, l)
				}
				return true
			}
		}
	}
	return false
}

// TestAgainstModel runs random sequences of Enqueue (by key and through
// cached, possibly stale, handles), Dequeue with random fits and maxScan,
// Remove and SetConfig on a Queue and on the reference model, and checks
// that they agree after every step: results, tags, Len, FlowLen, FlowCost, Flows,
// virtual times and Peek. Flows() agreeing with the model means a flow is
// forgotten as soon as it is empty.
func TestAgainstModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		// Sometimes one or two flows, whose lanes grow past their arrays.
		keys := []FlowKey{{"a", "x"}, {"a", "y"}, {"b", "x"}, {"c", "x"}}[:rapid.IntRange(1, 4).Draw(t, "keys")]
		pool := make([]*Item, rapid.IntRange(1, 32).Draw(t, "items"))
		for i := range pool {
			pool[i] = &Item{Value: i}
		}
		q := New(Config{})
		// Sometimes a sequence number limit just above the items there can
		// be, so that renumber runs often.
		q.seqLimit = rapid.SampledFrom([]uint32{math.MaxUint32, uint32(len(pool)) + 1, 64}).Draw(t, "seqLimit")
		m := &refQueue{lanes: map[refLane][]*refItem{}}
		handles := map[FlowKey]*Flow{}

		costGen := rapid.OneOf(rapid.Uint64Range(0, 100), rapid.Uint64Range(0, math.MaxUint64))
		for step := range rapid.IntRange(1, 200).Draw(t, "steps") {
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op < 5: // enqueue
				it := pool[rapid.IntRange(0, len(pool)-1).Draw(t, "item")]
				if !it.Queued() {
					it.Flow = rapid.SampledFrom(keys).Draw(t, "key")
					it.Cost = costGen.Draw(t, "cost")
					it.Weight = rapid.Uint64Range(0, 8).Draw(t, "weight")
					it.Critical = rapid.IntRange(0, 3).Draw(t, "band") == 0
				}
				wantTag, wantErr := m.enqueue(it)
				var err error
				if rapid.Bool().Draw(t, "byHandle") {
					h := handles[it.Flow]
					if h == nil {
						h = q.Flow(it.Flow)
						handles[it.Flow] = h
					}
					err = q.EnqueueFlow(h, it)
				} else {
					err = q.Enqueue(it)
				}
				if !errors.Is(err, wantErr) {
					t.Fatalf("step %d: Enqueue error %v, model %v", step, err, wantErr)
				}
				if err == nil && it.FinishTag() != wantTag {
					t.Fatalf("step %d: tag %d, model %d", step, it.FinishTag(), wantTag)
				}
			case op < 8: // dequeue
				maxScan := rapid.IntRange(0, 5).Draw(t, "maxScan")
				var fits func(*Item) bool
				if mod := rapid.IntRange(0, 3).Draw(t, "fitsMod"); mod > 0 {
					rem := rapid.IntRange(0, mod-1).Draw(t, "fitsRem")
					fits = func(it *Item) bool { return it.Value.(int)%(mod+1) != rem }
				}
				want := m.dequeue(fits, maxScan)
				if got := q.Dequeue(fits, maxScan); got != want {
					t.Fatalf("step %d: Dequeue = %v, model %v", step, show(got), show(want))
				}
			case op < 9: // remove an item, or a lane's head
				it := pool[rapid.IntRange(0, len(pool)-1).Draw(t, "item")]
				if it.Queued() && rapid.Bool().Draw(t, "head") {
					it = m.lanes[refLane{it.Flow, bandOf(it)}][0].it
				}
				if got, want := q.Remove(it), m.remove(it); got != want {
					t.Fatalf("step %d: Remove = %v, model %v", step, got, want)
				}
			default:
				cfg := Config{
					MaxPerFlow:  rapid.IntRange(0, 4).Draw(t, "maxPerFlow"),
					MaxTotal:    rapid.IntRange(0, 12).Draw(t, "maxTotal"),
					MaxCritical: rapid.IntRange(0, 3).Draw(t, "maxCritical"),
				}
				q.SetConfig(cfg)
				m.cfg = cfg
			}

			if q.Len() != m.len() || q.Flows() != m.flows() || len(q.flows) != q.Flows() {
				t.Fatalf("step %d: len %d flows %d, model %d, %d", step, q.Len(), q.Flows(), m.len(), m.flows())
			}
			for _, k := range keys {
				if q.FlowLen(k) != m.flowLen(k) {
					t.Fatalf("step %d: FlowLen(%v) = %d, model %d", step, k, q.FlowLen(k), m.flowLen(k))
				}
				if c := m.flowCost(k); q.FlowCost(k) != c {
					t.Fatalf("step %d: FlowCost(%v) = %d, model %d", step, k, q.FlowCost(k), c)
				}
			}
			if q.VirtualTime() != m.v[normal] || q.CriticalVirtualTime() != m.v[critical] {
				t.Fatalf("step %d: V %d/%d, model %d/%d", step,
					q.VirtualTime(), q.CriticalVirtualTime(), m.v[normal], m.v[critical])
			}
			if got, want := q.Peek(), m.peek(); got != want {
				t.Fatalf("step %d: Peek = %v, model %v", step, show(got), show(want))
			}
			checkInvariants(t, q)
		}
	})
}

func show(it *Item) any {
	if it == nil {
		return nil
	}
	return *it
}

// checkInvariants checks the queue's internal structure: heap order, lane
// ids and heap positions, entry keys equal to head keys, lanes' keys equal
// to their items' in enqueue order, counts, free ids.
func checkInvariants(t *rapid.T, q *Queue) {
	total := 0
	for b := range q.bands {
		bd := &q.bands[b]
		n := 0
		ids := map[int32]bool{}
		for _, id := range bd.free {
			ids[id] = true
			if l := &bd.lanes[id]; l.n != 0 || l.flow != nil || l.more != nil || l.item != [inline]*Item{} {
				t.Fatalf("band %d: free lane %d not cleared", b, id)
			}
		}
		for i := root; i < len(bd.heap.e); i++ {
			e := &bd.heap.e[i]
			if i > root && e.less(&bd.heap.e[parent(i)]) {
				t.Fatalf("band %d: heap order broken at %d", b, i)
			}
			l := &bd.lanes[e.id]
			head := l.at(0)
			if ids[e.id] || l.flow.lane[b] != e.id || int(bd.heap.pos[e.id]) != i || l.n == 0 || head.FinishTag() != e.tag || head.seq != e.seq {
				t.Fatalf("band %d: entry %d out of step with its lane", b, i)
			}
			ids[e.id] = true
			if f := q.flows[l.flow.key]; f != l.flow {
				t.Fatalf("band %d: lane of a flow that is not registered", b)
			}
			if c := l.cap(); c < inline || c&(c-1) != 0 || int(l.n) > c || c > inline && int(l.n) <= c/4 {
				t.Fatalf("band %d: lane of %d items in a ring of %d", b, l.n, c)
			}
			for k := range l.n {
				it := l.at(k)
				tag, seq := l.key(k)
				if it.flow != l.flow || bandOf(it) != b || it.Flow != l.flow.key {
					t.Fatalf("band %d: item in the wrong lane", b)
				}
				if tag != it.FinishTag() || seq != it.seq {
					t.Fatalf("band %d: lane's copy of an item's key is stale", b)
				}
				if l.more != nil && l.more[l.index(k)].tag != it.tag {
					t.Fatalf("band %d: a ring's stored tag differs from its item's", b)
				}
				if k > 0 {
					if _, prev := l.key(k - 1); prev >= seq {
						t.Fatalf("band %d: lane out of enqueue order", b)
					}
				}
			}
			n += int(l.n)
		}
		if len(ids) != len(bd.heap.pos) || len(ids) != len(bd.lanes) {
			t.Fatalf("band %d: %d ids in use or free, %d allocated, %d lanes", b, len(ids), len(bd.heap.pos), len(bd.lanes))
		}
		if n != bd.n {
			t.Fatalf("band %d: %d items, counts %d", b, n, bd.n)
		}
		checkTails(t, bd, b)
		total += n
	}
	for k, f := range q.flows {
		if !f.live || f.key != k || f.n() == 0 {
			t.Fatalf("flow %v registered but not live, or empty", k)
		}
	}
	if total != q.n {
		t.Fatalf("%d items, Len %d", total, q.n)
	}
}

// checkTails checks band b's tree of tails: search order by (tag, id),
// heap order by priority, each node's sums, every node reachable from the
// root; each unmarked lane in the tree as it is (a non-empty lane with its
// tail and weight, an empty one not at all); and each lane marked once.
func checkTails(t *rapid.T, bd *band, b int) {
	tr := &bd.tails
	if len(bd.lanes) == 0 {
		if tr.nodes != nil || tr.root != 0 || len(tr.marked) != 0 {
			t.Fatalf("band %d: a tree without lanes", b)
		}
		return
	}
	if len(tr.nodes) != len(bd.lanes)+1 || tr.nodes[0] != (node{}) {
		t.Fatalf("band %d: %d nodes for %d lanes, or the empty tree not empty", b, len(tr.nodes), len(bd.lanes))
	}
	marked := map[int32]bool{}
	for _, id := range tr.marked {
		if marked[id] || !bd.lanes[id].marked {
			t.Fatalf("band %d: lane %d marked twice, or not flagged", b, id)
		}
		marked[id] = true
	}
	inTree := 0
	for id := range bd.lanes {
		l, n := &bd.lanes[id], &tr.nodes[id+1]
		if n.weight != 0 {
			inTree++
		}
		if l.marked != marked[int32(id)] {
			t.Fatalf("band %d: lane %d flagged %v, in the marked list %v", b, id, l.marked, marked[int32(id)])
		}
		if l.marked {
			continue
		}
		if l.n == 0 && n.weight != 0 || l.n > 0 && (n.weight != l.weight || n.tag != l.tailTag()) {
			t.Fatalf("band %d: unmarked lane %d (%d items) out of step with its node %+v", b, id, l.n, *n)
		}
	}
	// walk checks the subtree at s, whose keys lie strictly between lo and
	// hi (0: no bound), and returns its size.
	var walk func(s, lo, hi int32) int
	walk = func(s, lo, hi int32) int {
		if s == 0 {
			return 0
		}
		n := &tr.nodes[s]
		if n.weight == 0 || lo != 0 && !tr.less(lo, s) || hi != 0 && !tr.less(s, hi) {
			t.Fatalf("band %d: node %d not a lane, or out of search order", b, s-1)
		}
		for _, c := range []int32{n.left, n.right} {
			if c != 0 && tr.nodes[c].prio > n.prio {
				t.Fatalf("band %d: node %d out of heap order", b, s-1)
			}
		}
		size := 1 + walk(n.left, lo, s) + walk(n.right, s, hi)
		l, r := &tr.nodes[n.left], &tr.nodes[n.right]
		if n.sumW != l.sumW+r.sumW+uint64(n.weight) || n.sumWT != l.sumWT.add(r.sumWT).add(mul128(uint64(n.weight), n.tag)) {
			t.Fatalf("band %d: node %d's sums are stale", b, s-1)
		}
		return size
	}
	if size := walk(tr.root, 0, 0); size != inTree {
		t.Fatalf("band %d: %d nodes reachable, %d in the tree", b, size, inTree)
	}
}
