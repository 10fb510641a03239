package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/internal/replay"
)

// recommendJSON runs recommend with args and -o json and returns its plan.
func recommendJSON(t *testing.T, args ...string) replay.Plan {
	t.Helper()
	var out, errw bytes.Buffer
	if code := run(append(append([]string{"recommend", "--trace", replayTrace, "--mix", replayMix}, args...), "-o", "json"), &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	var p replay.Plan
	if err := json.Unmarshal(out.Bytes(), &p); err != nil {
		t.Fatalf("-o json is not a plan: %v", err)
	}
	return p
}

// Without --target-p99 the rate is the sweep's knee, replayed alone and
// together on the cluster.
func TestRecommendCommand(t *testing.T) {
	p := recommendJSON(t)
	if p.By != "knee" || len(p.Tenants) != 4 || len(p.Together) != 4 || p.Capacity.Domains == 0 {
		t.Fatalf("by %s, %d tenants, %d together, capacity %+v", p.By, len(p.Tenants), len(p.Together), p.Capacity)
	}
	for _, r := range p.Tenants {
		if r.Rate <= 0 || r.Burst < r.LargestReq || len(r.Sweep) == 0 || !r.InConfig || r.Alone.Requests != r.Requests {
			t.Errorf("%s: R %d, C %d, largest request %d, %d sweep points, alone %+v", r.Tenant, r.Rate, r.Burst, r.LargestReq, len(r.Sweep), r.Alone)
		}
	}
}

// With --target-p99 each rate is searched for on the cluster --config and
// --topology give, and the replay together says met or not met.
func TestRecommendTargetFlag(t *testing.T) {
	p := recommendJSON(t, "--to", "5m", "--target-p99", "1500ms", "--config", replayConfig, "--topology", replayCluster)
	if p.By != "target" || p.TargetMs != 1500 || len(p.Together) != 4 || p.Capacity.Domains != 4 {
		t.Fatalf("by %s, target %v ms, %d together, %d domains", p.By, p.TargetMs, len(p.Together), p.Capacity.Domains)
	}
	for i, r := range p.Tenants {
		if len(r.Search) == 0 || len(r.Search) > replay.MaxSearchReplays {
			t.Errorf("%s: %d search replays", r.Tenant, len(r.Search))
		}
		if r.TargetMet && !r.Alone.Meets(1500) {
			t.Errorf("%s: met with p99 %s ms alone", r.Tenant, r.Alone)
		}
		if tr := p.Together[i]; tr.Met == nil || *tr.Met != tr.Wait.Meets(1500) {
			t.Errorf("%s together: %+v", r.Tenant, tr)
		}
	}
	var out, errw bytes.Buffer
	args := []string{"recommend", "--trace", replayTrace, "--mix", replayMix, "--to", "5m", "--target-p99", "1500ms", "--config", replayConfig, "--topology", replayCluster}
	if code := run(args, &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	for _, want := range []string{"smallest meeting p99 1.5s", "rate search", "p99 together ms", "capacity: 4 domains", "flags:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRecommendFlagErrors(t *testing.T) {
	base := []string{"recommend", "--trace", replayTrace, "--mix", replayMix}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--target-p99", "soon"}, `invalid argument "soon" for "--target-p99" flag`},
		{[]string{"--target-p99", "2"}, `invalid argument "2" for "--target-p99" flag`},
		{[]string{"--target-p99", "-1s"}, "--target-p99 -1s: must be at least 1ms"},
		{[]string{"--target-p99", "10us"}, "--target-p99 10µs: must be at least 1ms"},
		{[]string{"--output-token-weight", "3"}, "--output-token-weight 3: the config's output_token_weight is 4"},
		{[]string{"--config", "nope.yaml"}, "nope.yaml"},
		{[]string{"--topology", "nope.yaml"}, "nope.yaml"},
		{[]string{"--target-p99", "1s", "--config", replayConfig, "--mix", "wayne:small:1"}, `tenant "wayne" is not in the config`},
	} {
		var out, errw bytes.Buffer
		if code := run(append(base, tc.args...), &out, &errw); code == 0 || !strings.Contains(errw.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want it to contain %q", tc.args, code, errw.String(), tc.want)
		}
	}
}
