package storage

import (
	"strconv"
	"testing"

	"github.com/idemkv/idemkv"
)

// BenchmarkBatchNewRecord is the state machine's part of a new reserve on every node:
// in one batch, the decision reads the absent record, then puts the pending one (with
// its in-doubt and approval-wait indexes), and the batch commits. 50,000 records are
// in the memtable already, as after a few seconds of load.
//
//	go test -run '^$' -bench BatchNewRecord -benchmem ./storage/
func BenchmarkBatchNewRecord(b *testing.B) {
	s, err := Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	rec := func(key string) *idemkv.Record {
		return &idemkv.Record{Tenant: "bench", Key: key, Status: idemkv.StatusPending, Fence: 1, ExpiresAt: 1 << 40,
			Fingerprint: "sha256:ab", AttemptID: key + "/1", Tool: "create_ticket"}
	}
	seed := s.NewBatch()
	for i := range 50_000 {
		if err := seed.PutRecord(rec("seed/" + strconv.Itoa(i))); err != nil {
			b.Fatal(err)
		}
	}
	if err := seed.Commit(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		key := "new/" + strconv.Itoa(i)
		i++
		batch := s.NewBatch()
		if cur, err := batch.Record("bench", key); err != nil || cur != nil {
			b.Fatal(cur, err)
		}
		if err := batch.PutRecord(rec(key)); err != nil {
			b.Fatal(err)
		}
		if err := batch.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}
