// Package testdep finds the programs Sluice's tests run for real (a
// redis-server, chromium, promtool): a test on a machine without one skips,
// but under CI=true, where .ci/run installs them, it fails, so that a
// missing dependency can never make CI pass by skipping.
package testdep

import (
	"os"
	"os/exec"
	"testing"
)

// Binary returns the path of the first of names on PATH. Without any, the
// test fails when CI=true and skips otherwise; install says how to get one
// (e.g. "apt-get install -y redis-server").
func Binary(t testing.TB, install string, names ...string) string {
	t.Helper()
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	Missing(t, "%v not found on PATH (%s)", names, install)
	return ""
}

// Missing stops a test that lacks something of the machine it runs on (a
// program, a route): it skips, but fails under CI=true, where the machine
// is set up to have everything the suite needs.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format+"; CI must provide it", args...)
	}
	t.Skipf(format+"; under CI=true this fails", args...)
}
