package redistest_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/state/redistest"
)

// A cluster of 3 masters with a replica each: keys spread over the
// masters as their slots say, a live reshard moves slots with their keys,
// and a killed master's replica takes over.
func TestShardedCluster(t *testing.T) {
	c := redistest.StartShardedCluster(t, 3, 1)
	masters := c.Masters()
	if len(masters) != 3 {
		t.Fatalf("Masters() = %v, want 3", masters)
	}
	if n := len(c.Addrs()); n != 6 {
		t.Fatalf("Addrs() has %d nodes, want 6", n)
	}
	rdb := c.Client()
	ctx := context.Background()

	c.ResetStats()
	const n = 1000
	keys := make([]string, n)
	want := make(map[string]int64) // keys per master, by MasterOf
	for i := range keys {
		keys[i] = fmt.Sprintf("{k%d}v", i)
		if err := rdb.Set(ctx, keys[i], i, 0).Err(); err != nil {
			t.Fatal(err)
		}
		want[c.MasterOf(keys[i])]++
	}
	got := c.KeysPerMaster()
	for _, m := range masters {
		if got[m] == 0 || got[m] != want[m] {
			t.Errorf("master %s holds %d keys, MasterOf says %d: %v", m, got[m], want[m], got)
		}
	}
	if sets := c.CallsPerMaster("set"); !mapsEqual(sets, want) {
		t.Errorf("SET calls per master %v, want the keys per master %v", sets, want)
	}
	if load := c.CommandsPerMaster(); !mapsEqual(load, want) {
		t.Errorf("commands per master %v, want only the SETs %v", load, want)
	}
	for _, k := range keys[:10] {
		if mk, err := rdb.MasterForKey(ctx, k); err != nil || mk.Options().Addr != c.MasterOf(k) {
			t.Errorf("go-redis puts %s on %v (%v), MasterOf on %s", k, mk, err, c.MasterOf(k))
		}
	}

	before := c.SlotsPerMaster()
	if err := c.Reshard(masters[0], masters[1], 100); err != nil {
		t.Fatal(err)
	}
	after := c.SlotsPerMaster()
	if after[masters[0]] != before[masters[0]]-100 || after[masters[1]] != before[masters[1]]+100 || after[masters[2]] != before[masters[2]] {
		t.Errorf("slots before the reshard %v, after %v: want 100 moved from %s to %s", before, after, masters[0], masters[1])
	}
	wantAfter := make(map[string]int64)
	for _, k := range keys {
		v, err := rdb.Get(ctx, k).Result()
		if err != nil || v != k[2:len(k)-2] {
			t.Errorf("after the reshard GET %s = %q, %v", k, v, err)
		}
		wantAfter[c.MasterOf(k)]++
	}
	if keysAfter := c.KeysPerMaster(); !mapsEqual(keysAfter, wantAfter) {
		t.Errorf("keys per master after the reshard %v, MasterOf says %v", keysAfter, wantAfter)
	}
	moved := wantAfter[masters[1]] - want[masters[1]]
	if moved <= 0 || wantAfter[masters[0]] != want[masters[0]]-moved || wantAfter[masters[2]] != want[masters[2]] {
		t.Errorf("keys per master before the reshard %v, after %v: want some moved from %s to %s, none elsewhere", want, wantAfter, masters[0], masters[1])
	}

	old := c.MasterOf(keys[0])
	c.Kill(old)
	promoted := c.WaitFailover(old, 15*time.Second)
	if promoted == old {
		t.Fatalf("WaitFailover returned the killed master %s", old)
	}
	now := c.Masters()
	if len(now) != 3 || !slices.Contains(now, promoted) || slices.Contains(now, old) {
		t.Errorf("masters after the failover %v: want 3, with %s and without %s", now, promoted, old)
	}
	if m := c.MasterOf(keys[0]); m != promoted {
		t.Errorf("after the failover %s is served by %s, want %s", keys[0], m, promoted)
	}
	if slices.Contains(c.Addrs(), old) {
		t.Errorf("Addrs() %v still has the killed %s", c.Addrs(), old)
	}
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
