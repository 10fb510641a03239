package server

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/metrics"
)

// metricsConfig has ten busy tenants whose quotas never bind and 10,000
// tenants with a tight token bucket and burst credit ten times its rate.
func metricsConfig(tight int) string {
	var b strings.Builder
	// degrade_after 0: the clock stands still, so a degradable request
	// must not wait for its tier.
	b.WriteString(`queue: {degrade_after: 0s}
tiers:
  gold:
    rps: {rate: 1e9, burst: 1e9}
    tokens: {rate: 1e12, burst: 1e12}
    weight: 4
  tight:
    rps: {rate: 1e9, burst: 1e9}
    tokens: {rate: 1000, burst: 1000}
    burst_credit: {multiple: 10, window: 1h}
    weight: 1
tenants:
`)
	for i := range 10 {
		fmt.Fprintf(&b, "  busy-%d: {tier: gold}\n", i)
	}
	for i := range tight {
		fmt.Fprintf(&b, "  t%05d: {tier: tight}\n", i)
	}
	return b.String()
}

// scrape reads /metrics in the text format.
func scrape(t *testing.T, srv *Server) map[string]*dto.MetricFamily {
	t.Helper()
	r, err := http.Get("http://" + srv.HTTPAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// series returns the metrics of family name whose labels include want.
func series(fams map[string]*dto.MetricFamily, name string, want map[string]string) []*dto.Metric {
	var out []*dto.Metric
	for _, m := range fams[name].GetMetric() {
		match := 0
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
				match++
			}
		}
		if match == len(want) {
			out = append(out, m)
		}
	}
	return out
}

// value is the value of the one metric of name with labels want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	ms := series(fams, name, want)
	if len(ms) != 1 {
		t.Fatalf("%s%v: %d series, want 1", name, want, len(ms))
	}
	m := ms[0]
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	t.Fatalf("%s%v: no value", name, want)
	return 0
}

// TestMetricsScrapeBoundedTenants drives a real sluiced with 10,010 tenants,
// scrapes /metrics and parses it: every tenant-labelled family keeps at most
// --metrics-max-tenant-series names plus "other", the busiest tenants take
// the names at the next scrape, and each series the SRE view needs is there.
// The clock stands still, so no bucket refills and every figure is exact.
func TestMetricsScrapeBoundedTenants(t *testing.T) {
	const maxSeries, tight = 50, 10000
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, []byte(metricsConfig(tight)), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, c, _, _ := start(t, Options{ConfigPath: path, Clock: clock.NewManual(time.Now()),
		Metrics: metrics.Options{MaxTenantSeries: maxSeries}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admit := func(tenant, model string, prompt, output int64, accept ...string) *admissionv1.AdmitResponse {
		t.Helper()
		resp, err := c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: tenant, Model: model, PromptTokens: prompt,
			MaxOutputTokens: output, AcceptDowngrade: accept})
		if err != nil {
			t.Fatalf("Admit %s: %v", tenant, err)
		}
		return resp
	}

	// Every tight tenant decides once (the first 50 seen are named at once),
	// then the busy ones 30 times each.
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < tight; i += 8 {
				if r := admit(fmt.Sprintf("t%05d", i), "small", 10, 1); r.GetDecision() != admissionv1.Decision_ADMITTED {
					t.Errorf("t%05d: %v", i, r)
				}
			}
		})
	}
	wg.Wait()
	for i := range 10 {
		for range 30 {
			admit(fmt.Sprintf("busy-%d", i), "small", 10, 1)
		}
	}
	first := scrape(t, srv) // ranks: the busy tenants take names from the one-off ones
	if got := value(t, first, "sluice_metrics_max_tenant_series", nil); got != maxSeries {
		t.Fatalf("sluice_metrics_max_tenant_series = %v", got)
	}

	// A tight tenant that stayed named borrows from its burst credit, then
	// is refused; a gold tenant is degraded and another waits in the queue.
	named := ""
	for _, m := range series(first, "sluice_tenant_decisions_total", map[string]string{"decision": "ADMITTED"}) {
		for _, l := range m.GetLabel() {
			if l.GetName() == "tenant" && strings.HasPrefix(l.GetValue(), "t") {
				named = l.GetValue()
			}
		}
	}
	if named == "" {
		t.Fatal("no tight tenant is named")
	}
	for i := range 10 {
		admit(fmt.Sprintf("busy-%d", i), "small", 10, 1)
	}
	admit(named, "small", 10, 1)
	// 5000 + 4×1000 = 9000 weighted tokens from a bucket at 1000-2×14:
	// 8,028 borrowed; the same again would pass the credit of 10,000.
	if r := admit(named, "small", 5000, 1000); r.GetDecision() != admissionv1.Decision_ADMITTED {
		t.Fatalf("borrowing admit: %v", r)
	}
	if r := admit(named, "small", 5000, 1000); r.GetReason() != admissionv1.Reason_REASON_QUOTA_EXCEEDED {
		t.Fatalf("over the credit: %v", r)
	}
	eng := srv.Engine()
	for _, d := range eng.Domains() {
		if d.ID != "hgx-h200-1" {
			if err := eng.Drain(d.ID, "test"); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := 0; ; i++ { // fill hgx-h200-1: a large request that would wait is refused at once
		short, cancelShort := context.WithTimeout(ctx, time.Millisecond)
		resp, err := c.Admit(short, &admissionv1.AdmitRequest{Tenant: "busy-0", Model: "large", PromptTokens: 6000, MaxOutputTokens: 10})
		cancelShort()
		if err == nil && resp.GetDecision() == admissionv1.Decision_REJECTED {
			break
		}
		if i > 10000 {
			t.Fatal("never filled")
		}
	}
	if r := admit("busy-1", "large", 6000, 10, "medium", "small"); r.GetDecision() != admissionv1.Decision_DEGRADED {
		t.Fatalf("want a degradation: %v", r)
	}
	waitCtx, stopWaiting := context.WithCancel(ctx)
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		_, _ = c.Admit(waitCtx, &admissionv1.AdmitRequest{Tenant: "busy-2", Model: "large", PromptTokens: 6000, MaxOutputTokens: 10})
	}()
	eventually(t, func() bool { return eng.QueueLen() == 1 })

	fams := scrape(t, srv)
	// Bounded: every tenant-labelled family names at most maxSeries tenants,
	// plus "other", though 10,010 tenants decided.
	tenantFamilies := 0
	for name, f := range fams {
		tenants := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tenant" {
					tenants[l.GetValue()] = true
				}
			}
		}
		if len(tenants) == 0 {
			continue
		}
		tenantFamilies++
		if len(tenants) > maxSeries+1 {
			t.Errorf("%s: %d tenant label values, want at most %d", name, len(tenants), maxSeries+1)
		}
	}
	if tenantFamilies < 9 {
		t.Errorf("%d tenant-labelled families, want the 9 of docs/metrics.md", tenantFamilies)
	}
	// The busiest took names; the one-off tenants are "other".
	for i := range 10 {
		tenant := fmt.Sprintf("busy-%d", i)
		if got := value(t, fams, "sluice_tenant_decisions_total", map[string]string{"tenant": tenant, "decision": "ADMITTED"}); got < 1 {
			t.Errorf("%s admitted %v", tenant, got)
		}
	}
	if got := value(t, fams, "sluice_tenant_decisions_total", map[string]string{"tenant": metrics.OtherTenant, "decision": "ADMITTED"}); got < tight-maxSeries {
		t.Errorf("other admitted %v, want at least %d", got, tight-maxSeries)
	}
	// Refusals per tenant and reason; burst credit consumed; bucket levels.
	if got := value(t, fams, "sluice_tenant_decisions_total", map[string]string{"tenant": named, "decision": "REJECTED", "reason": "QUOTA_EXCEEDED"}); got != 1 {
		t.Errorf("%s refusals = %v, want 1", named, got)
	}
	if got := value(t, fams, "sluice_tenant_burst_credit_consumed_tokens_total", map[string]string{"tenant": named}); got != 9000-(1000-2*14) {
		t.Errorf("%s credit consumed = %v", named, got)
	}
	if got := value(t, fams, "sluice_tenant_token_bucket_level_tokens", map[string]string{"tenant": named}); got != -(9000 - (1000 - 2*14)) {
		t.Errorf("%s bucket level = %v", named, got)
	}
	if got := value(t, fams, "sluice_tenant_burst_credit_debt_tokens", map[string]string{"tenant": named}); got != 9000-(1000-2*14) {
		t.Errorf("%s debt = %v", named, got)
	}
	if got := value(t, fams, "sluice_tenant_burst_credit_limit_tokens", map[string]string{"tenant": named}); got != 10000 {
		t.Errorf("%s credit limit = %v", named, got)
	}
	// Degradation, per tenant and in total.
	if got := value(t, fams, "sluice_tenant_decisions_total", map[string]string{"tenant": "busy-1", "decision": "DEGRADED"}); got != 1 {
		t.Errorf("busy-1 degraded = %v", got)
	}
	if got := value(t, fams, "sluice_degraded_total", nil); got != 1 {
		t.Errorf("sluice_degraded_total = %v", got)
	}
	// The queue: per tenant, the rest, and per tier and model.
	if got := value(t, fams, "sluice_tenant_queue_length", map[string]string{"tenant": "busy-2"}); got != 1 {
		t.Errorf("busy-2 queue length = %v", got)
	}
	if got := value(t, fams, "sluice_tenant_queue_length", map[string]string{"tenant": metrics.OtherTenant}); got != 0 {
		t.Errorf("other queue length = %v", got)
	}
	if got := value(t, fams, "sluice_queue_depth", map[string]string{"tier": "gold", "model": "large"}); got != 1 {
		t.Errorf("queue depth gold/large = %v", got)
	}
	// Domain utilization: the filled domain's prefill bucket is mostly used.
	if got := value(t, fams, "sluice_domain_utilization_ratio", map[string]string{"domain": "hgx-h200-1", "phase": "prefill"}); got <= 0.5 || got > 1 {
		t.Errorf("hgx-h200-1 prefill utilization = %v", got)
	}
	if got := len(series(fams, "sluice_domain_utilization_ratio", map[string]string{"phase": "decode"})); got != len(eng.Domains()) {
		t.Errorf("decode utilization: %d series, want one per domain", got)
	}
	// Domain use and load: a series per domain (and phase), as DomainInfo
	// gives them.
	for _, d := range eng.Domains() {
		if got := value(t, fams, "sluice_domain_use_ratio", map[string]string{"domain": d.ID, "phase": "prefill"}); got != d.PrefillUse {
			t.Errorf("%s prefill use = %v, want %v", d.ID, got, d.PrefillUse)
		}
		if got := value(t, fams, "sluice_domain_load_ratio", map[string]string{"domain": d.ID}); got != d.Load {
			t.Errorf("%s load = %v, want %v", d.ID, got, d.Load)
		}
	}
	if got := len(series(fams, "sluice_domain_use_ratio", map[string]string{"phase": "decode"})); got != len(eng.Domains()) {
		t.Errorf("decode use: %d series, want one per domain", got)
	}
	// Admit latency by tenant and model: the decision of busy-3 after it
	// was named (the 30 before count as "other"), with classic buckets.
	if got := value(t, fams, "sluice_admit_latency_seconds", map[string]string{"tenant": "busy-3", "model": "small"}); got != 1 {
		t.Errorf("busy-3 latency samples = %v, want 1", got)
	}
	lat := series(fams, "sluice_admit_latency_seconds", map[string]string{"tenant": "busy-1", "model": "large"})
	if len(lat) != 1 || len(lat[0].GetHistogram().GetBucket()) < 10 {
		t.Errorf("busy-1 large latency: want classic buckets, got %v", lat)
	}
	if got := value(t, fams, "sluice_admit_latency_sla_seconds", nil); got != 2 {
		t.Errorf("SLA = %v", got)
	}

	stopWaiting()
	<-waited
	eventually(t, func() bool {
		return value(t, scrape(t, srv), "sluice_queue_depth", map[string]string{"tier": "gold", "model": "large"}) == 0
	})
}

// TestMetricsNativeHistogram scrapes /metrics in the protobuf format, which
// carries native histograms: the Admit latency has a schema and spans as
// well as its classic buckets.
func TestMetricsNativeHistogram(t *testing.T) {
	srv, c, _, _ := start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "acme", Model: "small", PromptTokens: 10, MaxOutputTokens: 10}); err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+srv.HTTPAddr().String()+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeProtoDelim)))
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	dec := expfmt.NewDecoder(r.Body, expfmt.ResponseFormat(r.Header))
	for {
		var f dto.MetricFamily
		if err := dec.Decode(&f); err != nil {
			t.Fatalf("no sluice_admit_latency_seconds in the protobuf scrape: %v", err)
		}
		if f.GetName() != "sluice_admit_latency_seconds" {
			continue
		}
		h := f.GetMetric()[0].GetHistogram()
		if h.GetSchema() != 3 || len(h.GetPositiveSpan()) == 0 || len(h.GetBucket()) == 0 {
			t.Fatalf("want a native histogram (schema 3, spans) with classic buckets: %v", h)
		}
		return
	}
}

// A domain back from a drain reports its warm-up ramp, the others 1; a
// credit freeze shows while it lasts.
func TestMetricsWarmupAndCreditFreeze(t *testing.T) {
	srv, _, _, _ := start(t, Options{Clock: clock.NewManual(time.Now())})
	eng := srv.Engine()
	if err := eng.Drain("nvl72-b", "test"); err != nil {
		t.Fatal(err)
	}
	if err := eng.Undrain("nvl72-b"); err != nil {
		t.Fatal(err)
	}
	eng.FreezeCreditFor(time.Hour, "test")
	fams := scrape(t, srv)
	if got := value(t, fams, "sluice_domain_warmup_fraction", map[string]string{"domain": "nvl72-b"}); got != 0.25 {
		t.Errorf("nvl72-b warm-up = %v, want 0.25 (the clock stands still)", got)
	}
	if got := value(t, fams, "sluice_domain_warmup_fraction", map[string]string{"domain": "nvl72-a"}); got != 1 {
		t.Errorf("nvl72-a warm-up = %v, want 1", got)
	}
	if got := value(t, fams, "sluice_burst_credit_frozen", nil); got != 1 {
		t.Errorf("sluice_burst_credit_frozen = %v, want 1", got)
	}
	if got := value(t, fams, "sluice_burst_credit_frozen_seconds", nil); got <= 0 || got > 3600 {
		t.Errorf("sluice_burst_credit_frozen_seconds = %v", got)
	}
	eng.ThawCredit()
	if got := value(t, scrape(t, srv), "sluice_burst_credit_frozen", nil); got != 0 {
		t.Errorf("after the thaw, sluice_burst_credit_frozen = %v, want 0", got)
	}
}

// gRPC calls are counted by method and code, and the invalid ones by the
// field they named.
func TestGRPCCallsAndInvalidRequestsAreCounted(t *testing.T) {
	srv, c, _, _ := start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		if _, err := c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "acme", Model: "large", PromptTokens: 0, MaxOutputTokens: 1}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("bad Admit: %v", err)
		}
	}
	if _, err := c.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: "l-1", CachedPromptTokens: -1}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad Release: %v", err)
	}
	fams := scrape(t, srv)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"sluice_invalid_requests_total", map[string]string{"method": "/sluice.admission.v1.Admission/Admit", "field": "prompt_tokens"}, 3},
		{"sluice_invalid_requests_total", map[string]string{"method": "/sluice.admission.v1.Admission/Release", "field": "cached_prompt_tokens"}, 1},
		{"grpc_server_handled_total", map[string]string{"grpc_method": "Admit", "grpc_code": "InvalidArgument"}, 3},
		{"grpc_server_handled_total", map[string]string{"grpc_method": "ListDomains", "grpc_code": "OK"}, 0}, // every method has its series
	} {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}
