package admission

import (
	"testing"

	"pgregory.net/rapid"
)

// TestLeaseIndexAgainstMap drives the open-addressed id index with ids
// whose low bits mostly collide (long probe runs, deletions that must shift
// cells back across the table's end) and checks it against a Go map.
func TestLeaseIndexAgainstMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var x leaseIndex
		model := map[uint64]uint32{}
		// Low bits from a small set, so that ids share homes; middle bits
		// keep them distinct; the top bits (the part) from two values.
		genID := rapid.Custom(func(t *rapid.T) uint64 {
			return rapid.SampledFrom([]uint64{0, 63 << 58}).Draw(t, "part") |
				rapid.Uint64Range(1, 1<<12).Draw(t, "high")<<32 |
				rapid.SampledFrom([]uint64{0, 1, 14, 15, 31, 127}).Draw(t, "low")
		})
		for i := range rapid.IntRange(1, 400).Draw(t, "ops") {
			id := genID.Draw(t, "id")
			_, held := model[id]
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				if got := x.insert(id, uint32(i)); got == held {
					t.Fatalf("insert %#x: %v, but held %v", id, got, held)
				}
				if !held {
					model[id] = uint32(i)
				}
			case 1:
				if held {
					x.remove(id)
					delete(model, id)
				}
			case 2:
				slot, ok := x.find(id)
				if ok != held || slot != model[id] {
					t.Fatalf("find %#x: %d %v, want %d %v", id, slot, ok, model[id], held)
				}
			}
			if x.len() != len(model) {
				t.Fatalf("%d ids in the index, want %d", x.len(), len(model))
			}
		}
		for id, want := range model {
			if slot, ok := x.find(id); !ok || slot != want {
				t.Fatalf("find %#x at the end: %d %v, want %d", id, slot, ok, want)
			}
		}
	})
}

// TestLeaseTableExpiresInOrder checks the lease table against a list of
// live leases: leases granted at nearly increasing times (Admits may pass
// each other between reading the clock and taking the lock) with TTLs that
// change (a reload), released in any order; popExpired always returns a
// lease with the earliest expiry, and only once it is due.
func TestLeaseTableExpiresInOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tbl := newLeaseTable()
		live := map[uint64]int64{} // id → expires
		var ids []uint64
		now := int64(1000)
		for range rapid.IntRange(1, 300).Draw(t, "ops") {
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0, 1:
				granted := now - rapid.Int64Range(0, 3).Draw(t, "passed")
				ttl := rapid.SampledFrom([]int64{10, 50, 200}).Draw(t, "ttl")
				id := tbl.add(lease{granted: granted, expires: granted + ttl})
				if _, dup := live[id]; dup || id == 0 {
					t.Fatalf("id %#x given twice", id)
				}
				live[id] = granted + ttl
				ids = append(ids, id)
			case 2:
				if len(ids) == 0 {
					continue
				}
				id := rapid.SampledFrom(ids).Draw(t, "release")
				l, ok := tbl.remove(id)
				if _, held := live[id]; ok != held || (ok && l.expires != live[id]) {
					t.Fatalf("remove %#x: %v, held %v", id, ok, held)
				}
				delete(live, id)
			case 3:
				now += rapid.Int64Range(0, 60).Draw(t, "advance")
				earliest := int64(-1)
				for _, exp := range live {
					if earliest < 0 || exp < earliest {
						earliest = exp
					}
				}
				l, _, ok := tbl.popExpired(now)
				switch {
				case ok != (earliest >= 0 && earliest <= now):
					t.Fatalf("at %d: popped %v, earliest live expiry %d", now, ok, earliest)
				case ok && l.expires != earliest:
					t.Fatalf("at %d: popped a lease expiring at %d before one at %d", now, l.expires, earliest)
				}
				if ok { // the popped lease is the one of that expiry no longer found
					for id, exp := range live {
						if _, held := tbl.get(id); exp == l.expires && !held {
							delete(live, id)
							break
						}
					}
				}
			}
			if tbl.len() != len(live) {
				t.Fatalf("%d leases, want %d", tbl.len(), len(live))
			}
			n := 0
			tbl.each(func(*lease) { n++ })
			if n != len(live) {
				t.Fatalf("each visited %d leases, want %d", n, len(live))
			}
		}
		for id := range live {
			if _, ok := tbl.get(id); !ok {
				t.Fatalf("live lease %#x not found", id)
			}
		}
	})
}
