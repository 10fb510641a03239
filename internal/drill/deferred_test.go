package drill

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/rendezvous"
	"github.com/sluice-sched/sluice/internal/testdep"
)

// The self-contained fleet's bursting tenants both route to replica-1
// whatever the replica count, as its config says: one replica's backlog
// holds both, so that its fair order can be compared with their weights.
func TestBurstTenantsShareAReplica(t *testing.T) {
	cfg, err := FleetPolicy()
	if err != nil {
		t.Fatal(err)
	}
	weights := map[int64]bool{}
	for _, m := range Defaults().BurstTenants {
		p, ok := cfg.Policy(m.Tenant)
		if !ok {
			t.Fatalf("bursting tenant %s is not in the fleet's config", m.Tenant)
		}
		weights[p.Weight] = true
		for n := 1; n <= 8; n++ {
			var nodes []rendezvous.Node
			for i := 1; i <= n; i++ {
				nodes = append(nodes, rendezvous.Node{ID: "replica-" + strconv.Itoa(i), Weight: 1})
			}
			if got := nodes[rendezvous.Order(rendezvous.Hash(m.Tenant), nodes, nil)[0]].ID; got != "replica-1" {
				t.Errorf("%s routes to %s of %d replicas, want replica-1", m.Tenant, got, n)
			}
		}
	}
	if len(weights) < 2 {
		t.Errorf("bursting tenants' weights %v: want two different ones, so that the fair order is seen", weights)
	}
}

// deferred-burst on a short self-contained run (real redis-server, etcd,
// agents and two sluiced): every promise holds; every deferrable request
// of the burst is admitted or deferred and every ticket is done, while
// the interactive half of the same burst is refused in part (the burst is
// real); the backlog drains, and it was claimed in its tenants' weights
// for at least one whole second.
func TestDeferredBurstSelfContained(t *testing.T) {
	if testing.Short() {
		testdep.Missing(t, "-short: this test starts a fleet of child processes")
	}
	testdep.Binary(t, "apt-get install -y redis-server", "redis-server")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log strings.Builder
	f, err := StartLocal(ctx, LocalOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	o := Defaults()
	if o.Config, err = FleetPolicy(); err != nil {
		t.Fatal(err)
	}
	o.Before, o.BurstFor, o.After = 2*time.Second, 4*time.Second, 2*time.Second
	o.Log = &log
	rep, err := Run(ctx, f, DeferredBurst, "", o)
	if err != nil {
		t.Fatalf("deferred-burst: %v\n%s", err, log.String())
	}
	var out strings.Builder
	_ = rep.WriteTable(&out)
	t.Logf("\n%s", out.String())
	for _, p := range rep.Promises {
		if !p.Held {
			t.Errorf("%s broke: %s", p.Name, p.Detail)
		}
	}
	d := rep.Deferred
	if d == nil {
		t.Fatal("no deferred report")
	}
	if d.Tickets == 0 || d.Done != d.Tickets || d.DeferrableLossPct != 0 {
		t.Errorf("%d tickets, %d done, deferrable burst loss %.1f%%: want tickets, all done, none lost", d.Tickets, d.Done, d.DeferrableLossPct)
	}
	if d.DrainS == nil || len(d.Fair) == 0 || d.WorstExcessPct > 100*o.ShareTolerance {
		t.Errorf("drained after %v s, %d seconds of fair order, worst gap beyond a claim %.1f points", d.DrainS, len(d.Fair), d.WorstExcessPct)
	}
	for _, bt := range d.Tenants {
		if bt.Replica != "replica-1" || bt.Deferred == 0 {
			t.Errorf("%s: %d deferred, claimed on %q; want some, on replica-1", bt.Tenant, bt.Deferred, bt.Replica)
		}
	}
	if during := rep.Phases[1]; during.Deferred == 0 {
		t.Errorf("the during phase counts no DEFERRED answer: %+v", during)
	}
}

// scriptedBurst is a deferred-burst over answers and claims written by
// hand: the burst from 1 s to 3 s, the drill's end at 8 s; corpus (weight
// 3) and labels (weight 1) each send 20 deferrable requests in the burst,
// all deferred, and 20 interactive ones, of which labels' are refused; the
// workers on replica-1 then claim 3 of corpus's for each of labels's, 8 a
// second, all released OK.
func scriptedBurst() *run {
	o := Defaults()
	o.Tenants = o.Tenants[:1] // gold
	r := &run{o: o, rep: &Report{Drill: DeferredBurst}, rec: newRecorder(time.Now(), nil, 4),
		fault: time.Second, begun: 3 * time.Second, ended: 8 * time.Second,
		pols: map[string]policy{"gold": {floor: 700, rate: 100000, burst: 100000, weight: 8},
			"corpus": {rate: 200000, weight: 3}, "labels": {rate: 200000, weight: 1}},
		burst: &burstRun{done: map[string]time.Duration{}, tickets: map[string]admissionv1.TicketState{}, drained: 5500 * time.Millisecond}}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for i := range 20 {
		for _, t := range []string{"corpus", "labels"} {
			at := time.Second + ms(100*i)
			id := fmt.Sprintf("%s-%d", t, i)
			r.rec.answers = append(r.rec.answers,
				answer{sent: at, answered: at + ms(1), tenant: t, weight: 140, deferrable: true, decision: admissionv1.Decision_DEFERRED, ticket: id},
				answer{sent: at, answered: at + ms(1), tenant: t, weight: 140, decision: admissionv1.Decision_ADMITTED})
			if t == "labels" {
				a := &r.rec.answers[len(r.rec.answers)-1]
				a.decision, a.reason = admissionv1.Decision_REJECTED, "DEADLINE_UNMEETABLE"
			}
			r.burst.tickets[id] = admissionv1.TicketState_TICKET_DONE
		}
		r.rec.answers = append(r.rec.answers, answer{sent: time.Second + ms(100*i), answered: time.Second + ms(100*i+1), tenant: "gold", weight: 140,
			decision: admissionv1.Decision_ADMITTED})
	}
	// From 3 s, 125 ms apart: corpus, corpus, corpus, labels, …
	next := map[string]int{}
	for k := 0; next["corpus"] < 20 || next["labels"] < 20; k++ {
		t := "corpus"
		if k%4 == 3 || next["corpus"] == 20 {
			t = "labels"
		}
		if next[t] == 20 {
			continue
		}
		at := 3*time.Second + ms(125*k)
		id := fmt.Sprintf("%s-%d", t, next[t])
		next[t]++
		r.burst.claims = append(r.burst.claims, claimed{at: at, replica: "replica-1", tenant: t, ticket: id, weight: 140})
		r.burst.done[id] = at + ms(160)
	}
	return r
}

// A clean burst holds every promise of its own, with the figures the
// script implies.
func TestJudgeDeferredClean(t *testing.T) {
	r := scriptedBurst()
	answers, _ := r.rec.snapshot()
	r.judgeDeferred(answers)
	for _, p := range r.rep.Promises {
		if !p.Held {
			t.Errorf("%s broke: %s", p.Name, p.Detail)
		}
	}
	d := r.rep.Deferred
	if d.Tickets != 40 || d.Done != 40 || d.DeferrableLossPct != 0 || d.InteractiveLossPct != 50 {
		t.Errorf("tickets %d, done %d, loss deferrable %.1f%% interactive %.1f%%; want 40, 40, 0%%, 50%%", d.Tickets, d.Done, d.DeferrableLossPct, d.InteractiveLossPct)
	}
	// corpus's 20 are claimed by 3.0 + 26 × 0.125 s: three whole seconds
	// with both backlogged, each 75% against 75%.
	if len(d.Fair) != 3 || d.WorstGapPct != 0 || d.DrainS == nil || *d.DrainS != 2.5 {
		t.Errorf("fair seconds %+v, worst gap %.1f, drained after %v; want 3 seconds at 75/25, 2.5 s", d.Fair, d.WorstGapPct, d.DrainS)
	}
	if d.PeakBacklog != 40 || d.Tenants[0].Replica != "replica-1" || d.Tenants[0].ClaimedTokens != 20*140 {
		t.Errorf("peak %d, tenants %+v", d.PeakBacklog, d.Tenants)
	}
}

// A fair queue serves whole requests, so a second's shares may be off the
// weights' by one claim: a heavy claim of corpus's leaves labels 11.8% of
// the second against its 25%, within the grain of that claim.
func TestJudgeDeferredAllowsOneClaimsGrain(t *testing.T) {
	r := scriptedBurst()
	for i := range r.burst.claims {
		if c := &r.burst.claims[i]; c.tenant == "corpus" && c.at >= 3*time.Second {
			c.weight = 1400
			break
		}
	}
	answers, _ := r.rec.snapshot()
	r.judgeDeferred(answers)
	p := promiseOf(t, r, "backlog drains in its tenants' weights")
	d := r.rep.Deferred
	if !p.Held || d.WorstGapPct < 13 || d.WorstExcessPct > 0 {
		t.Errorf("held %v (%s), worst gap %.1f beyond a claim %.1f; want held, 13.2 points off, within the claim", p.Held, p.Detail, d.WorstGapPct, d.WorstExcessPct)
	}
}

// Each broken promise is caught: an expired ticket and a refused
// deferrable are lost, a gold refusal touches the interactive tenants, a
// backlog claimed 1:1 is not in its weights, one not done is not drained.
func TestJudgeDeferredCatchesBrokenPromises(t *testing.T) {
	r := scriptedBurst()
	r.burst.tickets["corpus-0"] = admissionv1.TicketState_TICKET_EXPIRED
	r.burst.drained = -1
	for i := range r.rec.answers {
		a := &r.rec.answers[i]
		switch {
		case a.ticket == "labels-19":
			a.decision, a.reason, a.ticket = admissionv1.Decision_REJECTED, "QUEUE_FULL", ""
		case a.tenant == "gold" && i == 4:
			a.decision, a.reason = admissionv1.Decision_REJECTED, "CAPACITY_EXCEEDED"
		}
	}
	for i := range r.burst.claims {
		c := &r.burst.claims[i]
		if c.at < 4*time.Second {
			c.tenant = []string{"corpus", "labels"}[i%2]
		}
	}
	answers, _ := r.rec.snapshot()
	r.judgeDeferred(answers)
	want := map[string]string{
		"no deferrable request lost":             "1 refused QUEUE_FULL, 1 ticket EXPIRED",
		"interactive within share untouched":     "gold 1 of 20 refused",
		"backlog drained":                        "not done",
		"backlog drains in its tenants' weights": "within one claim and 12.5 points of its weight's",
	}
	for name, detail := range want {
		p := promiseOf(t, r, name)
		if p.Held || !strings.Contains(p.Detail, detail) {
			t.Errorf("%s: held %v, %q; want it broken, saying %q", name, p.Held, p.Detail, detail)
		}
	}
}
