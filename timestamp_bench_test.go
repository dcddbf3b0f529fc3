package idemkv

import (
	"encoding/json"
	"testing"
)

func BenchmarkTimestampMarshalJSON(b *testing.B) {
	r := Record{Tenant: "bench", Key: "k", CreatedAt: 1764633600123, UpdatedAt: 1764633600456, LeaseExpiresAt: 1764633660123, ExpiresAt: 1767225600123}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := json.Marshal(&r); err != nil {
			b.Fatal(err)
		}
	}
}
