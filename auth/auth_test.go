package auth_test

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/auth"
	"github.com/idemkv/idemkv/internal/testlog"
)

const (
	acmeToken  = "idk_acme-agents-token"
	adminToken = "idk_ops-admin-token"
	promToken  = "idk_prometheus-token"
)

func yamlFile() string {
	return `
tokens:
  - name: acme-agents
    hash: ` + auth.HashToken(acmeToken) + `
    role: client
    tenants: [acme, acme-staging]
  - name: ops
    hash: ` + strings.ToUpper(auth.HashToken(adminToken)) + `
    role: admin
    tenants: ["*"]
  - name: prometheus
    hash: ` + auth.HashToken(promToken) + `
    role: monitor
`
}

func TestHashTokenIsSHA256(t *testing.T) {
	// sha256("hello"), from any reference implementation.
	const want = "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
	if got := auth.HashToken("hello"); got != want {
		t.Fatalf("HashToken(hello) = %s, want %s", got, want)
	}
}

func TestNewTokensAreDistinctAndLong(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		tok, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(tok, "idk_") || len(tok) < 40 {
			t.Fatalf("token %q: want idk_ and at least 32 random bytes", tok)
		}
		if seen[tok] {
			t.Fatalf("token %q came twice", tok)
		}
		seen[tok] = true
	}
}

func TestJSONAndYAMLMeanTheSame(t *testing.T) {
	fromYAML, err := auth.Parse([]byte(yamlFile()))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(fromYAML)
	if err != nil {
		t.Fatal(err)
	}
	fromJSON, err := auth.Parse(raw)
	if err != nil {
		t.Fatalf("%v\n%s", err, raw)
	}
	if !reflect.DeepEqual(fromYAML, fromJSON) {
		t.Fatalf("YAML %+v\nJSON %+v", fromYAML, fromJSON)
	}
	if len(fromYAML.Tokens) != 3 || fromYAML.Tokens[0].Tenants[1] != "acme-staging" || fromYAML.Tokens[2].Role != auth.RoleMonitor {
		t.Fatalf("parsed %+v", fromYAML)
	}
}

func TestBadFilesAreRefused(t *testing.T) {
	h1, h2 := auth.HashToken("one"), auth.HashToken("two")
	cases := map[string]string{
		"empty":              ``,
		"no tokens":          `tokens: []`,
		"unknown field yaml": "tokens:\n  - name: a\n    hash: " + h1 + "\n    role: client\n    tenant: [acme]\n",
		"unknown field json": `{"tokens":[{"name":"a","hash":"` + h1 + `","role":"client","tenants":["acme"],"tenant":"x"}]}`,
		"trailing json":      `{"tokens":[{"name":"a","hash":"` + h1 + `","role":"client","tenants":["acme"]}]} {}`,
		"plain token":        `{"tokens":[{"name":"a","hash":"idk_secret","role":"client","tenants":["acme"]}]}`,
		"short hash":         `{"tokens":[{"name":"a","hash":"sha256:abcd","role":"client","tenants":["acme"]}]}`,
		"no name":            `{"tokens":[{"hash":"` + h1 + `","role":"client","tenants":["acme"]}]}`,
		"same name":          `{"tokens":[{"name":"a","hash":"` + h1 + `","role":"admin"},{"name":"a","hash":"` + h2 + `","role":"admin"}]}`,
		"same hash":          `{"tokens":[{"name":"a","hash":"` + h1 + `","role":"admin"},{"name":"b","hash":"` + strings.ToUpper(h1) + `","role":"admin"}]}`,
		"bad role":           `{"tokens":[{"name":"a","hash":"` + h1 + `","role":"root","tenants":["acme"]}]}`,
		"client no tenants":  `{"tokens":[{"name":"a","hash":"` + h1 + `","role":"client"}]}`,
		"monitor tenants":    `{"tokens":[{"name":"a","hash":"` + h1 + `","role":"monitor","tenants":["acme"]}]}`,
		"bad tenant":         `{"tokens":[{"name":"a","hash":"` + h1 + `","role":"client","tenants":["ac/me"]}]}`,
		"malformed yaml":     "tokens: [\n",
		// Issue 13, defect 1: a scoped admin was a global one in disguise.
		"scoped admin":               `{"tokens":[{"name":"a","hash":"` + h1 + `","role":"admin","tenants":["acme"]}]}`,
		"admin with star and tenant": `{"tokens":[{"name":"a","hash":"` + h1 + `","role":"admin","tenants":["*","acme"]}]}`,
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			f, err := auth.Parse([]byte(data))
			if !errors.Is(err, auth.ErrInvalidFile) {
				t.Fatalf("Parse = %+v, %v; want ErrInvalidFile", f, err)
			}
		})
	}
}

// TestAdminIsGlobal: an admin token, with no tenants or "*", acts on every tenant.
func TestAdminIsGlobal(t *testing.T) {
	for _, tenants := range []string{``, `,"tenants":["*"]`} {
		f, err := auth.Parse([]byte(`{"tokens":[{"name":"ops","hash":"` + auth.HashToken("t") + `","role":"admin"` + tenants + `}]}`))
		if err != nil {
			t.Fatalf("tenants %q: %v", tenants, err)
		}
		a, err := auth.New(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		p, err := a.Authenticate("t")
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range []api.Operation{api.OpWrite, api.OpRead, api.OpList, api.OpListEveryTenant, api.OpAdmin, api.OpMetrics} {
			if err := p.Allow(op, "any-tenant"); err != nil {
				t.Errorf("tenants %q: %s refused: %v", tenants, op, err)
			}
		}
	}
}

// TestEveryTenantListing: listing every tenant's records at once takes a token that
// acts on every tenant, an admin or a client of "*"; a client of named tenants, even
// all those there are, may not.
func TestEveryTenantListing(t *testing.T) {
	for tenants, ok := range map[string]bool{`["*"]`: true, `["acme","*"]`: true, `["acme"]`: false, `["acme","beta"]`: false} {
		f, err := auth.Parse([]byte(`{"tokens":[{"name":"c","hash":"` + auth.HashToken("t") + `","role":"client","tenants":` + tenants + `}]}`))
		if err != nil {
			t.Fatalf("tenants %s: %v", tenants, err)
		}
		a, err := auth.New(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		p, err := a.Authenticate("t")
		if err != nil {
			t.Fatal(err)
		}
		err = p.Allow(api.OpListEveryTenant, "")
		if ok && err != nil {
			t.Errorf("client of %s: refused: %v", tenants, err)
		}
		if !ok && !errors.Is(err, idemkv.ErrPermissionDenied) {
			t.Errorf("client of %s: %v, want permission denied", tenants, err)
		}
	}
}

func newAuthenticator(t *testing.T) *auth.Authenticator {
	t.Helper()
	f, err := auth.Parse([]byte(yamlFile()))
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(f, testlog.NewLevel(t, "", slog.LevelInfo))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAuthenticate(t *testing.T) {
	a := newAuthenticator(t)
	for tok, name := range map[string]string{acmeToken: "acme-agents", adminToken: "ops", promToken: "prometheus"} {
		p, err := a.Authenticate(tok)
		if err != nil || p.Name != name {
			t.Errorf("Authenticate(%s) = %+v, %v; want %s", tok, p, err, name)
		}
	}
	for _, bad := range []string{"", "idk_acme-agents-toke", acmeToken + " ", auth.HashToken(acmeToken)} {
		p, err := a.Authenticate(bad)
		if !errors.Is(err, idemkv.ErrUnauthenticated) || p != nil {
			t.Errorf("Authenticate(%q) = %+v, %v; want ErrUnauthenticated", bad, p, err)
		}
	}
}

func TestAllowMatrix(t *testing.T) {
	a := newAuthenticator(t)
	principal := func(tok string) *auth.Principal {
		p, err := a.Authenticate(tok)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	client, admin, monitor := principal(acmeToken), principal(adminToken), principal(promToken)
	type q struct {
		p      *auth.Principal
		op     api.Operation
		tenant string
		ok     bool
	}
	cases := []q{
		{client, api.OpWrite, "acme", true},
		{client, api.OpRead, "acme-staging", true},
		{client, api.OpList, "acme", true},
		{client, api.OpWrite, "beta", false},
		{client, api.OpRead, "beta", false},
		{client, api.OpList, "beta", false},
		{client, api.OpList, "acm", false},
		{client, api.OpWrite, "*", false},
		{client, api.OpCluster, "", true},
		{client, api.OpAdmin, "", false},
		{client, api.OpMetrics, "", false},
		{client, api.Operation("delete"), "acme", false},
		{admin, api.OpWrite, "beta", true},
		{admin, api.OpList, "anything", true},
		{admin, api.OpAdmin, "", true},
		{admin, api.OpMetrics, "", true},
		{monitor, api.OpMetrics, "", true},
		{monitor, api.OpCluster, "", true},
		{monitor, api.OpAdmin, "", false},
		{monitor, api.OpRead, "acme", false},
		{monitor, api.OpList, "acme", false},
		// Listing every tenant at once takes every tenant.
		{client, api.OpListEveryTenant, "", false},
		{client, api.OpListEveryTenant, "acme", false},
		{admin, api.OpListEveryTenant, "", true},
		{monitor, api.OpListEveryTenant, "", false},
	}
	for _, c := range cases {
		err := c.p.Allow(c.op, c.tenant)
		if c.ok && err != nil {
			t.Errorf("%s %s %q: refused: %v", c.p.Name, c.op, c.tenant, err)
		}
		if !c.ok && !errors.Is(err, idemkv.ErrPermissionDenied) {
			t.Errorf("%s %s %q: %v, want permission denied", c.p.Name, c.op, c.tenant, err)
		}
	}
}

func TestReloadRotatesTokensAndKeepsThemOnABadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	if err := os.WriteFile(path, []byte(yamlFile()), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := auth.Load(path, testlog.NewLevel(t, "", slog.LevelInfo))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(acmeToken); err != nil {
		t.Fatal(err)
	}
	rotated := strings.Replace(yamlFile(), auth.HashToken(acmeToken), auth.HashToken("idk_new-acme"), 1)
	if err := os.WriteFile(path, []byte(rotated), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(acmeToken); !errors.Is(err, idemkv.ErrUnauthenticated) {
		t.Fatalf("the rotated-out token still works: %v", err)
	}
	if _, err := a.Authenticate("idk_new-acme"); err != nil {
		t.Fatalf("the new token: %v", err)
	}
	if err := os.WriteFile(path, []byte("tokens: [{name: x}]"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(); !errors.Is(err, auth.ErrInvalidFile) {
		t.Fatalf("Reload of a bad file: %v", err)
	}
	if _, err := a.Authenticate("idk_new-acme"); err != nil {
		t.Fatalf("a bad file took the good tokens away: %v", err)
	}
}

func TestMiddleware(t *testing.T) {
	a := newAuthenticator(t)
	var reached *auth.Principal
	h := a.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached = nil
		if c, ok := api.CallerFrom(r.Context()); ok {
			reached, _ = c.(*auth.Principal)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	send := func(method, path, authz string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}

	for _, authz := range []string{"", "Bearer", "Bearer wrong", "Basic " + acmeToken, acmeToken} {
		reached = nil
		resp := send(http.MethodPost, "/v1/reserve", authz)
		body, _ := io.ReadAll(resp.Body)
		var e struct {
			Error idemkv.Error `json:"error"`
		}
		if resp.StatusCode != http.StatusUnauthorized || json.Unmarshal(body, &e) != nil || e.Error.Code != idemkv.CodeUnauthenticated {
			t.Errorf("Authorization %q: %d %s, want 401 unauthenticated", authz, resp.StatusCode, body)
		}
		if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("Authorization %q: no WWW-Authenticate challenge", authz)
		}
		if reached != nil {
			t.Errorf("Authorization %q reached the API", authz)
		}
		if strings.Contains(string(body), acmeToken) {
			t.Errorf("the refusal echoes the token: %s", body)
		}
	}
	for _, authz := range []string{"Bearer " + acmeToken, "bearer " + acmeToken} {
		if resp := send(http.MethodPost, "/v1/reserve", authz); resp.StatusCode != http.StatusNoContent || reached == nil || reached.Name != "acme-agents" {
			t.Errorf("Authorization %q: %d, principal %+v", authz, resp.StatusCode, reached)
		}
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if resp := send(http.MethodGet, p, ""); resp.StatusCode != http.StatusNoContent {
			t.Errorf("GET %s without a token: %d, want it open", p, resp.StatusCode)
		}
	}
	for _, p := range []string{"/metrics", "/v1/cluster", "/healthz/x", "/v1/records/acme/k"} {
		if resp := send(http.MethodGet, p, ""); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without a token: %d, want 401", p, resp.StatusCode)
		}
	}
	if resp := send(http.MethodPost, "/healthz", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST /healthz without a token: %d, want 401", resp.StatusCode)
	}
}
