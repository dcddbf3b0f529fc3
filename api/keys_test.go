package api_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
)

// escapeKey is how a client puts a key in a path: one escaped segment. A key that is
// exactly "." or ".." must have its dots escaped too, or path cleaning would treat it
// as a directory step.
func escapeKey(key string) string {
	if key == "." || key == ".." {
		return strings.ReplaceAll(key, ".", "%2E")
	}
	return url.PathEscape(key)
}

var pathKeys = []string{
	"conversation_9:approval_17:create_ticket",
	"a/b/c",
	"a//b",
	"trailing/",
	"/leading",
	"a%2Fb", // a literal percent sequence, not a slash
	"100%",
	"%",
	"with space and\ttab",
	"ünïcødé ☃ 日本語 🚀",
	"?query=1&x#fragment",
	"a/../b",
	"./x",
	".",
	"..",
	"+plus+",
	`"quoted" \back\ 'single'`,
	"semi;colon,comma=eq@at$dollar",
}

// TestKeysRoundTripThroughThePath proves that every key reaches the store as it was,
// from the node itself and through a follower's forward.
func TestKeysRoundTripThroughThePath(t *testing.T) {
	var got []string
	leaderFake := &FakeStore{GetFunc: func(_ context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
		got = append(got, req.Key)
		return pendingRecord(req.Key), nil
	}}
	leader, follower := pair(t, leaderFake, &FakeStore{}, nil)

	for _, key := range pathKeys {
		if err := idemkv.ValidKey(key); err != nil && !strings.Contains(key, "\t") {
			t.Fatalf("fixture key %q is invalid: %v", key, err)
		}
	}
	for _, node := range []*testNode{leader, follower} {
		for _, key := range pathKeys {
			got = nil
			r := do(t, "GET", node.url+"/v1/records/acme/"+escapeKey(key), nil, nil)
			if strings.Contains(key, "\t") {
				// A tab is not printable: the key is refused, named, and never looked up.
				r.wantError(t, 400, idemkv.CodeInvalidArgument, "idempotency_key")
				if len(got) != 0 {
					t.Errorf("key %q reached the store", key)
				}
				continue
			}
			m := r.object(t, http.StatusOK)
			if len(got) != 1 || got[0] != key {
				t.Errorf("via %s: key %q reached the store as %q", node.addr, key, got)
			}
			if m["idempotency_key"] != key {
				t.Errorf("key %q came back as %v", key, m["idempotency_key"])
			}
		}
	}
}

// TestUnescapedSlashesStillNameTheKey: the rest of the path after the tenant is the
// key, so a client that does not escape "/" still reaches the right record.
func TestUnescapedSlashesStillNameTheKey(t *testing.T) {
	var got string
	n := startNode(t, &FakeStore{GetFunc: func(_ context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
		got = req.Key
		return pendingRecord(req.Key), nil
	}}, nil)
	do(t, "GET", n.url+"/v1/records/acme/conv:9/step/2?consistency=stale", nil, nil).object(t, http.StatusOK)
	if got != "conv:9/step/2" {
		t.Errorf("key %q, want conv:9/step/2", got)
	}
}

// TestRawPathsAreNeverRedirected: a caller that does not escape a key with "//" or
// dot segments used to get a 307 to the cleaned path, another record's, possibly in
// another tenant (issue 13, defect 6). The raw path names the record, on the node and
// through a follower's forward; an unclean path elsewhere is refused, not redirected.
func TestRawPathsAreNeverRedirected(t *testing.T) {
	var got []string
	leaderFake := &FakeStore{GetFunc: func(_ context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
		got = append(got, req.Tenant+"|"+req.Key)
		return pendingRecord(req.Key), nil
	}}
	leader, follower := pair(t, leaderFake, &FakeStore{}, nil)
	cases := []struct{ path, want string }{
		{"/v1/records/acme/a//b", "acme|a//b"},
		{"/v1/records/acme/../other/k", "acme|../other/k"},
		{"/v1/records/acme/x/../../other/k", "acme|x/../../other/k"},
		{"/v1/records/acme/./k", "acme|./k"},
		{"/v1/records/acme/k/.", "acme|k/."},
		{"/v1/records/acme/a%2Fb//c", "acme|a/b//c"},
	}
	for _, node := range []*testNode{leader, follower} {
		for _, c := range cases {
			got = nil
			r := do(t, "GET", node.url+c.path, nil, nil)
			if r.status != http.StatusOK {
				t.Errorf("%s via %s: status %d (Location %q), want 200", c.path, node.addr, r.status, r.header.Get("Location"))
				continue
			}
			if len(got) != 1 || got[0] != c.want {
				t.Errorf("%s via %s reached the store as %q, want %q", c.path, node.addr, got, c.want)
			}
		}
	}
	for _, p := range []string{"//v1/reserve", "/v1/./reserve", "/v1/records/../cluster"} {
		r := do(t, "POST", leader.url+p, validReserve(), nil)
		if r.status == http.StatusTemporaryRedirect || r.header.Get("Location") != "" {
			t.Errorf("%s: redirected to %q", p, r.header.Get("Location"))
		}
		if r.status != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", p, r.status)
		}
	}
}
