package wfq

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/sluice-sched/sluice/internal/cputime"
)

// benchQueue fills a queue with flows flows of perFlow items each, of random
// cost and weight 1..4, and returns it with the flows' handles. Each item's
// Value is its flow's handle.
func benchQueue(b *testing.B, flows, perFlow int) *Queue {
	r := rand.New(rand.NewPCG(1, 2))
	q := New(Config{})
	handles := make([]*Flow, flows)
	for i := range handles {
		handles[i] = q.Flow(FlowKey{Tenant: "tenant-" + strconv.Itoa(i), Model: "m"})
	}
	items := make([]Item, flows*perFlow) // a flow's items lie flows apart
	for i := range items {
		f := handles[i%flows]
		it := &items[i]
		it.Flow, it.Cost, it.Weight, it.Value = f.Key(), 1+r.Uint64N(1000), 1+uint64(i%flows%4), f
		if err := q.EnqueueFlow(f, it); err != nil {
			b.Fatal(err)
		}
	}
	return q
}

// BenchmarkEnqueueDequeue is the queue in steady state: every flow holds
// four items; each op dequeues the smallest head and enqueues that item again
// at the back of its flow, through the flow's cached handle.
func BenchmarkEnqueueDequeue(b *testing.B) {
	for _, flows := range []int{1000, 100_000} {
		b.Run(fmt.Sprintf("flows=%d", flows), func(b *testing.B) {
			q := benchQueue(b, flows, 4)
			b.ReportAllocs()
			for b.Loop() {
				it := q.Dequeue(nil, 1)
				if err := q.EnqueueFlow(it.Value.(*Flow), it); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEnqueueDequeueRatio is BenchmarkEnqueueDequeue at 1k and at 100k
// flows in one run, in alternating blocks of ops so that a shared machine's
// noise falls on both alike. It reports each size's ns per op and their
// ratio, whose target is ≤ 4. Blocks are timed by the thread's CPU
// time (on Linux), which leaves out the time other processes held the CPU;
// and the first ops of each block are not timed: they bring the queue back
// into cache after the other size evicted it, a cost the steady state does
// not pay.
func BenchmarkEnqueueDequeueRatio(b *testing.B) {
	const (
		block  = 1 << 16 // ops per block
		warmup = 1 << 13 // of which untimed
	)
	qs := [2]*Queue{benchQueue(b, 1000, 4), benchQueue(b, 100_000, 4)}
	b.ReportAllocs()
	cputime.Ratio(b, block, warmup, "ns/op-1k", "ns/op-100k", func(which int) {
		q := qs[which]
		it := q.Dequeue(nil, 1)
		if err := q.EnqueueFlow(it.Value.(*Flow), it); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkEnqueueDequeueByKey is BenchmarkEnqueueDequeue through Enqueue,
// which looks the flow up by key.
func BenchmarkEnqueueDequeueByKey(b *testing.B) {
	for _, flows := range []int{1000, 100_000} {
		b.Run(fmt.Sprintf("flows=%d", flows), func(b *testing.B) {
			q := benchQueue(b, flows, 4)
			b.ReportAllocs()
			for b.Loop() {
				it := q.Dequeue(nil, 1)
				if err := q.Enqueue(it); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDequeueFits is the dispatcher's case: fits refuses every fourth
// head it is shown (a flow whose domain is full), scanning up to 8 heads.
func BenchmarkDequeueFits(b *testing.B) {
	for _, flows := range []int{1000, 100_000} {
		b.Run(fmt.Sprintf("flows=%d", flows), func(b *testing.B) {
			q := benchQueue(b, flows, 4)
			var calls int
			fits := func(*Item) bool { calls++; return calls%4 != 0 }
			b.ReportAllocs()
			for b.Loop() {
				it := q.Dequeue(fits, 8)
				if err := q.EnqueueFlow(it.Value.(*Flow), it); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkWorkAhead is the engine's position estimates for a request
// that waits and then leaves, behind flows backlogged flows of one item
// each: WorkAhead for a new flow's item (its wait, at Admit), the item
// enqueued, WorkBefore its finish tag (its Retry-After, when it leaves),
// and the item removed, so that the backlog stays at size. Two estimates
// per op, each of which sees a lane come or go.
func BenchmarkWorkAhead(b *testing.B) {
	for _, flows := range []int{100, 1000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("flows=%d", flows), func(b *testing.B) {
			q := benchQueue(b, flows, 1)
			it := &Item{Flow: FlowKey{Tenant: "newcomer", Model: "m"}, Cost: 500, Weight: 2}
			f := q.Flow(it.Flow)
			var sink uint64
			b.ReportAllocs()
			for b.Loop() {
				sink += q.WorkAhead(it.Flow, it.Cost, it.Weight, false)
				if err := q.EnqueueFlow(f, it); err != nil {
					b.Fatal(err)
				}
				sink += q.WorkBefore(it.FinishTag(), false)
				q.Remove(it)
			}
			if sink == 0 {
				b.Fatal("no work ahead of a backlog")
			}
		})
	}
}

// BenchmarkRemoveHead is a mass expiry's work on one flow: the head of a
// lane of n items removed (the oldest request's deadline passed), and
// enqueued again at the tail so that the lane stays at size.
func BenchmarkRemoveHead(b *testing.B) {
	for _, n := range []int{1000, 100_000} {
		b.Run(fmt.Sprintf("items=%d", n), func(b *testing.B) {
			q := New(Config{})
			f := q.Flow(FlowKey{Tenant: "deep", Model: "m"})
			items := make([]Item, n)
			for i := range items {
				items[i] = Item{Cost: 100, Weight: 1}
				if err := q.EnqueueFlow(f, &items[i]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				it := &items[i]
				if !q.Remove(it) {
					b.Fatal("the head was not queued")
				}
				if err := q.EnqueueFlow(f, it); err != nil {
					b.Fatal(err)
				}
				i = (i + 1) % n
			}
		})
	}
}
