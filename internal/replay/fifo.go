package replay

// fifo is a first-in, first-out queue of requests: a slice and the index
// of its head, compacted once the head has passed half of it, so that a
// long replay's queue does not hold every request it ever held.
type fifo struct {
	items []*simReq
	head  int
}

// waiting returns the queued requests, head first (the queue's own
// slice: read it, do not keep it).
func (q *fifo) waiting() []*simReq { return q.items[q.head:] }

// push adds r at the tail.
func (q *fifo) push(r *simReq) { q.items = append(q.items, r) }

// admit pushes r unless limit requests wait already; it reports whether r
// joined.
func (q *fifo) admit(r *simReq, limit int) bool {
	if q.len() >= limit {
		return false
	}
	q.push(r)
	return true
}

// len is how many requests wait.
func (q *fifo) len() int { return len(q.items) - q.head }

// peek returns the head; nil when the queue is empty.
func (q *fifo) peek() *simReq {
	if q.head == len(q.items) {
		return nil
	}
	return q.items[q.head]
}

// pop drops the head (the queue must not be empty).
func (q *fifo) pop() {
	q.items[q.head] = nil
	q.head++
	if q.head > 1024 && q.head*2 > len(q.items) {
		q.items = append(q.items[:0], q.items[q.head:]...)
		q.head = 0
	}
}
