package deferraltest_test

import (
	"testing"

	"github.com/sluice-sched/sluice/admission/deferral"
	"github.com/sluice-sched/sluice/admission/deferral/deferraltest"
)

// The in-memory store keeps nothing across instances: it runs the suite
// without reopen.
func TestMemStore(t *testing.T) {
	deferraltest.Run(t, func(*testing.T) deferral.Store { return deferral.NewMemStore() }, nil)
}
