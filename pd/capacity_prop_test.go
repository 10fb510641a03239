package pd

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/sluice-sched/sluice/topology"
)

// TestCapacityInvariants drives a domain through random sequences of
// charge-if-fits (shared or floor), release (with fewer or more output
// tokens than charged), reserve changes, capacity factors and time
// advances, and checks after
// every step that no bucket exceeds its burst or falls below minus its
// burst, that KV in use stays within [0, limit], and that shared charges
// never take a bucket below its reserve nor KV into the KV reserve.
func TestCapacityInvariants(t *testing.T) {
	cat := defaultCatalog(t)
	models := []*Model{get(t, cat, "large"), get(t, cat, "medium"), get(t, cat, "small")}
	sim := topology.Simulated()
	rapid.Check(t, func(t *rapid.T) {
		d, _ := sim.Domain(rapid.SampledFrom([]string{"hgx-h200-1", "nvl72-a"}).Draw(t, "domain"))
		c, err := NewDomainCapacity(d, cat, Config{BurstSeconds: rapid.Float64Range(0.1, 4).Draw(t, "burst_seconds")}, 0)
		if err != nil {
			t.Fatal(err)
		}
		type lease struct {
			m      *Model
			p, o   int64
			charge Cost
		}
		var leases []lease
		now := int64(0)
		check := func(what string) {
			p, dec := c.Levels(now)
			inUse, limit := c.KV()
			if p > c.PrefillBurst() || dec > c.DecodeBurst() || p < -c.PrefillBurst() || dec < -c.DecodeBurst() {
				t.Fatalf("%s: levels %d, %d outside ±bursts %d, %d", what, p, dec, c.PrefillBurst(), c.DecodeBurst())
			}
			if inUse < 0 || inUse > limit {
				t.Fatalf("%s: KV in use %d outside [0, %d]", what, inUse, limit)
			}
		}
		t.Repeat(map[string]func(*rapid.T){
			"admit": func(t *rapid.T) {
				m := rapid.SampledFrom(models).Draw(t, "model")
				p := rapid.Int64Range(0, 200_000).Draw(t, "prompt")
				o := rapid.Int64Range(0, 20_000).Draw(t, "output")
				floor := rapid.Bool().Draw(t, "floor")
				cost, err := c.Cost(m, p, o)
				if err != nil {
					t.Fatal(err)
				}
				if !c.Fits(now, cost, floor) {
					if !c.CanEverFit(cost) && c.RetryAfter(now, cost, floor) == 0 {
						t.Fatalf("%+v can never fit, yet RetryAfter is 0", cost)
					}
					return
				}
				c.Charge(now, cost)
				leases = append(leases, lease{m, p, o, cost})
				pl, dl := c.Levels(now)
				resP, resD, resKV := c.Reserves()
				inUse, limit := c.KV()
				if !floor && (pl < resP || dl < resD || inUse > limit-resKV) {
					t.Fatalf("shared charge left %d, %d (reserves %d, %d), KV %d of %d − %d", pl, dl, resP, resD, inUse, limit, resKV)
				}
				if floor && (pl < 0 || dl < 0) {
					t.Fatalf("floor charge left %d, %d", pl, dl)
				}
				check("admit")
			},
			"release": func(t *rapid.T) {
				if len(leases) == 0 {
					return // nothing held: this step does nothing (not a missing dependency)
				}
				i := rapid.IntRange(0, len(leases)-1).Draw(t, "lease")
				l := leases[i]
				leases = append(leases[:i], leases[i+1:]...)
				actualOut := rapid.Int64Range(0, 2*l.o).Draw(t, "actual output")
				actual, err := c.Cost(l.m, l.p, actualOut)
				if err != nil {
					t.Fatal(err)
				}
				_, before := c.Levels(now)
				inUse, _ := c.KV()
				c.Release(now, l.charge, actual)
				_, after := c.Levels(now)
				if actualOut <= l.o && after != min(before+l.charge.DecodeBytes-actual.DecodeBytes, c.DecodeBurst()) {
					t.Fatalf("release refunded %d, want %d", after-before, l.charge.DecodeBytes-actual.DecodeBytes)
				}
				if got, _ := c.KV(); got != inUse-l.charge.KVBytes {
					t.Fatalf("release freed %d KV, want %d", inUse-got, l.charge.KVBytes)
				}
				check("release")
			},
			"advance": func(t *rapid.T) {
				now += rapid.Int64Range(0, 2*sec).Draw(t, "ns")
				check("advance")
			},
			"factor": func(t *rapid.T) {
				f := rapid.Int64Range(FactorFull/10, 4*FactorFull).Draw(t, "factor")
				c.SetFactor(now, f)
				priorP, priorD := c.PriorRates()
				if want, _ := mulDiv(uint64(priorP), uint64(f), FactorFull); abs64(c.PrefillRate()-want) > 1 {
					t.Fatalf("factor %d: prefill rate %d, want %d", f, c.PrefillRate(), want)
				}
				if want, _ := mulDiv(uint64(priorD), uint64(f), FactorFull); abs64(c.DecodeRate()-want) > 1 {
					t.Fatalf("factor %d: decode rate %d, want %d", f, c.DecodeRate(), want)
				}
				check("factor")
			},
			"reserve": func(t *rapid.T) {
				f := rapid.Float64Range(0, 1).Draw(t, "fraction")
				c.SetReserve(int64(f*float64(c.PrefillRate())), int64(f*float64(c.DecodeRate())))
				check("reserve")
			},
		})
	})
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
