package api

import (
	"testing"

	"github.com/idemkv/idemkv"
)

// A reserve as the Go client sends it, with a small effect.
var benchReserveBody = []byte(`{"tenant":"acme","idempotency_key":"conv-81723:approval-55:create_ticket","tool":"create_ticket",` +
	`"effect_fingerprint":"sha256:6f1ed002ab5595859014ebf0951522d9f1a2f2a3b6c1d7e8f90a1b2c3d4e5f60",` +
	`"attempt_id":"att_0123456789abcdef01234567","lease_ttl_ms":30000,"ttl_ms":86400000,"side_effect":"non_idempotent_mutation"}`)

// BenchmarkDecodeReserve prints the cost of admitting one reserve body: decodeJSON
// (which takes the fast path for it), and the general path: the text and member-name
// checks, then encoding/json.
func BenchmarkDecodeReserve(b *testing.B) {
	b.Run("checks", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := checkBody(benchReserveBody); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("general", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var req idemkv.ReserveRequest
			if err := decodeGeneral(benchReserveBody, &req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decodeJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var req idemkv.ReserveRequest
			if err := decodeJSON(benchReserveBody, &req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
