package api_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
)

// TestOnReserveSeesWhatTheNodeAnswered: the hook sees each reserve decision this node
// answered, from its own state or the leader's way, and neither a refused request nor
// one a follower forwarded (the leader answers, and sees, that one).
func TestOnReserveSeesWhatTheNodeAnswered(t *testing.T) {
	var mu sync.Mutex
	var seen, leaderSeen []idemkv.Decision
	hook := func(into *[]idemkv.Decision) func(*api.Config) {
		return func(cfg *api.Config) {
			cfg.OnReserve = func(_ context.Context, _ *idemkv.ReserveRequest, res *idemkv.ReserveResult) {
				mu.Lock()
				defer mu.Unlock()
				*into = append(*into, res.Decision)
			}
		}
	}
	leader := startNode(t, &FakeStore{ReserveFunc: func(context.Context, *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
		return &idemkv.ReserveResult{Decision: idemkv.DecisionExecute, Fence: 7, Record: pendingRecord("k")}, nil
	}}, hook(&leaderSeen))
	follower := startNode(t, &FakeStore{
		ReserveLocalFunc: func(req *idemkv.ReserveRequest) (*idemkv.ReserveResult, bool) {
			if req.Key != "local" {
				return nil, false
			}
			return &idemkv.ReserveResult{Decision: idemkv.DecisionConflict, Record: committedRecord(),
				Conflict: &idemkv.Conflict{Status: "conflict", Reason: idemkv.ReasonDifferentEffect}}, true
		},
		LeaderFunc: func() (string, bool) { return leader.addr, false },
	}, hook(&seen))

	do(t, http.MethodPost, follower.url+"/v1/reserve", with(validReserve(), "idempotency_key", "local"), nil).object(t, http.StatusOK)
	do(t, http.MethodPost, follower.url+"/v1/reserve", validReserve(), nil).object(t, http.StatusOK)
	do(t, http.MethodPost, follower.url+"/v1/reserve", with(validReserve(), "tool", ""), nil).wantError(t, http.StatusBadRequest, idemkv.CodeInvalidArgument, "tool")

	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0] != idemkv.DecisionConflict {
		t.Fatalf("the follower's hook saw %v, want only the conflict it answered itself", seen)
	}
	if len(leaderSeen) != 1 || leaderSeen[0] != idemkv.DecisionExecute {
		t.Fatalf("the leader's hook saw %v, want the forwarded reserve it answered", leaderSeen)
	}
}
