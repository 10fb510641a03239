package deferral_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/deferral"
)

// delivery is one ticket handed to the test's worker.
type delivery struct {
	d     deferral.Delivery
	at    time.Time
	state int // live, released, forgotten (the worker died holding it)
}

const (
	live = iota
	released
	forgotten
)

// TestBacklogDeliversEachTicketOnceAndChargesOnce runs random sequences of
// deferrals, releases, workers dying with claimed work, cancellations,
// drains and time, and checks what the backlog promises: a ticket is
// delivered again only after its last lease's TTL and never once released;
// a final state never changes; in the end every ticket is final, every DONE
// ticket was released exactly once, and each tenant's spend is exactly the
// releases' cost (a lost run is never charged).
func TestBacklogDeliversEachTicketOnceAndChargesOnce(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		cfg := quotaConfig(5000)
		for name, tier := range cfg.Tiers {
			tier.Budget = admission.Budget{DailyUSD: 1e6, MonthlyUSD: 1e7}
			cfg.Tiers[name] = tier
		}
		ttl := 2 * time.Second
		cfg.Leases.TTL = admission.Duration{Duration: ttl}
		cfg.Deferral.DefaultWithin = admission.Duration{Duration: time.Minute}
		r := newRig(t, cfg, deferral.NewMemStore())
		var mu sync.Mutex
		var got []*delivery
		arrived := make(chan struct{}, 1) // a delivery reached the worker
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- r.b.Claim(ctx, deferral.ClaimOptions{MaxInFlight: 6}, func(d deferral.Delivery) error {
				mu.Lock()
				got = append(got, &delivery{d: d, at: r.clk.Now()})
				mu.Unlock()
				select {
				case arrived <- struct{}{}:
				default:
				}
				return nil
			})
		}()
		defer func() { cancel(); <-done }()
		// step runs the backlog and waits for what it handed over to reach
		// the worker.
		step := func() {
			r.e.Tick()
			r.b.Step(context.Background())
			// The worker's goroutine takes them from its channel and
			// says so; the wall-clock bound is for a worker that never
			// does, and a loaded machine does not reach it.
			timeout := time.NewTimer(10 * time.Second)
			defer timeout.Stop()
			for {
				mu.Lock()
				n := uint64(len(got))
				mu.Unlock()
				if n == r.b.Counts().Claimed.Load() {
					return
				}
				select {
				case <-arrived:
				case <-timeout.C:
					rt.Fatalf("worker holds %d deliveries, backlog handed %d", n, r.b.Counts().Claimed.Load())
				}
			}
		}
		tickets := map[string]bool{}
		var order []string
		final := map[string]deferral.State{}
		spent := map[string]int64{}
		check := func() {
			mu.Lock()
			defer mu.Unlock()
			prevOf := map[string]*delivery{}
			for _, dl := range got { // in the order delivered
				id := dl.d.Record.ID
				if prev := prevOf[id]; prev != nil {
					if prev.state == released {
						rt.Fatalf("ticket %s delivered again after its release", id)
					}
					if dl.at.Before(prev.at.Add(ttl)) {
						rt.Fatalf("ticket %s delivered again %v after the last, before the lease TTL %v", id, dl.at.Sub(prev.at), ttl)
					}
				}
				prevOf[id] = dl
			}
			for _, id := range order {
				rec, err := r.b.Get(context.Background(), id, nil)
				if err != nil {
					rt.Fatalf("Get(%s): %v", id, err)
				}
				if st, ok := final[id]; ok && rec.State != st {
					rt.Fatalf("ticket %s final %v, now %v", id, st, rec.State)
				}
				if rec.State.Final() {
					final[id] = rec.State
				}
			}
		}
		release := func(dl *delivery) {
			res, err := r.e.Release(context.Background(), admission.Release{LeaseID: dl.d.Decision.LeaseID, OutputTokens: 5, Outcome: admission.ReleaseOK})
			if err != nil {
				dl.state = forgotten // expired meanwhile: the ticket is delivered again
				return
			}
			r.b.Released(context.Background(), dl.d.Decision.LeaseID)
			dl.state = released
			spent[res.Tenant] += res.ActualCostMicros
		}
		pick := func(rt *rapid.T, label string) *delivery {
			mu.Lock()
			defer mu.Unlock()
			var open []*delivery
			for _, dl := range got {
				if dl.state == live {
					open = append(open, dl)
				}
			}
			if len(open) == 0 {
				return nil
			}
			return open[rapid.IntRange(0, len(open)-1).Draw(rt, label)]
		}
		tenants := []string{"a", "b", "c"}
		drained := false
		for range rapid.IntRange(1, 60).Draw(rt, "ops") {
			switch rapid.IntRange(0, 6).Draw(rt, "op") {
			case 0, 1:
				tenant := rapid.SampledFrom(tenants).Draw(rt, "tenant")
				a := r.admit(deferrable(tenant, rapid.Int64Range(100, 1500).Draw(rt, "prompt"), 10))
				switch a.Decision.Outcome {
				case admission.Deferred:
					if a.Ticket == "" || tickets[a.Ticket] {
						rt.Fatalf("DEFERRED with ticket %q (seen: %v)", a.Ticket, tickets[a.Ticket])
					}
					tickets[a.Ticket] = true
					order = append(order, a.Ticket)
				case admission.Admitted, admission.Degraded:
					// Ran at once: settled as a router would.
					res, err := r.e.Release(context.Background(), admission.Release{LeaseID: a.Decision.LeaseID, OutputTokens: 5, Outcome: admission.ReleaseOK})
					if err != nil {
						rt.Fatal(err)
					}
					spent[res.Tenant] += res.ActualCostMicros
				default:
					rt.Fatalf("deferrable answered %v %v", a.Decision.Outcome, a.Decision.Reason)
				}
			case 2:
				r.clk.Advance(time.Duration(rapid.Int64Range(1, 3000).Draw(rt, "ms")) * time.Millisecond)
				step()
			case 3:
				if dl := pick(rt, "release"); dl != nil {
					release(dl)
					step()
				}
			case 4:
				if dl := pick(rt, "forget"); dl != nil {
					dl.state = forgotten // its worker died: the lease runs to its TTL
				}
			case 5:
				if len(order) > 0 {
					id := rapid.SampledFrom(order).Draw(rt, "cancel")
					_, _ = r.b.Cancel(context.Background(), id, nil) // a claimed one refuses, a final one stays
				}
			case 6:
				for _, d := range []string{"d1", "d2"} {
					if drained {
						_ = r.e.Undrain(d)
					} else {
						_ = r.e.Drain(d, "test")
					}
				}
				drained = !drained
			}
			check()
		}
		// The end: domains back, the worker releases everything it holds,
		// time passes every TTL and defer_within.
		for _, d := range []string{"d1", "d2"} {
			_ = r.e.Undrain(d)
		}
		for range 200 {
			for dl := pick(rt, "end"); dl != nil; dl = pick(rt, "end") {
				release(dl)
			}
			r.clk.Advance(time.Second)
			step()
			check()
			if len(final) == len(order) {
				break
			}
		}
		if len(final) != len(order) {
			rt.Fatalf("%d of %d tickets final at the end", len(final), len(order))
		}
		mu.Lock()
		releases := map[string]int{}
		for _, dl := range got {
			if dl.state == released {
				releases[dl.d.Record.ID]++
			}
		}
		mu.Unlock()
		for id, st := range final {
			if n := releases[id]; (st == deferral.StateDone) != (n == 1) || n > 1 {
				rt.Fatalf("ticket %s %v after %d releases", id, st, n)
			}
		}
		for _, tenant := range tenants {
			info, _ := r.e.Tenant(tenant)
			if info.SpentTodayMicros != spent[tenant] {
				rt.Fatalf("tenant %s spent %d µUSD, its releases cost %d: %s", tenant, info.SpentTodayMicros, spent[tenant], fmt.Sprint(releases))
			}
		}
	})
}
