package api_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/auth"
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

// TestInDoubtAcrossTenantsShape: GET /v1/in-doubt takes a list's limit, after and
// consistency, refuses what a list refuses with the same error body before the store
// sees it, and answers a list's page ({"records":[]} when empty).
func TestInDoubtAcrossTenantsShape(t *testing.T) {
	var got idemkv.InDoubtRequest
	fake := &FakeStore{ListInDoubtFunc: func(_ context.Context, req *idemkv.InDoubtRequest) (*idemkv.ListResult, error) {
		got = *req
		if req.After != "" {
			return &idemkv.ListResult{}, nil
		}
		rec := pendingRecord("k1")
		rec.InDoubt, rec.InDoubtSince, rec.LeaseExpiresAt = true, rec.UpdatedAt, 0
		return &idemkv.ListResult{Records: []*idemkv.Record{rec}, Next: idemkv.DoubtPositionOf(rec).String()}, nil
	}}
	n := startNode(t, fake, nil)

	m := do(t, "GET", n.url+"/v1/in-doubt?limit=1", nil, nil).object(t, http.StatusOK)
	wantKeys(t, "in-doubt page", m, "records", "next")
	records, _ := m["records"].([]any)
	if len(records) != 1 || object(t, "records[0]", records[0])["in_doubt"] != true {
		t.Fatalf("in-doubt page %v", m)
	}
	if got.Limit != 1 || got.After != "" || got.Consistency != idemkv.Linearizable {
		t.Errorf("store got %+v", got)
	}
	next, _ := m["next"].(string)
	r := do(t, "GET", n.url+"/v1/in-doubt?consistency=stale&after="+url.QueryEscape(next), nil, nil)
	if r.object(t, http.StatusOK); strings.TrimSpace(string(r.body)) != `{"records":[]}` {
		t.Errorf("empty page %s", r.body)
	}
	if got.Limit != idemkv.DefaultListLimit || got.After != next || got.Consistency != idemkv.Stale {
		t.Errorf("store got %+v, want the default limit, after %q, stale", got, next)
	}

	calls := fake.Calls()
	for _, c := range []struct{ query, field string }{
		{"limit=0", "limit"},
		{"limit=1001", "limit"},
		{"limit=x", "limit"},
		{"consistency=eventual", "consistency"},
		{"after=acme%2Fk1", "after"},
		{"after=1%2Facme%2F", "after"},
	} {
		r := do(t, "GET", n.url+"/v1/in-doubt?"+c.query, nil, nil)
		r.wantError(t, http.StatusBadRequest, idemkv.CodeInvalidArgument, c.field)
		if c.field == "after" {
			continue // a list's after is a key
		}
		if list := do(t, "GET", n.url+"/v1/records/acme?"+c.query, nil, nil); string(r.body) != string(list.body) {
			t.Errorf("%s: in-doubt answered %s, a list %s", c.query, r.body, list.body)
		}
	}
	if fake.Calls() != calls {
		t.Fatal("an invalid request reached the store")
	}
}

// TestInDoubtAcrossTenantsNeedsEveryTenant: with authentication on, only a token that
// may act on every tenant lists their in-doubt records: an admin, or a client of "*".
// A client of some tenants and a monitor get 403, no token or a wrong one 401, and none
// of them reaches the store.
func TestInDoubtAcrossTenantsNeedsEveryTenant(t *testing.T) {
	tokens := map[string]string{"ops": "idk_ops", "everyone": "idk_everyone", "acme": "idk_acme", "prometheus": "idk_prom"}
	f, err := auth.Parse([]byte(`{"tokens":[
		{"name":"ops","hash":"` + auth.HashToken(tokens["ops"]) + `","role":"admin"},
		{"name":"everyone","hash":"` + auth.HashToken(tokens["everyone"]) + `","role":"client","tenants":["*"]},
		{"name":"acme","hash":"` + auth.HashToken(tokens["acme"]) + `","role":"client","tenants":["acme","beta"]},
		{"name":"prometheus","hash":"` + auth.HashToken(tokens["prometheus"]) + `","role":"monitor"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	fake := &FakeStore{
		ListInDoubtFunc: func(context.Context, *idemkv.InDoubtRequest) (*idemkv.ListResult, error) {
			return &idemkv.ListResult{}, nil
		},
		ListFunc: func(context.Context, *idemkv.ListRequest) (*idemkv.ListResult, error) {
			return &idemkv.ListResult{}, nil
		},
	}
	n := startNode(t, fake, func(c *api.Config) { c.Middleware = a.Middleware })
	bearer := func(token string) map[string]string {
		if token == "" {
			return nil
		}
		return map[string]string{"Authorization": "Bearer " + token}
	}
	for _, c := range []struct {
		token  string
		status int
		code   string
	}{
		{tokens["ops"], http.StatusOK, ""},
		{tokens["everyone"], http.StatusOK, ""},
		{tokens["acme"], http.StatusForbidden, idemkv.CodePermissionDenied},
		{tokens["prometheus"], http.StatusForbidden, idemkv.CodePermissionDenied},
		{"", http.StatusUnauthorized, idemkv.CodeUnauthenticated},
		{"idk_wrong", http.StatusUnauthorized, idemkv.CodeUnauthenticated},
	} {
		before := fake.Calls()
		r := do(t, "GET", n.url+"/v1/in-doubt?limit=5", nil, bearer(c.token))
		if c.status == http.StatusOK {
			r.object(t, http.StatusOK)
			if fake.Calls() != before+1 {
				t.Errorf("token %q: the store was not asked", c.token)
			}
			continue
		}
		r.wantError(t, c.status, c.code, "")
		if fake.Calls() != before {
			t.Errorf("token %q: a refused request reached the store", c.token)
		}
	}
	// The tenant-scoped token still lists its own tenant: only the listing of every
	// tenant is closed to it.
	do(t, "GET", n.url+"/v1/records/acme?in_doubt=true", nil, bearer(tokens["acme"])).object(t, http.StatusOK)
}

// TestInDoubtAcrossTenantsWithoutAuthentication: a server without tokens serves the
// listing of every tenant to anyone, as it serves every other endpoint.
func TestInDoubtAcrossTenantsWithoutAuthentication(t *testing.T) {
	fake := &FakeStore{ListInDoubtFunc: func(context.Context, *idemkv.InDoubtRequest) (*idemkv.ListResult, error) {
		return &idemkv.ListResult{}, nil
	}}
	n := startNode(t, fake, nil)
	do(t, "GET", n.url+"/v1/in-doubt", nil, nil).object(t, http.StatusOK)
}
