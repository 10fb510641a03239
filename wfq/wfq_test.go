package wfq

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"
)

var (
	fa = FlowKey{"a", "m"}
	fb = FlowKey{"b", "m"}
	fc = FlowKey{"c", "m"}
)

func item(k FlowKey, cost, weight uint64) *Item {
	return &Item{Flow: k, Cost: cost, Weight: weight}
}

func mustEnqueue(t *testing.T, q *Queue, its ...*Item) {
	t.Helper()
	for _, it := range its {
		if err := q.Enqueue(it); err != nil {
			t.Fatalf("Enqueue(%+v): %v", it, err)
		}
	}
}

func TestIncrement(t *testing.T) {
	for _, tc := range []struct{ cost, weight, want uint64 }{
		{1, 1, TagUnit},
		{10, 4, 10 * TagUnit / 4},
		{1, 3, TagUnit/3 + 1}, // rounded up
		{1, 0, TagUnit},       // weight 0 is 1
		{0, 5, 0},
		{1, math.MaxUint64, 1}, // never 0 for a positive cost
		{1 << 47, 1, 1 << 63},
		{1 << 48, 1, math.MaxUint64},       // saturates
		{math.MaxUint64, 1 << 20, 1 << 60}, // ⌈(2⁶⁴−1)/16⌉
		{math.MaxUint64, 1 << 16, math.MaxUint64},
	} {
		if got := increment(tc.cost, tc.weight); got != tc.want {
			t.Errorf("increment(%d, %d) = %d, want %d", tc.cost, tc.weight, got, tc.want)
		}
	}
	if satAdd(math.MaxUint64-1, 5) != math.MaxUint64 || satAdd(2, 3) != 5 {
		t.Error("satAdd does not saturate")
	}
}

func TestFinishTags(t *testing.T) {
	q := New(Config{})
	a1, a2, b1 := item(fa, 10, 1), item(fa, 10, 2), item(fb, 30, 3)
	mustEnqueue(t, q, a1, a2, b1)
	// F = max(F_prev, V) + cost/weight, V = 0.
	for _, tc := range []struct {
		it   *Item
		want uint64
	}{{a1, 10 * TagUnit}, {a2, 15 * TagUnit}, {b1, 10 * TagUnit}} {
		if got := tc.it.FinishTag(); got != tc.want {
			t.Errorf("tag %d, want %d", got, tc.want)
		}
	}
	// Equal tags: the earlier enqueue goes first.
	if got := q.Dequeue(nil, 1); got != a1 {
		t.Fatalf("first dequeue %+v, want a1", got)
	}
	if q.VirtualTime() != 10*TagUnit {
		t.Fatalf("V = %d after serving tag 10", q.VirtualTime())
	}
	if got := q.Dequeue(nil, 1); got != b1 {
		t.Fatalf("second dequeue %+v, want b1", got)
	}
	// A flow that is empty starts from V, not from its old tag or from 0.
	c1 := item(fc, 1, 1)
	mustEnqueue(t, q, c1)
	if got, want := c1.FinishTag(), 11*TagUnit; got != want {
		t.Fatalf("new flow tag %d, want V+1 = %d", got, want)
	}
}

// TestServedInTagOrder: with everything fitting, items leave in increasing
// (finish tag, sequence) order and V follows the served tags.
func TestServedInTagOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	q := New(Config{})
	keys := []FlowKey{fa, fb, fc, {"d", "x"}, {"e", "y"}}
	for range 2000 {
		mustEnqueue(t, q, item(keys[r.IntN(len(keys))], 1+r.Uint64N(100), 1+r.Uint64N(5)))
	}
	var last *Item
	for q.Len() > 0 {
		it := q.Dequeue(nil, 1)
		if last != nil && (it.tag < last.tag || it.tag == last.tag && it.seq < last.seq) {
			t.Fatalf("served (%d,%d) after (%d,%d)", it.tag, it.seq, last.tag, last.seq)
		}
		if q.VirtualTime() != it.tag {
			t.Fatalf("V = %d, want the served tag %d", q.VirtualTime(), it.tag)
		}
		last = it
	}
	if q.Flows() != 0 || q.Peek() != nil || q.Dequeue(nil, 1) != nil {
		t.Fatal("empty queue still holds flows or items")
	}
}

// serve keeps every flow backlogged with items of random cost (1..maxCost)
// and dequeues n items; it returns the cost each flow was served.
func serve(t *testing.T, weights map[FlowKey]uint64, n int, maxCost uint64) map[FlowKey]uint64 {
	t.Helper()
	r := rand.New(rand.NewPCG(7, 11))
	q := New(Config{})
	add := func(k FlowKey) { mustEnqueue(t, q, item(k, 1+r.Uint64N(maxCost), weights[k])) }
	for k := range weights {
		for range 3 {
			add(k)
		}
	}
	served := map[FlowKey]uint64{}
	for range n {
		it := q.Dequeue(nil, 1)
		served[it.Flow] += it.Cost
		add(it.Flow)
	}
	return served
}

func TestEqualWeightsShareEqually(t *testing.T) {
	s := serve(t, map[FlowKey]uint64{fa: 3, fb: 3}, 20_000, 100)
	if ratio := float64(s[fa]) / float64(s[fb]); math.Abs(ratio-1) > 0.02 {
		t.Fatalf("served a=%d b=%d: ratio %.4f, want 1 within 2%%", s[fa], s[fb], ratio)
	}
}

func TestWeightedShares(t *testing.T) {
	s := serve(t, map[FlowKey]uint64{fa: 1, fb: 4, fc: 2}, 30_000, 100)
	for _, tc := range []struct {
		k    FlowKey
		want float64
	}{{fb, 4}, {fc, 2}} {
		if ratio := float64(s[tc.k]) / float64(s[fa]); math.Abs(ratio/tc.want-1) > 0.02 {
			t.Errorf("%v/a served %d/%d = %.4f, want %v within 2%%", tc.k, s[tc.k], s[fa], ratio, tc.want)
		}
	}
}

// TestNoCreditForIdlePast: a flow arriving after another has been served for
// a long time starts at V and shares from then on; it does not get a burst
// for the time it was away.
func TestNoCreditForIdlePast(t *testing.T) {
	q := New(Config{})
	for range 1000 {
		mustEnqueue(t, q, item(fa, 10, 1))
		q.Dequeue(nil, 1)
	}
	v := q.VirtualTime()
	if v != 1000*10*TagUnit {
		t.Fatalf("V = %d after serving 1000 items of cost 10", v)
	}
	for range 100 {
		mustEnqueue(t, q, item(fa, 10, 1), item(fb, 10, 1))
	}
	if got := q.Peek(); got.Flow != fa || got.tag != v+10*TagUnit {
		t.Fatalf("first head %+v, want a at V+10", got)
	}
	var b int
	for range 100 {
		if q.Dequeue(nil, 1).Flow == fb {
			b++
		}
	}
	if b != 50 {
		t.Fatalf("newcomer got %d of 100 dequeues, want 50 (alternating)", b)
	}
}

func TestCriticalFirst(t *testing.T) {
	q := New(Config{})
	n1, n2 := item(fa, 1, 1), item(fb, 1, 100)
	c1 := &Item{Flow: fa, Cost: 1000, Weight: 1, Critical: true}
	c2 := &Item{Flow: fc, Cost: 5000, Weight: 1, Critical: true}
	mustEnqueue(t, q, n1, n2, c1, c2)
	if q.Peek() != c1 {
		t.Fatalf("Peek = %+v, want critical c1", q.Peek())
	}
	for i, want := range []*Item{c1, c2, n2, n1} {
		if got := q.Dequeue(nil, 1); got != want {
			t.Fatalf("dequeue %d: %+v, want %+v", i, got, want)
		}
	}
	// Each band keeps its own virtual time.
	if q.CriticalVirtualTime() != 5000*TagUnit || q.VirtualTime() != TagUnit {
		t.Fatalf("V critical %d normal %d", q.CriticalVirtualTime(), q.VirtualTime())
	}
	// A critical item that does not fit lets the normal band be served.
	mustEnqueue(t, q, n1, c1)
	if got := q.Dequeue(func(it *Item) bool { return !it.Critical }, 4); got != n1 {
		t.Fatalf("with critical not fitting: %+v, want n1", got)
	}
}

type snapshot struct {
	len, crit, flows, fa, fb int
	v, cv                    uint64
	peek                     *Item
}

func snap(q *Queue) snapshot {
	return snapshot{q.Len(), q.CriticalLen(), q.Flows(), q.FlowLen(fa), q.FlowLen(fb),
		q.VirtualTime(), q.CriticalVirtualTime(), q.Peek()}
}

func TestBounds(t *testing.T) {
	q := New(Config{MaxPerFlow: 2, MaxTotal: 5, MaxCritical: 1})
	mustEnqueue(t, q, item(fa, 1, 1), item(fa, 1, 1))
	reject := func(it *Item, want error) {
		t.Helper()
		before := snap(q)
		if err := q.Enqueue(it); !errors.Is(err, want) {
			t.Fatalf("Enqueue(%+v) = %v, want %v", it, err, want)
		}
		if after := snap(q); after != before {
			t.Fatalf("rejected enqueue changed the queue: %+v → %+v", before, after)
		}
		if it.Queued() || it.tag != 0 {
			t.Fatalf("rejected item was touched: %+v", it)
		}
	}
	reject(item(fa, 1, 1), ErrFlowFull)
	// The per-flow bound is per band: a critical item of a full flow is let in.
	mustEnqueue(t, q, &Item{Flow: fa, Cost: 1, Weight: 1, Critical: true})
	reject(&Item{Flow: fb, Cost: 1, Weight: 1, Critical: true}, ErrQueueFull)
	mustEnqueue(t, q, item(fb, 1, 1), item(fb, 1, 1))
	reject(item(fc, 1, 1), ErrQueueFull) // MaxTotal 5 counts both bands
	if q.Flows() != 2 {
		t.Fatalf("a rejected new flow was registered: %d flows", q.Flows())
	}
	// Lowering bounds drops nothing; raising them lets items in again.
	q.SetConfig(Config{MaxPerFlow: 1, MaxTotal: 1, MaxCritical: 0})
	if q.Len() != 5 || q.FlowLen(fa) != 3 {
		t.Fatalf("SetConfig dropped items: len %d", q.Len())
	}
	reject(item(fc, 1, 1), ErrQueueFull)
	q.SetConfig(Config{})
	mustEnqueue(t, q, item(fa, 1, 1), item(fc, 1, 1))
	if err := q.Enqueue(q.Peek()); !errors.Is(err, ErrQueued) {
		t.Fatalf("re-enqueue of a queued item: %v, want ErrQueued", err)
	}
}

// Check answers what Enqueue would, bound by bound, and changes nothing:
// not the queue, not the item.
func TestCheckAnswersAsEnqueue(t *testing.T) {
	q := New(Config{MaxPerFlow: 2, MaxTotal: 4, MaxCritical: 1})
	try := func(it *Item) {
		t.Helper()
		before := snap(q)
		got := q.Check(it)
		if after := snap(q); after != before {
			t.Fatalf("Check changed the queue: %+v → %+v", before, after)
		}
		if it.Queued() != (got == ErrQueued) || (got != ErrQueued && it.tag != 0) {
			t.Fatalf("Check touched the item: %+v", it)
		}
		if want := q.Enqueue(it); got != want {
			t.Fatalf("Check(%+v) = %v, Enqueue = %v", it, got, want)
		}
	}
	for _, it := range []*Item{
		item(fa, 1, 1), item(fa, 1, 1), // fa's bound reached
		item(fa, 1, 1), // ErrFlowFull
		{Flow: fa, Cost: 1, Weight: 1, Critical: true}, // its own band
		{Flow: fb, Cost: 1, Weight: 1, Critical: true}, // MaxCritical: ErrQueueFull
		item(fb, 1, 1), item(fc, 1, 1), item(fc, 5, 2), // MaxTotal: ErrQueueFull for the last two
	} {
		try(it)
	}
	if q.Len() != 4 {
		t.Fatalf("%d queued, want 4", q.Len())
	}
	try(q.Peek()) // ErrQueued
}

func TestRemove(t *testing.T) {
	q := New(Config{})
	a1, a2, a3, b1 := item(fa, 10, 1), item(fa, 10, 1), item(fa, 10, 1), item(fb, 15, 1)
	mustEnqueue(t, q, a1, a2, a3, b1)

	// Head: a2 and a3 move up by its 10 (to 10 and 20), as if it had never
	// come, and the flow is re-keyed by a2: first again, before b1 (15).
	if !q.Remove(a1) || a1.Queued() {
		t.Fatal("Remove(head) failed")
	}
	if q.Peek() != a2 || a2.tag != 10*TagUnit || a3.tag != 20*TagUnit || q.Len() != 3 || q.FlowLen(fa) != 2 {
		t.Fatalf("after removing the head: peek %+v len %d", q.Peek(), q.Len())
	}
	if q.Remove(a1) {
		t.Fatal("second Remove of the same item reported true")
	}
	if q.VirtualTime() != 0 {
		t.Fatal("Remove moved V")
	}
	// Middle: the FIFO closes up and the items behind move up.
	mustEnqueue(t, q, a1) // a1 again, now the tail: tag 30
	if !q.Remove(a3) {
		t.Fatal("Remove(middle) failed")
	}
	for i, want := range []*Item{a2, b1, a1} {
		if got := q.Dequeue(nil, 1); got != want {
			t.Fatalf("dequeue %d after removes: %+v (tag %d), want %+v", i, got, got.tag, want)
		}
	}
	if a1.tag != 20*TagUnit || q.Flows() != 0 {
		t.Fatalf("a1 tag %d, flows %d", a1.tag, q.Flows())
	}

	// Tail: the next item is tagged from the new tail, as if the removed
	// one had never come.
	mustEnqueue(t, q, a1, a2) // V = 20: tags 30, 40
	q.Remove(a2)
	mustEnqueue(t, q, a3)
	if a3.tag != 40*TagUnit {
		t.Fatalf("after removing the tail, next tag %d, want 40", a3.tag/TagUnit)
	}
	// Last item: the flow is forgotten and the next one starts from V.
	q.Remove(a1)
	q.Remove(a3)
	if q.Flows() != 0 || q.Len() != 0 {
		t.Fatalf("flows %d len %d after removing everything", q.Flows(), q.Len())
	}
	mustEnqueue(t, q, a1)
	if a1.tag != 30*TagUnit {
		t.Fatalf("tag %d, want V+10 = 30", a1.tag/TagUnit)
	}
	if New(Config{}).Remove(a1) {
		t.Fatal("another queue removed the item")
	}
}

// A lane longer than its arrays (a ring) lowers its tags lazily when its
// head is removed: the items behind move up by the head's increment all
// the same, also when a saturated tag is enqueued behind a lowered lane,
// and after more heads leave; and they are served with those tags.
func TestRemoveHeadOfALongLane(t *testing.T) {
	q := New(Config{})
	var as []*Item
	for range 2 * inline {
		as = append(as, item(fa, 10, 1))
	}
	mustEnqueue(t, q, as...) // tags 10, 20, …, 80
	wantTags := func(when string, its []*Item, tags ...uint64) {
		t.Helper()
		for i, it := range its {
			if got := it.FinishTag(); got != tags[i] {
				t.Fatalf("%s: item %d's tag %d, want %d", when, i, got, tags[i])
			}
		}
	}
	for k := range 3 {
		if !q.Remove(as[k]) {
			t.Fatalf("Remove(head %d) failed", k)
		}
		if got := as[k].FinishTag(); got != 10*TagUnit {
			t.Fatalf("removed head %d: tag %d, want the 10 it had", k, got/TagUnit)
		}
	}
	rest := as[3:]
	wantTags("three heads removed", rest, 10*TagUnit, 20*TagUnit, 30*TagUnit, 40*TagUnit, 50*TagUnit)
	big := item(fa, 1<<48, 1) // its tag saturates: stored with the lane's drop, it would pass 2⁶⁴−1
	mustEnqueue(t, q, big)
	wantTags("a saturated tag enqueued", append(rest, big), 10*TagUnit, 20*TagUnit, 30*TagUnit, 40*TagUnit, 50*TagUnit, math.MaxUint64)
	q.Remove(rest[0])
	rest = rest[1:]
	wantTags("one more head removed", append(rest, big), 10*TagUnit, 20*TagUnit, 30*TagUnit, 40*TagUnit, math.MaxUint64-10*TagUnit)
	for _, want := range append(rest, big) {
		tag := want.FinishTag()
		if got := q.Dequeue(nil, 1); got != want || got.FinishTag() != tag || q.VirtualTime() != tag {
			t.Fatalf("served %+v (tag %d, V %d), want the item of tag %d", got, got.FinishTag(), q.VirtualTime(), tag)
		}
	}
}

// TestRemoveSaturatedThenServeBelowRoot: a Remove whose increment
// saturated moves the item behind it up past its lane's head (to tag 0
// here); when fits then serves that head from below the root, the new head
// is smaller than the root and must rise to it.
func TestRemoveSaturatedThenServeBelowRoot(t *testing.T) {
	q := New(Config{})
	r1 := item(fb, 1, 1)     // tag 1
	a1 := item(fa, 2, 1)     // tag 2
	a2 := item(fa, 1<<48, 1) // increment and tag saturate
	a3 := item(fa, 1, 1)     // tag saturated too
	mustEnqueue(t, q, r1, a1, a2, a3)
	if !q.Remove(a2) || a3.tag != 0 {
		t.Fatalf("after removing a2, a3's tag is %d, want 0 (saturated at 0)", a3.tag)
	}
	if got := q.Dequeue(func(it *Item) bool { return it != r1 }, 2); got != a1 {
		t.Fatalf("Dequeue passing over r1 = %+v, want a1", got)
	}
	if got := q.Peek(); got != a3 {
		t.Fatalf("Peek = %+v (tag %d), want a3 (tag 0)", got, got.tag)
	}
}

func TestDequeueFits(t *testing.T) {
	q := New(Config{})
	a1, b1, c1, b2 := item(fa, 1, 1), item(fb, 2, 1), item(fc, 3, 1), item(fb, 4, 1)
	mustEnqueue(t, q, a1, b1, c1, b2) // heads: a1(1) b1(2) c1(3); b2(6) behind b1
	notA := func(it *Item) bool { return it.Flow != fa }
	if got := q.Dequeue(notA, 10); got != b1 {
		t.Fatalf("with a not fitting: %+v, want b1", got)
	}
	if q.Peek() != a1 || q.VirtualTime() != 2*TagUnit {
		t.Fatalf("head passed over must stay first: peek %+v, V %d", q.Peek(), q.VirtualTime())
	}
	// maxScan counts heads: scanning 1 head sees only a1.
	if got := q.Dequeue(notA, 1); got != nil {
		t.Fatalf("maxScan 1 served %+v past an unfitting head", got)
	}
	if got := q.Dequeue(notA, 0); got != nil {
		t.Fatalf("maxScan 0 (taken as 1) served %+v", got)
	}
	// Next heads: a1(1) c1(3) b2(6): c1 is next fitting.
	if got := q.Dequeue(notA, 2); got != c1 {
		t.Fatalf("second fitting head: %+v, want c1", got)
	}
	if got := q.Dequeue(func(*Item) bool { return false }, 100); got != nil {
		t.Fatalf("nothing fits, yet got %+v", got)
	}
	if q.Len() != 2 || q.Peek() != a1 {
		t.Fatalf("len %d peek %+v", q.Len(), q.Peek())
	}
	// V never moves back when the passed-over head is served later.
	if got := q.Dequeue(nil, 1); got != a1 || q.VirtualTime() != 3*TagUnit {
		t.Fatalf("got %+v, V %d: want a1 and V kept at 3", got, q.VirtualTime()/TagUnit)
	}
}

// TestDequeueScanOrder: over a large heap, the bounded scan examines heads in
// exact (tag, seq) order and serves the first that fits.
func TestDequeueScanOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	q := New(Config{})
	for i := range 500 {
		mustEnqueue(t, q, item(FlowKey{Tenant: string(rune('A' + i%250))}, 1+r.Uint64N(50), 1))
	}
	for q.Len() > 0 {
		// Every head in (tag, seq) order, by brute force.
		entries := slices.Clone(q.bands[normal].heap.entries())
		slices.SortFunc(entries, func(x, y entry) int {
			if x.less(&y) {
				return -1
			}
			return 1
		})
		heads := make([]*Item, len(entries))
		for i, e := range entries {
			heads[i] = q.bands[normal].lanes[e.id].at(0)
		}
		var seen []*Item
		want := 1 + r.IntN(8)
		got := q.Dequeue(func(it *Item) bool {
			seen = append(seen, it)
			return len(seen) == want
		}, 8)
		if len(seen) != min(want, len(heads)) {
			t.Fatalf("examined %d heads, want %d", len(seen), min(want, len(heads)))
		}
		for i, it := range seen {
			if it != heads[i] {
				t.Fatalf("head %d examined is not the %d-th smallest", i, i)
			}
		}
		switch {
		case len(seen) == want && got != seen[want-1]:
			t.Fatal("served item is not the one that fit")
		case len(seen) < want && got != nil:
			t.Fatalf("nothing fit, yet got %+v", got)
		case len(seen) < want:
			q.Dequeue(nil, 1)
		}
	}
}

func TestFlowHandle(t *testing.T) {
	q := New(Config{MaxPerFlow: 1})
	h := q.Flow(fa)
	if h.Len() != 0 || q.Flows() != 0 || h.Key() != fa {
		t.Fatal("Flow registered an empty flow")
	}
	a1 := &Item{Flow: FlowKey{"not", "this"}, Cost: 1, Weight: 1}
	if err := q.EnqueueFlow(h, a1); err != nil || a1.Flow != fa || q.FlowLen(fa) != 1 || h.Len() != 1 {
		t.Fatalf("EnqueueFlow: %v, %+v", err, a1)
	}
	if err := q.EnqueueFlow(h, item(fa, 1, 1)); !errors.Is(err, ErrFlowFull) {
		t.Fatalf("handle path ignores bounds: %v", err)
	}
	q.Dequeue(nil, 1) // flow forgotten; h is now stale
	mustEnqueue(t, q, item(fa, 1, 1))
	if err := q.EnqueueFlow(h, item(fa, 1, 1)); !errors.Is(err, ErrFlowFull) {
		t.Fatalf("stale handle did not find the live flow: %v", err)
	}
	if h.Len() != 1 || q.Flows() != 1 {
		t.Fatalf("stale handle: len %d, flows %d", h.Len(), q.Flows())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("EnqueueFlow with another queue's handle did not panic")
		}
	}()
	_ = New(Config{}).EnqueueFlow(h, item(fa, 1, 1))
}

func TestEach(t *testing.T) {
	q := New(Config{})
	its := []*Item{item(fa, 1, 1), item(fa, 2, 1), item(fb, 1, 1), {Flow: fc, Cost: 1, Weight: 1, Critical: true}}
	mustEnqueue(t, q, its...)
	seen := map[*Item]bool{}
	q.Each(func(it *Item) { seen[it] = true })
	for _, it := range its {
		if !seen[it] {
			t.Fatalf("Each missed %+v", it)
		}
	}
	if len(seen) != len(its) {
		t.Fatalf("Each visited %d items, want %d", len(seen), len(its))
	}
}

func TestSteadyStateAllocatesNothing(t *testing.T) {
	q := New(Config{})
	for i := range 100 {
		for range 3 {
			mustEnqueue(t, q, item(FlowKey{Tenant: string(rune('A' + i))}, 1+uint64(i%7), 1))
		}
	}
	notFirst := func(it *Item) bool { return it.Cost != 1 }
	allocs := testing.AllocsPerRun(1000, func() {
		it := q.Dequeue(notFirst, 100)
		if err := q.Enqueue(it); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("steady state: %v allocs per Enqueue+Dequeue, want 0", allocs)
	}
	// With the position estimates of a request that waits and leaves (in a
	// backlogged flow: a new one allocates its Flow), which bring the tree
	// of tails up to date each time.
	waiter := item(FlowKey{Tenant: "A"}, 3, 2)
	allocs = testing.AllocsPerRun(1000, func() {
		q.WorkAhead(waiter.Flow, waiter.Cost, waiter.Weight, false)
		if err := q.Enqueue(waiter); err != nil {
			t.Fatal(err)
		}
		q.WorkBefore(waiter.FinishTag(), false)
		q.Remove(waiter)
		it := q.Dequeue(notFirst, 100)
		if err := q.Enqueue(it); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("steady state with estimates: %v allocs per op, want 0", allocs)
	}
}

func TestFlowLayout(t *testing.T) {
	var f Flow
	if s := unsafe.Sizeof(f); s > 64 {
		t.Errorf("Flow is %d bytes, want at most 64 (one cache line)", s)
	}
	var l lane
	if s := unsafe.Sizeof(l); s != 2*cacheLine {
		t.Errorf("lane is %d bytes, want 128 (two cache lines in the band's array)", s)
	}
	if off := unsafe.Offsetof(l.item); off != cacheLine {
		t.Errorf("the lane's items start at byte %d, want 64 (the second line)", off)
	}
	if s := unsafe.Sizeof(node{}); s != 48 {
		t.Errorf("a node of the tree of tails is %d bytes, want the 48 the package doc says", s)
	}
	if s := unsafe.Sizeof(entry{}); s*arity != cacheLine {
		t.Errorf("a heap entry is %d bytes, want four siblings to a cache line", s)
	}
	var it Item
	if end := unsafe.Offsetof(it.Weight) + unsafe.Sizeof(it.Weight); end > 64 {
		t.Errorf("the queue's fields, Cost and Weight end at byte %d, past the first cache line", end)
	}
	if s := unsafe.Sizeof(it); s != 128 {
		t.Errorf("Item is %d bytes, want 128 (the elements of a slice of Items 64-byte aligned)", s)
	}
}

// Serve takes a flow's head as Dequeue would serve it (V moves to its
// tag, the flow's next item keeps its tag), and refuses an item that is
// not a head or not queued.
func TestServe(t *testing.T) {
	q := New(Config{})
	a1, b1, c1, b2 := item(fa, 1, 1), item(fb, 2, 1), item(fc, 3, 1), item(fb, 4, 1)
	mustEnqueue(t, q, a1, b1, c1, b2) // heads: a1(1) b1(2) c1(3); b2(6) behind b1
	if q.Serve(b2) {
		t.Fatal("Serve took b2, which is behind b1 in its flow")
	}
	if !q.Serve(c1) || q.VirtualTime() != 3*TagUnit || q.Len() != 3 {
		t.Fatalf("Serve(c1): V %d, len %d; want V 3 and 3 left", q.VirtualTime()/TagUnit, q.Len())
	}
	if q.Serve(c1) {
		t.Fatal("Serve took c1 twice")
	}
	if !q.Serve(b1) || q.VirtualTime() != 3*TagUnit {
		t.Fatalf("Serve(b1) below V: V %d, want it kept at 3", q.VirtualTime()/TagUnit)
	}
	// The rest come out in tag order, b2 with the tag it was given.
	if got := q.Dequeue(nil, 1); got != a1 {
		t.Fatalf("next %+v, want a1", got)
	}
	if got := q.Dequeue(nil, 1); got != b2 || q.VirtualTime() != 6*TagUnit {
		t.Fatalf("next %+v with V %d, want b2 at 6", got, q.VirtualTime()/TagUnit)
	}
	if q.Serve(item(fa, 1, 1)) {
		t.Fatal("Serve took an item never queued")
	}
}
