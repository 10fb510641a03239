package admission

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/clock"
)

// FuzzAdmit drives arbitrary requests through the real engine: no input may
// panic it, every error must be an InvalidArgumentError naming a field,
// every answer must be well formed, and Release of whatever was admitted
// must succeed exactly once.
func FuzzAdmit(f *testing.F) {
	f.Add("a", "medium", int64(100), int64(100), int32(1), "", "req-1", "")
	f.Add("", "", int64(0), int64(0), int32(0), "", "", "")
	f.Add("b", "large", int64(1<<40), int64(-1), int32(9), "medium", "x", "small")
	f.Add("nobody", "small", int64(1), int64(1), int32(2), "", "", "")
	f.Add("a", "large", int64(500000), int64(200000), int32(2), "small", "dup", "medium")
	f.Add("c", "large", int64(9223372036854775807), int64(9223372036854775807), int32(-1), "large", "\xff", "")
	clk := clock.NewManual(epoch)
	e, err := New(testConfig(), hgxCluster(f, 2), WithClock(clk))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, tenant, model string, prompt, output int64, prio int32, down1, id, down2 string) {
		r := Request{Tenant: tenant, Model: model, PromptTokens: prompt, MaxOutputTokens: output,
			Priority: Priority(prio), RequestID: id}
		for _, d := range []string{down1, down2} {
			if d != "" {
				r.AcceptDowngrade = append(r.AcceptDowngrade, d)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		d, err := e.Admit(ctx, r)
		if err != nil {
			var ia *InvalidArgumentError
			if !errors.As(err, &ia) || ia.Field == "" {
				t.Fatalf("error %v is not an InvalidArgumentError naming a field", err)
			}
			return
		}
		switch d.Outcome {
		case Admitted, Degraded:
			if d.LeaseID == 0 || d.Domain == "" || d.Model == "" || d.Reason != ReasonNone {
				t.Fatalf("malformed admission %+v", d)
			}
			if id == "" { // with an id, a later input may legitimately repeat it
				if _, err := e.Release(context.Background(), Release{LeaseID: d.LeaseID, OutputTokens: 1}); err != nil {
					t.Fatalf("release: %v", err)
				}
				if _, err := e.Release(context.Background(), Release{LeaseID: d.LeaseID}); !errors.Is(err, ErrLeaseNotFound) {
					t.Fatalf("second release: %v", err)
				}
			}
		case Rejected:
			if d.Reason == ReasonNone || d.RetryAfter < 0 {
				t.Fatalf("malformed rejection %+v", d)
			}
		default:
			t.Fatalf("unknown outcome %+v", d)
		}
		clk.Advance(time.Millisecond)
		e.Tick()
	})
}
