package storage

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// BenchmarkSnapshot writes a snapshot of a store of IDEMKV_BENCH_RECORDS records
// (default 100,000) into a file, fsynced as Raft's snapshot store does, and restores it
// into a new store: what a Raft snapshot costs the node that takes it and the one that
// installs it. The version-1 record stream (what snapshots were before version 2) runs
// beside it in the same process for the ratio. Besides ns/op it reports the stream's
// size and the CPU time the process used per op.
//
//	IDEMKV_BENCH_RECORDS=1000000 go test ./storage -run '^$' -bench Snapshot -benchtime 3x -timeout 1h
//
// IDEMKV_BENCH_DIR keeps the seeded store there between runs (seeding a million
// records takes about 20 s).
//
// Measured on the 2-core development machine, shared (load 3-11), files against the
// record stream of the code before (commit 0152691), back to back: at a million
// records, write 0.17 s against 0.54-0.58 s and restore 0.28-0.30 s against 3.9-5.3 s;
// at ten million, write 1.5-1.6 s against 7.0-20 s and restore 1.8-4.8 s against
// 24-37 s. The stream is 111-115 bytes per record against 243-251.
func BenchmarkSnapshot(b *testing.B) {
	n := 100_000
	if v := os.Getenv("IDEMKV_BENCH_RECORDS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	src := benchStore(b, n)
	work := b.TempDir()
	formats := []struct {
		name  string
		write func(*Snapshot, io.Writer) (int64, error)
	}{
		{"files", (*Snapshot).WriteTo},
		{"records", (*Snapshot).WriteRecordsTo},
	}
	for _, f := range formats {
		file := filepath.Join(work, f.name+".snap")
		b.Run("write/"+f.name, func(b *testing.B) {
			var size int64
			cpu := cpuTime()
			for range b.N {
				size = benchWrite(b, src, file, f.write)
			}
			b.ReportMetric(float64(size)/float64(n), "bytes/record")
			b.ReportMetric(float64((cpuTime()-cpu).Milliseconds())/float64(b.N), "cpu-ms/op")
		})
		b.Run("restore/"+f.name, func(b *testing.B) {
			if _, err := os.Stat(file); err != nil {
				benchWrite(b, src, file, f.write)
			}
			dst, err := Open(filepath.Join(work, "dst"), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer dst.Close()
			cpu := cpuTime()
			b.ResetTimer()
			for range b.N {
				in, err := os.Open(file)
				if err != nil {
					b.Fatal(err)
				}
				err = dst.Restore(in)
				in.Close()
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if got := dst.RecordCount(); got != int64(n) {
				b.Fatalf("restored %d records, want %d", got, n)
			}
			b.ReportMetric(float64((cpuTime()-cpu).Milliseconds())/float64(b.N), "cpu-ms/op")
		})
	}
}

// benchWrite writes a snapshot of s to file and syncs it; it returns the size.
func benchWrite(b *testing.B, s *Store, file string, write func(*Snapshot, io.Writer) (int64, error)) int64 {
	out, err := os.Create(file)
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	if err := s.Sync(); err != nil {
		b.Fatal(err)
	}
	snap := s.NewSnapshot()
	n, err := write(snap, out)
	if err := errors.Join(err, snap.Close(), out.Sync()); err != nil {
		b.Fatal(err)
	}
	return n
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchStore opens a store of n committed records shaped like the ones `idemkv bench`
// leaves (bench/seed.go), seeding it first unless IDEMKV_BENCH_DIR already holds it.
func benchStore(b *testing.B, n int) *Store {
	b.Helper()
	root := os.Getenv("IDEMKV_BENCH_DIR")
	if root == "" {
		root = b.TempDir()
	}
	dir := filepath.Join(root, fmt.Sprintf("records-%d", n))
	s, err := Open(dir, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	if got := s.RecordCount(); got == int64(n) {
		return s
	} else if got != 0 {
		b.Fatalf("%s holds %d records, want %d: remove it", dir, got, n)
	}
	start := time.Now()
	now := idemkv.Timestamp(time.Now().UnixMilli())
	for i := 0; i < n; {
		batch := s.NewBatch()
		for j := 0; j < 10_000 && i < n; j++ {
			key := fmt.Sprintf("%08x/new/s%d/%d", i/100_000*0x9e3779b1, i%16, i/16+1)
			sum := sha256.Sum256([]byte(key))
			r := &idemkv.Record{Tenant: "bench", Key: key, Fingerprint: "sha256:" + hex.EncodeToString(sum[:]),
				Tool: "create_ticket", Actor: "bench", Status: idemkv.StatusCommitted, Fence: uint64(2*i + 1),
				AttemptID: key + "/1", Attempts: 1, CreatedAt: now, UpdatedAt: now + 2, ExpiresAt: now + 30*24*3600*1000,
				Receipt: &idemkv.StoredReceipt{RemoteSystem: "bench", RemoteID: "R-" + strconv.Itoa(2*i+1), CommittedAt: now + 2}}
			if err := batch.PutRecord(r); err != nil {
				b.Fatal(err)
			}
			i++
		}
		if err := errors.Join(batch.SetApplied(uint64(2*i), 1), batch.Commit()); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Sync(); err != nil {
		b.Fatal(err)
	}
	b.Logf("seeded %d records in %s", n, time.Since(start).Round(time.Millisecond))
	return s
}
