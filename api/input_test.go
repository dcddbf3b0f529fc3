package api_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
)

// TestBadInputNeverReachesTheStore sends one bad request per case. Each must be a 4xx
// naming the field at fault, the store must never be called, and the server must
// still serve a good request afterwards.
func TestBadInputNeverReachesTheStore(t *testing.T) {
	fake := &FakeStore{ReserveFunc: func(_ context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
		return &idemkv.ReserveResult{Decision: idemkv.DecisionExecute, Fence: 1, Record: pendingRecord(req.Key)}, nil
	}}
	n := startNode(t, fake, nil)

	long := func(n int) string { return strings.Repeat("k", n) }
	big := `"` + strings.Repeat("x", 64<<10) + `"`
	const (
		minute = 60_000
		day    = 24 * 60 * minute
	)
	cases := []struct {
		name, method, path string
		body               any
		status             int
		code, field        string
	}{
		// Decoding.
		{"truncated JSON", "POST", "/v1/reserve", `{"tenant":"acme",`, 400, "invalid_argument", ""},
		{"syntax error", "POST", "/v1/reserve", `{"tenant":acme}`, 400, "invalid_argument", ""},
		{"empty body", "POST", "/v1/reserve", ``, 400, "invalid_argument", ""},
		{"array body", "POST", "/v1/reserve", `[]`, 400, "invalid_argument", ""},
		{"trailing object", "POST", "/v1/release", `{"tenant":"acme"} {}`, 400, "invalid_argument", ""},
		{"trailing garbage", "POST", "/v1/release", `{"tenant":"acme"}x`, 400, "invalid_argument", ""},
		{"unknown field", "POST", "/v1/reserve", with(validReserve(), "idempotencyKey", "k"), 400, "invalid_argument", "idempotencyKey"},
		{"unknown nested field", "POST", "/v1/fail",
			with(validFail(), "error", map[string]any{"code": "x", "stack": "..."}), 400, "invalid_argument", "error.stack"},
		{"string fence", "POST", "/v1/commit", with(validCommit(), "fence", "7"), 400, "invalid_argument", "fence"},
		{"negative fence", "POST", "/v1/commit", with(validCommit(), "fence", -7), 400, "invalid_argument", "fence"},
		{"fractional lease", "POST", "/v1/reserve", with(validReserve(), "lease_ttl_ms", 1.5), 400, "invalid_argument", "lease_ttl_ms"},
		{"string lease", "POST", "/v1/heartbeat", with(validHeartbeat(), "lease_ttl_ms", "60s"), 400, "invalid_argument", "lease_ttl_ms"},
		{"numeric error code", "POST", "/v1/fail",
			with(validFail(), "error", map[string]any{"code": 5}), 400, "invalid_argument", "error.code"},
		{"unparsable expires_at", "POST", "/v1/reserve", with(validReserve(), "expires_at", "tomorrow"), 400, "invalid_argument", "expires_at"},
		{"numeric expires_at", "POST", "/v1/reserve", with(validReserve(), "expires_at", 1e12), 400, "invalid_argument", "expires_at"},
		{"boolean tenant", "POST", "/v1/reserve", with(validReserve(), "tenant", true), 400, "invalid_argument", "tenant"},

		// Text and names that encoding/json would silently rewrite or let the last win
		// (issue 13, defect 4).
		{"invalid UTF-8 in a key", "POST", "/v1/reserve",
			`{"tenant":"acme","idempotency_key":"inv` + "\xff" + `","tool":"t","effect_fingerprint":"f"}`, 400, "invalid_argument", "idempotency_key"},
		{"invalid UTF-8 in a result", "POST", "/v1/commit",
			`{"tenant":"acme","idempotency_key":"k","effect_fingerprint":"f","fence":1,"remote_system":"s","remote_id":"i","result":"` + "\xfe\xff" + `"}`,
			400, "invalid_argument", "result"},
		{"lone surrogate escape in a key", "POST", "/v1/reserve",
			`{"tenant":"acme","idempotency_key":"inv\udcff","tool":"t","effect_fingerprint":"f"}`, 400, "invalid_argument", "idempotency_key"},
		{"high surrogate escape without its pair", "POST", "/v1/release",
			`{"tenant":"acme","idempotency_key":"inv\ud800x","effect_fingerprint":"f","fence":1}`, 400, "invalid_argument", "idempotency_key"},
		{"duplicate tenant", "POST", "/v1/reserve",
			`{"tenant":"acme","idempotency_key":"k","tool":"t","effect_fingerprint":"f","tenant":"other"}`, 400, "invalid_argument", "tenant"},
		{"duplicate tenant in another case", "POST", "/v1/release",
			`{"tenant":"acme","idempotency_key":"k","effect_fingerprint":"f","fence":1,"TENANT":"other"}`, 400, "invalid_argument", "TENANT"},
		{"duplicate key through the Kelvin sign", "POST", "/v1/release",
			`{"tenant":"acme","idempotency_key":"k","effect_fingerprint":"f","fence":1,"idempotency_Key":"j"}`, 400, "invalid_argument", "idempotency_Key"},

		// Identity.
		{"tenant missing", "POST", "/v1/reserve", with(validReserve(), "tenant", remove), 400, "invalid_argument", "tenant"},
		{"tenant too long", "POST", "/v1/reserve", with(validReserve(), "tenant", long(129)), 400, "invalid_argument", "tenant"},
		{"tenant charset", "POST", "/v1/reserve", with(validReserve(), "tenant", "acme corp"), 400, "invalid_argument", "tenant"},
		{"tenant slash", "POST", "/v1/commit", with(validCommit(), "tenant", "acme/eu"), 400, "invalid_argument", "tenant"},
		{"key missing", "POST", "/v1/reserve", with(validReserve(), "idempotency_key", ""), 400, "invalid_argument", "idempotency_key"},
		{"key too long", "POST", "/v1/reserve", with(validReserve(), "idempotency_key", long(513)), 400, "invalid_argument", "idempotency_key"},
		{"key not printable", "POST", "/v1/reserve", with(validReserve(), "idempotency_key", "a\x01b"), 400, "invalid_argument", "idempotency_key"},
		{"tool missing", "POST", "/v1/reserve", with(validReserve(), "tool", remove), 400, "invalid_argument", "tool"},
		{"tool too long", "POST", "/v1/reserve", with(validReserve(), "tool", long(129)), 400, "invalid_argument", "tool"},
		{"actor too long", "POST", "/v1/reserve", with(validReserve(), "actor", long(129)), 400, "invalid_argument", "actor"},
		{"no fingerprint nor effect", "POST", "/v1/reserve",
			with(validReserve(), "effect_fingerprint", remove), 400, "invalid_argument", "effect_fingerprint"},
		{"fingerprint too long", "POST", "/v1/release",
			with(validRelease(), "effect_fingerprint", long(129)), 400, "invalid_argument", "effect_fingerprint"},

		// Leases and TTLs.
		{"lease too short", "POST", "/v1/reserve", with(validReserve(), "lease_ttl_ms", 999), 400, "invalid_argument", "lease_ttl_ms"},
		{"lease too long", "POST", "/v1/reserve", with(validReserve(), "lease_ttl_ms", 3_600_001), 400, "invalid_argument", "lease_ttl_ms"},
		{"heartbeat lease too short", "POST", "/v1/heartbeat",
			with(validHeartbeat(), "lease_ttl_ms", 500), 400, "invalid_argument", "lease_ttl_ms"},
		{"ttl too short", "POST", "/v1/reserve", with(validReserve(), "ttl_ms", minute-1), 400, "invalid_argument", "ttl_ms"},
		{"ttl too long", "POST", "/v1/reserve", with(validReserve(), "ttl_ms", 30*day+1), 400, "invalid_argument", "ttl_ms"},
		{"ttl shorter than lease", "POST", "/v1/reserve",
			with(validReserve(), "lease_ttl_ms", 3_600_000, "ttl_ms", 2*minute), 400, "invalid_argument", "ttl_ms"},
		{"ttl and expires_at", "POST", "/v1/reserve",
			with(validReserve(), "ttl_ms", 10*minute, "expires_at", "2099-01-01T00:00:00Z"), 400, "invalid_argument", "expires_at"},
		{"expires_at in the past", "POST", "/v1/reserve",
			with(validReserve(), "expires_at", "2001-01-01T00:00:00.000Z"), 400, "invalid_argument", "expires_at"},
		// The zero time is what the request types read as "no expires_at": given, it
		// got the default TTL (issue 22, point 9). However the name is spelt.
		{"expires_at of the zero time", "POST", "/v1/reserve",
			with(validReserve(), "expires_at", "1970-01-01T00:00:00Z"), 400, "invalid_argument", "expires_at"},
		{"expires_at in the zero time's millisecond", "POST", "/v1/reserve",
			with(validReserve(), "expires_at", "1970-01-01T00:00:00.000999Z"), 400, "invalid_argument", "expires_at"},
		{"expires_at of the zero time, in another zone", "POST", "/v1/reserve",
			with(validReserve(), "expires_at", "1970-01-01T02:00:00+02:00"), 400, "invalid_argument", "expires_at"},
		{"expires_at of the zero time, name in capitals", "POST", "/v1/reserve",
			`{"tenant":"acme","idempotency_key":"k","tool":"t","effect_fingerprint":"f","EXPIRES_AT":"1970-01-01T00:00:00Z"}`,
			400, "invalid_argument", "expires_at"},
		{"expires_at of the zero time, name escaped", "POST", "/v1/reserve",
			`{"tenant":"acme","idempotency_key":"k","tool":"t","effect_fingerprint":"f","expire\u017f_at":"1970-01-01T00:00:00Z"}`,
			400, "invalid_argument", "expires_at"},

		// Commit, fail, release.
		{"fence missing", "POST", "/v1/commit", with(validCommit(), "fence", remove), 400, "invalid_argument", "fence"},
		{"remote_id missing", "POST", "/v1/commit", with(validCommit(), "remote_id", remove), 400, "invalid_argument", "remote_id"},
		{"result over 64 KiB", "POST", "/v1/commit",
			`{"tenant":"acme","idempotency_key":"k","effect_fingerprint":"f","fence":1,"remote_system":"s","remote_id":"i","result":` + big + `}`,
			413, "payload_too_large", "result"},
		{"error details over 64 KiB", "POST", "/v1/fail",
			`{"tenant":"acme","idempotency_key":"k","effect_fingerprint":"f","fence":1,"error":{"code":"c","details":` + big + `}}`,
			413, "payload_too_large", "error"},
		{"error code missing", "POST", "/v1/fail",
			with(validFail(), "error", map[string]any{"message": "m"}), 400, "invalid_argument", "error.code"},
		{"release fence zero", "POST", "/v1/release", with(validRelease(), "fence", 0), 400, "invalid_argument", "fence"},

		// Reads.
		{"get negative wait", "GET", "/v1/records/acme/k?wait_ms=-1", nil, 400, "invalid_argument", "wait_ms"},
		{"get wait over 5 min", "GET", "/v1/records/acme/k?wait_ms=300001", nil, 400, "invalid_argument", "wait_ms"},
		{"get wait overflowing", "GET", "/v1/records/acme/k?wait_ms=9223372036854775807", nil, 400, "invalid_argument", "wait_ms"},
		{"get wait not a number", "GET", "/v1/records/acme/k?wait_ms=soon", nil, 400, "invalid_argument", "wait_ms"},
		{"get consistency", "GET", "/v1/records/acme/k?consistency=eventual", nil, 400, "invalid_argument", "consistency"},
		{"get bad tenant", "GET", "/v1/records/acme%20corp/k", nil, 400, "invalid_argument", "tenant"},
		{"get empty key", "GET", "/v1/records/acme/", nil, 400, "invalid_argument", "idempotency_key"},
		{"get key too long", "GET", "/v1/records/acme/" + long(513), nil, 400, "invalid_argument", "idempotency_key"},
		{"get malformed query", "GET", "/v1/records/acme/k?wait_ms=%zz", nil, 400, "invalid_argument", ""},
		{"list limit over 1000", "GET", "/v1/records/acme?limit=1001", nil, 400, "invalid_argument", "limit"},
		{"list limit zero", "GET", "/v1/records/acme?limit=0", nil, 400, "invalid_argument", "limit"},
		{"list limit not a number", "GET", "/v1/records/acme?limit=ten", nil, 400, "invalid_argument", "limit"},
		{"list consistency", "GET", "/v1/records/acme?consistency=eventual", nil, 400, "invalid_argument", "consistency"},
		{"list status", "GET", "/v1/records/acme?status=done", nil, 400, "invalid_argument", "status"},
		{"list prefix too long", "GET", "/v1/records/acme?prefix=" + long(513), nil, 400, "invalid_argument", "prefix"},
		{"list bad tenant", "GET", "/v1/records/ac%2Fme", nil, 400, "invalid_argument", "tenant"},

		// Membership.
		{"join without id", "POST", "/v1/cluster/join",
			map[string]any{"raft_addr": "127.0.0.1:1", "api_addr": "127.0.0.1:2"}, 400, "invalid_argument", "id"},
		{"join bad raft_addr", "POST", "/v1/cluster/join",
			map[string]any{"id": "n3", "raft_addr": "nowhere", "api_addr": "127.0.0.1:2"}, 400, "invalid_argument", "raft_addr"},
		{"join without api_addr", "POST", "/v1/cluster/join",
			map[string]any{"id": "n3", "raft_addr": "127.0.0.1:1"}, 400, "invalid_argument", "api_addr"},
		{"remove without id", "POST", "/v1/cluster/remove", map[string]any{}, 400, "invalid_argument", "id"},
		{"remove unknown field", "POST", "/v1/cluster/remove", map[string]any{"id": "n2", "purge": true}, 400, "invalid_argument", "purge"},

		// Size: 2 MiB, announced and chunked.
		{"2 MiB body", "POST", "/v1/reserve", hugeBody(), 413, "payload_too_large", ""},
		{"2 MiB chunked body", "POST", "/v1/commit", io.MultiReader(strings.NewReader(hugeBody())), 413, "payload_too_large", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			do(t, c.method, n.url+c.path, c.body, nil).wantError(t, c.status, c.code, c.field)
			if calls := n.fake.Calls(); calls != 0 {
				t.Fatalf("the store was called %d times", calls)
			}
		})
	}

	do(t, "GET", n.url+"/healthz", nil, nil).object(t, http.StatusOK)
	if m := do(t, "POST", n.url+"/v1/reserve", validReserve(), nil).object(t, http.StatusOK); m["decision"] != "execute" {
		t.Errorf("after the bad requests, reserve answered %v", m)
	}
}

// hugeBody is a syntactically valid reserve of 2 MiB, so that only its size is wrong.
func hugeBody() string {
	return `{"tenant":"acme","idempotency_key":"k","tool":"t","effect":"` + strings.Repeat("x", 2<<20) + `"}`
}

// TestBodyUpToTheLimitIsAccepted guards the other side of the size check: a body just
// under 1 MiB is read in full.
func TestBodyUpToTheLimitIsAccepted(t *testing.T) {
	var got int
	fake := &FakeStore{ReserveFunc: func(_ context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
		got = len(req.Effect)
		return &idemkv.ReserveResult{Decision: idemkv.DecisionExecute, Fence: 1, Record: pendingRecord(req.Key)}, nil
	}}
	n := startNode(t, fake, nil)
	prefix := `{"tenant":"acme","idempotency_key":"k","tool":"t","effect":"`
	pad := idemkv.MaxRequestBytes - len(prefix) - len(`"}`)
	body := prefix + strings.Repeat("x", pad) + `"}`
	if len(body) != idemkv.MaxRequestBytes {
		t.Fatalf("body is %d bytes", len(body))
	}
	do(t, "POST", n.url+"/v1/reserve", body, nil).object(t, http.StatusOK)
	if got != pad+2 {
		t.Errorf("store got an effect of %d bytes, want %d", got, pad+2)
	}
}
