package admission

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"sigs.k8s.io/yaml"

	"github.com/sluice-sched/sluice/internal/clock"
)

// TestScenarios runs the engine scenarios in testdata/ on a manual clock.
// Each file is a script of commands; the expected output is the printed
// state, rewritten with `go test ./admission -run TestScenarios -rewrite`.
//
//	init domains=N          a cluster of N HGX H200 nodes (d1…dN); the body
//	                        is a YAML config (tiers, tenants, knobs)
//	admit tenant=T model=M prompt=P output=O [accept=m1,m2] [id=X] [critical]
//	                        submit one request; queued requests get a #n
//	burst tenant=T model=M prompt=P output=O n=K
//	                        submit K identical requests; print a summary
//	advance D               move the clock by D (a Go duration) and Tick;
//	                        prints the queued requests answered
//	release lease=N output=O [error]
//	drain D [reason=R] / undrain D
//	print                   domains and active tenants
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/scenarios", func(t *testing.T, path string) {
		var s scenario
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return s.run(t, d)
		})
	})
}

type scenario struct {
	h       *harness
	queued  []*waiter
	ids     map[*waiter]int
	nextNum int
}

func (s *scenario) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "init":
		var n int
		d.ScanArgs(t, "domains", &n)
		var cfg Config
		if err := yaml.UnmarshalStrict([]byte(d.Input), &cfg); err != nil {
			return "config: " + err.Error()
		}
		clk := clock.NewManual(epoch)
		e, err := New(cfg, hgxCluster(t, n), WithClock(clk))
		if err != nil {
			return "error: " + err.Error()
		}
		s.h = &harness{t: t, clk: clk, e: e}
		s.ids = map[*waiter]int{}
		return ""
	case "admit":
		r := s.request(t, d)
		if d.HasArg("id") {
			d.ScanArgs(t, "id", &r.RequestID)
		}
		if d.HasArg("critical") {
			r.Priority = PriorityCritical
		}
		return s.submit(r)
	case "burst":
		r := s.request(t, d)
		var n int
		d.ScanArgs(t, "n", &n)
		counts := map[string]int{}
		for i := 0; i < n; i++ {
			out := s.submit(r)
			counts[strings.Fields(out)[0]]++
		}
		return summarize(counts)
	case "advance":
		dur, err := time.ParseDuration(strings.TrimSpace(d.CmdArgs[0].Key))
		if err != nil {
			t.Fatal(err)
		}
		s.h.advance(dur)
		var b strings.Builder
		var still []*waiter
		for _, w := range s.queued {
			if answered(w) {
				fmt.Fprintf(&b, "#%d %s\n", s.ids[w], formatDecision(w.decision))
			} else {
				still = append(still, w)
			}
		}
		s.queued = still
		return b.String()
	case "release":
		var lease uint64
		var output int64
		d.ScanArgs(t, "lease", &lease)
		d.ScanArgs(t, "output", &output)
		outcome := ReleaseOK
		if d.HasArg("error") {
			outcome = ReleaseError
		}
		id := s.leaseID(lease)
		res, err := s.h.e.Release(context.Background(), Release{LeaseID: id, OutputTokens: output, Outcome: outcome})
		if err != nil {
			return "error: " + err.Error()
		}
		return fmt.Sprintf("released from %s: refunded %d tokens, cost %d µ$", res.Domain, res.RefundedTokens, res.ActualCostMicros)
	case "drain", "undrain":
		id := d.CmdArgs[0].Key
		var err error
		if d.Cmd == "drain" {
			reason := ""
			if d.HasArg("reason") {
				d.ScanArgs(t, "reason", &reason)
			}
			err = s.h.e.Drain(id, reason)
		} else {
			err = s.h.e.Undrain(id)
		}
		if err != nil {
			return "error: " + err.Error()
		}
		return ""
	case "print":
		return s.print()
	}
	t.Fatalf("unknown command %q", d.Cmd)
	return ""
}

func (s *scenario) request(t *testing.T, d *datadriven.TestData) Request {
	var r Request
	d.ScanArgs(t, "tenant", &r.Tenant)
	d.ScanArgs(t, "model", &r.Model)
	d.ScanArgs(t, "prompt", &r.PromptTokens)
	d.ScanArgs(t, "output", &r.MaxOutputTokens)
	if d.HasArg("accept") {
		var accept string
		d.ScanArgs(t, "accept", &accept)
		r.AcceptDowngrade = strings.Split(accept, ",")
	}
	return r
}

func (s *scenario) submit(r Request) string {
	if err := validateRequest(&r); err != nil {
		return "error: " + err.Error()
	}
	dec, w, err := s.h.e.admit(context.Background(), &r)
	if err != nil {
		return "error: " + err.Error()
	}
	if w != nil {
		s.nextNum++
		s.ids[w] = s.nextNum
		s.queued = append(s.queued, w)
		return fmt.Sprintf("QUEUED #%d", s.nextNum)
	}
	return formatDecision(dec)
}

// leaseID maps a scenario's lease number (the slot shown in answers) back
// to the engine's id: scenarios print the low half, which is the slot+1.
func (s *scenario) leaseID(n uint64) uint64 {
	var id uint64
	s.h.e.mu.Lock()
	if slot := uint32(n) - 1; int(slot) < len(s.h.e.mu.leases.slots) {
		id = uint64(s.h.e.mu.leases.slots[slot].gen)<<32 | n
	}
	s.h.e.mu.Unlock()
	return id
}

func formatDecision(d Decision) string {
	switch d.Outcome {
	case Admitted, Degraded:
		out := fmt.Sprintf("%s lease=%d domain=%s model=%s", d.Outcome, uint32(d.LeaseID), d.Domain, d.Model)
		if d.Outcome == Degraded {
			out += " path=" + strings.Join(d.DowngradePath, ">")
		}
		if d.Trace.Floor {
			out += " floor"
		}
		if d.Trace.Critical {
			out += " critical"
		}
		if d.Queued > 0 {
			out += " queued=" + d.Queued.String()
		}
		return out + fmt.Sprintf(" quota=%d>%d", d.Trace.QuotaBefore, d.Trace.QuotaAfter)
	}
	return fmt.Sprintf("%s %s retry_after=%s", d.Outcome, d.Reason, d.RetryAfter)
}

func summarize(counts map[string]int) string {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, counts[k]))
	}
	return strings.Join(parts, " ")
}

func (s *scenario) print() string {
	var b strings.Builder
	for _, d := range s.h.e.Domains() {
		state := ""
		if d.Draining {
			state = " draining(" + d.DrainReason + ")"
		}
		fmt.Fprintf(&b, "domain %s: prefill %.0f%% decode %.0f%% kv %.1f%% reserved %.0f%% in-flight %d weight %.2f%s\n",
			d.ID, pct(d.PrefillLevel, d.PrefillBurst), pct(d.DecodeLevel, d.DecodeBurst), pct(d.KVInUse, d.KVLimit),
			100*d.ReservedFrac, d.InFlight, d.HealthWeight, state)
	}
	for _, ti := range s.h.e.Tenants() {
		fmt.Fprintf(&b, "tenant %s: tokens %d/%d credit %d in-flight %d queued %d", ti.Name, ti.TokenLevel, ti.TokenBurst, ti.Credit, ti.InFlight, ti.Queued)
		if ti.BreakerOpen {
			b.WriteString(" breaker-open")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func pct(v, of int64) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(v) / float64(of)
}
