package admission

import (
	"fmt"
	"reflect"
	"testing"

	"pgregory.net/rapid"
)

// One tenant's change applied alone does what Apply of the whole config
// with that change does: the same config in force, the same tenants' state
// and domains' reserves, the same floors' total and highest weight, and the
// same refusal (which then changes nothing).
func TestUpdateTenantsActsAsApplyWould(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := testConfig()
		cfg.Tenants = map[string]TenantConfig{}
		drawTenant := func(label string) TenantConfig {
			tc := TenantConfig{Tier: rapid.SampledFrom([]string{"gold", "bronze", "lead"}).Draw(t, label+" tier")}
			o := &TenantOverrides{}
			if rapid.Bool().Draw(t, label+" own floor") {
				o.Floor = ptr(rapid.Int64Range(0, 40_000).Draw(t, label+" floor"))
			}
			if rapid.Bool().Draw(t, label+" own weight") {
				o.Weight = ptr(rapid.Int64Range(0, 64).Draw(t, label+" weight"))
			}
			if *o != (TenantOverrides{}) {
				tc.TenantOverrides = o
			}
			return tc
		}
		for i := range rapid.IntRange(1, 8).Draw(t, "tenants") {
			tc := drawTenant(fmt.Sprint("t", i))
			tc.Tier = "bronze"
			tc.TenantOverrides = nil
			cfg.Tenants[fmt.Sprint("t", i)] = tc
		}
		cluster := hgxCluster(t, 2)
		alone, whole := newHarness(t, cfg, cluster), newHarness(t, cfg, cluster)
		for _, h := range []*harness{alone, whole} { // some tenants active
			for name := range cfg.Tenants {
				if name != "t0" {
					h.admit(req(name, "small", 100, 10))
				}
			}
		}
		for step := range rapid.IntRange(1, 6).Draw(t, "steps") {
			var updates []TenantUpdate
			next := whole.e.Config()
			for range rapid.IntRange(1, 3).Draw(t, "changes") {
				name := fmt.Sprint("t", rapid.IntRange(0, 10).Draw(t, "name"))
				u := TenantUpdate{Name: name, Remove: rapid.IntRange(0, 3).Draw(t, "remove") == 0}
				if !u.Remove {
					u.Config = drawTenant(name)
				}
				updates = append(updates, u)
			}
			errAlone := alone.e.UpdateTenants(updates)
			seen := map[string]bool{}
			twice := false
			for _, u := range updates {
				twice = twice || seen[u.Name]
				seen[u.Name] = true
				if u.Remove {
					delete(next.Tenants, u.Name)
				} else {
					next.Tenants[u.Name] = u.Config
				}
			}
			if twice {
				if errAlone == nil {
					t.Fatalf("step %d: a tenant changed twice in one update was not refused", step)
				}
				continue
			}
			errWhole := whole.e.Apply(next)
			if fmt.Sprint(errAlone) != fmt.Sprint(errWhole) {
				t.Fatalf("step %d: UpdateTenants says %v, Apply says %v", step, errAlone, errWhole)
			}
			if a, w := alone.e.Config(), whole.e.Config(); !reflect.DeepEqual(a, w) {
				t.Fatalf("step %d: configs differ:\nalone %+v\nwhole %+v", step, a.Tenants, w.Tenants)
			}
			if a, w := alone.e.Tenants(), whole.e.Tenants(); !reflect.DeepEqual(a, w) {
				t.Fatalf("step %d: tenants differ:\nalone %+v\nwhole %+v", step, a, w)
			}
			if a, w := alone.e.Domains(), whole.e.Domains(); !reflect.DeepEqual(a, w) {
				t.Fatalf("step %d: domains differ:\nalone %+v\nwhole %+v", step, a, w)
			}
			pa, pw := &alone.e.mu.place, &whole.e.mu.place
			if pa.floorTotal != pw.floorTotal || pa.maxWeight != pw.maxWeight {
				t.Fatalf("step %d: floors %d and highest weight %d alone, %d and %d whole",
					step, pa.floorTotal, pa.maxWeight, pw.floorTotal, pw.maxWeight)
			}
		}
	})
}
