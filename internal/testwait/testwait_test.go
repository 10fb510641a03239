package testwait

import (
	"testing"
	"time"
)

// recorder is a testing.TB that records a failure instead of stopping.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = format
	panic(r) // as Fatal stops the goroutine
}

func TestUntil(t *testing.T) {
	n := 0
	Until(t, time.Second, "three polls", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Errorf("polled %d times, want 3", n)
	}
	r := &recorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		Until(r, 20*time.Millisecond, "never", func() bool { return false })
	}()
	if r.failed == "" {
		t.Error("a condition that never holds did not fail the test")
	}
}
