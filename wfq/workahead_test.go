package wfq

import (
	"fmt"
	"testing"

	"pgregory.net/rapid"
)

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
