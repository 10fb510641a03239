package replay

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
)

// deferredMix is the test mix with acme on medium: on large a third of
// acme's prompts are too large for the shared part of a domain less
// deferral.headroom, so they could never run as deferred work.
const deferredMix = "acme:medium:0.4,globex:medium:0.3,initech:small:0.2,hooli:small:0.1"

// deferredBurstRows is a short scaled replay of the code trace: trace
// minutes 4 to 7 at 3× speed, acme bursting 15× for 30 s of trace time
// on top of the steady traffic, half of its burst deferrable.
func deferredBurstRows(t *testing.T) []Row {
	t.Helper()
	mix, err := ParseMix(deferredMix)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ParseBurst("acme:15x:300s-330s")
	rows, err := LoadTrace(codeTrace, TraceOptions{Mix: mix, Seed: 1, From: 4 * time.Minute, To: 7 * time.Minute, Speed: 3,
		Bursts: []Burst{b}, DeferrableShare: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestDeferredBurst: under sluice no deferrable request of the burst is
// lost, the tenants that do not burst are never refused within their
// share and every floor holds every second, and the backlog drains after
// the burst; the baselines, for which the same requests are ordinary,
// lose a large share of them.
func TestDeferredBurst(t *testing.T) {
	cfg, cl := setup(t)
	rows := deferredBurstRows(t)
	c, err := Compare("code", 1, rows, Options{Config: cfg, Cluster: cl, Deadline: 2 * time.Second}, []string{PolicySluice, PolicyFIFO, PolicyTenantBuckets})
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := c.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", table.String())
	sl := c.Reports[0].Deferral
	switch {
	case sl == nil:
		t.Fatal("sluice: no deferral report")
	case sl.Deferrable < 150 || sl.Interactive < 150:
		t.Fatalf("the burst has %d deferrable and %d other requests, want ≥ 150 of each", sl.Deferrable, sl.Interactive)
	case sl.Lost != 0:
		t.Errorf("sluice lost %d of %d deferrable requests: %v", sl.Lost, sl.Deferrable, sl.LostBy)
	case sl.Tickets < sl.Deferrable/2:
		t.Errorf("sluice deferred %d of %d: the burst did not fill the cluster", sl.Tickets, sl.Deferrable)
	}
	if sl.WithinShareRefused != 0 || sl.FloorViolations != 0 || sl.BurstFloorViolations != 0 {
		t.Errorf("sluice: %d refusals within share, %d floor violation seconds (burster %d), want none",
			sl.WithinShareRefused, sl.FloorViolations, sl.BurstFloorViolations)
	}
	if !(sl.DrainS > 0) || !(sl.DrainRate > 0) {
		t.Errorf("sluice: drained %.1f s after the last deferrable arrival at %.0f tok/s, want a drain after the burst", sl.DrainS, sl.DrainRate)
	}
	worst := 0.0
	for _, r := range c.Reports[1:] {
		d := r.Deferral
		lost := float64(d.Lost) / float64(d.Deferrable)
		worst = max(worst, lost)
		if lost < 0.2 {
			t.Errorf("%s lost %.1f%% of the deferrable requests, want ≥ 20%% (they are ordinary requests there)", r.Policy, 100*lost)
		}
		if d.Tickets != 0 || len(d.Shares) != 0 {
			t.Errorf("%s: %d tickets, %d shares: a baseline has no backlog", r.Policy, d.Tickets, len(d.Shares))
		}
	}
	if worst < 0.4 {
		t.Errorf("the worst baseline lost %.1f%% of the deferrable requests, want ≥ 40%%", 100*worst)
	}
	v := c.Verdict()
	i := len(v.Measures) - 1
	if m := v.Measures[i]; m.Name != "deferrable requests lost" || len(m.Winners) != 1 || m.Winners[0] != PolicySluice {
		t.Errorf("verdict's last measure %q, best %v: want deferrable requests lost, sluice", m.Name, m.Winners)
	}
	for _, want := range []string{"deferrable work: ", "ticket wait p50 ms", "deferrable requests lost"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("the table has no %q", want)
		}
	}
	var page bytes.Buffer
	if err := c.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), `<table class="deferral">`) {
		t.Error("the HTML report has no deferral table")
	}
}

// TestDeferredReplayIsDeterministic: the deliveries of one Step reach the
// worker from concurrent goroutines, and ticket ids are random; the
// report must not depend on either.
func TestDeferredReplayIsDeterministic(t *testing.T) {
	cfg, cl := setup(t)
	opts := Options{Config: cfg, Cluster: cl, Deadline: 2 * time.Second}
	a := compareJSON(t, deferredBurstRows(t), opts, PolicySluice)
	b := compareJSON(t, deferredBurstRows(t), opts, PolicySluice)
	if !bytes.Equal(a, b) {
		t.Fatal("two replays of the same deferred burst differ")
	}
}

// TestDeferredSharesFollowWeights: two tenants of weights 8 and 4 (acme
// and globex, their quotas raised so that capacity, not quota, holds
// them) each defer 800 requests of one size within 10 s, far beyond the
// cluster; while both wait in the backlog, each one's share of the
// deferred work admitted is within 5% of its weight's.
func TestDeferredSharesFollowWeights(t *testing.T) {
	cfg, cl := setup(t)
	for _, tier := range []string{"enterprise", "premium"} {
		p := cfg.Tiers[tier]
		p.Tokens = admission.Limit{Rate: 1e6, Burst: 2e6}
		p.RPS = admission.Limit{Rate: 1e4, Burst: 2e4}
		cfg.Tiers[tier] = p
	}
	var rows []Row
	for i := range 800 {
		at := time.Duration(i) * 10 * time.Second / 800
		for _, tenant := range []string{"acme", "globex"} {
			rows = append(rows, Row{At: at, Tenant: tenant, Model: "medium", Prompt: 2000, Output: 50, Line: len(rows) + 2, Burst: true, Deferrable: true})
		}
	}
	r, err := Run(rows, Options{Policy: PolicySluice, Config: cfg, Cluster: cl})
	if err != nil {
		t.Fatal(err)
	}
	d := r.Deferral
	if d.Lost != 0 || d.Tickets < 1000 {
		t.Fatalf("lost %d of %d, %d tickets: want none lost, most deferred", d.Lost, d.Deferrable, d.Tickets)
	}
	if len(d.Shares) != 2 {
		t.Fatalf("shares %+v, want acme's and globex's", d.Shares)
	}
	for _, sh := range d.Shares {
		want := map[string]float64{"acme": 8.0 / 12, "globex": 4.0 / 12}[sh.Tenant]
		t.Logf("%s: weight %d, %d deferred tokens, share %.4f, weighted share %.4f (%+.2f%%)", sh.Tenant, sh.Weight, sh.Tokens, sh.Share, sh.Fair, 100*sh.Off())
		if math.Abs(sh.Fair-want) > 1e-9 {
			t.Errorf("%s: weighted share %.4f, want %.4f (both wait throughout)", sh.Tenant, sh.Fair, want)
		}
		if math.Abs(sh.Off()) > 0.05 {
			t.Errorf("%s: share %.4f, %+.1f%% off its weighted share %.4f, want within 5%%", sh.Tenant, sh.Share, 100*sh.Off(), sh.Fair)
		}
	}
}

// TestDeferrableShareMarksBurstRows: the share marks the bursts' rows
// only, about that share of them, and needs a burst.
func TestDeferrableShareMarksBurstRows(t *testing.T) {
	b, _ := ParseBurst("acme:15x:300s-330s")
	rows := codeRows(t, TraceOptions{To: 7 * time.Minute, Bursts: []Burst{b}, DeferrableShare: 0.5})
	burst, marked := 0, 0
	for _, r := range rows {
		// A copy arrives within the gap to its row's next: maybe past
		// the window's end.
		inWindow := r.Tenant == "acme" && r.At >= 300*time.Second && r.At < 330*time.Second
		if inWindow && !r.Burst || r.Burst && (r.Tenant != "acme" || r.At < 300*time.Second) {
			t.Fatalf("row at %v of %s: Burst %v", r.At, r.Tenant, r.Burst)
		}
		if r.Deferrable && !r.Burst {
			t.Fatalf("row at %v of %s: deferrable outside the burst", r.At, r.Tenant)
		}
		if r.Burst {
			burst++
		}
		if r.Deferrable {
			marked++
		}
	}
	if f := float64(marked) / float64(burst); burst < 100 || f < 0.4 || f > 0.6 {
		t.Errorf("%d of %d burst rows deferrable, want about half", marked, burst)
	}
	// The copies and their offsets do not depend on the share.
	plain := codeRows(t, TraceOptions{To: 7 * time.Minute, Bursts: []Burst{b}})
	if len(plain) != len(rows) {
		t.Fatalf("%d rows without the share, %d with it", len(plain), len(rows))
	}
	for i := range plain {
		if plain[i].At != rows[i].At || plain[i].Tenant != rows[i].Tenant || plain[i].Deferrable {
			t.Fatalf("row %d: %+v without the share, %+v with it", i, plain[i], rows[i])
		}
	}
	for _, tc := range []struct {
		opts TraceOptions
		want string
	}{
		{TraceOptions{DeferrableShare: 0.5}, "there is no --burst"},
		{TraceOptions{DeferrableShare: 1.5, Bursts: []Burst{b}}, "must be in [0, 1]"},
		{TraceOptions{DeferrableShare: math.NaN(), Bursts: []Burst{b}}, "must be in [0, 1]"},
	} {
		mix, _ := ParseMix(testMix)
		tc.opts.Mix = mix
		if _, err := LoadTrace(codeTrace, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.opts.DeferrableShare, err, tc.want)
		}
	}
}
