package replay

import (
	"fmt"
	"math"
)

// DowngradeComparison is sluice on the same rows without lower tiers and
// with every request accepting its model's (Options.Downgrade): whether
// degrading costs the cluster utilization or a tenant admitted work.
type DowngradeComparison struct {
	Not, Allowed *Report
	// UtilNot and UtilAllowed are the cluster's utilization (the engines'
	// with them on, else the mean of the domains') over the longer of the
	// two replays: the work done in the same time. A replay that does
	// more work may end a little later, which its own utilization would
	// count against it.
	UtilNot, UtilAllowed float64
	// LeastTenant is the tenant with the smallest ratio of weighted tokens
	// admitted with lower tiers to those without; LeastRatio is the ratio
	// (1 for a tenant admitted nothing either way).
	LeastTenant string
	LeastRatio  float64
}

// CompareDowngrade replays rows under sluice with opts, without lower tiers
// and with them.
func CompareDowngrade(rows []Row, opts Options) (*DowngradeComparison, error) {
	opts.Policy = PolicySluice
	c := &DowngradeComparison{}
	var err error
	opts.Downgrade = false
	if c.Not, err = Run(rows, opts); err != nil {
		return nil, fmt.Errorf("without lower tiers: %w", err)
	}
	opts.Downgrade = true
	if c.Allowed, err = Run(rows, opts); err != nil {
		return nil, fmt.Errorf("with lower tiers: %w", err)
	}
	if span := math.Max(c.Not.Seconds, c.Allowed.Seconds); span > 0 {
		c.UtilNot = utilization(c.Not) * c.Not.Seconds / span
		c.UtilAllowed = utilization(c.Allowed) * c.Allowed.Seconds / span
	}
	not := map[string]int64{}
	for i := range c.Not.Tenants {
		not[c.Not.Tenants[i].Name] = sum(c.Not.Tenants[i].Achieved)
	}
	c.LeastRatio = math.Inf(1)
	for i := range c.Allowed.Tenants {
		t := &c.Allowed.Tenants[i]
		ratio := 1.0
		if n := not[t.Name]; n > 0 {
			ratio = float64(sum(t.Achieved)) / float64(n)
		}
		if ratio < c.LeastRatio {
			c.LeastTenant, c.LeastRatio = t.Name, ratio
		}
	}
	if math.IsInf(c.LeastRatio, 1) {
		c.LeastRatio = 1
	}
	return c, nil
}

// sum is the sum of per-second figures (a tenant's Achieved: the weighted
// tokens it was admitted, on any tier; its Target).
func sum(perS []int64) int64 {
	var n int64
	for _, v := range perS {
		n += v
	}
	return n
}
