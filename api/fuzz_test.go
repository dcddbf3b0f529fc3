package api

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// fuzzDecode checks request decoding against hostile bodies: it never panics, every
// refusal is an invalid_argument, and whatever it accepts survives validation without
// panicking and decodes again, after one round of encoding, to the same request.
func fuzzDecode[T any](f *testing.F, seeds []string, validate func(*T) error) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req T
		if err := decodeJSON(body, &req); err != nil {
			var e *idemkv.Error
			if !errors.As(err, &e) || e.Code != idemkv.CodeInvalidArgument || e.Message == "" {
				t.Fatalf("decode refused %q with %#v, want an invalid_argument with a message", body, err)
			}
			return
		}
		if err := validate(&req); err != nil {
			var e *idemkv.Error
			if !errors.As(err, &e) || e.Code != idemkv.CodeInvalidArgument {
				t.Fatalf("validation refused %q with %#v, want an invalid_argument", body, err)
			}
		}
		// Encoding normalises raw JSON (whitespace in effect, result, details), so the
		// fixed point is reached after one round.
		once := roundTrip(t, &req)
		twice := roundTrip(t, once)
		if !reflect.DeepEqual(once, twice) {
			t.Fatalf("decoding is not stable for %q:\n%+v\n%+v", body, once, twice)
		}
	})
}

func roundTrip[T any](t *testing.T, req *T) *T {
	t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatalf("encoding an accepted request %+v: %v", req, err)
	}
	var again T
	if err := decodeJSON(b, &again); err != nil {
		t.Fatalf("an accepted request does not decode again: %v\n%s", err, b)
	}
	return &again
}

var fuzzNow = idemkv.TimestampOf(time.Date(2026, 7, 29, 13, 0, 0, 0, time.UTC))

func FuzzDecodeReserve(f *testing.F) {
	fuzzDecode(f, []string{
		`{"tenant":"acme","idempotency_key":"conversation_9:approval_17:create_ticket","tool":"create_ticket","actor":"agent-7","effect_fingerprint":"sha256:7f4c2a9d0b1e3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a3c5e7b9d1f3a"}`,
		`{"tenant":"acme","idempotency_key":"k","tool":"t","effect":{"project":"OPS","title":"Outage","n":[1,2.5,-3e10,null,true]},"lease_ttl_ms":60000,"ttl_ms":3600000}`,
		`{"tenant":"acme","idempotency_key":"k","tool":"t","effect_fingerprint":"sha256:00","expires_at":"2026-08-01T00:00:00.000Z","attempt_id":"a1"}`,
	}, func(r *idemkv.ReserveRequest) error { return r.Validate(idemkv.DefaultLimits(), fuzzNow) })
}

func FuzzDecodeCommit(f *testing.F) {
	fuzzDecode(f, []string{
		`{"tenant":"acme","idempotency_key":"k","effect_fingerprint":"sha256:00","fence":7,"remote_system":"linear","remote_id":"LIN-1842","remote_url":"https://linear.example/issue/LIN-1842","result":{"number":1842}}`,
		`{"tenant":"acme","idempotency_key":"k","effect_fingerprint":"sha256:00","fence":18446744073709551615,"remote_system":"s","remote_id":"i","result":"\u00e9\ud83d\ude00"}`,
	}, func(r *idemkv.CommitRequest) error { return r.Validate(idemkv.DefaultLimits()) })
}

func FuzzDecodeFail(f *testing.F) {
	fuzzDecode(f, []string{
		`{"tenant":"acme","idempotency_key":"k","effect_fingerprint":"sha256:00","fence":7,"error":{"code":"quota_exceeded","message":"project is full","details":{"limit":10}}}`,
	}, func(r *idemkv.FailRequest) error { return r.Validate(idemkv.DefaultLimits()) })
}

func FuzzDecodeRelease(f *testing.F) {
	fuzzDecode(f, []string{
		`{"tenant":"acme","idempotency_key":"k","effect_fingerprint":"sha256:00","fence":7}`,
	}, (*idemkv.ReleaseRequest).Validate)
}

func FuzzDecodeHeartbeat(f *testing.F) {
	fuzzDecode(f, []string{
		`{"tenant":"acme","idempotency_key":"k","fence":7,"lease_ttl_ms":60000}`,
	}, func(r *idemkv.HeartbeatRequest) error { return r.Validate(idemkv.DefaultLimits()) })
}

func FuzzDecodeJoin(f *testing.F) {
	fuzzDecode(f, []string{
		`{"id":"n3","raft_addr":"127.0.0.1:7431","api_addr":"127.0.0.1:7430"}`,
		`{"id":"n3","raft_addr":"[::1]:7431","api_addr":"node3.example:7430"}`,
	}, validJoin)
}
