package load

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// MaxChurnRate bounds Churn's changes per second: past it the churn's own
// calls would be a load of their own.
const MaxChurnRate = 1000

// churnReason is the drain reason Churn's drains carry, so that an
// operator reading ListDomains knows whose they are.
const churnReason = "sluicectl load --churn"

// healthTries is how many Admits a health change makes to find a domain
// whose weight it has not cut yet, before it counts a miss.
const healthTries = 16

// changeTimeout bounds the calls of one change.
const changeTimeout = 5 * time.Second

// Churn changes placement on one server while a load runs, as a fleet
// does: at Rate changes per second, in turn, it drains a random domain,
// cuts a domain's health weight, and undrains the domain it drained
// longest ago, all through the server's public API. A drain and an undrain
// are the Operator API's DrainDomain and UndrainDomain. A health cut is an
// Admit of a tenant drawn from the load's mix and its Release with
// OUTCOME_ERROR, which counts against the domain the Admit was placed on
// (the API has no call that sets a weight): with the config `sluicectl
// fleet generate` writes (health.min_samples 1, error_rate 1e-6, cooldown
// 1h) that one failure cuts the domain's weight and nothing restores it
// during the run; under other health settings it is one failed outcome of
// the many the cut needs. A health change looks for a domain it has not
// cut yet (up to 16 Admits, each released OK when its domain was cut
// before) and counts a miss when it finds none.
//
// At the end of each run Churn undrains what it drained, and reads the
// server's domains: how many are draining and how many have a health
// weight below 1.
type Churn struct {
	rate   float64
	op     admissionv1.OperatorClient
	target Target
	seed   uint64

	mu      sync.Mutex // one run at a time
	domains []string   // the domains that were not draining when NewChurn listed them
	cut     map[string]bool
	runs    uint64
}

// ChurnResult is what a Churn did over a run (or rounds of runs).
type ChurnResult struct {
	// Rate is the changes per second asked for; Seconds how long it ran.
	Rate    float64 `json:"rate"`
	Seconds float64 `json:"seconds"`
	// Drains, Undrains and HealthCuts are the changes made; HealthMisses
	// the health changes that found no domain they had not cut yet.
	Drains       int64 `json:"drains"`
	Undrains     int64 `json:"undrains"`
	HealthCuts   int64 `json:"healthCuts"`
	HealthMisses int64 `json:"healthMisses,omitempty"`
	// ChangesPerSec is the changes made per second (drains, undrains and
	// health cuts).
	ChangesPerSec float64 `json:"changesPerSec"`
	// Errors are the churn's failed calls by gRPC code; FirstError the
	// first one's message.
	Errors     map[string]int64 `json:"errors,omitempty"`
	FirstError string           `json:"firstError,omitempty"`
	// Draining and WeightCut are the server's domains draining and with a
	// health weight below 1 after the (last) run, from ListDomains; -1
	// when it did not answer.
	Draining  int `json:"draining"`
	WeightCut int `json:"weightCut"`
	// Domains is how many domains it chose from.
	Domains int `json:"domains"`
}

// NewChurn returns a Churn of rate changes per second on the server behind
// cc, whose Admits and Releases go to target. It lists the server's
// domains: those not draining then are the ones it drains. Each run draws
// its domains and tenants with a generator seeded by seed.
func NewChurn(ctx context.Context, cc grpc.ClientConnInterface, target Target, rate float64, seed uint64) (*Churn, error) {
	if !(rate > 0 && rate <= MaxChurnRate) {
		return nil, fmt.Errorf("--churn-rate %g: want more than 0 and at most %d changes per second", rate, MaxChurnRate)
	}
	c := &Churn{rate: rate, op: admissionv1.NewOperatorClient(cc), target: target, seed: seed, cut: map[string]bool{}}
	resp, err := c.op.ListDomains(ctx, &admissionv1.ListDomainsRequest{})
	if err != nil {
		return nil, fmt.Errorf("churn: ListDomains: %w", err)
	}
	for _, d := range resp.GetDomains() {
		if !d.GetDraining() {
			c.domains = append(c.domains, d.GetId())
		}
	}
	if len(c.domains) < 2 {
		return nil, fmt.Errorf("churn: %d domains not draining; want at least 2, so that one is left to place on", len(c.domains))
	}
	return c, nil
}

// start runs the churn in the background until the returned stop, which
// ends it, undrains what it drained and returns what it did.
func (c *Churn) start(ctx context.Context, opts *Options) (stop func() *ChurnResult) {
	c.mu.Lock()
	c.runs++
	run := &churnRun{Churn: c, opts: opts, pick: newPicker(&Options{Tenants: opts.Tenants, Prompt: opts.Prompt, Output: opts.Output}),
		rng: rand.New(rand.NewPCG(c.seed, c.runs<<32)), res: &ChurnResult{Rate: c.rate, Domains: len(c.domains)},
		errs: map[string]int64{}}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	t0 := time.Now()
	go func() {
		defer close(done)
		run.loop(cctx)
	}()
	return func() *ChurnResult {
		cancel()
		<-done
		defer c.mu.Unlock()
		res := run.res
		res.Seconds = time.Since(t0).Seconds()
		// Undrain and look, even when ctx is done: the run must not leave
		// its drains behind.
		end, endCancel := context.WithTimeout(context.WithoutCancel(ctx), 2*changeTimeout)
		defer endCancel()
		for len(run.drained) > 0 {
			run.undrain(end)
		}
		if res.Seconds > 0 {
			res.ChangesPerSec = float64(res.Drains+res.Undrains+res.HealthCuts) / res.Seconds
		}
		res.Draining, res.WeightCut = -1, -1
		if resp, err := c.op.ListDomains(end, &admissionv1.ListDomainsRequest{}); err != nil {
			run.fail(err)
		} else {
			res.Draining, res.WeightCut = 0, 0
			for _, d := range resp.GetDomains() {
				if d.GetDraining() {
					res.Draining++
				}
				if d.GetHealthWeight() < 1 {
					res.WeightCut++
				}
			}
		}
		if len(run.errs) > 0 {
			res.Errors = run.errs
		}
		return res
	}
}

// churnRun is one run's churn state, used by its goroutine alone (and by
// stop once it has ended).
type churnRun struct {
	*Churn
	opts    *Options
	pick    *picker
	rng     *rand.Rand
	res     *ChurnResult
	errs    map[string]int64
	drained []string // by this run, oldest first
}

// loop makes one change per tick: drain, health cut, undrain, in turn.
func (r *churnRun) loop(ctx context.Context) {
	tick := time.NewTicker(time.Duration(float64(time.Second) / r.rate))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// A change, once begun, is finished even when the run ends
		// meanwhile: a drain cut short might be made on the server and not
		// known here, and an Admit's lease left unreleased.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), changeTimeout)
		switch i % 3 {
		case 0:
			r.drain(cctx)
		case 1:
			r.healthCut(cctx)
		default:
			r.undrain(cctx)
		}
		cancel()
	}
}

// drain drains a random domain this run has not drained, keeping at least
// one domain eligible.
func (r *churnRun) drain(ctx context.Context) {
	if len(r.drained) >= len(r.domains)-1 {
		r.undrain(ctx)
		return
	}
	var id string
	for {
		id = r.domains[r.rng.IntN(len(r.domains))]
		if !r.isDrained(id) {
			break
		}
	}
	if _, err := r.op.DrainDomain(ctx, &admissionv1.DrainDomainRequest{Domain: id, Reason: churnReason}); err != nil {
		r.fail(err)
		return
	}
	r.drained = append(r.drained, id)
	r.res.Drains++
}

func (r *churnRun) isDrained(id string) bool {
	for _, d := range r.drained {
		if d == id {
			return true
		}
	}
	return false
}

// undrain undrains the domain this run drained longest ago, if any.
func (r *churnRun) undrain(ctx context.Context) {
	if len(r.drained) == 0 {
		return
	}
	id := r.drained[0]
	r.drained = r.drained[1:]
	if _, err := r.op.UndrainDomain(ctx, &admissionv1.UndrainDomainRequest{Domain: id}); err != nil {
		r.fail(err)
		return
	}
	r.res.Undrains++
}

// healthCut reports a failed outcome on a domain whose weight the churn
// has not cut yet: an Admit of a tenant of the mix, and its Release with
// OUTCOME_ERROR.
func (r *churnRun) healthCut(ctx context.Context) {
	for range healthTries {
		a := r.pick.pick(r.rng)
		resp, err := r.target.Admit(ctx, &admissionv1.AdmitRequest{Tenant: a.Tenant, Model: a.Model, PromptTokens: a.Prompt,
			MaxOutputTokens: a.Output, Priority: admissionv1.Priority_PRIORITY_NORMAL, AcceptDowngrade: r.opts.AcceptDowngrade})
		if err != nil {
			r.fail(err)
			return
		}
		lease := resp.GetLeaseId()
		if lease == "" {
			continue // refused: no domain to report on
		}
		outcome := admissionv1.Outcome_OUTCOME_ERROR
		again := r.cut[resp.GetDomain()]
		if again {
			outcome = admissionv1.Outcome_OUTCOME_OK
		}
		if _, err := r.target.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: lease, PromptTokens: a.Prompt,
			OutputTokens: a.Output, Outcome: outcome}); err != nil {
			r.fail(err)
			return
		}
		if !again {
			r.cut[resp.GetDomain()] = true
			r.res.HealthCuts++
			return
		}
	}
	r.res.HealthMisses++
}

// fail counts a failed call.
func (r *churnRun) fail(err error) {
	r.errs[errCodeName(status.Code(err))]++
	if r.res.FirstError == "" {
		r.res.FirstError = err.Error()
	}
}

// merge sums two runs' results (either may be nil); the server's view is
// the later run's.
func (a *ChurnResult) merge(b *ChurnResult) *ChurnResult {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	out := *a
	out.Seconds += b.Seconds
	out.Drains += b.Drains
	out.Undrains += b.Undrains
	out.HealthCuts += b.HealthCuts
	out.HealthMisses += b.HealthMisses
	if out.Seconds > 0 {
		out.ChangesPerSec = float64(out.Drains+out.Undrains+out.HealthCuts) / out.Seconds
	}
	if len(a.Errors)+len(b.Errors) > 0 {
		out.Errors = map[string]int64{}
		for _, m := range []map[string]int64{a.Errors, b.Errors} {
			for k, n := range m {
				out.Errors[k] += n
			}
		}
	}
	if out.FirstError == "" {
		out.FirstError = b.FirstError
	}
	out.Draining, out.WeightCut = b.Draining, b.WeightCut
	return &out
}
