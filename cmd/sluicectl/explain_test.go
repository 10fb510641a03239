package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// explain asks a live sluiced what Admit would do: the verdict, every gate
// and the domains looked at, as a table or JSON; nothing is charged.
func TestExplain(t *testing.T) {
	srv := startPlain(t)
	addr := srv.GRPCAddr().String()
	code, out, errs := sluicectl("explain", "--server", addr, "--tenant", "acme", "--model", "large", "--accept", "medium")
	if code != 0 {
		t.Fatalf("explain: %d %s", code, errs)
	}
	for _, want := range []string{"would be: ADMITTED on ", "GATE", "tokens", "pass", "MODEL", "large"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain output lacks %q:\n%s", want, out)
		}
	}
	if n := srv.Engine().LeaseCount(); n != 0 {
		t.Errorf("explain took %d leases", n)
	}
	// hooli's token bucket (8000, no credit) can never hold a request 10×
	// its burst: REQUEST_TOO_LARGE, refused at the tokens gate, no retry.
	code, out, errs = sluicectl("explain", "--server", addr, "--tenant", "hooli", "--model", "small", "--prompt", "80000")
	if code != 0 || !strings.Contains(out, "would be: REJECTED REQUEST_TOO_LARGE\n") {
		t.Fatalf("too large: %d %s\n%s", code, errs, out)
	}
	code, out, errs = sluicectl("explain", "--server", addr, "--tenant", "hooli", "--model", "small", "--prompt", "80000", "-o", "json")
	if code != 0 {
		t.Fatalf("explain -o json: %d %s", code, errs)
	}
	var x struct {
		Outcome string `json:"outcome"`
		Reason  string `json:"reason"`
		Gates   []struct {
			Gate   string `json:"gate"`
			Passed bool   `json:"passed"`
		} `json:"gates"`
	}
	if err := json.Unmarshal([]byte(out), &x); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if x.Outcome != "REJECTED" || x.Reason != "REASON_REQUEST_TOO_LARGE" || len(x.Gates) != 6 || x.Gates[4].Gate != "tokens" || x.Gates[4].Passed {
		t.Fatalf("too large: %+v", x)
	}
	if code, _, errs := sluicectl("explain", "--server", addr, "--tenant", "acme"); code == 0 || !strings.Contains(errs, "--model") {
		t.Fatalf("without --model: %d %q", code, errs)
	}
	if code, _, errs := sluicectl("explain", "--server", addr, "--tenant", "acme", "--model", "huge"); code == 0 || !strings.Contains(errs, "model") {
		t.Fatalf("unknown model: %d %q", code, errs)
	}
}
