package wfq

import (
	"fmt"
	"math"
	"math/big"
	"testing"

	"pgregory.net/rapid"
)

// When a Dequeue serves a head other than the smallest, V moves past the
// lanes of the heads it passed over, and WorkAhead no longer counts their
// work; FlowCost still counts all of a flow's: the work that a flow's next
// item has ahead of it whatever V does.
func TestFlowCostCountsWhatVirtualTimePassed(t *testing.T) {
	q := New(Config{})
	waiting, other := FlowKey{"acme", "large"}, FlowKey{"globex", "small"}
	for range 5 {
		mustEnqueue(t, q, &Item{Flow: waiting, Cost: 100, Weight: 1})
	}
	late := &Item{Flow: other, Cost: 1000, Weight: 1}
	mustEnqueue(t, q, late)
	if got := q.FlowCost(waiting); got != 500 {
		t.Fatalf("FlowCost %d, want 500", got)
	}
	// acme's head does not fit: globex's, tagged after all of acme's, is
	// served, and V moves to its tag.
	if it := q.Dequeue(func(it *Item) bool { return it.Flow == other }, 8); it != late {
		t.Fatalf("Dequeue = %v, want globex's item", it)
	}
	if got := q.WorkAhead(waiting, 100, 1, false); got >= 500 {
		t.Fatalf("WorkAhead %d: V did not pass acme's lane, the test means nothing", got)
	}
	if got := q.FlowCost(waiting); got != 500 {
		t.Errorf("FlowCost %d after V passed the lane, want 500", got)
	}
	if it := q.Dequeue(nil, 8); it == nil || it.Flow != waiting {
		t.Fatalf("Dequeue = %v, want acme's head", it)
	}
	q.Remove(q.Peek())
	if got := q.FlowCost(waiting); got != 300 {
		t.Errorf("FlowCost %d after one served and one removed, want 300", got)
	}
}

// A light flow arriving behind a neighbour's burst has only the burst's
// weighted share of its own span ahead of it, not the burst; a flow's own
// backlog counts in full; a normal item has the critical band ahead.
func TestWorkAheadCountsByPosition(t *testing.T) {
	q := New(Config{})
	burst, light, own := FlowKey{"acme", "m"}, FlowKey{"globex", "m"}, FlowKey{"hooli", "m"}
	for range 100 {
		mustEnqueue(t, q, &Item{Flow: burst, Cost: 10, Weight: 1})
	}
	if got := q.WorkAhead(light, 10, 4, false); got != 2 { // ⌊1 · 10/4⌋ of the burst
		t.Errorf("light flow behind a burst of 1000: %d ahead, want 2", got)
	}
	if got := q.WorkAhead(FlowKey{"initech", "m"}, 10, 1, false); got != 10 {
		t.Errorf("equal weight behind a burst: %d ahead, want 10", got)
	}
	for range 2 {
		mustEnqueue(t, q, &Item{Flow: own, Cost: 10, Weight: 4})
	}
	// own's tail is at V+5; its next item ends at V+7.5: its own 20, and
	// 7 of the burst.
	if got := q.WorkAhead(own, 10, 4, false); got != 20+7 {
		t.Errorf("a flow's own backlog: %d ahead, want 27", got)
	}
	mustEnqueue(t, q, &Item{Flow: FlowKey{"ops", "m"}, Cost: 30, Weight: 1, Critical: true})
	// The burst's 2, own's 4 · 2.5 = 10, and the whole critical band.
	if got := q.WorkAhead(light, 10, 4, false); got != 2+10+30 {
		t.Errorf("with a critical item queued: %d ahead, want 42", got)
	}
	// In the critical band, fairly among critical flows: 1 · 2.5 of its 30.
	if got := q.WorkAhead(light, 10, 4, true); got != 2 {
		t.Errorf("a critical item: %d ahead, want 2", got)
	}
}

// WorkAhead against the service order: with every head fitting, the work
// dequeued before a new item differs from WorkAhead by at most one item per
// lane (a head partly served before V, an item straddling the new tag) and
// rounding.
func TestWorkAheadMatchesServiceOrder(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		q := New(Config{})
		nFlows := rapid.IntRange(1, 6).Draw(rt, "flows")
		weights := make([]uint64, nFlows)
		var maxCost uint64
		for f := range weights {
			weights[f] = rapid.Uint64Range(1, 8).Draw(rt, fmt.Sprintf("w%d", f))
		}
		// Some service first, so that V has moved and heads are part served.
		for i, n := 0, rapid.IntRange(0, 40).Draw(rt, "items"); i < n; i++ {
			f := rapid.IntRange(0, nFlows-1).Draw(rt, "flow")
			c := rapid.Uint64Range(1, 100).Draw(rt, "cost")
			maxCost = max(maxCost, c)
			if err := q.Enqueue(&Item{Flow: FlowKey{fmt.Sprint(f), ""}, Cost: c, Weight: weights[f]}); err != nil {
				rt.Fatal(err)
			}
			if rapid.Bool().Draw(rt, "serve") {
				q.Dequeue(func(*Item) bool { return true }, 1)
			}
		}
		f := rapid.IntRange(0, nFlows).Draw(rt, "newFlow") // nFlows: a new flow
		w := uint64(1)
		if f < nFlows {
			w = weights[f]
		}
		cost := rapid.Uint64Range(1, 100).Draw(rt, "newCost")
		key := FlowKey{fmt.Sprint(f), ""}
		lanes := uint64(q.bands[normal].heap.len())
		est := q.WorkAhead(key, cost, w, false)
		it := &Item{Flow: key, Cost: cost, Weight: w}
		if err := q.Enqueue(it); err != nil {
			rt.Fatal(err)
		}
		var served uint64
		for {
			got := q.Dequeue(func(*Item) bool { return true }, 1)
			if got == nil {
				rt.Fatal("the new item was never served")
			}
			if got == it {
				break
			}
			served += got.Cost
		}
		slack := (lanes + 1) * (maxCost + 1)
		if served+slack < est || served > est+slack {
			rt.Fatalf("served %d before the item, WorkAhead said %d (lanes %d, max cost %d)", served, est, lanes, maxCost)
		}
	})
}

// refBandWork is bandWork by its definition, lane by lane, in big
// integers: ⌊Σ_l w_l · (min(T_l, upTo) − V)⁺ / TagUnit⌋ over band b's
// lanes, saturated at MaxUint64.
func refBandWork(q *Queue, b int, upTo uint64) uint64 {
	bd := &q.bands[b]
	sum := new(big.Int)
	for _, e := range bd.heap.entries() {
		l := &bd.lanes[e.id]
		span := min(l.tailTag(), upTo)
		if span <= bd.v {
			continue
		}
		term := new(big.Int).SetUint64(span - bd.v)
		sum.Add(sum, term.Mul(term, new(big.Int).SetUint64(uint64(l.weight))))
	}
	sum.Rsh(sum, 16)
	if !sum.IsUint64() {
		return math.MaxUint64
	}
	return sum.Uint64()
}

// refWorkBefore is WorkBefore from refBandWork.
func refWorkBefore(q *Queue, tag uint64, crit bool) uint64 {
	if crit {
		return refBandWork(q, critical, tag)
	}
	return satAdd(refBandWork(q, normal, tag), refBandWork(q, critical, math.MaxUint64))
}

// TestWorkAheadIsExact runs random Enqueues, Dequeues (with random fits)
// and Removes in both bands, with costs and weights up to the bounds (tags
// that saturate, weights past MaxUint32), and after each step compares
// WorkBefore and WorkAhead, for random tags and items, with the sum over
// every lane of the definition (refBandWork): the tree answers exactly,
// whether it has a lane's change to catch up on or many.
func TestWorkAheadIsExact(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		keys := make([]FlowKey, rapid.IntRange(1, 40).Draw(t, "flows"))
		for i := range keys {
			keys[i] = FlowKey{fmt.Sprint(i), "m"}
		}
		pool := make([]*Item, rapid.IntRange(1, 120).Draw(t, "items"))
		for i := range pool {
			pool[i] = &Item{Value: i}
		}
		q := New(Config{})
		costGen := rapid.OneOf(rapid.Uint64Range(0, 1000), rapid.Uint64Range(0, 1<<48), rapid.Uint64Range(0, math.MaxUint64))
		weightGen := rapid.OneOf(rapid.Uint64Range(0, 8), rapid.Uint64Range(math.MaxUint32-8, math.MaxUint32+8), rapid.Uint64())
		// A tag to ask about: near V or a lane's tail, or anywhere.
		tagGen := func(label string) uint64 {
			switch rapid.IntRange(0, 3).Draw(t, label+"Kind") {
			case 0:
				return rapid.Uint64().Draw(t, label)
			case 1:
				return math.MaxUint64
			default:
				bd := &q.bands[rapid.IntRange(0, nBands-1).Draw(t, label+"Band")]
				base := bd.v
				if es := bd.heap.entries(); len(es) > 0 && rapid.Bool().Draw(t, label+"AtTail") {
					base = bd.lanes[es[rapid.IntRange(0, len(es)-1).Draw(t, label+"Lane")].id].tailTag()
				}
				d := rapid.Uint64Range(0, 2*TagUnit).Draw(t, label+"Offset")
				if rapid.Bool().Draw(t, label+"Below") {
					return satSub(base, d)
				}
				return satAdd(base, d)
			}
		}
		for step := range rapid.IntRange(1, 300).Draw(t, "steps") {
			// Several changes between queries, sometimes: the tree then
			// has several marks to catch up on at once.
			for range rapid.IntRange(1, 3).Draw(t, "changes") {
				switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
				case op < 6:
					it := pool[rapid.IntRange(0, len(pool)-1).Draw(t, "item")]
					if !it.Queued() {
						it.Flow = rapid.SampledFrom(keys).Draw(t, "key")
						it.Cost = costGen.Draw(t, "cost")
						it.Weight = weightGen.Draw(t, "weight")
						it.Critical = rapid.IntRange(0, 3).Draw(t, "band") == 0
						if err := q.Enqueue(it); err != nil {
							t.Fatal(err)
						}
					}
				case op < 8:
					mod := rapid.IntRange(1, 3).Draw(t, "fitsMod")
					q.Dequeue(func(it *Item) bool { return it.Value.(int)%mod == 0 }, rapid.IntRange(1, 4).Draw(t, "maxScan"))
				default:
					q.Remove(pool[rapid.IntRange(0, len(pool)-1).Draw(t, "item")])
				}
			}
			tag, crit := tagGen("tag"), rapid.Bool().Draw(t, "crit")
			if got, want := q.WorkBefore(tag, crit), refWorkBefore(q, tag, crit); got != want {
				t.Fatalf("step %d: WorkBefore(%d, %v) = %d, by the definition %d", step, tag, crit, got, want)
			}
			k := rapid.SampledFrom(keys).Draw(t, "askKey")
			cost, weight := costGen.Draw(t, "askCost"), weightGen.Draw(t, "askWeight")
			b := normal
			if crit {
				b = critical
			}
			f := q.bands[b].v
			if fl := q.flows[k]; fl != nil && fl.lane[b] != noLane {
				f = max(f, q.bands[b].lanes[fl.lane[b]].tailTag())
			}
			if got, want := q.WorkAhead(k, cost, weight, crit), refWorkBefore(q, satAdd(f, increment(cost, weight)), crit); got != want {
				t.Fatalf("step %d: WorkAhead(%v, %d, %d, %v) = %d, by the definition %d", step, k, cost, weight, crit, got, want)
			}
			checkInvariants(t, q)
		}
	})
}
