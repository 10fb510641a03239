package main

import (
	"bytes"
	"strings"
	"testing"
)

// --seeds prints the feedback table once per seed, each headed by its
// seed, and refuses a list that is not one of distinct seeds.
func TestReplayFeedbackSeeds(t *testing.T) {
	args := []string{"replay", "feedback", "--trace", replayTrace, "--mix", replayMix, "--to", "1m", "--config", replayConfig, "--topology", replayCluster}
	var out, errw bytes.Buffer
	if code := run(append(args, "--seeds", "1,2"), &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	for _, want := range []string{"seed 1,", "seed 2,"} {
		if n := strings.Count(out.String(), want); n != 1 {
			t.Errorf("%q %d times in the output, want once:\n%s", want, n, out.String())
		}
	}
	for _, tc := range []struct{ seeds, want string }{
		{"1,x", `"x" is not a seed`},
		{"2,2", "seed 2 twice"},
	} {
		errw.Reset()
		if code := run(append(args, "--seeds", tc.seeds), &bytes.Buffer{}, &errw); code == 0 || !strings.Contains(errw.String(), tc.want) {
			t.Errorf("--seeds %s: exit %d, stderr %q, want an error naming %q", tc.seeds, code, errw.String(), tc.want)
		}
	}
}
