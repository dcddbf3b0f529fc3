package api_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
)

// authzCaller is a Caller whose answers come from a function; it records every
// question the API asked.
type authzCaller struct {
	allow func(op api.Operation, tenant string) bool

	mu    sync.Mutex
	asked []string
}

var _ api.Caller = (*authzCaller)(nil)

func (c *authzCaller) Allow(op api.Operation, tenant string) error {
	c.mu.Lock()
	c.asked = append(c.asked, string(op)+" "+tenant)
	c.mu.Unlock()
	if c.allow(op, tenant) {
		return nil
	}
	return idemkv.Errorf(idemkv.ErrPermissionDenied, "this token may not %s on %q", op, tenant)
}

func (c *authzCaller) questions() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.asked)
}

// withCaller installs c on every request, in front of the test node's own middleware.
func withCaller(c api.Caller) func(*api.Config) {
	return func(cfg *api.Config) {
		inner := cfg.Middleware
		cfg.Middleware = func(next http.Handler) http.Handler {
			h := inner(next)
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h.ServeHTTP(w, r.WithContext(api.WithCaller(r.Context(), c)))
			})
		}
	}
}

// onlyAcme may do anything on tenant acme and nothing else.
func onlyAcme(op api.Operation, tenant string) bool { return tenant == testTenant }

type tenantRequest struct {
	name, method, path string
	body               any
	op                 api.Operation
}

func tenantRequests(tenant string) []tenantRequest {
	return []tenantRequest{
		{"reserve", http.MethodPost, "/v1/reserve", with(validReserve(), "tenant", tenant), api.OpWrite},
		{"commit", http.MethodPost, "/v1/commit", with(validCommit(), "tenant", tenant), api.OpWrite},
		{"fail", http.MethodPost, "/v1/fail", with(validFail(), "tenant", tenant), api.OpWrite},
		{"release", http.MethodPost, "/v1/release", with(validRelease(), "tenant", tenant), api.OpWrite},
		{"heartbeat", http.MethodPost, "/v1/heartbeat", with(validHeartbeat(), "tenant", tenant), api.OpWrite},
		{"get", http.MethodGet, "/v1/records/" + tenant + "/k1", nil, api.OpRead},
		{"long-poll", http.MethodGet, "/v1/records/" + tenant + "/k1?wait_ms=5000", nil, api.OpRead},
		{"stale get", http.MethodGet, "/v1/records/" + tenant + "/k1?consistency=stale", nil, api.OpRead},
		{"list", http.MethodGet, "/v1/records/" + tenant + "?limit=5", nil, api.OpList},
	}
}

func TestCallerRefusedOnAnotherTenantBeforeTheStore(t *testing.T) {
	fake := &FakeStore{}
	caller := &authzCaller{allow: onlyAcme}
	n := startNode(t, fake, withCaller(caller))
	for _, tr := range tenantRequests("beta") {
		t.Run(tr.name, func(t *testing.T) {
			resp := do(t, tr.method, n.url+tr.path, tr.body, nil)
			resp.wantError(t, http.StatusForbidden, idemkv.CodePermissionDenied, "")
			q := caller.questions()
			if want := string(tr.op) + " beta"; len(q) == 0 || q[len(q)-1] != want {
				t.Errorf("caller was asked %v, want the last question %q", q, want)
			}
		})
	}
	if c := fake.Calls(); c != 0 {
		t.Fatalf("the store was called %d times for refused requests", c)
	}
}

func TestCallerAllowedOnItsTenantReachesTheStore(t *testing.T) {
	fake := &FakeStore{
		ReserveFunc: func(context.Context, *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
			return &idemkv.ReserveResult{Decision: idemkv.DecisionExecute, Fence: 7, Record: pendingRecord(testKey)}, nil
		},
		GetFunc: func(_ context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
			return pendingRecord(req.Key), nil
		},
		ListFunc: func(context.Context, *idemkv.ListRequest) (*idemkv.ListResult, error) {
			return &idemkv.ListResult{Records: []*idemkv.Record{pendingRecord("k1")}}, nil
		},
	}
	caller := &authzCaller{allow: onlyAcme}
	n := startNode(t, fake, withCaller(caller))
	for _, tr := range tenantRequests(testTenant) {
		if tr.name != "reserve" && tr.method != http.MethodGet {
			continue
		}
		resp := do(t, tr.method, n.url+tr.path, tr.body, nil)
		if resp.status != http.StatusOK {
			t.Errorf("%s on its own tenant: %d %s", tr.name, resp.status, resp.body)
		}
	}
	if got, want := fake.Calls(), int64(5); got != want {
		t.Fatalf("store called %d times, want %d", got, want)
	}
}

func TestRouteOperationsAskedOfTheCaller(t *testing.T) {
	fake := &FakeStore{
		ClusterFunc: func(context.Context) (*idemkv.ClusterInfo, error) { return sampleCluster(), nil },
	}
	caller := &authzCaller{allow: func(op api.Operation, _ string) bool { return op == api.OpCluster }}
	n := startNode(t, fake, withCaller(caller))

	cases := []struct {
		method, path string
		body         any
		status       int
		question     string
	}{
		{http.MethodGet, "/v1/cluster", nil, http.StatusOK, "cluster "},
		{http.MethodPost, "/v1/cluster/join", map[string]any{"id": "n9", "raft_addr": "127.0.0.1:1", "api_addr": "127.0.0.1:2"}, http.StatusForbidden, "admin "},
		{http.MethodPost, "/v1/cluster/remove", map[string]any{"id": "n2"}, http.StatusForbidden, "admin "},
		{http.MethodGet, "/metrics", nil, http.StatusForbidden, "metrics "},
		{http.MethodGet, "/v1/in-doubt", nil, http.StatusForbidden, "list_every_tenant "},
	}
	for _, c := range cases {
		resp := do(t, c.method, n.url+c.path, c.body, nil)
		if resp.status != c.status {
			t.Errorf("%s %s: %d %s, want %d", c.method, c.path, resp.status, resp.body, c.status)
		}
		q := caller.questions()
		if len(q) == 0 || q[len(q)-1] != c.question {
			t.Errorf("%s %s: caller asked %q, want last %q", c.method, c.path, q, c.question)
		}
	}
	before := len(caller.questions())
	for _, p := range []string{"/healthz", "/readyz"} {
		if resp := do(t, http.MethodGet, n.url+p, nil, nil); resp.status != http.StatusOK {
			t.Errorf("%s: %d %s", p, resp.status, resp.body)
		}
	}
	if after := len(caller.questions()); after != before {
		t.Errorf("health probes asked the caller %d questions; they need none", after-before)
	}
	if c := fake.Calls(); c != 1 {
		t.Errorf("store called %d times, want 1 (the cluster read)", c)
	}
}

func TestFollowerRefusesBeforeForwarding(t *testing.T) {
	leader := startNode(t, &FakeStore{}, nil)
	follower := startNode(t, &FakeStore{LeaderFunc: func() (string, bool) { return leader.addr, false }},
		withCaller(&authzCaller{allow: onlyAcme}))
	for _, tr := range tenantRequests("beta") {
		resp := do(t, tr.method, follower.url+tr.path, tr.body, nil)
		resp.wantError(t, http.StatusForbidden, idemkv.CodePermissionDenied, "")
	}
	if seen := leader.seen(); len(seen) != 0 {
		t.Fatalf("the leader saw %d refused requests", len(seen))
	}
}

// backupStore is a FakeStore that can also take backups.
type backupStore struct {
	*FakeStore
	backup func(ctx context.Context, w io.Writer) error
}

func (b *backupStore) Backup(ctx context.Context, w io.Writer) error { return b.backup(ctx, w) }

func TestBackupStreamsFromTheLeader(t *testing.T) {
	payload := bytes.Repeat([]byte("idemkv-backup-"), 100_000)
	store := &backupStore{FakeStore: &FakeStore{}, backup: func(_ context.Context, w io.Writer) error {
		for chunk := range slices.Chunk(payload, 64<<10) {
			if _, err := w.Write(chunk); err != nil {
				return err
			}
		}
		return nil
	}}
	leader := startNode(t, store.FakeStore, func(c *api.Config) { c.Store = store })
	followerStore := &backupStore{
		FakeStore: &FakeStore{LeaderFunc: func() (string, bool) { return leader.addr, false }},
		backup: func(context.Context, io.Writer) error {
			t.Error("a follower took the backup itself")
			return idemkv.ErrNotLeader
		},
	}
	follower := startNode(t, followerStore.FakeStore, func(c *api.Config) { c.Store = followerStore })
	for _, n := range []*testNode{leader, follower} {
		resp := do(t, http.MethodGet, n.url+"/v1/backup", nil, nil)
		if resp.status != http.StatusOK || !bytes.Equal(resp.body, payload) {
			t.Fatalf("backup through %s: %d, %d bytes, want %d", n.addr, resp.status, len(resp.body), len(payload))
		}
		if ct := resp.header.Get("Content-Type"); ct != api.BackupContentType {
			t.Errorf("Content-Type %q", ct)
		}
	}
}

func TestBackupErrors(t *testing.T) {
	fail := errors.New("disk on fire")
	var mode string
	store := &backupStore{FakeStore: &FakeStore{}, backup: func(_ context.Context, w io.Writer) error {
		switch mode {
		case "before":
			return idemkv.Errorf(idemkv.ErrUnavailable, "no leader")
		default:
			if _, err := w.Write(bytes.Repeat([]byte("x"), 1<<20)); err != nil {
				return err
			}
			return fail
		}
	}}
	n := startNode(t, store.FakeStore, func(c *api.Config) { c.Store = store })

	mode = "before"
	do(t, http.MethodGet, n.url+"/v1/backup", nil, nil).wantError(t, http.StatusServiceUnavailable, idemkv.CodeUnavailable, "")

	mode = "during"
	resp, err := testClient.Get(n.url + "/v1/backup")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.Copy(io.Discard, resp.Body)
	if err == nil {
		t.Fatalf("a backup that failed after %d bytes ended like a complete one", got)
	}

	// Relayed by a follower from a leader that fails midway: the caller sees the same
	// broken transfer, not a clean end of a short stream.
	follower := startNode(t, &FakeStore{LeaderFunc: func() (string, bool) { return n.addr, false }}, func(c *api.Config) {
		c.Store = &backupStore{FakeStore: &FakeStore{LeaderFunc: func() (string, bool) { return n.addr, false }},
			backup: func(context.Context, io.Writer) error { return idemkv.ErrNotLeader }}
	})
	resp2, err := testClient.Get(follower.url + "/v1/backup")
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	if got, err := io.Copy(io.Discard, resp2.Body); err == nil {
		t.Fatalf("a backup relayed by a follower that failed after %d bytes ended like a complete one", got)
	}
}

func TestBackupNeedsAdmin(t *testing.T) {
	called := false
	store := &backupStore{FakeStore: &FakeStore{}, backup: func(context.Context, io.Writer) error {
		called = true
		return nil
	}}
	caller := &authzCaller{allow: func(op api.Operation, tenant string) bool { return op != api.OpAdmin }}
	n := startNode(t, store.FakeStore, func(c *api.Config) {
		c.Store = store
		withCaller(caller)(c)
	})
	do(t, http.MethodGet, n.url+"/v1/backup", nil, nil).wantError(t, http.StatusForbidden, idemkv.CodePermissionDenied, "")
	if called {
		t.Fatal("a refused backup ran")
	}
	if q := caller.questions(); fmt.Sprint(q) != "[admin ]" {
		t.Fatalf("caller asked %q", q)
	}
}

// TestRequestsAnsweredByTheMiddlewareAreTimed: a 401 from the authentication in front
// of the API never reaches an endpoint, and must still be in the request metric,
// under the endpoint it was for, so that a client with a bad token shows up on the
// dashboard. A request that does reach an endpoint is counted there, once.
func TestRequestsAnsweredByTheMiddlewareAreTimed(t *testing.T) {
	fake := &FakeStore{
		ReserveFunc: func(_ context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
			return &idemkv.ReserveResult{Decision: idemkv.DecisionExecute, Fence: 1, Record: pendingRecord(req.Key)}, nil
		},
	}
	n := startNode(t, fake, func(cfg *api.Config) {
		inner := cfg.Middleware
		cfg.Middleware = func(next http.Handler) http.Handler {
			h := inner(next)
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Authorization") == "" {
					w.WriteHeader(http.StatusUnauthorized)
					return
				}
				h.ServeHTTP(w, r)
			})
		}
	})
	auth := map[string]string{"Authorization": "Bearer t"}
	do(t, http.MethodPost, n.url+"/v1/reserve", validReserve(), nil)
	do(t, http.MethodPost, n.url+"/v1/reserve", validReserve(), nil)
	do(t, http.MethodGet, n.url+"/v1/nowhere", nil, nil)
	do(t, http.MethodPost, n.url+"/v1/reserve", validReserve(), auth).object(t, http.StatusOK)
	for _, c := range []struct {
		endpoint, code string
		want           uint64
	}{
		{"POST /v1/reserve", "401", 2},
		{"unmatched", "401", 1},
		{"POST /v1/reserve", "200", 1},
	} {
		if got := n.requestCount(t, c.endpoint, c.code); got != c.want {
			t.Errorf("%s %s: counted %d, want %d", c.endpoint, c.code, got, c.want)
		}
	}
}

// TestPprofNeedsAdmin: profiles are served only with Config.Pprof, and only to a caller
// the admin operation is allowed (issue 13, defect 2).
func TestPprofNeedsAdmin(t *testing.T) {
	off := startNode(t, &FakeStore{}, nil)
	if r := do(t, http.MethodGet, off.url+"/debug/pprof/cmdline", nil, nil); r.status != http.StatusNotFound {
		t.Errorf("without Pprof: %d %s, want 404", r.status, r.body)
	}
	for _, admin := range []bool{false, true} {
		caller := &authzCaller{allow: func(op api.Operation, _ string) bool { return admin && op == api.OpAdmin }}
		n := startNode(t, &FakeStore{}, func(c *api.Config) { withCaller(caller)(c); c.Pprof = true })
		for _, p := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/goroutine?debug=1", "/debug/pprof/heap"} {
			r := do(t, http.MethodGet, n.url+p, nil, nil)
			want := http.StatusForbidden
			if admin {
				want = http.StatusOK
			}
			if r.status != want {
				t.Errorf("admin %v, %s: %d, want %d", admin, p, r.status, want)
			}
			if q := caller.questions(); len(q) == 0 || q[len(q)-1] != "admin " {
				t.Errorf("admin %v, %s: asked %q, want admin", admin, p, q)
			}
		}
	}
}
