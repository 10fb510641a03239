package memstate_test

import (
	"testing"

	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/state/memstate"
	"github.com/sluice-sched/sluice/internal/state/statetest"
)

func TestConformance(t *testing.T) {
	statetest.Run(t, func(*testing.T) sharing.Store { return memstate.New(nil) })
}
