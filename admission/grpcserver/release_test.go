package grpcserver

import (
	"context"
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/topology"
)

// Over the wire, against the real engine, a Release whose measurements
// cannot be true is INVALID_ARGUMENT naming the field, and the lease stays
// held: a valid Release of it afterwards settles it.
func TestReleaseRefusesImpossibleMeasurements(t *testing.T) {
	const tenYears = 10 * 365 * 24 * time.Hour
	tenThousandYears := &durationpb.Duration{Seconds: 315_576_000_000} // the largest a protobuf Duration holds
	for _, c := range []struct {
		name  string
		in    *admissionv1.ReleaseRequest
		field string
	}{
		{"cached above prompt", &admissionv1.ReleaseRequest{PromptTokens: 10, CachedPromptTokens: 11}, "cached_prompt_tokens"},
		{"cached above the admitted prompt", &admissionv1.ReleaseRequest{CachedPromptTokens: 101}, "cached_prompt_tokens"},
		{"cached at MaxInt64", &admissionv1.ReleaseRequest{PromptTokens: math.MaxInt64, CachedPromptTokens: math.MaxInt64}, "cached_prompt_tokens"},
		{"time to first token of 10,000 years", &admissionv1.ReleaseRequest{TimeToFirstToken: tenThousandYears}, "time_to_first_token"},
		{"duration of 10 years", &admissionv1.ReleaseRequest{Duration: durationpb.New(tenYears)}, "duration"},
		{"duration of 10,000 years", &admissionv1.ReleaseRequest{TimeToFirstToken: durationpb.New(time.Second), Duration: tenThousandYears}, "duration"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := config.Default()
			if err != nil {
				t.Fatal(err)
			}
			clk := clock.NewManual(time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC))
			eng, err := admission.New(cfg, topology.Simulated(), admission.WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			srv := &admissionServer{eng: eng}
			ctx := context.Background()
			d, err := srv.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "acme", Model: "large", PromptTokens: 100, MaxOutputTokens: 10})
			if err != nil || d.GetLeaseId() == "" {
				t.Fatalf("admit: %v %v", d, err)
			}
			c.in.LeaseId = d.GetLeaseId()
			_, err = srv.Release(ctx, c.in)
			wantInvalidArgument(t, err, c.field)
			if _, err := srv.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: d.GetLeaseId(), CachedPromptTokens: 100}); err != nil {
				t.Fatalf("the lease was not left held: %v", err)
			}
		})
	}
}
