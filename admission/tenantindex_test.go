package admission

import (
	"fmt"
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// The index holds what a map of the same changes holds, through hash
// collisions (a hash that collides often stands in for maphash) and the
// rebuilds that reclaim removed entries' room.
func TestTenantIndexActsAsAMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tiers := map[string]TierPolicy{"gold": {}, "bronze": {}}
		model := map[string]TenantConfig{}
		x := newTenantIndex(model, tiers)
		if rapid.Bool().Draw(t, "colliding hash") {
			x.hash = func(s string) uint64 { return uint64(len(s) % 3) }
		}
		names := rapid.IntRange(1, 3000).Draw(t, "names")
		for range rapid.IntRange(1, 400).Draw(t, "steps") {
			name := fmt.Sprint("t", rapid.IntRange(0, names).Draw(t, "name"))
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0, 1:
				tc := TenantConfig{Tier: rapid.SampledFrom([]string{"gold", "bronze"}).Draw(t, "tier")}
				if rapid.Bool().Draw(t, "overrides") {
					tc.TenantOverrides = &TenantOverrides{Weight: ptr(rapid.Int64Range(1, 9).Draw(t, "weight"))}
				}
				x.set(name, tc)
				model[name] = tc
			case 2:
				x.remove(name)
				delete(model, name)
			case 3: // a burst of tenants, some with overrides
				for i := range 1500 {
					tc := TenantConfig{Tier: "gold"}
					if i%7 == 0 {
						tc.TenantOverrides = &TenantOverrides{Weight: ptr(int64(i))}
					}
					n := fmt.Sprint("t", i)
					x.set(n, tc)
					model[n] = tc
				}
			case 4: // a burst of removals, past the rebuild's threshold
				for i := range 1200 {
					n := fmt.Sprint("t", i)
					x.remove(n)
					delete(model, n)
				}
			}
			if x.len() != len(model) {
				t.Fatalf("len %d, want %d", x.len(), len(model))
			}
		}
		if got := x.toMap(); !reflect.DeepEqual(got, model) {
			t.Fatalf("index holds %v, want %v", got, model)
		}
		for name, tc := range model {
			if got, ok := x.get(name); !ok || got.Tier != tc.Tier {
				t.Fatalf("get(%s) = %+v, %v; want %+v", name, got, ok, tc)
			}
		}
		if _, ok := x.get("absent"); ok {
			t.Fatal("an absent name was found")
		}
		if !slices.IsSorted(x.sortedNames()) || len(x.sortedNames()) != len(model) {
			t.Fatal("sortedNames is not every name, sorted")
		}
	})
}
