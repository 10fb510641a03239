package admission

import (
	"cmp"
	"slices"

	"github.com/sluice-sched/sluice/pd"
)

// TenantUpdate is one tenant's new entry, or its removal.
type TenantUpdate struct {
	Name   string
	Config TenantConfig // the entry; ignored when Remove is set
	Remove bool
}

// UpdateTenants changes the named tenants alone, as Apply of the config in
// force with those tenants changed would, at the cost of the changes rather
// than of every tenant (one tenant's change among a million). The changes
// are checked together against the tiers in force and the floors' new total
// against the cluster's capacity; a refusal (a *ConfigError naming the key)
// changes nothing. An active tenant keeps its levels under its new policy; a
// removed one is forgotten: new requests are UNKNOWN_TENANT, while its
// leases and queued requests finish.
func (e *Engine) UpdateTenants(updates []TenantUpdate) error {
	updates = slices.Clone(updates)
	slices.SortStableFunc(updates, func(a, b TenantUpdate) int { return cmp.Compare(a.Name, b.Name) })
	for i := 1; i < len(updates); i++ {
		if updates[i].Name == updates[i-1].Name {
			return cfgErr("tenants."+updates[i].Name, "changed twice in one update")
		}
	}
	for i := range updates {
		updates[i].Config = updates[i].Config.clone() // the engine keeps its own copy
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	cfg, p, index := e.mu.cfg, &e.mu.place, e.mu.gates.index
	floorTotal := p.floorTotal
	for _, u := range updates {
		if old, ok := index.get(u.Name); ok {
			pol, _ := cfg.policyOf(old)
			floorTotal -= pol.Floor
		}
		if u.Remove {
			continue
		}
		if err := cfg.validateTenant(u.Name, u.Config); err != nil {
			return err
		}
		pol, _ := cfg.policyOf(u.Config)
		floorTotal += pol.Floor
	}
	caps := make([]*pd.DomainCapacity, 0, len(p.domains))
	for _, d := range p.domains {
		caps = append(caps, d.cap)
	}
	if err := checkFloorsFit(p.cat, caps, floorTotal, cfg.OutputTokenWeight); err != nil {
		return err
	}
	// Commit: nothing below can fail.
	now := e.nowLocked()
	for _, u := range updates {
		if old, ok := index.get(u.Name); ok {
			pol, _ := cfg.policyOf(old)
			p.unweigh(pol.Weight)
		}
		if u.Remove {
			index.remove(u.Name)
		} else {
			index.set(u.Name, u.Config)
			pol, _ := cfg.policyOf(u.Config)
			p.weights[pol.Weight]++
		}
		e.mu.gates.reconfigureTenantLocked(u.Name, now, p.modelList, func(t *tenantState) {
			e.shared.TenantReadyLocked(t, now, true)
		})
	}
	p.maxWeight = p.highestWeight()
	if floorTotal != p.floorTotal {
		p.floorTotal = floorTotal
		p.changed()
	}
	return nil
}

// unweigh takes one tenant of weight w out of the count.
func (p *placer) unweigh(w int64) {
	if p.weights[w]--; p.weights[w] <= 0 {
		delete(p.weights, w)
	}
}

// highestWeight is the highest weight a tenant or a tier has (at least 1):
// a handful of distinct weights, however many tenants.
func (p *placer) highestWeight() int64 {
	w := int64(1)
	for weight := range p.weights {
		w = max(w, weight)
	}
	for _, pol := range p.cfg.Tiers {
		w = max(w, pol.Weight)
	}
	return w
}
