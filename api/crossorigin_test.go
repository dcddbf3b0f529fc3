package api_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/idemkv/idemkv"
)

// A web page the operator visits can make their browser POST to a node it can reach
// (127.0.0.1, authentication off): such a write never reaches the store. Clients send
// neither Sec-Fetch-Site nor Origin and pass; so does a same-origin request and a read.
func TestCrossSiteBrowserWritesAreRefused(t *testing.T) {
	fake := &FakeStore{ReserveFunc: func(context.Context, *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
		return &idemkv.ReserveResult{Decision: idemkv.DecisionExecute, Fence: 1, Record: pendingRecord(testKey)}, nil
	}}
	n := startNode(t, fake, nil)
	body := map[string]any{"tenant": testTenant, "idempotency_key": testKey, "tool": "refund", "effect_fingerprint": "sha256:x"}
	for _, h := range map[string]map[string]string{
		"a cross-site fetch":       {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"},
		"a cross-site form":        {"Origin": "https://evil.example", "Content-Type": "application/x-www-form-urlencoded"},
		"another site's same-site": {"Sec-Fetch-Site": "same-site"},
	} {
		resp := do(t, http.MethodPost, n.url+"/v1/reserve", body, h)
		resp.wantError(t, http.StatusForbidden, idemkv.CodePermissionDenied, "")
	}
	if got := fake.Calls(); got != 0 {
		t.Fatalf("the store was called %d times by cross-site writes", got)
	}
	for name, h := range map[string]map[string]string{
		"a client":            nil,
		"a same-origin fetch": {"Sec-Fetch-Site": "same-origin"},
	} {
		if resp := do(t, http.MethodPost, n.url+"/v1/reserve", body, h); resp.status != http.StatusOK {
			t.Errorf("%s: %d %s", name, resp.status, resp.body)
		}
	}
}

// A same-origin browser request to a follower is forwarded without what the browser
// said of its origin: the leader, whose Host the browser never named, took it for a
// cross-origin write.
func TestForwardedBrowserWriteIsNotCheckedAgain(t *testing.T) {
	leader := startNode(t, &FakeStore{ReserveFunc: func(context.Context, *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
		return &idemkv.ReserveResult{Decision: idemkv.DecisionExecute, Fence: 1, Record: pendingRecord(testKey)}, nil
	}}, nil)
	follower := startNode(t, &FakeStore{LeaderFunc: func() (string, bool) { return leader.addr, false }}, nil)
	body := map[string]any{"tenant": testTenant, "idempotency_key": testKey, "tool": "refund", "effect_fingerprint": "sha256:x"}
	resp := do(t, http.MethodPost, follower.url+"/v1/reserve", body, map[string]string{"Origin": "http://" + follower.addr})
	if resp.status != http.StatusOK {
		t.Fatalf("a same-origin write through a follower: %d %s", resp.status, resp.body)
	}
}
