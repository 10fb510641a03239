package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/internal/replay"
)

// TestReplayDeferrableShare: --deferrable-share marks the burst's rows,
// sluice defers them and every report says what became of them.
func TestReplayDeferrableShare(t *testing.T) {
	args := []string{"replay", "--trace", replayTrace, "--mix", replayMix, "--config", replayConfig, "--topology", replayCluster,
		"--from", "4m", "--to", "6m", "--speed", "3", "--burst", "acme:15x:300s-330s", "--deferrable-share", "0.5",
		"--defer-within", "10m", "--deadline", "2s", "-o", "json"}
	var out, errw bytes.Buffer
	if code := run(args, &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	var c replay.Comparison
	if err := json.Unmarshal(out.Bytes(), &c); err != nil {
		t.Fatalf("-o json is not JSON: %v", err)
	}
	for _, r := range c.Reports {
		if d := r.Deferral; d == nil || d.Deferrable == 0 || d.Deferrable+d.Interactive != d.Burst {
			t.Errorf("%s: deferral %+v", r.Policy, d)
		}
	}
	if d := c.Reports[0].Deferral; d == nil || d.Tickets == 0 {
		t.Errorf("sluice deferred nothing: %+v", d)
	}
}

func TestReplayDeferralErrors(t *testing.T) {
	base := []string{"replay", "--trace", replayTrace, "--mix", replayMix, "--config", replayConfig, "--topology", replayCluster}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(base, "--deferrable-share", "0.5"), "there is no --burst"},
		{append(base, "--burst", "acme:2x:1s-2s", "--deferrable-share", "2"), "--deferrable-share 2: must be in [0, 1]"},
		{append(base, "--defer-within", "-1s"), "--defer-within -1s"},
	} {
		var out, errw bytes.Buffer
		if code := run(tc.args, &out, &errw); code == 0 || !strings.Contains(errw.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want an error with %q", tc.args[len(base):], code, errw.String(), tc.want)
		}
	}
}
