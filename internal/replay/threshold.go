package replay

import (
	"github.com/sluice-sched/sluice/admission"
)

// threshold is the Gateway API Inference Extension's rule, on the
// engines' signals alone: no quotas, no floors and no capacity model. A
// domain is saturated when its last signal shows a waiting queue above
// feedback.queue_threshold or KV use above feedback.kv_threshold (the
// extension's 5 and 0.8); the head of one FIFO queue goes to the least
// loaded domain that is not (the shortest waiting queue, then the least
// KV in use, then the fewest running, then the cluster's order), and
// waits while every domain is. Between two reports it decides on the last
// one, with what it has sent each domain since counted as waiting there:
// without that, the requests queued while every domain was saturated
// would all go to the one domain the next report shows free (the herd
// that stale metrics cause), and the rule would look worse than it is.
//
// Queued requests are refused DEADLINE_UNMEETABLE when their deadline
// passes, QUEUE_FULL beyond queue.max_total, and CAPACITY_EXCEEDED at once
// when no domain's engine could ever hold their KV. Requests are never
// degraded.
type threshold struct {
	s       *sim
	queue   fifo
	wait    int64
	max     int
	qT, kvT float64
	sent    []float64 // requests sent to each domain since the last report
	// onDispatch, when set, sees each dispatch with the signals it was
	// decided on (tests).
	onDispatch func(r *simReq, domain int, signals []admission.EngineSignal)
}

func newThreshold(s *sim) *threshold {
	cfg := &s.opts.Config
	return &threshold{s: s, wait: int64(cfg.Queue.DefaultWait.Duration), max: cfg.Queue.MaxTotal,
		qT: cfg.Feedback.QueueThreshold, kvT: cfg.Feedback.KVThreshold, sent: make([]float64, len(s.domains))}
}

// signal is domain i's last signal with what was sent to it since.
func (b *threshold) signal(i int) admission.EngineSignal {
	sig := b.s.signals[i]
	sig.Queue += b.sent[i]
	return sig
}

// saturated reports whether sig is past a threshold.
func (b *threshold) saturated(sig admission.EngineSignal) bool {
	return sig.Queue > b.qT || sig.KVUsage > b.kvT
}

func (b *threshold) submit(now int64, r *simReq) error {
	if r.deadline == 0 {
		r.deadline = now + b.wait
	}
	if _, ever := b.s.prefillWork(r); !ever {
		return b.s.decided(r, admission.Rejected, admission.ReasonCapacityExceeded, "", "", 0)
	}
	if !b.queue.admit(r, b.max) {
		return b.s.decided(r, admission.Rejected, admission.ReasonQueueFull, "", "", 0)
	}
	return b.dispatch(now)
}

// pick returns the least loaded domain under the thresholds that can
// hold r's KV, or -1.
func (b *threshold) pick(r *simReq) int {
	m, _ := b.s.cat.Get(r.row.Model)
	best := -1
	var bestSig admission.EngineSignal
	for i, d := range b.s.domains {
		sig := b.signal(i)
		if b.saturated(sig) {
			continue
		}
		if c, err := d.cap.Cost(m, r.row.Prompt, r.row.Output); err != nil || c.KVBytes > d.eng.kvCap {
			continue
		}
		if best < 0 || lessLoaded(sig, bestSig) {
			best, bestSig = i, sig
		}
	}
	return best
}

// lessLoaded orders signals by waiting queue, KV use, then running.
func lessLoaded(a, b admission.EngineSignal) bool {
	switch {
	case a.Queue != b.Queue:
		return a.Queue < b.Queue
	case a.KVUsage != b.KVUsage:
		return a.KVUsage < b.KVUsage
	}
	return a.Running < b.Running
}

// dispatch sends queue heads to a domain while one is under the
// thresholds, after refusing the heads whose deadline has passed.
func (b *threshold) dispatch(now int64) error {
	for r := b.queue.peek(); r != nil; r = b.queue.peek() {
		if r.deadline <= now {
			b.queue.pop()
			if err := b.s.decided(r, admission.Rejected, admission.ReasonDeadlineUnmeetable, "", "", 0); err != nil {
				return err
			}
			continue
		}
		best := b.pick(r)
		if best < 0 {
			return nil // every domain is saturated: the FIFO waits
		}
		b.queue.pop()
		if b.onDispatch != nil {
			sigs := make([]admission.EngineSignal, len(b.sent))
			for i := range sigs {
				sigs[i] = b.signal(i)
			}
			b.onDispatch(r, best, sigs)
		}
		b.sent[best]++
		if err := b.s.decided(r, admission.Admitted, admission.ReasonNone, b.s.domains[best].id, r.row.Model, uint64(r.id)+1); err != nil {
			return err
		}
	}
	return nil
}

func (b *threshold) tick(now int64) {
	if err := b.dispatch(now); err != nil {
		b.s.rec.fail(err)
	}
}

func (b *threshold) release(int64, *simReq) error { return nil }

func (b *threshold) observe(now int64, _ []admission.EngineSignal) {
	clear(b.sent)
	b.tick(now)
}

func (b *threshold) queued() int { return b.queue.len() }

func (b *threshold) close() {}
