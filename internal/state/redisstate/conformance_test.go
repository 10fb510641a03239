package redisstate_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/state/redisstate"
	"github.com/sluice-sched/sluice/internal/state/redistest"
	"github.com/sluice-sched/sluice/internal/state/statetest"
)

func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	n := 0
	statetest.Run(t, func(*testing.T) sharing.Store {
		n++ // a prefix per subtest: a fresh, empty store on the same server
		return redisstate.New(rdb, "conf"+string(rune('a'+n)))
	})
}

// The scripts run by EVALSHA; after SCRIPT FLUSH (or a Redis restart)
// the first call gets NOSCRIPT and loads the script again.
func TestScriptsReloadAfterFlush(t *testing.T) {
	rdb := redistest.Start(t).Client()
	s := redisstate.New(rdb, "flush")
	ctx := context.Background()
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	commit := func(lease string) {
		t.Helper()
		v, err := s.Commit(ctx, &sharing.StrictCharge{
			Takes: []sharing.StrictTake{{Key: "k", Rate: 1, Burst: 10, Amount: 1}},
			KV:    sharing.KVHold{Key: "kv", Lease: lease, Limit: 10, Bytes: 1, TTL: time.Minute},
		})
		if err != nil || !v.Admitted {
			t.Fatalf("commit: %+v %v", v, err)
		}
	}
	commit("a")
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	commit("b")
	loaded, err := rdb.ScriptExists(ctx, redisstate.CommitSHA()).Result()
	if err != nil || !loaded[0] {
		t.Errorf("commit script not loaded again after the flush: %v %v", loaded, err)
	}
}
