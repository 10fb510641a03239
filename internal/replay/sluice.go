package replay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/clock"
)

// epoch is the manual clock's zero: any fixed instant does, so that a
// replay's answers never depend on when it ran.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// sluicePolicy is the real engine on a manual clock. Queued requests are
// Tickets, answered by Tick or Release; the policy finds them when the
// engine's queue is shorter than its list of tickets.
type sluicePolicy struct {
	s       *sim
	eng     *admission.Engine
	clk     *clock.Manual
	pending []pendingTicket
	lower   map[string][]string // model → the lower tiers a request accepts with --downgrade
}

type pendingTicket struct {
	tk *admission.Ticket
	r  *simReq
}

func newSluicePolicy(s *sim) (*sluicePolicy, error) {
	clk := clock.NewManual(epoch)
	eng, err := admission.New(s.opts.Config, s.opts.Cluster, admission.WithClock(clk))
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	p := &sluicePolicy{s: s, eng: eng, clk: clk, lower: map[string][]string{}}
	if s.opts.Downgrade {
		for _, m := range s.cat.Names() {
			chain := s.cat.DegradeChain(m)
			if len(chain) > 1 {
				p.lower[m] = chain[1:]
			}
		}
	}
	return p, nil
}

func (p *sluicePolicy) at(now int64) { p.clk.Set(epoch.Add(time.Duration(now))) }

func (p *sluicePolicy) submit(now int64, r *simReq) error {
	p.at(now)
	req := admission.Request{
		Tenant:          r.row.Tenant,
		Model:           r.row.Model,
		PromptTokens:    r.row.Prompt,
		MaxOutputTokens: r.row.Output,
		AcceptDowngrade: p.lower[r.row.Model],
	}
	if r.deadline > 0 {
		req.Deadline = epoch.Add(time.Duration(r.deadline))
	}
	d, tk, err := p.eng.Submit(context.Background(), req)
	var inv *admission.InvalidArgumentError
	switch {
	case errors.As(err, &inv):
		return fmt.Errorf("trace line %d: the engine refused the request as invalid: %w", r.row.Line, err)
	case err != nil:
		return fmt.Errorf("trace line %d: %w", r.row.Line, err)
	case tk != nil:
		p.pending = append(p.pending, pendingTicket{tk, r})
		return p.collect()
	}
	if err := p.decide(r, d); err != nil {
		return err
	}
	return p.collect()
}

func (p *sluicePolicy) decide(r *simReq, d admission.Decision) error {
	return p.s.decided(r, d.Outcome, d.Reason, d.Domain, d.Model, d.LeaseID)
}

// collect answers the tickets the engine has answered, in arrival order.
func (p *sluicePolicy) collect() error {
	if p.eng.QueueLen() == len(p.pending) {
		return nil
	}
	kept := p.pending[:0]
	var err error
	for _, pt := range p.pending {
		select {
		case <-pt.tk.Done():
			d := p.eng.Await(context.Background(), pt.tk)
			if e := p.decide(pt.r, d); e != nil && err == nil {
				err = e
			}
		default:
			kept = append(kept, pt)
		}
	}
	clear(p.pending[len(kept):])
	p.pending = kept
	return err
}

func (p *sluicePolicy) tick(now int64) {
	p.at(now)
	p.eng.Tick()
	// Tick answers only through tickets; an error here is a broken answer
	// (an unknown model granted), reported by the next submit or release.
	if err := p.collect(); err != nil {
		p.s.rec.fail(err)
	}
}

func (p *sluicePolicy) release(now int64, r *simReq) error {
	p.at(now)
	_, err := p.eng.Release(context.Background(), admission.Release{
		LeaseID: r.lease, PromptTokens: r.row.Prompt, OutputTokens: r.row.Output, Outcome: admission.ReleaseOK,
	})
	if err != nil {
		return err
	}
	return p.collect()
}

func (p *sluicePolicy) queued() int { return len(p.pending) }

func (p *sluicePolicy) close() { p.eng.Close() }
