package admission

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// Tenants that all keep contending for a tier and take it only on their
// turn stay within one grant's increment of each other in use over weight
// (VTC's bound), whatever the weights, costs and order of asking.
func TestTierSharesStayWithinOneGrant(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := tierShares{window: int64(time.Second)}
		n := rapid.IntRange(2, 5).Draw(rt, "tenants")
		weights := make([]int64, n)
		for i := range weights {
			weights[i] = rapid.Int64Range(1, 8).Draw(rt, fmt.Sprint("weight", i))
			s.want(0, "large", fmt.Sprint("t", i), true)
		}
		const maxCost = 10_000
		now := int64(0)
		for step := range rapid.IntRange(1, 300).Draw(rt, "steps") {
			i := rapid.IntRange(0, n-1).Draw(rt, fmt.Sprint("asker", step))
			now += rapid.Int64Range(0, int64(time.Second)).Draw(rt, fmt.Sprint("gap", step))
			s.full(now, "large") // they all want more than it holds
			if s.turn(now, "large", fmt.Sprint("t", i)) {
				s.charge(now, "large", fmt.Sprint("t", i), rapid.Int64Range(1, maxCost).Draw(rt, fmt.Sprint("cost", step)), weights[i])
			}
			l := s.models["large"]
			if len(l.entries) != n {
				rt.Fatalf("step %d: %d contenders, want %d (all keep a request queued)", step, len(l.entries), n)
			}
			lo, hi := uint64(1<<63), uint64(0)
			for _, u := range l.entries {
				lo, hi = min(lo, u.used), max(hi, u.used)
			}
			if bound := addUse(0, maxCost, 1); hi-lo > bound {
				rt.Fatalf("step %d: uses spread %d, more than one grant's increment %d", step, hi-lo, bound)
			}
		}
	})
}

func TestTierSharesTurns(t *testing.T) {
	const sec = int64(time.Second)
	s := tierShares{window: 5 * sec}
	if !s.turn(0, "large", "a") || len(s.models) != 0 {
		t.Fatalf("nobody contends: every tenant's turn, and nothing kept")
	}
	s.charge(0, "large", "a", 1000, 1) // nobody contends: not counted
	if len(s.models) != 0 {
		t.Fatalf("a grant nobody contends for was recorded: %+v", s.models)
	}

	// Large is full: b wants it and is queued; a, granted large now, joins at
	// the least and is charged: b's turn next.
	s.full(0, "large")
	s.want(0, "large", "b", true)
	s.charge(0, "large", "a", 1000, 2)
	if s.turn(0, "large", "a") || !s.turn(0, "large", "b") {
		t.Fatalf("after a's grant: a's turn %v, b's %v; want b's only", s.turn(0, "large", "a"), s.turn(0, "large", "b"))
	}
	s.charge(0, "large", "b", 1000, 8) // weight 8: a quarter of a's increment
	for range 3 {
		if !s.turn(0, "large", "b") {
			t.Fatalf("b (weight 8) must have four grants to a's one")
		}
		s.charge(0, "large", "b", 1000, 8)
	}
	if !s.turn(0, "large", "a") {
		t.Fatalf("after b's four grants: a's turn again")
	}
	s.charge(0, "large", "a", 1000, 2)
	if s.turn(0, "large", "a") || !s.turn(0, "large", "b") {
		t.Fatalf("after a's second grant: b's turn, not a's")
	}

	// b leaves the queue and stops asking; a keeps a request queued, and
	// large stays full. b keeps its place for the window, then it is a's
	// turn again.
	s.full(sec, "large")
	s.want(sec, "large", "a", true)
	s.leave(sec, "large", "b")
	if s.turn(2*sec, "large", "a") {
		t.Fatalf("b asked 1 s ago: still its turn")
	}
	s.full(6*sec, "large")
	if !s.turn(6*sec, "large", "a") {
		t.Fatalf("b last asked 5 s ago: its place is gone")
	}

	// A tenant that comes back is lifted to the least use: time away earns
	// nothing.
	s.want(6*sec, "large", "b", true)
	if a, b := s.models["large"].entries["a"].used, s.models["large"].entries["b"].used; b != a {
		t.Fatalf("b came back at use %d, want the least, a's %d", b, a)
	}

	// When large has room again, everybody's turn, whatever the uses; and
	// when nobody contends any more, the model's counters are forgotten.
	s.charge(6*sec, "large", "b", 1000, 1)
	if !s.turn(12*sec, "large", "b") {
		t.Fatalf("large last full 6 s ago: every tenant's turn")
	}
	s.leave(6*sec, "large", "a")
	s.leave(6*sec, "large", "b")
	if !s.turn(20*sec, "large", "a") || len(s.models) != 0 {
		t.Fatalf("nobody has contended for 14 s: the ledger must be gone, got %+v", s.models)
	}
}

// A hold puts back what asking whose turn it is tidies: contenders dropped
// once they stop contending, a ledger forgotten once nobody contends.
func TestTierHoldPutsBack(t *testing.T) {
	const sec = int64(time.Second)
	s := tierShares{window: 5 * sec}
	s.full(0, "large")
	s.want(0, "large", "a", false)
	s.want(0, "large", "b", false)
	s.charge(0, "large", "b", 1000, 1)
	s.full(0, "medium")
	s.want(0, "medium", "c", false)
	type ledgerCopy struct {
		full       int64
		wasFull    bool
		entries    map[string]tierUse
		contenders []tierUse // in heap order
	}
	snapshot := func() map[string]ledgerCopy {
		out := map[string]ledgerCopy{}
		for m, l := range s.models {
			cp := ledgerCopy{full: l.full, wasFull: l.wasFull, entries: map[string]tierUse{}}
			for k, u := range l.entries {
				cp.entries[k] = *u
			}
			for _, u := range l.contenders.All() {
				cp.contenders = append(cp.contenders, *u)
			}
			out[m] = cp
		}
		return out
	}
	before := snapshot()
	models := []*modelState{{name: "large"}, {name: "medium"}, {name: "small"}, {name: "large"}}
	h := s.hold(models)
	// 20 s on: nobody contends; asking drops both ledgers.
	if !s.turn(20*sec, "large", "a") || !s.turn(20*sec, "medium", "c") || len(s.models) != 0 {
		t.Fatalf("nobody contends for 20 s: both ledgers must be gone, got %+v", s.models)
	}
	h.Cancel()
	if after := snapshot(); !reflect.DeepEqual(before, after) {
		t.Fatalf("after Cancel:\n%+v\nwant\n%+v", after, before)
	}
	if l := s.models["large"]; !l.contenders.Contains(l.entries["a"]) || l.contenders.All()[l.entries["a"].heapIdx] != l.entries["a"] {
		t.Fatal("after Cancel, the contenders' heap and entries disagree")
	}
	if _, ok := s.models["small"]; ok {
		t.Fatal("Cancel made a ledger for a model that had none")
	}
}
