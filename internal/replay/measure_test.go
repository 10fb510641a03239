package replay

import (
	"math"
	"slices"
	"testing"

	"github.com/sluice-sched/sluice/admission"
)

func TestWaterfill(t *testing.T) {
	for _, c := range []struct {
		total          int64
		demand, weight []int64
		want           []int64
	}{
		{100, []int64{10, 100, 100}, []int64{1, 1, 2}, []int64{10, 30, 60}},
		{100, []int64{0, 100}, []int64{5, 1}, []int64{0, 100}},
		{300, []int64{50, 60}, []int64{1, 1}, []int64{50, 60}}, // more than the demand: everyone served
		{120, []int64{100, 100}, []int64{8, 2}, []int64{96, 24}},
	} {
		if got := waterfill(c.total, c.demand, c.weight); !slices.Equal(got, c.want) {
			t.Errorf("waterfill(%d, %v, %v) = %v, want %v", c.total, c.demand, c.weight, got, c.want)
		}
	}
}

func TestWasserstein2(t *testing.T) {
	if d := wasserstein2([]int64{1, 2, 3}, []int64{3, 1, 2}); d != 0 {
		t.Errorf("same distribution: %v", d)
	}
	if d, want := wasserstein2([]int64{0, 0}, []int64{3, 4}), math.Sqrt(12.5); math.Abs(d-want) > 1e-12 {
		t.Errorf("W2 = %v, want %v", d, want)
	}
}

// TestServiceDifference drives the recorder by hand: two equal-weight
// tenants both backlogged; A is served 300 tokens ahead, then B catches
// up; then A alone is served while B is idle, which does not count.
func TestServiceDifference(t *testing.T) {
	cfg, cl := setup(t)
	rows := []Row{{Tenant: "globex", Model: "small", Prompt: 1, Output: 1}, {Tenant: "acme", Model: "small", Prompt: 1, Output: 1}}
	s, err := newSim(rows, Options{Policy: PolicyFIFO, Config: cfg, Cluster: cl})
	if err != nil {
		t.Fatal(err)
	}
	r := s.rec
	for _, tr := range r.t {
		tr.weight = 2
	}
	a, b := s.tix["acme"], s.tix["globex"]
	req := func(tenant int, tokens int64) *simReq {
		q := &simReq{row: &rows[0], tenant: tenant, weighted: tokens, outcome: admission.Admitted}
		r.queued(q)
		return q
	}
	serve := func(q *simReq) { r.answered(q, q.row.Model) }
	qa1, qa2, qb1 := req(a, 200), req(a, 100), req(b, 300)
	_ = req(b, 1) // keeps B backlogged to the end
	serve(qa1)
	serve(qa2) // A 300 ahead
	serve(qb1) // B level again
	if r.maxDiff != 300 {
		t.Errorf("max service difference %v, want 300 tokens", r.maxDiff)
	}
	// A's queue empties; service while only one is backlogged is not a
	// difference between backlogged tenants.
	qa3 := req(a, 1000)
	r.t[b].queued = 0
	r.touch(b)
	serve(qa3)
	if r.maxDiff != 300 {
		t.Errorf("max service difference %v after A was served alone, want 300", r.maxDiff)
	}
}
