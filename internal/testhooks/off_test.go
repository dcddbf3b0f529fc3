//go:build !idemkv_testhooks

package testhooks

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// In the production build nothing can switch a hook on: not the environment, not a
// request.
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
	mux := http.NewServeMux()
	Mount(mux, func() (Snapshot, error) { return Snapshot{AppliedIndex: 1, StateHash: "x"}, nil })
	for _, r := range []*http.Request{
		httptest.NewRequest(http.MethodGet, PathHooks, nil),
		httptest.NewRequest(http.MethodGet, PathStateHash, nil),
	} {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		if w.Code != http.StatusNotFound {
			t.Errorf("%s answered %d in the production build", r.URL.Path, w.Code)
		}
	}
}
