package replay

import (
	"testing"
	"time"
)

// TestClairvoyantEndsPrefillsWithinItsBudget replays the code trace at 10×
// on slow engines under the clairvoyant dispatcher: every request it sends
// has its first token within the budget of its dispatch, but the few it
// sends late (at most lateShare of them, past the budget by design), and
// the trace is past what the engines take within the budget, so requests
// wait in its queue and some are refused for their deadline.
func TestClairvoyantEndsPrefillsWithinItsBudget(t *testing.T) {
	cfg, cl := setup(t)
	rows := codeRows(t, TraceOptions{Speed: 10, To: 20 * time.Minute})
	const budget = time.Second
	s, err := newSim(rows, Options{Policy: PolicyClairvoyant, Config: cfg, Cluster: cl, Deadline: 2 * time.Second,
		Engine: EngineOptions{Capacity: 0.6, Budget: budget}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.pol.close()
	cv := s.pol.(*clairvoyant)
	var sent []*simReq
	cv.onDispatch = func(r *simReq, domain int, work, room float64) {
		if work > room && !cv.late[r] {
			t.Errorf("line %d: %g FLOP of prefill sent to %s with room for %g", r.row.Line, work, s.domains[domain].id, room)
		}
		sent = append(sent, r)
	}
	if err := s.run(rows); err != nil {
		t.Fatal(err)
	}
	rep := s.rec.report(s)
	late, refused := 0, 0
	for _, r := range sent {
		ttft := time.Duration(r.firstAt - r.admitAt)
		switch {
		case r.firstAt == 0:
			t.Errorf("line %d: sent at %d ns, never prefilled", r.row.Line, r.admitAt)
		case cv.late[r]:
			late++
		case ttft > budget+time.Microsecond:
			t.Errorf("line %d: first token %v after its dispatch, budget %v", r.row.Line, ttft, budget)
		}
	}
	for _, tr := range rep.Tenants {
		refused += tr.Rejected["DEADLINE_UNMEETABLE"]
	}
	t.Logf("%d sent, %d late, %d refused for their deadline; utilization %.1f%%, TTFT p99 %.0f ms", len(sent), late, refused, 100*rep.Engines.Util, rep.Engines.TTFTP99)
	if len(sent) == 0 || refused == 0 {
		t.Errorf("%d sent, %d refused for their deadline: the replay does not hold the dispatcher back", len(sent), refused)
	}
	if float64(late) > lateShare*float64(len(sent))+1 {
		t.Errorf("%d of %d sent late, more than %g of them", late, len(sent), lateShare)
	}
	if p99 := rep.Engines.TTFTP99; p99 > 1.001*float64(budget/time.Millisecond) {
		t.Errorf("TTFT p99 %.1f ms, budget %v", p99, budget)
	}
}

// TestClairvoyantKeepsTheQuotas replays the code trace at 10× on fast
// engines, where capacity holds back little and the quotas bind: the
// clairvoyant dispatcher refuses globex and hooli QUOTA_EXCEEDED, and
// admits each tenant no more than its token bucket lets through over the
// replay (rate × seconds + burst + burst credit).
func TestClairvoyantKeepsTheQuotas(t *testing.T) {
	cfg, cl := setup(t)
	rows := codeRows(t, TraceOptions{Speed: 10, To: 20 * time.Minute})
	rep, err := Run(rows, Options{Policy: PolicyClairvoyant, Config: cfg, Cluster: cl, Deadline: 2 * time.Second,
		Engine: EngineOptions{Capacity: 1.5}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range rep.Tenants {
		p, _ := cfg.Policy(tr.Name)
		var admitted int64
		for _, a := range tr.Achieved {
			admitted += a
		}
		most := p.Tokens.Rate*rep.Seconds + p.Tokens.Burst + p.BurstCredit.Multiple*p.Tokens.Rate
		t.Logf("%s: %d weighted tokens admitted, at most %.0f; refused %v", tr.Name, admitted, most, tr.Rejected)
		if float64(admitted) > most {
			t.Errorf("%s: %d weighted tokens admitted over %.0f s, more than its quota's %.0f", tr.Name, admitted, rep.Seconds, most)
		}
		if (tr.Name == "globex" || tr.Name == "hooli") && tr.Rejected["QUOTA_EXCEEDED"] == 0 {
			t.Errorf("%s: no request refused QUOTA_EXCEEDED (refused %v): the quota does not hold the dispatcher", tr.Name, tr.Rejected)
		}
	}
}
