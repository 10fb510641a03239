package drill

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"time"
)

// Soak runs drills back to back for d, each chosen at random (seeded) with a
// random target and random phase lengths around o's, on one fleet under the
// same load, and gathers every report: the faults of the list at random
// times, every promise checked throughout. A drill the fleet cannot run
// (no etcd, no hooks) is not chosen.
func Soak(ctx context.Context, f *Fleet, d time.Duration, o Options, seed uint64) *Summary {
	rng := rand.New(rand.NewPCG(seed, 0x50a6))
	var pool []*drillSpec
	for i := range drills {
		if drills[i].soakable(f, o) {
			pool = append(pool, &drills[i])
		}
	}
	sum := &Summary{Held: true}
	defer func() { t := sum.totals(); sum.Totals = &t }()
	// between draws a length in [base/2, 3·base/2).
	between := func(base time.Duration) time.Duration {
		return base/2 + time.Duration(rng.Int64N(int64(base)))
	}
	start := time.Now()
	for i := 0; time.Since(start) < d && ctx.Err() == nil; i++ {
		dr := pool[rng.IntN(len(pool))]
		name, target := dr.name, ""
		if f.Local != nil && dr.soakTarget != nil {
			target = dr.soakTarget(f.Local, rng)
		}
		do := o
		do.Before, do.During, do.After = between(o.Before), between(o.During), between(o.After)
		if dr.burst {
			do.BurstFor = between(o.BurstFor)
		}
		do.Seed = o.Seed + uint64(i)
		if o.Log != nil {
			fmt.Fprintf(o.Log, "soak: %v in, drill %d: %s %s\n", time.Since(start).Round(time.Second), i+1, name, target)
		}
		rep, err := Run(ctx, f, name, target, do)
		if err != nil {
			if ctx.Err() == nil {
				sum.Held = false
				sum.Errors = append(sum.Errors, fmt.Sprintf("%s %s: %v", name, target, err))
			}
			continue
		}
		sum.Reports = append(sum.Reports, rep)
		sum.Held = sum.Held && rep.Held
	}
	return sum
}

// SoakTotals adds up a soak's reports: drills run, Admits sent, lost and
// past their deadline, placements after a mark, and the promises broken
// (by name, with how often).
type SoakTotals struct {
	Drills       map[string]int `json:"drills"`
	Sent         int64          `json:"sent"`
	Lost         int64          `json:"lost"`
	PastDeadline int64          `json:"pastDeadline"`
	AfterMark    int64          `json:"placementsAfterMark"`
	Broken       map[string]int `json:"broken,omitempty"`
	// WorstRecover is the longest time to recover, in seconds.
	WorstRecover float64 `json:"worstTimeToRecoverS"`
}

// totals adds up the summary's reports.
func (s *Summary) totals() SoakTotals {
	t := SoakTotals{Drills: map[string]int{}, Broken: map[string]int{}}
	for _, r := range s.Reports {
		t.Drills[r.Drill]++
		for _, p := range r.Phases {
			t.Sent += p.Sent
			t.Lost += p.Lost
			t.PastDeadline += p.PastDeadline
			if p.Forbidden != nil {
				t.AfterMark += *p.Forbidden
			}
		}
		for _, p := range r.Promises {
			if !p.Held {
				t.Broken[r.Drill+": "+p.Name]++
			}
		}
		if r.RecoverSeconds != nil {
			t.WorstRecover = max(t.WorstRecover, *r.RecoverSeconds)
		}
	}
	return t
}

// WriteTotals prints the totals as a few lines.
func (t SoakTotals) WriteTotals(w io.Writer) error {
	total := 0
	var parts []string
	for _, n := range sortedKeys(t.Drills) {
		total += t.Drills[n]
		parts = append(parts, fmt.Sprintf("%s ×%d", n, t.Drills[n]))
	}
	fmt.Fprintf(w, "soak: %d drills (%s); %d Admits, %d lost, %d past their deadline, %d placements after a mark; worst time to recover %.2fs\n",
		total, strings.Join(parts, ", "), t.Sent, t.Lost, t.PastDeadline, t.AfterMark, t.WorstRecover)
	for _, k := range sortedKeys(t.Broken) {
		if _, err := fmt.Fprintf(w, "  broken %d×: %s\n", t.Broken[k], k); err != nil {
			return fmt.Errorf("write totals: %w", err)
		}
	}
	return nil
}
