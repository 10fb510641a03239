package grpcserver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

func TestAdmitRoundTripsEveryField(t *testing.T) {
	in := &admissionv1.AdmitRequest{
		RequestId:       "req-1",
		Tenant:          "acme",
		Model:           "large",
		PromptTokens:    1000,
		MaxOutputTokens: 200,
		Priority:        admissionv1.Priority_PRIORITY_CRITICAL,
		AcceptDowngrade: []string{"medium", "small"},

		ExpectedCachedTokens: 400,
		Deferrable:           true,
		DeferWithin:          durationpb.New(time.Hour),
	}
	wantAllFieldsSet(t, in)
	dec := admission.Decision{
		Outcome:       admission.Degraded,
		Reason:        admission.ReasonCapacityExceeded,
		RetryAfter:    1500 * time.Millisecond,
		LeaseID:       math.MaxUint64,
		Domain:        "cluster-a.7",
		Model:         "small",
		DowngradePath: []string{"large", "medium", "small"},
		Queued:        250*time.Millisecond + 3,
		Trace: admission.Trace{
			Tenant: "acme", Model: "large", Tier: "premium",
			QuotaBefore: 10, QuotaAfter: -20, BurstCreditBefore: 30, BurstCreditAfter: 40,
			Floor: true, Critical: true,
			PrefillLevel: 50, DecodeLevel: 60, KVInUse: 70, KVLimit: 80,
			WeightedTokens: 90, EstimatedCostMicros: 100, EstimatedWait: 1200 * time.Millisecond,
		},
	}
	wantNoZeroFields(t, dec)
	want := &admissionv1.AdmitResponse{
		Decision:      admissionv1.Decision_DEGRADED,
		Reason:        admissionv1.Reason_REASON_CAPACITY_EXCEEDED,
		RetryAfter:    durationpb.New(1500 * time.Millisecond),
		LeaseId:       "l-18446744073709551615",
		Domain:        "cluster-a.7",
		Model:         "small",
		DowngradePath: []string{"large", "medium", "small"},
		Queued:        durationpb.New(250*time.Millisecond + 3),
		Trace: &admissionv1.Trace{
			Tenant: "acme", Model: "large", Tier: "premium",
			QuotaBefore: 10, QuotaAfter: -20, BurstCreditBefore: 30, BurstCreditAfter: 40,
			Floor: true, Critical: true,
			PrefillLevel: 50, DecodeLevel: 60, KvInUse: 70, KvLimit: 80,
			WeightedTokens: 90, EstimatedCostMicros: 100, EstimatedWait: durationpb.New(1200 * time.Millisecond),
		},
		TicketId: "t-1",
		Message:  "detail",
	}

	var got admission.Request
	eng := &testEngine{admit: func(_ context.Context, req admission.Request) (admission.Decision, error) {
		got = req
		return dec, nil
	}}
	// A deferrable request goes to the backlog, which answers with the
	// engine's decision, a ticket and a message.
	bl := &testBacklog{eng: eng, ticket: "t-1", message: "detail"}
	cl := admissionv1.NewAdmissionClient(startServer(t, eng, nil, WithBacklog(bl)).conn)
	resp, err := cl.Admit(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	wantReq := admission.Request{
		RequestID: "req-1", Tenant: "acme", Model: "large",
		PromptTokens: 1000, MaxOutputTokens: 200,
		Priority:        admission.PriorityCritical,
		AcceptDowngrade: []string{"medium", "small"},

		ExpectedCachedTokens: 400,
		Deferrable:           true,
		DeferWithin:          time.Hour,
	}
	if !reflect.DeepEqual(got, wantReq) {
		t.Errorf("engine got %+v, want %+v", got, wantReq)
	}
	if !proto.Equal(resp, want) {
		t.Errorf("response\n got %v\nwant %v", resp, want)
	}
	wantAllFieldsSet(t, resp)
}

func TestAdmitLeavesZeroDurationsAndLeaseAbsent(t *testing.T) {
	eng := &testEngine{admit: func(context.Context, admission.Request) (admission.Decision, error) {
		return admission.Decision{Outcome: admission.Rejected, Reason: admission.ReasonQueueFull}, nil
	}}
	cl := admissionv1.NewAdmissionClient(startServer(t, eng, nil).conn)
	resp, err := cl.Admit(context.Background(), &admissionv1.AdmitRequest{Tenant: "a", Model: "m", PromptTokens: 1, MaxOutputTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	if resp.RetryAfter != nil || resp.Queued != nil || resp.LeaseId != "" {
		t.Errorf("retry_after=%v queued=%v lease_id=%q, want all absent", resp.RetryAfter, resp.Queued, resp.LeaseId)
	}
	if resp.GetReason() != admissionv1.Reason_REASON_QUEUE_FULL || resp.GetDecision() != admissionv1.Decision_REJECTED {
		t.Errorf("got %v %v", resp.GetDecision(), resp.GetReason())
	}
}

func TestAdmitPriority(t *testing.T) {
	var got admission.Priority
	eng := &testEngine{admit: func(_ context.Context, req admission.Request) (admission.Decision, error) {
		got = req.Priority
		return admission.Decision{Outcome: admission.Admitted}, nil
	}}
	cl := admissionv1.NewAdmissionClient(startServer(t, eng, nil).conn)
	for p, want := range map[admissionv1.Priority]admission.Priority{
		admissionv1.Priority_PRIORITY_UNSPECIFIED: admission.PriorityNormal,
		admissionv1.Priority_PRIORITY_NORMAL:      admission.PriorityNormal,
		admissionv1.Priority_PRIORITY_CRITICAL:    admission.PriorityCritical,
	} {
		if _, err := cl.Admit(context.Background(), &admissionv1.AdmitRequest{Priority: p}); err != nil {
			t.Fatalf("%v: %v", p, err)
		}
		if got != want {
			t.Errorf("%v reached the engine as %v, want %v", p, got, want)
		}
	}
	calls := eng.admitCalls.Load()
	for _, p := range []admissionv1.Priority{3, -1, math.MaxInt32} {
		_, err := cl.Admit(context.Background(), &admissionv1.AdmitRequest{Tenant: "a", Priority: p})
		wantInvalidArgument(t, err, "priority")
	}
	if n := eng.admitCalls.Load() - calls; n != 0 {
		t.Errorf("engine called %d times for bad priorities, want 0", n)
	}
}

func TestAdmitPassesNegativeTokensToEngine(t *testing.T) {
	var got admission.Request
	eng := &testEngine{admit: func(_ context.Context, req admission.Request) (admission.Decision, error) {
		got = req
		return admission.Decision{}, &admission.InvalidArgumentError{Field: "prompt_tokens", Reason: "must be > 0"}
	}}
	cl := admissionv1.NewAdmissionClient(startServer(t, eng, nil).conn)
	_, err := cl.Admit(context.Background(), &admissionv1.AdmitRequest{Tenant: "a", PromptTokens: -5, MaxOutputTokens: -7})
	wantInvalidArgument(t, err, "prompt_tokens")
	if got.PromptTokens != -5 || got.MaxOutputTokens != -7 {
		t.Errorf("engine got prompt=%d max_output=%d, want -5 -7", got.PromptTokens, got.MaxOutputTokens)
	}
	if msg := err.Error(); !strings.HasSuffix(msg, "invalid prompt_tokens: must be > 0") {
		t.Errorf("message %q", msg)
	}
}

func TestAdmitDeadlineReachesEngine(t *testing.T) {
	type seen struct {
		ctxDeadline time.Time
		ok          bool
		req         time.Time
	}
	var got seen
	eng := &testEngine{admit: func(ctx context.Context, req admission.Request) (admission.Decision, error) {
		got.ctxDeadline, got.ok = ctx.Deadline()
		got.req = req.Deadline
		return admission.Decision{Outcome: admission.Admitted}, nil
	}}
	cl := admissionv1.NewAdmissionClient(startServer(t, eng, nil).conn)

	if _, err := cl.Admit(context.Background(), &admissionv1.AdmitRequest{}); err != nil {
		t.Fatal(err)
	}
	if got.ok || !got.req.IsZero() {
		t.Errorf("without a gRPC deadline: ctx deadline %v (%v), request deadline %v; want none", got.ctxDeadline, got.ok, got.req)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	clientDeadline, _ := ctx.Deadline()
	if _, err := cl.Admit(ctx, &admissionv1.AdmitRequest{}); err != nil {
		t.Fatal(err)
	}
	if !got.ok {
		t.Fatal("the engine's ctx has no deadline")
	}
	if !got.req.Equal(got.ctxDeadline) {
		t.Errorf("request deadline %v != ctx deadline %v", got.req, got.ctxDeadline)
	}
	// The deadline travels as a relative timeout; it lands within the
	// transit time of the client's (a minute is far more than any transit).
	if d := got.ctxDeadline.Sub(clientDeadline); d < -time.Minute || d > time.Minute {
		t.Errorf("server deadline is %v off the client's", d)
	}
}

func TestErrorMapping(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{&admission.InvalidArgumentError{Field: "tenant", Reason: "required"}, codes.InvalidArgument},
		{fmt.Errorf("wrapped: %w", &admission.InvalidArgumentError{Field: "model", Reason: "unknown"}), codes.InvalidArgument},
		{admission.ErrLeaseNotFound, codes.NotFound},
		{fmt.Errorf("drain x: %w", admission.ErrUnknownDomain), codes.NotFound},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{fmt.Errorf("queued: %w", context.Canceled), codes.Canceled},
		{errors.New("boom"), codes.Internal},
		{(*admission.InvalidArgumentError)(nil), codes.Internal},
	} {
		err := statusFromError(tc.err)
		wantCode(t, err, tc.want)
		var ia *admission.InvalidArgumentError
		if errors.As(tc.err, &ia) && ia != nil {
			wantInvalidArgument(t, err, ia.Field)
		}
	}
}

func TestAdmitInvalidArgumentOverTheWire(t *testing.T) {
	eng := &testEngine{admit: func(context.Context, admission.Request) (admission.Decision, error) {
		return admission.Decision{}, fmt.Errorf("validate: %w", &admission.InvalidArgumentError{Field: "accept_downgrade", Reason: `"tiny" is not below "large"`})
	}}
	cl := admissionv1.NewAdmissionClient(startServer(t, eng, nil).conn)
	_, err := cl.Admit(context.Background(), &admissionv1.AdmitRequest{})
	wantInvalidArgument(t, err, "accept_downgrade")
}

func TestPanickingEngineGivesInternalAndServerKeepsServing(t *testing.T) {
	var log lockedBuffer
	eng := &testEngine{}
	eng.admit = func(context.Context, admission.Request) (admission.Decision, error) {
		if eng.admitCalls.Load() == 1 {
			panic("engine bug")
		}
		return admission.Decision{Outcome: admission.Admitted}, nil
	}
	cl := admissionv1.NewAdmissionClient(startServer(t, eng, &log).conn)
	_, err := cl.Admit(context.Background(), &admissionv1.AdmitRequest{})
	wantCode(t, err, codes.Internal)
	if !strings.Contains(log.String(), "engine bug") || !strings.Contains(log.String(), "/sluice.admission.v1.Admission/Admit") {
		t.Errorf("panic not logged with method: %q", log.String())
	}
	resp, err := cl.Admit(context.Background(), &admissionv1.AdmitRequest{})
	if err != nil || resp.GetDecision() != admissionv1.Decision_ADMITTED {
		t.Fatalf("after the panic: %v, %v", resp, err)
	}
}

func TestRelease(t *testing.T) {
	var got admission.Release
	eng := &testEngine{release: func(_ context.Context, rel admission.Release) (admission.ReleaseResult, error) {
		got = rel
		if rel.LeaseID == 404 {
			return admission.ReleaseResult{}, admission.ErrLeaseNotFound
		}
		return admission.ReleaseResult{Tenant: "acme", Domain: "d1", Model: "m1", RefundedTokens: -12, ActualCostMicros: 345, HeldFor: 2 * time.Second, OverrunClamped: true, Deferred: rel.LeaseID == 42}, nil
	}}
	// Every field is answered but Tenant, which the router named itself,
	// and Deferred, which tells the backlog.
	wantNoZeroFields(t, admission.ReleaseResult{Tenant: "acme", Domain: "d1", Model: "m1", RefundedTokens: -12, ActualCostMicros: 345, HeldFor: 2 * time.Second, OverrunClamped: true, Deferred: true})
	bl := &testBacklog{eng: eng}
	cl := admissionv1.NewAdmissionClient(startServer(t, eng, nil, WithBacklog(bl)).conn)

	in := &admissionv1.ReleaseRequest{LeaseId: "l-42", PromptTokens: 900, OutputTokens: 150, Outcome: admissionv1.Outcome_OUTCOME_ERROR,
		TimeToFirstToken: durationpb.New(300 * time.Millisecond), Duration: durationpb.New(4 * time.Second), CachedPromptTokens: 512}
	wantAllFieldsSet(t, in)
	resp, err := cl.Release(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if got.Authorize != nil {
		t.Error("a Release without a tenant guard carries an Authorize")
	}
	if want := (admission.Release{LeaseID: 42, PromptTokens: 900, OutputTokens: 150, Outcome: admission.ReleaseError,
		TTFT: 300 * time.Millisecond, Duration: 4 * time.Second, CachedPromptTokens: 512}); got.LeaseID != want.LeaseID ||
		got.PromptTokens != want.PromptTokens || got.OutputTokens != want.OutputTokens || got.Outcome != want.Outcome ||
		got.TTFT != want.TTFT || got.Duration != want.Duration || got.CachedPromptTokens != want.CachedPromptTokens {
		t.Errorf("engine got %+v, want %+v", got, want)
	}
	want := &admissionv1.ReleaseResponse{Domain: "d1", Model: "m1", RefundedTokens: -12, ActualCostMicros: 345, HeldFor: durationpb.New(2 * time.Second), OverrunClamped: true}
	if !proto.Equal(resp, want) {
		t.Errorf("got %v, want %v", resp, want)
	}
	wantAllFieldsSet(t, resp)
	if !slices.Equal(bl.released, []uint64{42}) {
		t.Errorf("backlog told of released leases %v, want [42] (the deferred one)", bl.released)
	}

	for o, want := range map[admissionv1.Outcome]admission.ReleaseOutcome{
		admissionv1.Outcome_OUTCOME_UNSPECIFIED: admission.ReleaseOK,
		admissionv1.Outcome_OUTCOME_OK:          admission.ReleaseOK,
	} {
		if _, err := cl.Release(context.Background(), &admissionv1.ReleaseRequest{LeaseId: "l-1", Outcome: o}); err != nil {
			t.Fatal(err)
		}
		if got.Outcome != want {
			t.Errorf("%v reached the engine as %v", o, got.Outcome)
		}
	}

	_, err = cl.Release(context.Background(), &admissionv1.ReleaseRequest{LeaseId: "l-404"})
	wantCode(t, err, codes.NotFound)

	calls := eng.releaseCalls.Load()
	_, err = cl.Release(context.Background(), &admissionv1.ReleaseRequest{LeaseId: "l-1", Outcome: 3})
	wantInvalidArgument(t, err, "outcome")
	_, err = cl.Release(context.Background(), &admissionv1.ReleaseRequest{LeaseId: "l-1", TimeToFirstToken: &durationpb.Duration{Seconds: 1, Nanos: -1}})
	wantInvalidArgument(t, err, "time_to_first_token")
	for _, id := range []string{"", "1", "l-", "l-0", "l-01", "L-1", "l-+1", "l--1", "l- 1", "l-1 ", "l-1a", "l-0x1f", "x-1", "l-18446744073709551616", "l-99999999999999999999999"} {
		_, err := cl.Release(context.Background(), &admissionv1.ReleaseRequest{LeaseId: id})
		wantInvalidArgument(t, err, "lease_id")
	}
	if n := eng.releaseCalls.Load() - calls; n != 0 {
		t.Errorf("engine called %d times for bad requests, want 0", n)
	}
}

func TestLeaseIDFormat(t *testing.T) {
	for _, id := range []uint64{1, 9, 10, 123, 1 << 53, math.MaxUint64} {
		s := formatLeaseID(id)
		if want := fmt.Sprintf("l-%d", id); s != want {
			t.Errorf("formatLeaseID(%d) = %q, want %q", id, s, want)
		}
		back, err := parseLeaseID(s)
		if err != nil || back != id {
			t.Errorf("parseLeaseID(%q) = %d, %v", s, back, err)
		}
	}
}

func TestOperator(t *testing.T) {
	dom := admission.DomainInfo{
		ID: "c.1", Kind: "nvl72", GPUs: 72, Draining: true, DrainReason: "maintenance",
		HealthWeight: 0.05, InFlight: 3, PrefillRate: 1, PrefillLevel: 2, PrefillBurst: 3,
		DecodeRate: 4, DecodeLevel: 5, DecodeBurst: 6, KVInUse: 7, KVLimit: 8, ReservedFrac: 0.25,
		WarmupFraction: 0.4, WarmupLeft: 36 * time.Second,
		EffectivePrefillRate: 9, EffectiveDecodeRate: 10, PriorPrefillRate: 11, PriorDecodeRate: 12, CapacityFactor: 0.8,
		EngineQueue: 6, EngineKVUsage: 0.9, EngineMetricsAge: 120 * time.Millisecond, EngineMetricsStale: true, EngineSaturated: true, FloorsShort: true,
		PrefillUse: 0.55, DecodeUse: 0.1, Load: 0.6,
	}
	until := time.Date(2026, 3, 1, 12, 0, 0, 5, time.UTC)
	ten := admission.TenantInfo{
		Name: "acme", Tier: "enterprise", Weight: 4, FloorTokens: 1000, TokenRate: 2000,
		TokenBurst: 3000, TokenLevel: 400, Credit: 500, RPSLevel: 6, InFlight: 7, Queued: 8,
		BreakerOpen: true, BreakerUntil: until, SpentTodayMicros: 9, SpentMonthMicros: 10,
	}
	wantNoZeroFields(t, dom)
	wantNoZeroFields(t, ten)
	var drained, undrained []string
	eng := &testEngine{
		domains: []admission.DomainInfo{dom},
		tenants: []admission.TenantInfo{ten, {Name: "idle"}},
		drain: func(domain, reason string) error {
			if domain != dom.ID {
				return fmt.Errorf("drain %q: %w", domain, admission.ErrUnknownDomain)
			}
			drained = append(drained, domain+"/"+reason)
			return nil
		},
		undrain: func(domain string) error {
			if domain != dom.ID {
				return fmt.Errorf("undrain %q: %w", domain, admission.ErrUnknownDomain)
			}
			undrained = append(undrained, domain)
			return nil
		},
	}
	cl := admissionv1.NewOperatorClient(startServer(t, eng, nil).conn)
	ctx := context.Background()
	wantDom := &admissionv1.DomainInfo{
		Id: "c.1", Kind: "nvl72", Gpus: 72, Draining: true, DrainReason: "maintenance",
		HealthWeight: 0.05, InFlight: 3, PrefillRate: 1, PrefillLevel: 2, PrefillBurst: 3,
		DecodeRate: 4, DecodeLevel: 5, DecodeBurst: 6, KvInUse: 7, KvLimit: 8, ReservedFrac: 0.25,
		WarmupFraction: 0.4, WarmupLeft: durationpb.New(36 * time.Second),
		EffectivePrefillRate: 9, EffectiveDecodeRate: 10, PriorPrefillRate: 11, PriorDecodeRate: 12, CapacityFactor: 0.8,
		EngineQueue: 6, EngineKvUsage: 0.9, EngineMetricsAge: durationpb.New(120 * time.Millisecond), EngineMetricsStale: true, EngineSaturated: true, FloorsShort: true,
		PrefillUse: 0.55, DecodeUse: 0.1, Load: 0.6,
	}
	wantTen := &admissionv1.TenantInfo{
		Name: "acme", Tier: "enterprise", Weight: 4, FloorTokens: 1000, TokenRate: 2000,
		TokenBurst: 3000, TokenLevel: 400, Credit: 500, RpsLevel: 6, InFlight: 7, Queued: 8,
		BreakerOpen: true, BreakerUntil: timestamppb.New(until), SpentTodayMicros: 9, SpentMonthMicros: 10,
	}

	ld, err := cl.ListDomains(ctx, &admissionv1.ListDomainsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ld.Domains) != 1 || !proto.Equal(ld.Domains[0], wantDom) {
		t.Errorf("ListDomains = %v, want [%v]", ld.Domains, wantDom)
	}
	wantAllFieldsSet(t, ld.Domains[0])

	dr, err := cl.DrainDomain(ctx, &admissionv1.DrainDomainRequest{Domain: "c.1", Reason: "maintenance"})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(dr.Domain, wantDom) || !reflect.DeepEqual(drained, []string{"c.1/maintenance"}) {
		t.Errorf("DrainDomain = %v, engine saw %v", dr, drained)
	}
	ur, err := cl.UndrainDomain(ctx, &admissionv1.UndrainDomainRequest{Domain: "c.1"})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(ur.Domain, wantDom) || !reflect.DeepEqual(undrained, []string{"c.1"}) {
		t.Errorf("UndrainDomain = %v, engine saw %v", ur, undrained)
	}
	_, err = cl.DrainDomain(ctx, &admissionv1.DrainDomainRequest{Domain: "nope"})
	wantCode(t, err, codes.NotFound)
	_, err = cl.UndrainDomain(ctx, &admissionv1.UndrainDomainRequest{Domain: "nope"})
	wantCode(t, err, codes.NotFound)
	_, err = cl.DrainDomain(ctx, &admissionv1.DrainDomainRequest{})
	wantInvalidArgument(t, err, "domain")
	_, err = cl.UndrainDomain(ctx, &admissionv1.UndrainDomainRequest{})
	wantInvalidArgument(t, err, "domain")

	lt, err := cl.ListTenants(ctx, &admissionv1.ListTenantsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(lt.Tenants) != 2 || !proto.Equal(lt.Tenants[0], wantTen) || lt.Tenants[1].GetName() != "idle" || lt.Tenants[1].BreakerUntil != nil {
		t.Errorf("ListTenants = %v", lt.Tenants)
	}
	wantAllFieldsSet(t, lt.Tenants[0])
	gt, err := cl.GetTenant(ctx, &admissionv1.GetTenantRequest{Name: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(gt.Tenant, wantTen) {
		t.Errorf("GetTenant = %v, want %v", gt.Tenant, wantTen)
	}
	_, err = cl.GetTenant(ctx, &admissionv1.GetTenantRequest{Name: "nope"})
	wantCode(t, err, codes.NotFound)
	_, err = cl.GetTenant(ctx, &admissionv1.GetTenantRequest{})
	wantInvalidArgument(t, err, "name")
}

func TestHealthServing(t *testing.T) {
	ts := startServer(t, &testEngine{}, nil)
	hc := healthpb.NewHealthClient(ts.conn)
	services := []string{"", "sluice.admission.v1.Admission", "sluice.admission.v1.Operator"}
	for _, svc := range services {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check(%q) = %v, %v; want SERVING", svc, resp, err)
		}
	}
	ts.health.Shutdown()
	for _, svc := range services {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("after Shutdown, Check(%q) = %v, %v; want NOT_SERVING", svc, resp, err)
		}
	}
}

func TestReflectionListsServices(t *testing.T) {
	ts := startServer(t, &testEngine{}, nil)
	stream, err := reflectionpb.NewServerReflectionClient(ts.conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, s := range resp.GetListServicesResponse().GetService() {
		listed[s.GetName()] = true
	}
	for _, want := range []string{"sluice.admission.v1.Admission", "sluice.admission.v1.Operator", "grpc.health.v1.Health"} {
		if !listed[want] {
			t.Errorf("reflection does not list %s (it lists %v)", want, listed)
		}
	}
}

func TestEnumNumbersMatchEngine(t *testing.T) {
	if n := len(admissionv1.Reason_name); n != int(admission.LastReason)+1 {
		t.Errorf("proto has %d reasons, engine %d", n, admission.LastReason+1)
	}
	if name := admission.LastReason + 1; !strings.HasPrefix(name.String(), "Reason(") {
		t.Errorf("reason %d (%s) is past LastReason", int32(name), name)
	}
	for r := admission.ReasonNone; r <= admission.LastReason; r++ {
		want := "REASON_" + r.String()
		if r == admission.ReasonNone {
			want = r.String()
		}
		if got := admissionv1.Reason(r).String(); got != want {
			t.Errorf("reason %d: proto %s, engine %s", r, got, want)
		}
	}
	if n := len(admissionv1.Decision_name); n != 5 {
		t.Errorf("proto has %d decisions, want 5", n)
	}
	for _, o := range []admission.Outcome{admission.Admitted, admission.Degraded, admission.Rejected, admission.Deferred} {
		if got, want := admissionv1.Decision(o).String(), o.String(); got != want {
			t.Errorf("outcome %d: proto %s, engine %s", o, got, want)
		}
	}
	if admissionv1.Priority_PRIORITY_NORMAL != admissionv1.Priority(admission.PriorityNormal) ||
		admissionv1.Priority_PRIORITY_CRITICAL != admissionv1.Priority(admission.PriorityCritical) {
		t.Error("priority numbers differ")
	}
	if admissionv1.Outcome_OUTCOME_OK != admissionv1.Outcome(admission.ReleaseOK) ||
		admissionv1.Outcome_OUTCOME_ERROR != admissionv1.Outcome(admission.ReleaseError) {
		t.Error("release outcome numbers differ")
	}
}
