package drill

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/load"
)

// creditExhaustion drives CreditTenant past its burst credit beside the
// steady load of the others: calm before (CreditCalm × its rate), overload
// (CreditOverload × its rate) until its breaker opens and a while after,
// then calm again while the breaker half-opens and closes.
func (r *run) creditExhaustion(ctx context.Context) error {
	t := r.o.CreditTenant
	r.rep.Target = t
	pol := r.pols[t]
	if pol.credit <= 0 || pol.rate <= 0 {
		return fmt.Errorf("tenant %s lends no burst credit now (rate %d, credit %d): its tier has none, or its breaker is not closed", t, pol.rate, pol.credit)
	}
	model := "small"
	if len(r.o.Tenants) > 0 {
		model = r.o.Tenants[0].Model
	}
	per := float64(r.o.Prompt + r.o.OutputWeight*r.o.Output)
	spike := func(mult float64, seed uint64) load.Options {
		o := r.loadOptions()
		o.Mode, o.Arrivals = load.ModeOpen, nil // the credit tenant's own load is Poisson at a multiple of its rate, trace or not
		o.Tenants = []load.Mix{{Tenant: t, Model: model, Share: 1}}
		o.Rate = mult * float64(pol.rate) / per
		o.Seed = r.o.Seed + seed
		return o
	}
	base := startSegment(ctx, r.rec, r.loadOptions())
	defer base.stop(r.drainWait())
	states := r.watchBreaker(ctx, t)
	defer states()
	r.note("load: %.0f Admits/s over %s; %s at %.1f Admits/s (%.1f× its %d tokens/s)", r.o.Rate, mixString(r.o.Tenants), t,
		r.o.CreditCalm*float64(pol.rate)/per, r.o.CreditCalm, pol.rate)
	calm := startSegment(ctx, r.rec, spike(r.o.CreditCalm, 1))
	if err := r.sleepUntil(ctx, r.o.Before); err != nil {
		calm.stop(r.drainWait())
		return err
	}
	calm.stop(r.drainWait())
	r.fault = r.now()
	r.held = r.fault // an overload takes effect as it starts
	over := startSegment(ctx, r.rec, spike(r.o.CreditOverload, 2))
	r.note("%s overloads: %.1f Admits/s (%.1f× its rate; burst %d, credit %d tokens)", t, r.o.CreditOverload*float64(pol.rate)/per,
		r.o.CreditOverload, pol.burst, pol.credit)
	// Burst and credit drain at (overload − 1) × rate; the window follows.
	drain := time.Duration(float64(pol.burst+pol.credit) / ((r.o.CreditOverload - 1) * float64(pol.rate)) * float64(time.Second))
	limit := drain + 30*time.Second
	var opened time.Duration = -1
	_ = waitFor(ctx, limit, func() bool {
		if a, ok := r.firstBCE(t); ok {
			opened = a.answered
			return true
		}
		return false
	})
	if opened < 0 {
		over.stop(r.drainWait())
		r.begun, r.ended = r.now(), r.now()
		r.note("%s: no BURST_CREDIT_EXHAUSTED within %v of overload", t, limit.Round(time.Second))
		return nil
	}
	r.note("%s: first BURST_CREDIT_EXHAUSTED (breaker open)", t)
	// Keep overloading through part of the open period, so that the
	// breaker's answers are seen under load, then calm down for the rest.
	if err := r.sleepUntil(ctx, max(opened+r.o.BreakerOpen/3, r.fault+r.o.During)); err != nil {
		over.stop(r.drainWait())
		return err
	}
	over.stop(r.drainWait())
	calm = startSegment(ctx, r.rec, spike(r.o.CreditCalm, 3))
	r.begun = r.now()
	r.note("%s calms down to %.1f× its rate", t, r.o.CreditCalm)
	if err := r.sleepUntil(ctx, max(opened+r.o.BreakerOpen, r.begun)+r.o.After); err != nil {
		calm.stop(r.drainWait())
		return err
	}
	r.ended = r.now()
	calm.stop(r.drainWait())
	r.note("load stops")
	r.judgeCredit(ctx, t, opened)
	return nil
}

// firstBCE returns the tenant's first BURST_CREDIT_EXHAUSTED answer.
func (r *run) firstBCE(t string) (answer, bool) {
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	for _, a := range r.rec.answers {
		if a.tenant == t && a.reason == "BURST_CREDIT_EXHAUSTED" {
			return a, true
		}
	}
	return answer{}, false
}

// breakerState is GetTenant's view of the breaker: open, half-open (not
// open, but lending nothing) or closed (lending credit again; in batched
// mode a replica may lend only its share of the tenant's credit).
func breakerState(ti *admissionv1.TenantInfo) string {
	switch {
	case ti.GetBreakerOpen():
		return "open"
	case ti.GetCredit() == 0:
		return "half-open"
	}
	return "closed"
}

// watchBreaker polls the tenant's replica every 50 ms and notes each
// change of its breaker's state; the returned func stops it.
func (r *run) watchBreaker(ctx context.Context, t string) func() {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := "closed"
		for ctx.Err() == nil {
			if ti, err := r.tenantInfo(ctx, t); err == nil {
				if s := breakerState(ti); s != last {
					until := ""
					if ti.GetBreakerUntil() != nil {
						until = fmt.Sprintf(" until %s", ti.GetBreakerUntil().AsTime().Format("15:04:05.000"))
					}
					r.note("GetTenant %s: breaker %s → %s%s", t, last, s, until)
					last = s
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() { cancel(); <-done }
}

// tenantInfo asks the tenant's replica for it.
func (r *run) tenantInfo(ctx context.Context, t string) (*admissionv1.TenantInfo, error) {
	m, ok := r.f.Router.Route(t)
	if !ok {
		return nil, fmt.Errorf("no replica is registered")
	}
	op, err := r.f.operator(m.Addr)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := op.GetTenant(cctx, &admissionv1.GetTenantRequest{Name: t})
	if err != nil {
		return nil, fmt.Errorf("tenant %s on replica %s: %w", t, m.ID, err)
	}
	return resp.GetTenant(), nil
}

// judgeCredit adds credit-exhaustion's promises: the breaker opened, every
// BURST_CREDIT_EXHAUSTED's Retry-After points at the end of the open
// period, the refusals stop there (half-open), the tenant is admitted
// again, no other tenant was refused for credit or lost its rate, and its
// breaker is closed (lending again) at the end.
func (r *run) judgeCredit(ctx context.Context, t string, opened time.Duration) {
	r.judgeCreditAnswers(t, opened)
	if r.firstBCEOf(t) {
		ti, err := r.tenantInfo(ctx, t)
		if err != nil {
			r.rep.Promises = append(r.rep.Promises, Promise{Name: "closes", Held: false, Detail: err.Error()})
			return
		}
		r.rep.Promises = append(r.rep.Promises, Promise{Name: "closes", Held: breakerState(ti) == "closed",
			Detail: fmt.Sprintf("GetTenant at the end: breaker %s, credit %d", breakerState(ti), ti.GetCredit())})
	}
}

// judgeCreditAnswers judges what the recorded answers show.
func (r *run) judgeCreditAnswers(t string, opened time.Duration) {
	add := func(name string, held bool, format string, args ...any) {
		r.rep.Promises = append(r.rep.Promises, Promise{Name: name, Held: held, Detail: fmt.Sprintf(format, args...)})
	}
	answers, _ := r.rec.snapshot()
	var bce []answer
	for _, a := range answers {
		if a.tenant == t && a.reason == "BURST_CREDIT_EXHAUSTED" {
			bce = append(bce, a)
		}
	}
	slices.SortFunc(bce, func(a, b answer) int { return int(a.answered - b.answered) })
	add("breaker opens", len(bce) > 0, "%s refused BURST_CREDIT_EXHAUSTED %d times, first %.2fs after the overload began", t, len(bce), secs(opened-r.fault))
	if len(bce) == 0 {
		return
	}
	// Every answer of the opening should point at the same instant: the
	// first refusal's time plus breaker_open (each answer's own time plus
	// its retry_after).
	closeAt := bce[0].answered + r.o.BreakerOpen
	worst := time.Duration(0)
	for _, a := range bce {
		worst = max(worst, absDur(a.answered+a.retryAfter-closeAt))
	}
	add("Retry-After is the breaker's", worst <= r.o.RetryAfterTolerance,
		"answer time + retry_after within %v of first refusal + breaker_open (%v) for all %d (tolerance %v)", worst.Round(time.Millisecond), r.o.BreakerOpen, len(bce), r.o.RetryAfterTolerance)
	var lateBCE, admittedAfter int64
	for _, a := range answers {
		if a.tenant != t || a.sent <= closeAt+r.o.RetryAfterTolerance {
			continue
		}
		if a.reason == "BURST_CREDIT_EXHAUSTED" {
			lateBCE++
		}
		if a.admitted() {
			admittedAfter++
		}
	}
	add("half-opens on time", lateBCE == 0 && admittedAfter > 0, "after the open period: %d BURST_CREDIT_EXHAUSTED, %d admitted", lateBCE, admittedAfter)
	// Others untouched: each keeps the share of its requests admitted (a
	// ratio of answers, not a rate: Poisson arrivals over phases of a few
	// seconds make rates too noisy to compare).
	var otherBCE int64
	worstShare := math.Inf(1)
	worstTenant := ""
	for _, m := range r.o.Tenants {
		if m.Tenant == r.o.QuotaTenant {
			continue // held to its quota by "quota kept" instead
		}
		var sentB, admB, sentD, admD float64
		for _, a := range answers {
			if a.tenant != m.Tenant {
				continue
			}
			if a.reason == "BURST_CREDIT_EXHAUSTED" {
				otherBCE++
			}
			switch {
			case a.sent < r.fault:
				sentB++
				if a.admitted() {
					admB++
				}
			case a.sent < r.begun:
				sentD++
				if a.admitted() {
					admD++
				}
			}
		}
		if sentB == 0 || sentD == 0 || admB == 0 {
			continue
		}
		if ratio := (admD / sentD) / (admB / sentB); ratio < worstShare {
			worstShare, worstTenant = ratio, m.Tenant
		}
	}
	add("others untouched", otherBCE == 0 && worstShare >= r.o.RecoverFraction,
		"%d BURST_CREDIT_EXHAUSTED for others; lowest share admitted during / before, the quota tenant aside: %.2f (%s; bound %.2f)", otherBCE, worstShare, worstTenant, r.o.RecoverFraction)
}

// firstBCEOf reports whether the tenant was refused for its credit at all.
func (r *run) firstBCEOf(t string) bool {
	_, ok := r.firstBCE(t)
	return ok
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
