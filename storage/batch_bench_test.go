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

// BenchmarkTombstoneMiss is what tombstones add to a new reserve: the state machine
// looks the absent key's tombstone up (a miss, almost always) in the batch that then
// writes the record. 50,000 records and 5,000 tombstones are in the memtable.
//
//	go test -run '^$' -bench TombstoneMiss -benchmem ./storage/
func BenchmarkTombstoneMiss(b *testing.B) {
	s, err := Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	seed := s.NewBatch()
	for i := range 50_000 {
		key := "seed/" + strconv.Itoa(i)
		if err := seed.PutRecord(&idemkv.Record{Tenant: "bench", Key: key, Status: idemkv.StatusPending, Fence: 1, ExpiresAt: 1 << 40,
			Fingerprint: "sha256:ab", AttemptID: key + "/1", Tool: "create_ticket"}); err != nil {
			b.Fatal(err)
		}
		if i%10 == 0 {
			if err := seed.PutTombstone(&idemkv.Tombstone{Tenant: "bench", Key: "gone/" + strconv.Itoa(i), Tool: "create_ticket",
				ExpiresAt: 1 << 40, History: []idemkv.HistoryEvent{{At: 1, Event: idemkv.EventRelease, Fence: 1}}}); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := seed.Commit(); err != nil {
		b.Fatal(err)
	}
	batch := s.NewBatch()
	defer batch.Close()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if t, err := batch.Tombstone("bench", "new/"+strconv.Itoa(i)); err != nil || t != nil {
			b.Fatal(t, err)
		}
		i++
	}
}
