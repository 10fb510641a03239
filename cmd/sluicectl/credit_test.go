package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/controlplane"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
)

// credit freeze and thaw, through etcd and through a server that follows
// etcd; domains and config status show the freeze; bad flags are refused.
func TestCreditFreezeThaw(t *testing.T) {
	etcd := etcdtest.Start(t)
	srv := startSluiced(t, etcd.Endpoint())
	addr := srv.GRPCAddr().String()
	t.Setenv("USER", "alice")
	t.Setenv("SLUICE_ETCD", "")
	frozen := func(want bool) func() bool {
		return func() bool { _, ok := srv.Engine().CreditFrozen(); return ok == want }
	}

	code, out, errs := sluicectl("credit", "freeze", "--for", "5m", "--reason", "incident 42", "--etcd", etcd.Endpoint())
	if code != 0 || !strings.Contains(out, "burst credit frozen until") || !strings.Contains(out, "every replica") || !strings.Contains(out, "by alice") {
		t.Fatalf("credit freeze --etcd: %d %q %q", code, out, errs)
	}
	eventually(t, "the server frozen", frozen(true))
	code, out, errs = sluicectl("domains", "--server", addr, "--etcd", etcd.Endpoint())
	if code != 0 || strings.Count(out, "burst credit: FROZEN until") != 2 || !strings.Contains(out, "incident 42") {
		t.Fatalf("domains while frozen: %d %q\n%s", code, errs, out)
	}
	code, out, errs = sluicectl("config", "status", "--server", addr)
	if code != 0 || !strings.Contains(out, "burst credit: FROZEN until") || !strings.Contains(out, "incident 42") {
		t.Fatalf("config status while frozen: %d %q\n%s", code, errs, out)
	}
	code, out, errs = sluicectl("credit", "thaw", "--etcd", etcd.Endpoint(), "-o", "json")
	if code != 0 || !strings.Contains(out, `"wasFrozen": true`) {
		t.Fatalf("credit thaw --etcd: %d %q %q", code, out, errs)
	}
	eventually(t, "the server thawed", frozen(false))

	// Through the server: it writes the key itself, as it follows etcd.
	code, out, errs = sluicectl("credit", "freeze", "--for", "1m", "--server", addr)
	if code != 0 || !strings.Contains(out, "by "+addr) {
		t.Fatalf("credit freeze --server: %d %q %q", code, out, errs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if m, ok, err := controlplane.GetCreditFreeze(ctx, etcd.Client(t), controlplane.DefaultPrefix); err != nil || !ok || time.Until(m.Until) > time.Minute {
		t.Fatalf("the freeze in etcd: %+v %v %v", m, ok, err)
	}
	if code, out, errs = sluicectl("credit", "thaw", "--server", addr); code != 0 || !strings.Contains(out, "thawed") {
		t.Fatalf("credit thaw --server: %d %q %q", code, out, errs)
	}
	if code, out, _ = sluicectl("credit", "thaw", "--server", addr); code != 0 || !strings.Contains(out, "was not frozen") {
		t.Fatalf("a second thaw: %d %q", code, out)
	}

	for _, args := range [][]string{
		{"credit"}, {"credit", "melt"}, {"credit", "freeze", "--server", addr},
		{"credit", "freeze", "--for", "169h", "--server", addr}, {"credit", "freeze", "--for", "-1m", "--server", addr},
		{"credit", "thaw", "extra"},
	} {
		if code, _, _ := sluicectl(args...); code == 0 {
			t.Errorf("%v succeeded", args)
		}
	}
}

// A domain back from a drain shows its warm-up ramp in domains.
func TestDomainsShowWarmup(t *testing.T) {
	srv := startSluiced(t, "")
	addr := srv.GRPCAddr().String()
	if code, out, errs := sluicectl("drain", "nvl72-b", "--server", addr); code != 0 {
		t.Fatalf("drain: %d %q %q", code, out, errs)
	}
	if code, out, errs := sluicectl("undrain", "nvl72-b", "--server", addr); code != 0 {
		t.Fatalf("undrain: %d %q %q", code, out, errs)
	}
	code, out, errs := sluicectl("domains", "--server", addr)
	if code != 0 || !strings.Contains(out, "CAPACITY") {
		t.Fatalf("domains: %d %q\n%s", code, errs, out)
	}
	for l := range strings.SplitSeq(out, "\n") {
		switch {
		case strings.HasPrefix(l, "nvl72-b ") && !strings.Contains(l, "warming 25%"):
			t.Errorf("the undrained domain: %q, want warming 25%%", l)
		case strings.HasPrefix(l, "nvl72-a ") && !strings.Contains(l, " full "):
			t.Errorf("a domain present from the start: %q, want full", l)
		}
	}
	rows := domainsJSON(t, "--server", addr)
	if r := rows["nvl72-b"]; r.WarmupFraction < 0.25 || r.WarmupFraction > 0.26 || r.WarmupLeftSeconds <= 0 || rows["nvl72-a"].WarmupFraction != 1 {
		t.Fatalf("domains -o json: %+v %+v", r, rows["nvl72-a"])
	}
}
