package api

import (
	"reflect"
	"testing"

	"github.com/idemkv/idemkv"
)

var fastSamples = []string{
	string(benchReserveBody),
	`{"tenant":"acme","idempotency_key":"k","tool":"t","effect":{"b":[1,2,{"c":null}],"a":"}"},"attempt_id":"a1"}`,
	` { "tenant" : "acme" , "idempotency_key" : "ü/€/𝄞" , "store_effect" : true , "effect" : "x" } `,
	`{"tenant":"acme","idempotency_key":"k","effect_fingerprint":"sha256:ab","fence":18446744073709551615,"remote_system":"s","remote_id":"r","result":[1,{"a":true}]}`,
	`{"tenant":"acme","idempotency_key":"k","effect_fingerprint":"sha256:ab","fence":7,"remote_system":"s","remote_id":"r","remote_url":"https://x/y?z=1"}`,
	`{}`,
	`{"lease_ttl_ms":-0,"ttl_ms":-9223372036854775808}`,
	// Each of these the fast path must leave to the general one.
	`{"tenant":"a","tenant":"b"}`,
	`{"tenant":"a","Tenant":"b"}`,
	`{"TENANT":"a"}`,
	`{"tenant":"a\"b"}`,
	`{"tenant":null}`,
	`{"effect":null}`,
	`{"lease_ttl_ms":1.0}`,
	`{"lease_ttl_ms":1e3}`,
	`{"lease_ttl_ms":01}`,
	`{"lease_ttl_ms":9223372036854775808}`,
	`{"fence":-1}`,
	`{"store_effect":"true"}`,
	`{"expires_at":"2026-01-01T00:00:00Z"}`,
	`{"expires_at":"1970-01-01T00:00:00Z"}`,
	`{"approval":{"required":true}}`,
	`{"unknown":1}`,
	`{"tenant":"a"} {}`,
	`{"tenant":"a"}x`,
	`{"tenant":"a",}`,
	`{"effect":{"a":}}`,
	`{"tenant":"a` + "\x01" + `"}`,
	`{"tenant":"` + "\xff" + `"}`,
	`[]`,
	``,
	`   `,
}

// TestFastDecodeIsEncodingJSON: whatever the fast path decodes, the general path
// decodes to the same request; what the fast path leaves, decodeJSON still decodes (or
// refuses) as the general path does.
func TestFastDecodeIsEncodingJSON(t *testing.T) {
	taken := 0
	for _, s := range fastSamples {
		if checkFastDecode(t, []byte(s)) {
			taken++
		}
	}
	if taken != 7 {
		t.Errorf("the fast path took %d of the samples, want the first 7", taken)
	}
}

func checkFastDecode(t *testing.T, body []byte) (taken bool) {
	t.Helper()
	for _, fresh := range []func() any{func() any { return new(idemkv.ReserveRequest) }, func() any { return new(idemkv.CommitRequest) }} {
		fast, general, full := fresh(), fresh(), fresh()
		generalErr := decodeGeneral(body, general)
		fullErr := decodeJSON(body, full)
		if (generalErr == nil) != (fullErr == nil) || (fullErr == nil && !reflect.DeepEqual(full, general)) {
			t.Fatalf("%q: decodeJSON %+v (%v), the general path %+v (%v)", body, full, fullErr, general, generalErr)
		}
		if !fastDecode(body, fast) {
			continue
		}
		taken = true
		if generalErr != nil {
			t.Fatalf("%q: the fast path decoded %+v, the general path refuses it: %v", body, fast, generalErr)
		}
		if !reflect.DeepEqual(fast, general) {
			t.Fatalf("%q: the fast path decoded %+v, the general path %+v", body, fast, general)
		}
	}
	return taken
}

func FuzzFastDecode(f *testing.F) {
	for _, s := range fastSamples {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFastDecode(t, body)
	})
}
