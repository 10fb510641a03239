package redisstate_test

import (
	"testing"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/state/redisstate"
	"github.com/sluice-sched/sluice/internal/state/redistest"
	"github.com/sluice-sched/sluice/internal/state/statetest"
)

func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	n := 0
	statetest.Run(t, func(*testing.T) admission.SharedState {
		n++ // a prefix per subtest: a fresh, empty store on the same server
		return redisstate.New(rdb, "conf"+string(rune('a'+n)))
	})
}
