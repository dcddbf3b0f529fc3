package node_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/auth"
	"github.com/idemkv/idemkv/internal/testcluster"
)

// FuzzHandler sends random methods, paths, bodies and tokens to the whole HTTP handler
// (authentication, routing, decoding, the node) of a real in-process node with a
// token file. Whatever comes in: no panic, no redirect, no 500, an error body in the
// API's shape with the status of its code, valid UTF-8 out, and a token for tenant
// acme never reads or changes tenant beta's record (issue 13).
func FuzzHandler(f *testing.F) {
	c := testcluster.Start(f, 1)
	nd := c.Node(0)
	tokens := []string{"", "idk_acme", "idk_monitor", "idk_bogus"}
	file := &auth.File{Tokens: []auth.Token{
		{Name: "acme", Hash: auth.HashToken("idk_acme"), Role: auth.RoleClient, Tenants: []string{"acme"}},
		{Name: "monitor", Hash: auth.HashToken("idk_monitor"), Role: auth.RoleMonitor},
	}}
	a, err := auth.New(file, nil)
	if err != nil {
		f.Fatal(err)
	}
	h := api.New(api.Config{Store: nd, Middleware: a.Middleware, Logger: slog.New(slog.DiscardHandler),
		MaxLongPolls: 4, MaxLongPollsPerCaller: 2}).Handler()

	// beta's record, which no input may read or change.
	ctx := context.Background()
	res, err := nd.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "beta", Key: "secret", Tool: "t", Fingerprint: "sha256:beta"})
	if err != nil {
		f.Fatal(err)
	}
	if _, err := nd.Commit(ctx, &idemkv.CommitRequest{Tenant: "beta", Key: "secret", Fingerprint: "sha256:beta",
		Fence: res.Fence, RemoteSystem: "s", RemoteID: "BETA-SECRET"}); err != nil {
		f.Fatal(err)
	}
	betaBefore, err := nd.Get(ctx, &idemkv.GetRequest{Tenant: "beta", Key: "secret", Consistency: idemkv.Stale})
	if err != nil {
		f.Fatal(err)
	}

	methods := []string{"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"}
	for _, s := range []struct {
		m     uint8
		path  string
		body  string
		token uint8
	}{
		{1, "/v1/reserve", `{"tenant":"acme","idempotency_key":"k","tool":"t","effect":{"a":1}}`, 1},
		{1, "/v1/reserve", `{"tenant":"beta","idempotency_key":"secret","tool":"t","effect_fingerprint":"sha256:beta"}`, 1},
		{1, "/v1/reserve", `{"tenant":"acme","Tenant":"beta","idempotency_key":"secret","tool":"t","effect_fingerprint":"sha256:beta"}`, 1},
		{1, "/v1/commit", `{"tenant":"acme","idempotency_key":"k","effect_fingerprint":"f","fence":1,"remote_system":"s","remote_id":"r","result":"\xff"}`, 1},
		{1, "/v1/heartbeat", `{"tenant":"acme","idempotency_key":"k","fence":1,"lease_ttl_ms":166020696664386}`, 1},
		{1, "/v1/release", `{"tenant":"beta","idempotency_key":"secret","effect_fingerprint":"sha256:beta","fence":1}`, 1},
		{0, "/v1/records/beta/secret", ``, 1},
		{0, "/v1/records/acme/../beta/secret", ``, 1},
		{0, "/v1/records/acme/..%2Fbeta%2Fsecret", ``, 1},
		{0, "/v1/records/%62eta", ``, 1},
		{0, "/v1/records/acme/k?wait_ms=100", ``, 1},
		{0, "/v1/records/acme?prefix=%ff&limit=1000", ``, 1},
		{0, "/v1/backup", ``, 1},
		{0, "/metrics", ``, 2},
		{0, "/v1/cluster", ``, 0},
		{1, "/v1/cluster/join", `{"id":"n1","raft_addr":"127.0.0.1:1","api_addr":"127.0.0.1:2"}`, 1},
		{0, "//v1/records/beta/secret", ``, 3},
	} {
		f.Add(s.m, s.path, []byte(s.body), s.token)
	}
	f.Fuzz(func(t *testing.T, m uint8, path string, body []byte, token uint8) {
		method := methods[int(m)%len(methods)]
		r, err := http.NewRequest(method, "http://node"+path, strings.NewReader(string(body)))
		if err != nil || !strings.HasPrefix(r.URL.Path, "/") {
			return // not a request a client can send
		}
		rctx, cancel := context.WithTimeout(r.Context(), 300*time.Millisecond)
		defer cancel()
		r = r.WithContext(rctx)
		tok := tokens[int(token)%len(tokens)]
		if tok != "" {
			r.Header.Set("Authorization", "Bearer "+tok)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)

		status, out := w.Code, w.Body.Bytes()
		switch {
		case status >= 300 && status < 400:
			t.Fatalf("%s %q: redirect %d to %q", method, path, status, w.Header().Get("Location"))
		case status == http.StatusInternalServerError:
			t.Fatalf("%s %q %q: 500 %s", method, path, body, out)
		case !utf8.Valid(out):
			t.Fatalf("%s %q: the answer is not valid UTF-8: %q", method, path, out)
		case strings.Contains(string(out), "BETA-SECRET"):
			t.Fatalf("%s %q %q with token %q: beta's receipt leaked: %s", method, path, body, tok, out)
		}
		if status >= 400 && method != "HEAD" {
			var e struct {
				Error *idemkv.Error `json:"error"`
			}
			if err := json.Unmarshal(out, &e); err != nil || e.Error == nil || e.Error.Message == "" {
				t.Fatalf("%s %q: %d with a body not in the error shape: %q", method, path, status, out)
			}
			if want := idemkv.HTTPStatus(e.Error.Code); want != status && status != http.StatusMethodNotAllowed {
				t.Fatalf("%s %q: status %d for code %s (its status is %d)", method, path, status, e.Error.Code, want)
			}
		}
		after, err := nd.Get(ctx, &idemkv.GetRequest{Tenant: "beta", Key: "secret", Consistency: idemkv.Stale})
		if err != nil || after.UpdatedAt != betaBefore.UpdatedAt || after.Status != betaBefore.Status || after.Fence != betaBefore.Fence {
			t.Fatalf("%s %q %q with token %q changed beta's record: %+v, %v", method, path, body, tok, after, err)
		}
	})
}
