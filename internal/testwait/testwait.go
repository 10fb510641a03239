// Package testwait is the polling wait that Sluice's tests share: they wait
// on a condition with a deadline, never for a fixed time.
package testwait

import (
	"testing"
	"time"
)

// Until polls cond every few milliseconds until it holds, and fails the
// test if it still does not after within; what says what was awaited.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		<-tick.C
	}
}
