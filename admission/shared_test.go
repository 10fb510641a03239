package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/admissiontest"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/state/memstate"
	"github.com/sluice-sched/sluice/topology"
)

// The shared-state behaviours are scenarios (testdata/scenarios/shared-*,
// on the in-memory store; internal/state/redisstate's tests run engines
// against a real redis-server). What stays here is what a script cannot
// say: option checking, and callers racing on one store call.

const sharedConfig = `
output_token_weight: 1
leases: {ttl: 1m, idempotency_ttl: 1m}
tiers:
  open:
    rps: {rate: 1000, burst: 1000}
    tokens: {rate: 1000, burst: 3000}
    weight: 1
tenants:
  o: {tier: open}
`

func TestSharedOptionsAreChecked(t *testing.T) {
	cfg, _ := config.Default()
	for _, o := range []admission.SharedOptions{{Mode: admission.SharedBatched}, {Replica: "r"}} {
		if _, err := admission.New(cfg, topology.Simulated(), admission.WithSharedState(memstate.New(nil), o)); err == nil {
			t.Errorf("New accepted %+v", o)
		}
	}
}

// An idempotent duplicate that arrives while the store is deciding waits
// for that one commit and gets its answer: never an admission the store
// then refuses, never a second charge.
func TestStrictDuplicateWaitsForTheCommit(t *testing.T) {
	for _, admit := range []bool{false, true} {
		name := map[bool]string{false: "refused", true: "admitted"}[admit]
		t.Run(name, func(t *testing.T) { strictDuplicate(t, admit) })
	}
}

func strictDuplicate(t *testing.T, admit bool) {
	cfg, err := config.Parse("shared.yaml", []byte(sharedConfig))
	if err != nil {
		t.Fatal(err)
	}
	counted := admissiontest.NewCounting(memstate.New(nil))
	store := admissiontest.NewGated(counted, 2)
	e, err := admission.New(cfg, topology.Simulated(),
		admission.WithSharedState(store, admission.SharedOptions{Mode: admission.SharedStrict, Replica: "r", Timeout: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	req := admission.Request{Tenant: "o", Model: "small", PromptTokens: 50, MaxOutputTokens: 50, RequestID: "dup"}
	answers := make(chan admission.Decision, 2)
	go func() { d, _ := e.Admit(ctx, req); answers <- d }()
	<-store.Entered() // the first call is in the store
	go func() { d, _ := e.Admit(ctx, req); answers <- d }()
	select {
	case d := <-answers:
		t.Fatalf("answered %v while the store was still deciding", d.Outcome)
	case <-store.Entered():
		t.Fatal("the duplicate committed a second time")
	case <-time.After(50 * time.Millisecond): // a wait for absence: nothing may arrive
	}
	if !admit {
		store.Refuse(admission.StrictVerdict{Refused: 1, RetryAfter: time.Second})
		for range 2 {
			if d := <-answers; d.Outcome != admission.Rejected || d.Reason != admission.ReasonQuotaExceeded {
				t.Errorf("answer %v %v, want both callers refused by the store", d.Outcome, d.Reason)
			}
		}
		if n := e.LeaseCount(); n != 0 {
			t.Errorf("%d leases after the refusal", n)
		}
		return
	}
	store.Pass()
	a, b := <-answers, <-answers
	if a.Outcome != admission.Admitted || b.Outcome != admission.Admitted || a.LeaseID != b.LeaseID {
		t.Errorf("answers %v lease %d and %v lease %d, want both callers given the one admission", a.Outcome, a.LeaseID, b.Outcome, b.LeaseID)
	}
	if n, c := e.LeaseCount(), counted.Commits(); n != 1 || c != 1 {
		t.Errorf("%d leases and %d commits in the store, want 1 and 1", n, c)
	}
}
