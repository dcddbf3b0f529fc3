//go:build !idemkv_testhooks

package testhooks

import (
	"testing"
	"time"
)

// In the production build nothing can switch a hook on: not the environment, and no
// request either, since this build has no endpoints (api.TestProductionBuildHasNoDebugEndpoints).
func TestProductionBuildIsInert(t *testing.T) {
	if Enabled {
		t.Fatal("hooks enabled without the build tag")
	}
	t.Setenv(EnvSabotage, "stale-reads,ignore-fences,early-ack")
	t.Setenv(EnvClockOffset, "1h")
	if Sabotaged(AllModes) {
		t.Fatal("a sabotage mode is on in the production build")
	}
	if ClockOffset() != 0 {
		t.Fatalf("clock offset %v in the production build", ClockOffset())
	}
	if d := time.Until(Now()); d > time.Second || d < -time.Second {
		t.Fatalf("Now is %v away from the wall clock", d)
	}
}
