package server

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission/sharing"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
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
		fields, err := rdb.HKeys(ctx, "{sluice/t/acme}/tok").Result()
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

// With etcd membership a batched replica's holding of each domain's KV
// lasts in Redis until its member lease would expire (a dead replica's
// capacity comes back to the others when the membership says it is gone),
// not the lease TTL (10 minutes by default) nor, as without a membership,
// sharing.SilentHoldRounds intervals; without etcd, those intervals.
func TestKVHoldingFollowsTheMemberLease(t *testing.T) {
	rs := redistest.Start(t)
	rdb := rs.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// heldFor is how long Redis keeps the replica's holding of every
	// domain's KV past now, once the replica has reported.
	heldFor := func(prefix string) []time.Duration {
		t.Helper()
		var out []time.Duration
		eventually(t, func() bool {
			keys, err := rdb.Keys(ctx, "{"+prefix+"/d/*}/kv").Result()
			if err != nil || len(keys) == 0 {
				return false
			}
			tm, err := rdb.Time(ctx).Result()
			if err != nil {
				return false
			}
			out = out[:0]
			for _, k := range keys {
				fields, err := rdb.HGetAll(ctx, k).Result()
				if err != nil {
					return false
				}
				for f, v := range fields {
					if strings.HasPrefix(f, "u:") {
						us, _ := strconv.ParseFloat(v, 64)
						out = append(out, time.UnixMicro(int64(us)).Sub(tm))
					}
				}
			}
			return len(out) == len(keys)
		})
		return out
	}
	etcd := etcdtest.Start(t)
	eo := etcdOpts(etcd.Endpoint())
	eo.MemberTTL = 6 * time.Second
	start(t, Options{Topology: "simulated", Etcd: eo, Shared: SharedOptions{RedisURL: rs.URL(), Mode: "batched", Prefix: "member"}})
	hold := sharing.SilentHoldRounds * 100 * time.Millisecond
	for _, d := range heldFor("member") {
		// At least 2/3 of the TTL ahead (keepalives every third of it),
		// at most the TTL.
		if d < 3*time.Second || d > eo.MemberTTL {
			t.Errorf("with etcd: the holding outlives the replica's last report by %v, want until its member lease expires (%v TTL)", d, eo.MemberTTL)
		}
	}
	start(t, Options{Topology: "simulated", Shared: SharedOptions{RedisURL: rs.URL(), Mode: "batched", Prefix: "alone"}})
	for _, d := range heldFor("alone") {
		if d <= 0 || d > hold {
			t.Errorf("without etcd: the holding outlives the replica's last report by %v, want %v", d, hold)
		}
	}
}
