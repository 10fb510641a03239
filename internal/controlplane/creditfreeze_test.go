package controlplane

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/topology"
)

// A credit freeze written to etcd (as one replica's FreezeBurstCredit does)
// applies on every replica with the same absolute end; deleting it thaws
// them all. While frozen, a request within quota passes and one that would
// borrow burst credit is BURST_CREDIT_FROZEN.
func TestCreditFreezeAppliesOnEveryReplica(t *testing.T) {
	etcd := etcdtest.Start(t)
	// The second replica decides on a stopped clock, so that no refill
	// between two requests blurs the quota arithmetic below.
	cfg, err := config.Default()
	if err != nil {
		t.Fatal(err)
	}
	still, err := admission.New(cfg, topology.Simulated(), admission.WithClock(clock.NewManual(time.Now())))
	if err != nil {
		t.Fatal(err)
	}
	reps := []*replica{startReplica(t, newClient(t, etcd), Options{}), startReplica(t, newClient(t, etcd), Options{Engine: still})}
	for _, r := range reps {
		eventually(t, "synced", r.ctl.Synced)
	}
	cli := etcd.Client(t)
	until := time.Now().Add(5 * time.Minute).Truncate(time.Second)
	m := CreditFreezeMark{Until: until, Reason: "incident 42", By: "sre", At: time.Now()}
	if _, err := PutCreditFreeze(ctxT(t), cli, DefaultPrefix, m); err != nil {
		t.Fatal(err)
	}
	engines := []*admission.Engine{reps[0].eng, still}
	for i, eng := range engines {
		eventually(t, "the freeze on every replica", func() bool {
			f, ok := eng.CreditFrozen()
			return ok && f.Until.Equal(until) && strings.Contains(f.Reason, "incident 42") && strings.Contains(f.Reason, "by sre")
		})
		if got, ok, err := GetCreditFreeze(ctxT(t), cli, DefaultPrefix); err != nil || !ok || !got.Until.Equal(until) {
			t.Fatalf("replica %d: GetCreditFreeze = %+v, %v, %v", i, got, ok, err)
		}
	}
	// initech (standard: 40,000 tokens/s, burst 80,000, credit 20,000)
	// spends 70,000 within its quota, then is refused the 20,000 only
	// credit would carry: retry when 10,000 have refilled, in 250ms.
	d := bigAdmit(t, still, "initech", 70000)
	if d.Outcome != admission.Admitted {
		t.Fatalf("within quota while frozen: %+v", d)
	}
	if d = bigAdmit(t, still, "initech", 20000); d.Outcome != admission.Rejected || d.Reason != admission.ReasonBurstCreditFrozen || d.RetryAfter != 250*time.Millisecond {
		t.Fatalf("over quota while frozen: %+v, want BURST_CREDIT_FROZEN retrying in 250ms", d)
	}

	if ok, err := DeleteCreditFreeze(ctxT(t), cli, DefaultPrefix); err != nil || !ok {
		t.Fatalf("DeleteCreditFreeze = %v, %v", ok, err)
	}
	for _, eng := range engines {
		eventually(t, "thawed on every replica", func() bool { _, ok := eng.CreditFrozen(); return !ok })
	}
	if d = bigAdmit(t, still, "initech", 20000); d.Outcome != admission.Admitted {
		t.Fatalf("after the thaw, credit lends again: %+v", d)
	}
	// An unreadable mark (no end) is not applied: a freeze must end.
	put(t, cli, CreditFreezeKey(DefaultPrefix), `{"reason":"forever"}`)
	// A later write, to know the watch has passed the bad one.
	put(t, cli, DrainKey(DefaultPrefix, "hgx-h200-1"), `{"domain":"hgx-h200-1"}`)
	eventually(t, "the later drain", func() bool {
		for _, d := range reps[0].eng.Domains() {
			if d.ID == "hgx-h200-1" {
				return d.Draining
			}
		}
		return false
	})
	if _, ok := reps[0].eng.CreditFrozen(); ok {
		t.Fatal("a freeze without an end was applied")
	}
}

// bigAdmit asks for a small-model request of weighted tokens (prompt only
// but one output token, weighted 4).
func bigAdmit(t *testing.T, eng *admission.Engine, tenant string, weighted int64) admission.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := eng.Admit(ctx, admission.Request{Tenant: tenant, Model: "small", PromptTokens: weighted - 4, MaxOutputTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	return d
}
