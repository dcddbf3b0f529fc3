package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
)

// TestInDoubtEndpointShapes: ?in_doubt reaches the store and refuses other values;
// POST /v1/doubt answers the record; POST /v1/resolve answers the receipt when
// committed and {"released":true} when not executed, and its body is validated before
// the store sees it.
func TestInDoubtEndpointShapes(t *testing.T) {
	var listed idemkv.ListRequest
	var resolved []idemkv.ResolveRequest
	fake := &FakeStore{
		ListFunc: func(_ context.Context, req *idemkv.ListRequest) (*idemkv.ListResult, error) {
			listed = *req
			return &idemkv.ListResult{}, nil
		},
		DoubtFunc: func(_ context.Context, req *idemkv.DoubtRequest) (*idemkv.Record, error) {
			rec := pendingRecord(req.Key)
			rec.InDoubt, rec.InDoubtSince, rec.LeaseExpiresAt = true, rec.UpdatedAt, 0
			return rec, nil
		},
		ResolveFunc: func(_ context.Context, req *idemkv.ResolveRequest) (*idemkv.ResolveResult, error) {
			resolved = append(resolved, *req)
			if req.Outcome == idemkv.ResolveNotExecuted {
				return &idemkv.ResolveResult{Released: true}, nil
			}
			return &idemkv.ResolveResult{Receipt: &idemkv.Receipt{Key: req.Key, Fingerprint: req.Fingerprint,
				Status: idemkv.StatusCommitted, RemoteSystem: req.RemoteSystem, RemoteID: req.RemoteID}}, nil
		},
	}
	n := startNode(t, fake, nil)

	do(t, "GET", n.url+"/v1/records/acme?in_doubt=true", nil, nil).object(t, http.StatusOK)
	if !listed.InDoubt {
		t.Fatalf("store got %+v", listed)
	}
	do(t, "GET", n.url+"/v1/records/acme?in_doubt=yes", nil, nil).wantError(t, http.StatusBadRequest, idemkv.CodeInvalidArgument, "in_doubt")
	do(t, "GET", n.url+"/v1/records/acme?in_doubt=true&status=committed", nil, nil).wantError(t, http.StatusBadRequest, idemkv.CodeInvalidArgument, "in_doubt")

	m := do(t, "POST", n.url+"/v1/doubt", map[string]any{"tenant": "acme", "idempotency_key": "k", "effect_fingerprint": "sha256:aa", "fence": 7}, nil).object(t, http.StatusOK)
	if m["in_doubt"] != true || m["in_doubt_since"] == nil || m["lease_expires_at"] != nil {
		t.Fatalf("doubt answer %v", m)
	}
	do(t, "POST", n.url+"/v1/doubt", map[string]any{"tenant": "acme", "idempotency_key": "k", "effect_fingerprint": "sha256:aa"}, nil).
		wantError(t, http.StatusBadRequest, idemkv.CodeInvalidArgument, "fence")

	base := map[string]any{"tenant": "acme", "idempotency_key": "k", "effect_fingerprint": "sha256:aa"}
	with := func(kv ...any) map[string]any {
		m := map[string]any{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	r := do(t, "POST", n.url+"/v1/resolve", with("outcome", "not_executed"), nil)
	if r.object(t, http.StatusOK); strings.TrimSpace(string(r.body)) != `{"released":true}` {
		t.Fatalf("resolve not_executed answered %s", r.body)
	}
	m = do(t, "POST", n.url+"/v1/resolve", with("outcome", "committed", "remote_system", "linear", "remote_id", "LIN-1"), nil).object(t, http.StatusOK)
	if m["remote_id"] != "LIN-1" || m["status"] != "committed" {
		t.Fatalf("resolve committed answered %v", m)
	}
	calls := len(resolved)
	do(t, "POST", n.url+"/v1/resolve", with("outcome", "committed"), nil).wantError(t, http.StatusBadRequest, idemkv.CodeInvalidArgument, "remote_system")
	do(t, "POST", n.url+"/v1/resolve", with("outcome", "maybe"), nil).wantError(t, http.StatusBadRequest, idemkv.CodeInvalidArgument, "outcome")
	do(t, "POST", n.url+"/v1/resolve", with("outcome", "not_executed", "remote_id", "x"), nil).wantError(t, http.StatusBadRequest, idemkv.CodeInvalidArgument, "outcome")
	if len(resolved) != calls {
		t.Fatal("an invalid resolve reached the store")
	}
}
