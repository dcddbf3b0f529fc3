package storage

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idemkv"
)

// sweepAll deletes every overdue record at now, limit per batch, the way the state
// machine's sweep does, and marks each batch's last entry swept.
func sweepAll(t *testing.T, s *Store, now idemkv.Timestamp, limit int) int {
	t.Helper()
	total := 0
	for {
		b := s.NewBatch()
		entries, err := b.Expired(now, limit)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if ok, err := b.DeleteRecord(e.Tenant, e.Key); err != nil || !ok {
				t.Fatalf("delete %v: %v %v", e, ok, err)
			}
		}
		if len(entries) > 0 {
			if err := b.MarkSwept(entries[len(entries)-1]); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		total += len(entries)
		if len(entries) < limit {
			return total
		}
	}
}

func putExpiring(t *testing.T, s *Store, n int, at func(i int) idemkv.Timestamp) {
	t.Helper()
	b := s.NewBatch()
	for i := range n {
		rec := &idemkv.Record{Tenant: "acme", Key: fmt.Sprintf("k%06d", i), Fingerprint: "sha256:x", Tool: "t",
			Status: idemkv.StatusPending, Fence: uint64(i + 1), Attempts: 1, CreatedAt: ts, UpdatedAt: ts, ExpiresAt: at(i)}
		if err := b.PutRecord(rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
}

// Scans of the expiry index start after the swept mark: entries swept earlier leave
// tombstones that, without the mark, every later scan would step over until a
// compaction drops them, making a sweep of a large backlog quadratic.
func TestScanStartsAfterTheSweptMark(t *testing.T) {
	s := openStore(t, t.TempDir())
	const swept, live = 5000, 10
	putExpiring(t, s, swept+live, func(i int) idemkv.Timestamp {
		if i < swept {
			return ts + idemkv.Timestamp(i)
		}
		return ts + 1_000_000
	})
	now := ts + swept
	if got := sweepAll(t, s, now, 128); got != swept {
		t.Fatalf("swept %d, want %d", got, swept)
	}
	if n, _, err := s.Overdue(now, 1<<20); err != nil || n != 0 {
		t.Fatalf("overdue after sweeping: %d %v", n, err)
	}
	if err := s.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}

	points := func(lower []byte) uint64 {
		t.Helper()
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: recordExpiry.bound(ts + 2_000_000)})
		if err != nil {
			t.Fatal(err)
		}
		defer it.Close()
		if !it.First() {
			t.Fatal("no live index entry found")
		}
		return it.Stats().InternalStats.PointCount
	}
	bound, err := sweptBound(s.db)
	if err != nil {
		t.Fatal(err)
	}
	// The premise: the tombstones are there for a scan from the start to wade through.
	if fromStart := points([]byte(prefixExpiry)); fromStart < swept {
		t.Fatalf("a scan from the start of the index met %d points; the test needs the %d tombstones in place", fromStart, swept)
	}
	if fromMark := points(bound); fromMark > 2 {
		t.Errorf("a scan from the swept mark met %d points before the first live entry, want 1", fromMark)
	}
}

// The mark is state like any other: it survives a reopen and a snapshot restore, and
// the index check reports an entry the mark would hide from the sweeper.
func TestSweptMarkPersistsAndIsChecked(t *testing.T) {
	dir := t.TempDir()
	s, closeNow := openClosable(t, dir)
	putExpiring(t, s, 30, func(i int) idemkv.Timestamp { return ts + idemkv.Timestamp(i) })
	now := ts + 19 // k000000..k000019 are overdue
	b := s.NewBatch()
	entries, err := b.Expired(now, 15)
	if err != nil || len(entries) != 15 {
		t.Fatalf("expired: %d %v", len(entries), err)
	}
	for _, e := range entries {
		if _, err := b.DeleteRecord(e.Tenant, e.Key); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.MarkSwept(entries[len(entries)-1]); err != nil {
		t.Fatal(err)
	}
	// Reads in the same batch see the mark.
	if rest, err := b.Expired(now, 100); err != nil || len(rest) != 5 || rest[0].Key != "k000015" {
		t.Fatalf("expired within the sweeping batch: %v %v", rest, err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	check := func(s *Store, when string) {
		t.Helper()
		n, oldest, err := s.Overdue(now, 100)
		if err != nil || n != 5 || oldest != ts+15 {
			t.Fatalf("%s: overdue %d oldest %s (%v), want 5 from %s", when, n, oldest, err, ts+15)
		}
		if err := s.CheckExpiryIndex(); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
	}
	check(s, "after the sweep")
	closeNow()
	s = openStore(t, dir)
	check(s, "after reopening")

	snap := s.NewSnapshot()
	var buf bytes.Buffer
	if _, err := snap.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	if err := snap.Close(); err != nil {
		t.Fatal(err)
	}
	restored := openStore(t, t.TempDir())
	if err := restored.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	check(restored, "after a restore")

	// An entry written at or before the mark (which only a bug could do) is invisible
	// to the sweeper: the index check must say so.
	stray := s.NewBatch()
	if err := stray.PutRecord(&idemkv.Record{Tenant: "acme", Key: "k000000", Fingerprint: "f", Tool: "t",
		Status: idemkv.StatusPending, Fence: 99, Attempts: 1, CreatedAt: ts, UpdatedAt: ts, ExpiresAt: ts}); err != nil {
		t.Fatal(err)
	}
	if err := stray.Commit(); err != nil {
		t.Fatal(err)
	}
	if n, _, err := s.Overdue(now, 100); err != nil || n != 5 {
		t.Fatalf("overdue with an entry before the mark: %d %v, want the 5 after it", n, err)
	}
	if err := s.CheckExpiryIndex(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("index check with an entry before the swept mark: %v, want ErrCorrupt", err)
	}
}
