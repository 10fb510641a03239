package grpcserver

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/topology"
)

// FuzzAdmitRequest drives the Admit handler over the real engine (the
// embedded default config on the simulated cluster, on a manual clock) with
// arbitrary AdmitRequest messages. The engine lives for the whole fuzz
// process, so leases, queues and idempotency records build up across inputs
// as they would in a server. Every call must answer a well-formed response
// or INVALID_ARGUMENT.
func FuzzAdmitRequest(f *testing.F) {
	downgrades := make([]string, 20)
	for i := range downgrades {
		downgrades[i] = [...]string{"medium", "small"}[i%2]
	}
	for _, m := range []*admissionv1.AdmitRequest{
		{},
		{RequestId: "r", Tenant: "acme", Model: "large", PromptTokens: 100, MaxOutputTokens: 10},
		{Tenant: "acme", Model: "large", PromptTokens: 1, MaxOutputTokens: 1, Priority: admissionv1.Priority_PRIORITY_CRITICAL, AcceptDowngrade: []string{"medium", "small"}},
		{Tenant: "acme", Model: "large", PromptTokens: -1, MaxOutputTokens: 1},
		{Tenant: "acme", Model: "large", PromptTokens: 1, MaxOutputTokens: 1, Priority: 7},
		{Tenant: "acme", Model: "large", PromptTokens: 1, MaxOutputTokens: 1, Priority: -3},
		{Tenant: "hooli", Model: "small", PromptTokens: 4000, MaxOutputTokens: 1000, AcceptDowngrade: []string{"small"}},
		{RequestId: "r", Tenant: "globex", Model: "medium", PromptTokens: 100, MaxOutputTokens: 10}, // a request id another tenant used
		{Tenant: "nobody", Model: "large", PromptTokens: 1, MaxOutputTokens: 1},
		{Tenant: "acme", Model: strings.Repeat("m", 3<<20), PromptTokens: 1, MaxOutputTokens: 1},
		{Tenant: "initech", Model: "large", PromptTokens: 1, MaxOutputTokens: math.MaxInt64},
		{Tenant: "acme", Model: "large", PromptTokens: math.MaxInt64, MaxOutputTokens: math.MaxInt64},
		{Tenant: "acme", Model: "large", PromptTokens: 100, MaxOutputTokens: 10, AcceptDowngrade: downgrades},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xff, 0xff, 0xff})

	cfg, err := config.Default()
	if err != nil {
		f.Fatal(err)
	}
	clk := clock.NewManual(time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC))
	eng, err := admission.New(cfg, topology.Simulated(), admission.WithClock(clk))
	if err != nil {
		f.Fatal(err)
	}
	srv := &admissionServer{eng: eng}
	f.Fuzz(func(t *testing.T, b []byte) {
		var in admissionv1.AdmitRequest
		if proto.Unmarshal(b, &in) != nil {
			return // the gRPC codec rejects these before any handler runs
		}
		// Nothing may block: a call still running 10 s on crashes the
		// worker with every goroutine's stack, and the input is kept.
		watchdog := time.AfterFunc(10*time.Second, func() {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			panic(fmt.Sprintf("Admit or Tick blocked for 10 s on %s\n%s", brief(&in), buf))
		})
		defer watchdog.Stop()
		defer func() {
			clk.Advance(time.Millisecond)
			eng.Tick()
		}()
		// A queued request gives up after 1 ms of real time, so none blocks.
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		resp, err := srv.Admit(ctx, &in)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument {
				t.Fatalf("code %v (%v) for %s", c, err, brief(&in))
			}
			return
		}
		if _, err := proto.Marshal(resp); err != nil {
			t.Fatalf("response does not marshal: %v", err)
		}
		if ra := resp.GetRetryAfter(); ra != nil {
			if err := ra.CheckValid(); err != nil {
				t.Fatalf("retry_after %v: %v", ra, err)
			}
			if d := ra.AsDuration(); d < 0 || d > 24*time.Hour {
				t.Fatalf("retry_after %v, want within [0, 24h], for %s", d, brief(&in))
			}
		}
		switch resp.GetDecision() {
		case admissionv1.Decision_ADMITTED, admissionv1.Decision_DEGRADED:
			if resp.GetLeaseId() == "" || resp.GetDomain() == "" || resp.GetModel() == "" {
				t.Fatalf("%v without lease_id, domain or model: %s", resp.GetDecision(), brief(resp))
			}
		case admissionv1.Decision_REJECTED:
			if resp.GetReason() == admissionv1.Reason_REASON_UNSPECIFIED {
				t.Fatalf("REJECTED without a reason: %s for %s", brief(resp), brief(&in))
			}
		default:
			t.Fatalf("decision %v for %s", resp.GetDecision(), brief(&in))
		}
	})
}

// brief prints m for a failure message, cut to 1 KiB (a fuzzed model name
// may be megabytes).
func brief(m proto.Message) string {
	s := prototext.MarshalOptions{}.Format(m)
	if len(s) > 1024 {
		s = s[:1024] + "…"
	}
	return s
}
