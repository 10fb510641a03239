package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/state/redistest"
)

// Two sluiced replicas on one real redis-server, batched: both admit, both
// reconcile (Redis sees their replicas), and /metrics exports the link.
func TestTwoReplicasShareStateThroughRedis(t *testing.T) {
	rs := redistest.Start(t)
	shared := SharedOptions{RedisURL: rs.URL(), Mode: "batched", Replicas: 2}
	a, ca, _, _ := start(t, Options{Topology: "simulated", Shared: shared})
	_, cb, _, _ := start(t, Options{Topology: "simulated", Shared: shared})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []interface {
		Admit(context.Context, *admissionv1.AdmitRequest) (*admissionv1.AdmitResponse, error)
	}{ca, cb} {
		resp, err := c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "acme", Model: "small", PromptTokens: 100, MaxOutputTokens: 10})
		if err != nil || resp.GetDecision() != admissionv1.Decision_ADMITTED {
			t.Fatalf("Admit: %v %v", resp, err)
		}
	}
	rdb := rs.Client()
	eventually(t, func() bool {
		fields, err := rdb.HKeys(ctx, "{sluice}:t/acme/tok").Result()
		if err != nil {
			return false
		}
		replicas := 0
		for _, f := range fields {
			if strings.HasPrefix(f, "c:") {
				replicas++
			}
		}
		return replicas == 2
	})
	resp, err := http.Get("http://" + a.HTTPAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"sluice_shared_breaker_open 0", "sluice_shared_replicas 2", "sluice_shared_redis_calls_total", `sluice_shared_overage_applied_total{bucket="tokens"}`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestRedisFlagsAreChecked(t *testing.T) {
	for _, o := range []SharedOptions{
		{RedisURL: "localhost:6379"},
		{RedisURL: "redis://127.0.0.1:1", Mode: "eventual"},
	} {
		if _, err := New(Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Topology: "simulated", Shared: o}); err == nil {
			t.Errorf("New accepted %+v", o)
		}
	}
}
