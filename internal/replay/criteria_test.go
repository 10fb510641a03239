package replay

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// The acceptance criteria replay the whole code trace on the test
// cluster while acme, the heaviest tenant, bursts 15× for a minute of
// ordinary load (the trace's 6th minute), every request with a 2 s
// deadline, under sluice and fifo.
const (
	burster     = "acme"
	burstSpec   = "acme:15x:300s-360s"
	burstFactor = 10 // sluice must beat fifo by this factor
)

var (
	burstOnce            sync.Once
	burstSluice, burstFF *Report
	burstErr             error
)

func burstReports(t *testing.T) (sluice, fifo *Report) {
	t.Helper()
	burstOnce.Do(func() {
		cfg, cl := setup(t)
		b, _ := ParseBurst(burstSpec)
		rows := codeRows(t, TraceOptions{Bursts: []Burst{b}})
		c, err := Compare("code", 1, rows, Options{Config: cfg, Cluster: cl, Deadline: 2 * time.Second}, []string{PolicySluice, PolicyFIFO})
		if err != nil {
			burstErr = err
			return
		}
		burstSluice, burstFF = c.Reports[0], c.Reports[1]
	})
	if burstErr != nil {
		t.Fatal(burstErr)
	}
	return burstSluice, burstFF
}

// ownLimited reports whether the tenant was refused by its own limits
// (quota, credit, budget, concurrency): it asked for more than its quota,
// so "within its quota" does not hold for it.
func ownLimited(t *TenantReport) bool {
	for r := range t.Rejected {
		switch r {
		case "QUOTA_EXCEEDED", "BURST_CREDIT_EXHAUSTED", "BUDGET_EXHAUSTED", "CONCURRENCY_EXCEEDED":
			return true
		}
	}
	return false
}

// criteria evaluates the done criteria on a sluice and a fifo report of
// the same replay, returning a line of figures per tenant and the
// failures.
func criteria(sl, ff *Report) (figures, failures []string) {
	var slViol, ffViol int
	for i := range sl.Tenants {
		s, f := &sl.Tenants[i], &ff.Tenants[i]
		if s.Name == burster {
			continue
		}
		within := !ownLimited(s)
		figures = append(figures, fmt.Sprintf("%-8s within quota %-5v refused sluice %d %v / fifo %d; p99 wait sluice %.1f ms / fifo %.1f ms; floor violations sluice %d / fifo %d",
			s.Name, within, s.Refused(), s.Rejected, f.Refused(), s.WaitP99, f.WaitP99, s.FloorViolations, f.FloorViolations))
		slViol += s.FloorViolations
		ffViol += f.FloorViolations
		if s.Floor > 0 && s.FloorViolations > 0 {
			failures = append(failures, fmt.Sprintf("%s: floor %d tok/s not held in %d simulated seconds", s.Name, s.Floor, s.FloorViolations))
		}
		if within && s.Refused() > 0 {
			failures = append(failures, fmt.Sprintf("%s: within its quota, refused %d times: %v", s.Name, s.Refused(), s.Rejected))
		}
		if within && s.WaitP99 >= 2000 {
			failures = append(failures, fmt.Sprintf("%s: p99 wait %.1f ms, want < 2 s", s.Name, s.WaitP99))
		}
		if f.WaitP99 < burstFactor*s.WaitP99 || f.WaitP99 == 0 {
			failures = append(failures, fmt.Sprintf("%s: p99 wait sluice %.1f ms, fifo %.1f ms: want fifo ≥ %d× sluice", s.Name, s.WaitP99, f.WaitP99, burstFactor))
		}
	}
	figures = append(figures, fmt.Sprintf("others' floor violations: sluice %d s, fifo %d s; spanning: sluice %d, fifo %d", slViol, ffViol, sl.Spanning, ff.Spanning))
	if ffViol == 0 {
		failures = append(failures, "fifo violated no floor: the burst does not saturate the cluster")
	} else if ffViol < burstFactor*slViol {
		failures = append(failures, fmt.Sprintf("floor violations: sluice %d s, fifo %d s: want fifo ≥ %d× sluice", slViol, ffViol, burstFactor))
	}
	if sl.Spanning != 0 || ff.Spanning != 0 {
		failures = append(failures, fmt.Sprintf("requests spanning two domains: sluice %d, fifo %d", sl.Spanning, ff.Spanning))
	}
	return figures, failures
}

// TestCodeTraceBurst asserts the done criteria: no request spans two
// domains; every other tenant within its quota is never refused and waits
// p99 < 2 s; every floor holds every simulated second; and sluice beats
// fifo by 10× on the other tenants' p99 wait and on floor violations.
func TestCodeTraceBurst(t *testing.T) {
	sl, ff := burstReports(t)
	figures, failures := criteria(sl, ff)
	t.Log("\n" + strings.Join(figures, "\n"))
	for _, f := range failures {
		t.Error(f)
	}
}
