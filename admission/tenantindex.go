package admission

import (
	"hash/maphash"
	"slices"
)

// tenantIndex is the configured tenants as the engine keeps them: a million
// of them in memory the garbage collector does not scan. A map of names to
// TenantConfig holds two pointers per tenant (its name and its tier's), and
// every collection marks them all: at a million tenants that is most of a
// collection's work, paid on every cycle for data that rarely changes.
// Here the names lie end to end in one byte slice, an entry is two words,
// and the index is a map of 64-bit name hashes (a name whose hash another
// already holds, a chance of about 3 in 10⁸ among a million names, goes to
// a small map by name). The few tenants with overrides keep them in a map
// of their own.
type tenantIndex struct {
	hash      func(string) uint64 // maphash with a seed of its own; tests make it collide
	byHash    map[uint64]uint32   // name hash → entry
	byName    map[string]uint32   // the entries whose hash an earlier entry holds
	names     []byte              // every entry's name, end to end
	entries   []indexEntry
	tiers     []string // tier names; an entry holds its tier's position
	tierOf    map[string]uint16
	overrides map[uint32]*TenantOverrides // by entry
	removed   int                         // entries removed, whose names still take room
}

// indexEntry is one tenant: its name's place in names and its tier.
type indexEntry struct {
	off  uint32
	n    uint16 // name length (at most 128)
	tier uint16 // position in tiers; noTier once removed
}

// noTier marks a removed entry.
const noTier = ^uint16(0)

// newTenantIndex indexes tenants, whose tiers are all among tiers (the
// config was validated).
func newTenantIndex(tenants map[string]TenantConfig, tiers map[string]TierPolicy) *tenantIndex {
	seed := maphash.MakeSeed()
	x := &tenantIndex{
		hash:      func(s string) uint64 { return maphash.String(seed, s) },
		byHash:    make(map[uint64]uint32, len(tenants)),
		entries:   make([]indexEntry, 0, len(tenants)),
		tierOf:    make(map[string]uint16, len(tiers)),
		overrides: make(map[uint32]*TenantOverrides),
	}
	size := 0
	for name := range tenants {
		size += len(name)
	}
	x.names = make([]byte, 0, size)
	x.tiers = sortedKeys(tiers)
	for i, t := range x.tiers {
		x.tierOf[t] = uint16(i)
	}
	for name, tc := range tenants {
		x.set(name, tc.clone()) // the engine keeps its own overrides
	}
	return x
}

// len is the number of tenants.
func (x *tenantIndex) len() int { return len(x.entries) - x.removed }

// find returns name's entry.
func (x *tenantIndex) find(name string) (uint32, bool) {
	i, ok := x.byHash[x.hash(name)]
	if ok && x.nameAt(i) == name {
		return i, x.entries[i].tier != noTier
	}
	i, ok = x.byName[name]
	return i, ok && x.entries[i].tier != noTier
}

// nameAt is entry i's name.
func (x *tenantIndex) nameAt(i uint32) string {
	e := x.entries[i]
	return string(x.names[e.off : e.off+uint32(e.n)])
}

// get returns name's entry as a TenantConfig.
func (x *tenantIndex) get(name string) (TenantConfig, bool) {
	i, ok := x.find(name)
	if !ok {
		return TenantConfig{}, false
	}
	return x.configAt(i), true
}

// configAt is entry i as a TenantConfig (its overrides shared).
func (x *tenantIndex) configAt(i uint32) TenantConfig {
	return TenantConfig{Tier: x.tiers[x.entries[i].tier], TenantOverrides: x.overrides[i]}
}

// set adds name or replaces its entry; tc's tier must be a known one.
func (x *tenantIndex) set(name string, tc TenantConfig) {
	i, ok := x.find(name)
	if !ok {
		i = uint32(len(x.entries))
		x.entries = append(x.entries, indexEntry{off: uint32(len(x.names)), n: uint16(len(name))})
		x.names = append(x.names, name...)
		h := x.hash(name)
		if _, taken := x.byHash[h]; !taken {
			x.byHash[h] = i
		} else {
			if x.byName == nil {
				x.byName = make(map[string]uint32)
			}
			x.byName[name] = i
		}
	}
	x.entries[i].tier = x.tierOf[tc.Tier]
	if tc.TenantOverrides != nil {
		x.overrides[i] = tc.TenantOverrides
	} else {
		delete(x.overrides, i)
	}
}

// remove drops name's entry, if any. Its name keeps its room until the
// removed entries are as many as the live ones; the index is then rebuilt.
func (x *tenantIndex) remove(name string) {
	h := x.hash(name)
	i, ok := x.byHash[h]
	if ok && x.nameAt(i) == name {
		delete(x.byHash, h)
	} else if i, ok = x.byName[name]; ok {
		delete(x.byName, name)
	} else {
		return
	}
	if x.entries[i].tier != noTier {
		x.removed++
	}
	x.entries[i].tier = noTier
	delete(x.overrides, i)
	if x.removed > 1024 && x.removed > x.len() {
		x.compact()
	}
}

// compact rebuilds the index without the removed entries.
func (x *tenantIndex) compact() {
	old := *x
	x.byHash, x.byName = make(map[uint64]uint32, old.len()), nil
	x.names, x.entries = make([]byte, 0, len(old.names)), make([]indexEntry, 0, old.len())
	x.overrides, x.removed = make(map[uint32]*TenantOverrides, len(old.overrides)), 0
	old.each(func(name string, tc TenantConfig) { x.set(name, tc) })
}

// each calls f for every tenant, in no order.
func (x *tenantIndex) each(f func(name string, tc TenantConfig)) {
	for i, e := range x.entries {
		if e.tier != noTier {
			f(x.nameAt(uint32(i)), x.configAt(uint32(i)))
		}
	}
}

// sortedNames returns every tenant's name, sorted.
func (x *tenantIndex) sortedNames() []string {
	out := make([]string, 0, x.len())
	x.each(func(name string, _ TenantConfig) { out = append(out, name) })
	slices.Sort(out)
	return out
}

// toMap returns the tenants as a Config's map.
func (x *tenantIndex) toMap() map[string]TenantConfig {
	out := make(map[string]TenantConfig, x.len())
	x.each(func(name string, tc TenantConfig) { out[name] = tc.clone() })
	return out
}
