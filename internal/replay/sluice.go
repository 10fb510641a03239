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
	def     *backlog            // the deferred backlog; nil without deferrable rows
}

type pendingTicket struct {
	tk *admission.Ticket
	r  *simReq
}

func newSluicePolicy(s *sim) (*sluicePolicy, error) {
	clk := clock.NewManual(epoch)
	opts := []admission.Option{admission.WithClock(clk)}
	var order *grantOrder
	if s.deferrable > 0 {
		order = newGrantOrder()
		opts = append(opts, admission.WithObserver(order))
	}
	eng, err := admission.New(s.opts.Config, s.opts.Cluster, opts...)
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
	if order != nil {
		if p.def, err = newBacklog(p, order); err != nil {
			eng.Close()
			return nil, err
		}
	}
	return p, nil
}

func (p *sluicePolicy) at(now int64) { p.clk.Set(epoch.Add(time.Duration(now))) }

func (p *sluicePolicy) submit(now int64, r *simReq) error {
	p.at(now)
	if p.def != nil && r.row.Deferrable {
		if err := p.def.submit(r); err != nil {
			return err
		}
		return p.collect()
	}
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
	if p.def != nil {
		// After the engine's Tick: interactive requests first.
		if err := p.def.tick(now); err != nil {
			p.s.rec.fail(err)
		}
	}
}

func (p *sluicePolicy) release(now int64, r *simReq) error {
	p.at(now)
	rel := admission.Release{LeaseID: r.lease, PromptTokens: r.row.Prompt, OutputTokens: r.row.Output, Outcome: admission.ReleaseOK}
	if p.s.eng.On() && !p.s.eng.OpenLoop {
		// What the router measured, for the capacity loop's calibration.
		rel.TTFT, rel.Duration = time.Duration(r.firstAt-r.admitAt), time.Duration(now-r.admitAt)
	}
	res, err := p.eng.Release(context.Background(), rel)
	if err == nil && res.Deferred && p.def != nil {
		p.def.released(r)
	}
	switch {
	case errors.Is(err, admission.ErrLeaseNotFound) && p.s.erec != nil:
		// The request waited in its engine past the lease's TTL: the
		// engine freed its charge when the lease expired.
		p.s.erec.expired++
	case err != nil:
		return err
	}
	return p.collect()
}

// observe hands the engines' signals to the capacity loop, unless the
// loop is open.
func (p *sluicePolicy) observe(now int64, signals []admission.EngineSignal) {
	if p.s.eng.OpenLoop {
		return
	}
	p.at(now)
	if err := p.eng.ObserveEngines(signals); err != nil {
		p.s.rec.fail(err)
	}
}

// firstDomain is the domain the engine would place (tenant, model) on
// first, asked of an idle engine before the replay starts: its
// rendezvous first choice.
func (p *sluicePolicy) firstDomain(tenant, model string) (string, bool) {
	ex, err := p.eng.Explain(context.Background(), admission.Request{Tenant: tenant, Model: model, PromptTokens: 1, MaxOutputTokens: 1})
	if err != nil || len(ex.Placement) == 0 {
		return "", false
	}
	return ex.Placement[0].Domain, true
}

// factors returns each domain's capacity factor.
func (p *sluicePolicy) factors() map[string]float64 {
	out := map[string]float64{}
	for _, d := range p.eng.Domains() {
		out[d.ID] = d.CapacityFactor
	}
	return out
}

func (p *sluicePolicy) queued() int { return len(p.pending) }

// wake is when the deferred backlog next needs a tick (waker).
func (p *sluicePolicy) wake() int64 {
	if p.def == nil {
		return -1
	}
	return p.def.wake()
}

func (p *sluicePolicy) close() {
	if p.def != nil {
		p.def.close()
	}
	p.eng.Close()
}
