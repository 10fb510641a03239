package enginesim

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Spec sizes one engine: its true rates, its KV cache and its scheduler's
// limits.
type Spec struct {
	// PrefillRate is the FLOP/s its prefills share; DecodeRate the bytes/s
	// of HBM traffic its decodes share.
	PrefillRate, DecodeRate float64
	// KVBytes is the KV cache it holds.
	KVBytes int64
	// MaxBatch is how many requests it runs at once (vLLM's max_num_seqs).
	MaxBatch int
	// PrefillTokens is how many prompt tokens it prefills at once (vLLM's
	// max_num_batched_tokens); a longer prompt is prefilled alone.
	PrefillTokens int64
}

func (s Spec) validate() error {
	switch {
	case !(s.PrefillRate > 0) || math.IsInf(s.PrefillRate, 0):
		return fmt.Errorf("prefill rate %g: must be positive and finite", s.PrefillRate)
	case !(s.DecodeRate > 0) || math.IsInf(s.DecodeRate, 0):
		return fmt.Errorf("decode rate %g: must be positive and finite", s.DecodeRate)
	case s.KVBytes <= 0:
		return fmt.Errorf("KV cache %d B: must be positive", s.KVBytes)
	case s.MaxBatch <= 0:
		return fmt.Errorf("max batch %d: must be positive", s.MaxBatch)
	case s.PrefillTokens <= 0:
		return fmt.Errorf("prefill tokens %d: must be positive", s.PrefillTokens)
	}
	return nil
}

// Work is what one request asks of an engine: its tokens and, from the pd
// cost model, its prefill FLOP, decode bytes and KV bytes.
type Work struct {
	Prompt, Output int64
	PrefillFLOP    float64
	DecodeBytes    float64
	KVBytes        int64
}

// ErrTooLarge is returned by Engine.Add for a request whose KV cache is
// more than the engine holds: it could never run.
var ErrTooLarge = errors.New("the request's KV cache is more than the engine holds")

// stage is where a request is in its engine.
type stage uint8

const (
	waiting stage = iota
	prefilling
	decoding
	done
	cancelled
)

// Request is one request in an Engine. Its fields are the engine's: read
// them through the engine's methods, under whatever serialises the
// engine.
type Request struct {
	id    uint64
	work  Work
	stage stage
	// finish is the phase's attained service at which its work in the
	// current phase is done.
	finish float64
	// AddAt, FirstAt and DoneAt are when it was added, ended prefill (its
	// first token) and completed, in the engine's nanoseconds; 0 until
	// then.
	AddAt, FirstAt, DoneAt int64
}

// phase is one processor-shared resource of an engine (prefill FLOP/s or
// decode bytes/s), as the replay's: its requests share its rate equally;
// s is the attained service per request, and a request that enters with
// work W at s0 leaves when s reaches s0 + W.
type phase struct {
	rate float64
	s    float64
	last int64
	reqs []*Request
}

func (p *phase) advance(now int64) {
	if now <= p.last {
		return
	}
	if len(p.reqs) == 0 {
		p.s = 0 // nothing refers to it: keep float64's precision
	} else {
		p.s += float64(now-p.last) / 1e9 * p.rate / float64(len(p.reqs))
	}
	p.last = now
}

// first is the request that finishes first (ties to the earliest added),
// or nil.
func (p *phase) first() *Request {
	var f *Request
	for _, r := range p.reqs {
		if f == nil || r.finish < f.finish || r.finish == f.finish && r.id < f.id {
			f = r
		}
	}
	return f
}

// next is when the first request finishes, or -1.
func (p *phase) next() int64 {
	f := p.first()
	if f == nil {
		return -1
	}
	left := f.finish - p.s
	if left <= 0 {
		return p.last
	}
	return p.last + int64(math.Ceil(left*float64(len(p.reqs))/p.rate*1e9))
}

// done takes out the request finishing by now (within a nanosecond's
// service, the rounding of next), if any.
func (p *phase) done() *Request {
	f := p.first()
	if f == nil || (f.finish-p.s)*float64(len(p.reqs))/p.rate*1e9 > 1 {
		return nil
	}
	p.remove(f)
	return f
}

func (p *phase) add(r *Request, work float64) {
	r.finish = p.s + work
	p.reqs = append(p.reqs, r)
}

func (p *phase) remove(r *Request) {
	if i := slices.Index(p.reqs, r); i >= 0 {
		p.reqs = slices.Delete(p.reqs, i, i+1)
	}
}

// Engine is one continuous-batching serving engine in time (see the
// package documentation): a FIFO waiting queue in front of a batch whose
// prefills share the prefill rate and whose decodes share the decode
// rate. Times are int64 nanoseconds on the caller's clock, never going
// back. An Engine is not safe for concurrent use.
type Engine struct {
	spec            Spec
	prefill, decode phase
	waiting         []*Request
	running         int
	kvHeld          int64
	inPrefill       int64 // prompt tokens in prefill
	nextID          uint64
}

// NewEngine returns an idle engine of spec.
func NewEngine(spec Spec) (*Engine, error) {
	if err := spec.validate(); err != nil {
		return nil, fmt.Errorf("enginesim: engine: %w", err)
	}
	e := &Engine{spec: spec}
	e.prefill.rate, e.decode.rate = spec.PrefillRate, spec.DecodeRate
	return e, nil
}

// Spec returns the engine's spec.
func (e *Engine) Spec() Spec { return e.spec }

// Add queues a request of w at now (after the events before it) and
// starts it at once if it fits the batch. It fails with ErrTooLarge for a
// request that could never fit, and for a request with no output token.
func (e *Engine) Add(now int64, w Work) (*Request, error) {
	switch {
	case w.KVBytes > e.spec.KVBytes:
		return nil, fmt.Errorf("%w: %d B of KV, the engine holds %d B", ErrTooLarge, w.KVBytes, e.spec.KVBytes)
	case w.Output < 1 || w.Prompt < 0 || w.PrefillFLOP < 0 || w.DecodeBytes < 0 || w.KVBytes < 0:
		return nil, fmt.Errorf("enginesim: a request of %d prompt and %d output tokens: want at least one output token", w.Prompt, w.Output)
	}
	e.Advance(now)
	e.nextID++
	r := &Request{id: e.nextID, work: w, AddAt: now}
	e.waiting = append(e.waiting, r)
	e.fill(now)
	return r, nil
}

// Cancel takes r out of the engine at now, wherever it is, freeing its
// place in the batch and its KV.
func (e *Engine) Cancel(now int64, r *Request) {
	e.Advance(now)
	switch r.stage {
	case waiting:
		if i := slices.Index(e.waiting, r); i >= 0 {
			e.waiting = slices.Delete(e.waiting, i, i+1)
		}
	case prefilling:
		e.prefill.remove(r)
		e.inPrefill -= r.work.Prompt
		e.leave(r)
	case decoding:
		e.decode.remove(r)
		e.leave(r)
	default:
		return
	}
	r.stage = cancelled
	e.fill(now)
}

// Next returns when the engine's next event (a prefill or a decode
// ending) is due, or -1 when none is.
func (e *Engine) Next() int64 {
	p, d := e.prefill.next(), e.decode.next()
	switch {
	case p < 0:
		return d
	case d < 0:
		return p
	}
	return min(p, d)
}

// Advance runs the engine's events up to now, in time order, and those
// due at now within a nanosecond's rounding (the replay runs them at any
// instant it visits), and reports whether any happened. At each event's
// instant, prefills that end move to decode, the batch is filled, decodes
// that end leave it, and it is filled again: the replay's order.
func (e *Engine) Advance(now int64) bool {
	happened := false
	for t := e.Next(); t >= 0 && t <= now; t = e.Next() {
		e.step(t)
		happened = true
	}
	return e.step(now) || happened
}

// step runs the events due at now and reports whether any was.
func (e *Engine) step(now int64) bool {
	e.prefill.advance(now)
	e.decode.advance(now)
	happened := false
	for r := e.prefill.done(); r != nil; r = e.prefill.done() {
		r.FirstAt, r.stage = now, decoding
		e.inPrefill -= r.work.Prompt
		e.decode.add(r, r.work.DecodeBytes)
		happened = true
	}
	e.fill(now)
	for r := e.decode.done(); r != nil; r = e.decode.done() {
		r.DoneAt, r.stage = now, done
		e.leave(r)
		happened = true
	}
	e.fill(now)
	return happened
}

// leave frees r's place in the batch and its KV.
func (e *Engine) leave(r *Request) {
	e.kvHeld -= r.work.KVBytes
	e.running--
}

// fill moves waiting requests into the batch, in order, while the head
// fits the batch, the KV and the prefill budget; each starts its prefill.
func (e *Engine) fill(now int64) {
	for len(e.waiting) > 0 && e.running < e.spec.MaxBatch {
		r := e.waiting[0]
		if e.kvHeld+r.work.KVBytes > e.spec.KVBytes || e.inPrefill >= e.spec.PrefillTokens {
			return // the head waits: first come, first served
		}
		e.waiting = e.waiting[1:]
		e.kvHeld += r.work.KVBytes
		e.running++
		e.inPrefill += r.work.Prompt
		r.stage = prefilling
		e.prefill.advance(now)
		e.prefill.add(r, r.work.PrefillFLOP)
	}
}

// Tokens returns how many of r's output tokens are out at the engine's
// last Advance: none before its first token, one at it, then the rest in
// proportion to its decode work done, and all once it is done.
func (e *Engine) Tokens(r *Request) int64 {
	switch r.stage {
	case done:
		return r.work.Output
	case decoding:
		w := r.work.DecodeBytes
		if w <= 0 || r.work.Output == 1 {
			return 1
		}
		doneWork := w - max(r.finish-e.decode.s, 0)
		return min(1+int64(float64(r.work.Output-1)*doneWork/w), r.work.Output)
	}
	return 0
}

// TokenAt returns when r's token k (counting from 1) comes out if the
// decode batch stays as it is, or -1 when r is not decoding or k is past
// its output.
func (e *Engine) TokenAt(r *Request, k int64) int64 {
	if r.stage != decoding || k > r.work.Output || k < 2 {
		return -1
	}
	w := r.work.DecodeBytes
	need := w*float64(k-1)/float64(r.work.Output-1) - (w - (r.finish - e.decode.s))
	if need <= 0 {
		return e.decode.last
	}
	return e.decode.last + int64(math.Ceil(need*float64(len(e.decode.reqs))/e.decode.rate*1e9))
}

// Finished reports whether r is done or cancelled.
func (e *Engine) Finished(r *Request) bool { return r.stage == done || r.stage == cancelled }

// Stats is what an engine's metrics say.
type Stats struct {
	Waiting, Running int
	// KVUsage is the share of the KV cache the batch holds, 0..1.
	KVUsage float64
}

// Stats returns the engine's state at its last Advance.
func (e *Engine) Stats() Stats {
	return Stats{Waiting: len(e.waiting), Running: e.running, KVUsage: float64(e.kvHeld) / float64(e.spec.KVBytes)}
}
