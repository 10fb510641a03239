package drill

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-sched/sluice/admission/client"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/load"
)

// burstRun is what deferred-burst's worker pool and its end-of-drill
// reading of the tickets saw.
type burstRun struct {
	mu sync.Mutex
	// claims is every ClaimedWork in the order it arrived; done is when
	// each ticket's Release answered OK; relErr counts failed Releases by
	// code, streamErr failed Claim streams.
	claims    []claimed
	done      map[string]time.Duration
	relErr    map[string]int64
	streamErr map[string]int64
	running   sync.WaitGroup // the workers and their runs
	// tickets is each ticket's state at the drill's end, by GetTicket;
	// ticketErr says why one could not be read.
	tickets   map[string]admissionv1.TicketState
	ticketErr map[string]string
	// drained is when the last ticket was done (-1: not within
	// DrainWithin of the burst's end).
	drained time.Duration
}

// claimed is one ClaimedWork: when it came, on which replica's stream,
// whose ticket and its weighted tokens.
type claimed struct {
	at              time.Duration
	replica, tenant string
	ticket          string
	weight          int64
}

// deferredBurst drives the bursting tenants beside the steady mix: their
// own steady interactive load (BurstRate) before, BurstFactor times it for
// BurstFor (the fault), every other request of it deferrable, then steady
// again until every ticket is done (at most DrainWithin) and After has
// passed. A worker pool holds Workers Claim streams on every replica,
// runs each ticket it is handed for WorkerRun and releases it.
func (r *run) deferredBurst(ctx context.Context) error {
	switch {
	case len(r.o.BurstTenants) == 0:
		return errors.New("deferred-burst: no bursting tenants (--burst-tenants)")
	case !(r.o.BurstRate > 0) || !(r.o.BurstFactor >= 1) || r.o.BurstFor <= 0:
		return fmt.Errorf("deferred-burst: --burst-rate %g, --burst-factor %g, burst %v: want a positive rate, a factor of at least 1 and a positive length",
			r.o.BurstRate, r.o.BurstFactor, r.o.BurstFor)
	case r.o.Workers < 1 || r.o.WorkerInFlight < 1 || r.o.WorkerRun < 0:
		return fmt.Errorf("deferred-burst: --workers %d, --worker-in-flight %d, --worker-run %v: want at least one stream of at least one ticket",
			r.o.Workers, r.o.WorkerInFlight, r.o.WorkerRun)
	}
	names := make([]string, len(r.o.BurstTenants))
	for i, m := range r.o.BurstTenants {
		names[i] = fmt.Sprintf("%s (weight %d)", m.Tenant, r.pols[m.Tenant].weight)
	}
	r.rep.Target = strings.Join(names, ", ")
	// The fault is the burst: the report's asked span is its length.
	r.o.During = r.o.BurstFor
	b := &burstRun{done: map[string]time.Duration{}, relErr: map[string]int64{}, streamErr: map[string]int64{}, drained: -1}
	r.burst = b

	base := startSegment(ctx, r.rec, r.loadOptions())
	defer base.stop(r.drainWait())
	wctx, stopWorkers := context.WithCancel(ctx)
	defer func() { stopWorkers(); b.running.Wait() }()
	streams := r.startWorkers(wctx, b)
	r.note("load: %.0f Admits/s (Poisson) over %s; bursting tenants %.0f Admits/s over %s; workers: %d Claim streams (%d per replica, %d in flight each, %v a run)",
		r.o.Rate, mixString(r.o.Tenants), r.o.BurstRate, mixString(r.o.BurstTenants), streams, r.o.Workers, r.o.WorkerInFlight, r.o.WorkerRun)
	calm := startSegment(ctx, r.rec, r.burstOptions(1, 1))
	if err := r.sleepUntil(ctx, r.o.Before); err != nil {
		calm.stop(r.drainWait())
		return err
	}
	// Each segment is halted before the next one's time is taken, so that
	// the bursting tenants' requests sent from the fault to the burst's
	// end are the burst's.
	calm.halt()
	r.fault = r.now()
	r.held = r.fault // a burst takes effect as it starts
	burst := startDeferring(ctx, r.rec, r.burstOptions(r.o.BurstFactor, 2), 2)
	calm.stop(r.drainWait())
	r.note("burst: %.0f Admits/s (%.0f× for %v), every other one deferrable", r.o.BurstFactor*r.o.BurstRate, r.o.BurstFactor, r.o.BurstFor)
	if err := r.sleepUntil(ctx, r.held+r.o.BurstFor); err != nil {
		burst.stop(r.drainWait())
		return err
	}
	burst.halt()
	r.mend = r.now()
	r.begun = r.mend
	calm = startSegment(ctx, r.rec, r.burstOptions(1, 3))
	defer calm.stop(r.drainWait())
	r.note("burst ends; the bursting tenants back to %.0f Admits/s", r.o.BurstRate)
	burst.stop(r.drainWait()) // every DEFERRED answer is in: the tickets are known
	issued := r.tickets()
	r.note("the burst's answers are in: %d tickets issued, %d done so far", len(issued), b.doneOf(issued))
	_ = waitFor(ctx, r.o.DrainWithin, func() bool { return b.doneOf(issued) == len(issued) })
	if b.doneOf(issued) == len(issued) {
		b.drained = b.lastDone(issued)
		r.note("every ticket done (the last at %.2fs)", secs(b.drained))
	} else {
		r.note("%d of %d tickets not done %v after the burst's end", len(issued)-b.doneOf(issued), len(issued), r.o.DrainWithin)
	}
	if err := r.sleepUntil(ctx, r.begun+r.o.After); err != nil {
		return err
	}
	r.ended = r.now()
	r.note("load stops; reading every ticket")
	r.readTickets(ctx, b, issued)
	r.noteBacklog(ctx)
	return nil
}

// burstOptions is the bursting tenants' load at mult times BurstRate.
func (r *run) burstOptions(mult float64, seed uint64) load.Options {
	o := r.loadOptions()
	o.Mode, o.Arrivals = load.ModeOpen, nil // the burst is Poisson, trace or not
	o.Tenants = r.o.BurstTenants
	o.Rate = mult * r.o.BurstRate
	o.Seed = r.o.Seed + seed
	return o
}

// tickets are the tickets of the recorded DEFERRED answers, by id, with
// the tenant each is of.
func (r *run) tickets() map[string]string {
	answers, _ := r.rec.snapshot()
	out := map[string]string{}
	for _, a := range answers {
		if a.ticket != "" {
			out[a.ticket] = a.tenant
		}
	}
	return out
}

func (b *burstRun) doneOf(tickets map[string]string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for id := range tickets {
		if _, ok := b.done[id]; ok {
			n++
		}
	}
	return n
}

func (b *burstRun) lastDone(tickets map[string]string) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	var last time.Duration
	for id := range tickets {
		last = max(last, b.done[id])
	}
	return last
}

// startWorkers opens Workers Claim streams on every replica and returns
// how many; each runs until ctx ends, opening its stream again when it
// breaks.
func (r *run) startWorkers(ctx context.Context, b *burstRun) int {
	n := 0
	for _, m := range r.f.members() {
		for range r.o.Workers {
			n++
			b.running.Go(func() { r.work(ctx, b, m.ID, m.Addr) })
		}
	}
	return n
}

// work is one worker: a Claim stream on the replica at addr, each
// ClaimedWork run for WorkerRun and released there.
func (r *run) work(ctx context.Context, b *burstRun, replica, addr string) {
	for ctx.Err() == nil {
		adm, err := r.f.admission(addr)
		if err == nil {
			var stream admissionv1.Admission_ClaimClient
			if stream, err = adm.Claim(ctx, &admissionv1.ClaimRequest{MaxInFlight: int32(r.o.WorkerInFlight)}); err == nil {
				for {
					w, rerr := stream.Recv()
					if rerr != nil {
						err = rerr
						break
					}
					b.claim(r, replica, w)
					b.running.Go(func() { r.runClaimed(ctx, b, adm, w) })
				}
			}
		}
		if ctx.Err() != nil {
			return
		}
		b.mu.Lock()
		b.streamErr[status.Code(err).String()]++
		b.mu.Unlock()
		_ = clock.Sleep(ctx, 200*time.Millisecond)
	}
}

// claim records one ClaimedWork.
func (b *burstRun) claim(r *run, replica string, w *admissionv1.ClaimedWork) {
	req := w.GetTicket().GetRequest()
	c := claimed{at: r.now(), replica: replica, tenant: req.GetTenant(), ticket: w.GetTicket().GetTicketId(),
		weight: req.GetPromptTokens() + r.o.OutputWeight*req.GetMaxOutputTokens()}
	b.mu.Lock()
	b.claims = append(b.claims, c)
	b.mu.Unlock()
}

// runClaimed "runs" the claimed work for WorkerRun and releases its lease.
// The Release has a context of its own: a drill that ends meanwhile still
// settles the lease rather than leave it to its TTL.
func (r *run) runClaimed(ctx context.Context, b *burstRun, adm admissionv1.AdmissionClient, w *admissionv1.ClaimedWork) {
	_ = clock.Sleep(ctx, r.o.WorkerRun)
	req := w.GetTicket().GetRequest()
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := adm.Release(rctx, &admissionv1.ReleaseRequest{LeaseId: w.GetAdmission().GetLeaseId(),
		PromptTokens: req.GetPromptTokens(), OutputTokens: req.GetMaxOutputTokens(), Outcome: admissionv1.Outcome_OUTCOME_OK})
	at := r.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.relErr[status.Code(err).String()]++
		return
	}
	if _, ok := b.done[w.GetTicket().GetTicketId()]; !ok {
		b.done[w.GetTicket().GetTicketId()] = at
	}
}

// readTickets asks each ticket's state (GetTicket on its tenant's
// replica, else on the others), eight at a time.
func (r *run) readTickets(ctx context.Context, b *burstRun, tickets map[string]string) {
	b.tickets, b.ticketErr = map[string]admissionv1.TicketState{}, map[string]string{}
	ids := sortedKeys(tickets)
	var wg sync.WaitGroup
	next := make(chan string)
	for range 8 {
		wg.Go(func() {
			for id := range next {
				st, err := r.ticketState(ctx, id, tickets[id])
				b.mu.Lock()
				if err != nil {
					b.ticketErr[id] = err.Error()
				} else {
					b.tickets[id] = st
				}
				b.mu.Unlock()
			}
		})
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	wg.Wait()
}

// ticketState is GetTicket's state of the ticket.
func (r *run) ticketState(ctx context.Context, id, tenant string) (admissionv1.TicketState, error) {
	members := r.f.members()
	if m, ok := r.f.Router.Route(tenant); ok {
		i := slices.IndexFunc(members, func(x client.Member) bool { return x.ID == m.ID })
		if i > 0 {
			members[0], members[i] = members[i], members[0]
		}
	}
	var err error
	for _, m := range members {
		var adm admissionv1.AdmissionClient
		if adm, err = r.f.admission(m.Addr); err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		t, gerr := adm.GetTicket(cctx, &admissionv1.GetTicketRequest{TicketId: id})
		cancel()
		if gerr == nil {
			return t.GetState(), nil
		}
		if err = gerr; status.Code(gerr) != codes.NotFound {
			break
		}
	}
	return 0, fmt.Errorf("GetTicket %s: %w", id, err)
}

// noteBacklog notes what every replica's ListBacklog holds at the end.
func (r *run) noteBacklog(ctx context.Context) {
	var parts []string
	for _, m := range r.f.members() {
		op, err := r.f.operator(m.Addr)
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := op.ListBacklog(cctx, &admissionv1.ListBacklogRequest{})
		cancel()
		if err != nil {
			parts = append(parts, fmt.Sprintf("%s: %v", m.ID, status.Code(err)))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %d pending, %d claimed", m.ID, resp.GetPending(), resp.GetClaimed()))
	}
	r.note("ListBacklog: %s", strings.Join(parts, "; "))
}
