package storage

import (
	"testing"

	"github.com/idemkv/idemkv"
)

// BenchmarkApprovalRuleMiss is what every reserve now pays on the node that takes it:
// a look-up of its tenant and tool's approval rule, which almost always finds none.
func BenchmarkApprovalRuleMiss(b *testing.B) {
	s, err := Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	batch := s.NewBatch()
	for i := range 1000 {
		if err := batch.PutRecord(&idemkv.Record{Tenant: "acme", Key: string(rune('a'+i%26)) + string(rune(i)), Status: idemkv.StatusPending, Fence: 1, ExpiresAt: 1 << 40}); err != nil {
			b.Fatal(err)
		}
	}
	if err := batch.PutApprovalRule(idemkv.ApprovalRule{Tenant: "acme", Tool: "refund", TTLMs: 60_000}); err != nil {
		b.Fatal(err)
	}
	if err := batch.Commit(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok, err := s.ApprovalRule("acme", "create_ticket"); err != nil || ok {
			b.Fatal(ok, err)
		}
	}
}
