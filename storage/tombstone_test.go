package storage

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"testing"

	"github.com/idemkv/idemkv"
)

// typicalTombstone is what a released record leaves: its execute and its release.
func typicalTombstone(key string, expires idemkv.Timestamp) *idemkv.Tombstone {
	r := typicalRecord()
	ev := idemkv.HistoryEvent{At: r.CreatedAt, Event: idemkv.EventExecute, Fence: r.Fence, AttemptID: r.AttemptID, Actor: r.Actor}
	rel := ev
	rel.At, rel.Event, rel.Detail = r.CreatedAt+850, idemkv.EventRelease, "the effect did not happen"
	return &idemkv.Tombstone{Tenant: r.Tenant, Key: key, Tool: r.Tool, Fingerprint: r.Fingerprint, ReleasedAt: rel.At,
		ExpiresAt: expires, History: []idemkv.HistoryEvent{ev, rel}}
}

func commitBatch(t *testing.T, s *Store, f func(b *Batch) error) {
	t.Helper()
	b := s.NewBatch()
	defer b.Close()
	if err := f(b); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
}

func TestTombstoneEncodingRoundTrip(t *testing.T) {
	full := typicalTombstone("k", ts+5)
	rec := typicalRecord()
	fullHistory(rec)
	full.History, full.HistoryDropped = rec.History, rec.HistoryDropped
	for _, want := range []*idemkv.Tombstone{typicalTombstone("conv:9/ticket ü", ts+1), full} {
		v, err := encodeTombstone(nil, want)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeTombstone(want.Tenant, want.Key, v)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip: %+v (%v)\nwant %+v", got, err, want)
		}
		for n := 0; n < len(v); n++ {
			if _, err := decodeTombstone(want.Tenant, want.Key, v[:n]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("a tombstone cut at %d of %d bytes: %v", n, len(v), err)
			}
		}
	}
	if _, err := encodeTombstone(nil, &idemkv.Tombstone{Tenant: "t", Key: "k", ExpiresAt: ts}); err == nil {
		t.Fatal("a tombstone without history was stored")
	}
}

// TestTombstoneIndexFollowsTombstones: put, replace and delete keep the tombstone and
// its index entry one to one; CheckExpiryIndex finds a missing entry and a key that
// holds a record beside a tombstone.
func TestTombstoneIndexFollowsTombstones(t *testing.T) {
	s := openStore(t, t.TempDir())
	commitBatch(t, s, func(b *Batch) error {
		return errors.Join(b.PutTombstone(typicalTombstone("a", ts+10)), b.PutTombstone(typicalTombstone("b", ts+20)))
	})
	if err := s.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
	commitBatch(t, s, func(b *Batch) error { return b.PutTombstone(typicalTombstone("a", ts+30)) })
	if err := s.CheckExpiryIndex(); err != nil {
		t.Fatalf("after replacing a tombstone: %v", err)
	}
	if n, oldest, err := s.Overdue(ts+30, 100); err != nil || n != 2 || oldest != ts+20 {
		t.Fatalf("overdue %d oldest %s (%v)", n, oldest, err)
	}
	commitBatch(t, s, func(b *Batch) error {
		ok, err := b.DeleteTombstone("acme-prod", "b")
		if !ok {
			return fmt.Errorf("no tombstone of b to delete (%v)", err)
		}
		return err
	})
	if err := s.CheckExpiryIndex(); err != nil {
		t.Fatalf("after deleting one: %v", err)
	}
	if got, err := s.Tombstone("acme-prod", "b"); got != nil || err != nil {
		t.Fatalf("deleted tombstone reads %+v %v", got, err)
	}
	if got, err := s.Tombstone("acme-prod", "a"); err != nil || got == nil || got.ExpiresAt != ts+30 {
		t.Fatalf("tombstone a: %+v %v", got, err)
	}
	if s.RecordCount() != 0 {
		t.Fatalf("tombstones counted as records: %d", s.RecordCount())
	}

	// Damage: an index entry gone, then a record beside a tombstone.
	commitBatch(t, s, func(b *Batch) error {
		return b.DeleteTombstoneExpiry(ExpiryEntry{ExpiresAt: ts + 30, Tenant: "acme-prod", Key: "a"})
	})
	if err := s.CheckExpiryIndex(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a tombstone without index entry passed: %v", err)
	}
	commitBatch(t, s, func(b *Batch) error { return b.PutTombstone(typicalTombstone("c", ts+40)) })
	commitBatch(t, s, func(b *Batch) error { _, err := b.DeleteTombstone("acme-prod", "a"); return err })
	rec := typicalRecord()
	rec.Key = "c"
	commitBatch(t, s, func(b *Batch) error { return b.PutRecord(rec) })
	if err := s.CheckExpiryIndex(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a record beside a tombstone passed: %v", err)
	}
}

// TestSweepRemovesTombstones sweeps the tombstone index as the state machine does,
// in small batches behind its own swept mark: every tombstone due is deleted, the
// others stay, and neither index is left behind.
func TestSweepRemovesTombstones(t *testing.T) {
	s := openStore(t, t.TempDir())
	putExpiring(t, s, 5, func(i int) idemkv.Timestamp { return ts + idemkv.Timestamp(i) })
	commitBatch(t, s, func(b *Batch) error {
		for i := range 7 {
			if err := b.PutTombstone(typicalTombstone(fmt.Sprintf("t%d", i), ts+idemkv.Timestamp(i))); err != nil {
				return err
			}
		}
		return nil
	})
	now := ts + 4
	if n, _, err := s.Overdue(now, 100); err != nil || n != 10 {
		t.Fatalf("overdue %d (%v), want 5 records and 5 tombstones", n, err)
	}
	swept := 0
	for {
		b := s.NewBatch()
		entries, err := b.ExpiredTombstones(now, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if ok, err := b.DeleteTombstone(e.Tenant, e.Key); err != nil || !ok {
				t.Fatalf("delete %v: %v %v", e, ok, err)
			}
		}
		if len(entries) > 0 {
			if err := b.MarkTombstonesSwept(entries[len(entries)-1]); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		swept += len(entries)
		if len(entries) == 0 {
			break
		}
	}
	if swept != 5 {
		t.Fatalf("swept %d tombstones, want 5", swept)
	}
	if n, oldest, err := s.Overdue(now, 100); err != nil || n != 5 || oldest != ts {
		t.Fatalf("overdue after the tombstone sweep: %d oldest %s (%v); the records' are untouched", n, oldest, err)
	}
	if err := s.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{false, false, false, false, false, true, true} {
		got, err := s.Tombstone("acme-prod", fmt.Sprintf("t%d", i))
		if err != nil || (got != nil) != want {
			t.Fatalf("tombstone t%d: %+v %v, want present=%v", i, got, err, want)
		}
	}
	if n := sweepAll(t, s, now, 2); n != 5 {
		t.Fatalf("record sweep after the tombstones' took %d", n)
	}
	if err := s.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotCarriesTombstonesBothFormats: a store with records and tombstones,
// snapshotted in either stream format and restored, holds the same tombstones, the
// same hash, and indexes in step; a snapshot written before tombstones existed still
// restores, with none.
func TestSnapshotCarriesTombstonesBothFormats(t *testing.T) {
	src := openStore(t, t.TempDir())
	putExpiring(t, src, 3, func(i int) idemkv.Timestamp { return ts + 1000 })
	want := []*idemkv.Tombstone{typicalTombstone("x1", ts+10), typicalTombstone("x2", ts+20)}
	commitBatch(t, src, func(b *Batch) error {
		return errors.Join(b.PutTombstone(want[0]), b.PutTombstone(want[1]), b.SetApplied(9, 2))
	})
	wantHash, err := src.Hash()
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"files": snapshotOf(t, src), "records": recordsOf(t, src)} {
		dst := openStore(t, t.TempDir())
		if err := dst.Restore(bytes.NewReader(data)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, w := range want {
			if got, err := dst.Tombstone(w.Tenant, w.Key); err != nil || !reflect.DeepEqual(got, w) {
				t.Fatalf("%s: restored %+v (%v), want %+v", name, got, err, w)
			}
		}
		if h, err := dst.Hash(); err != nil || h != wantHash {
			t.Fatalf("%s: hash differs after restore (%v)", name, err)
		}
		if err := dst.CheckExpiryIndex(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n, _, err := dst.Overdue(ts+20, 100); err != nil || n != 2 {
			t.Fatalf("%s: overdue tombstones after restore: %d (%v)", name, n, err)
		}
	}
	old, err := os.ReadFile("testdata/snapshot-before-history.bin")
	if err != nil {
		t.Fatal(err)
	}
	dst := openStore(t, t.TempDir())
	if err := dst.Restore(bytes.NewReader(old)); err != nil {
		t.Fatal(err)
	}
	if got, err := dst.Tombstone("acme", "k1"); got != nil || err != nil {
		t.Fatalf("a snapshot from before tombstones restored one: %+v %v", got, err)
	}
	if err := dst.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
}

// TestTombstoneCost measures what a tombstone stores (docs/protocol.md quotes it):
// the usual one (execute, release) and one with a full history, value and keys.
func TestTombstoneCost(t *testing.T) {
	size := func(ts *idemkv.Tombstone) (value, keys int) {
		v, err := encodeTombstone(nil, ts)
		if err != nil {
			t.Fatal(err)
		}
		return len(v), len(tombKey(ts.Tenant, ts.Key)) + len(tombExpiry.key(ts.ExpiresAt, ts.Tenant, ts.Key))
	}
	key := typicalRecord().Key
	usual := typicalTombstone(key, ts+86_400_000)
	full := typicalTombstone(key, ts+86_400_000)
	rec := typicalRecord()
	fullHistory(rec)
	full.History = append(rec.History[1:], full.History[1])
	full.HistoryDropped = rec.HistoryDropped + 1
	uv, uk := size(usual)
	fv, fk := size(full)
	t.Logf("tombstone: %d bytes of value + %d of keys (record and index) with execute+release; %d + %d with %d events",
		uv, uk, fv, fk, len(full.History))
	if uv > 300 || fv > recentMaxValue/2 {
		t.Fatalf("a tombstone costs %d bytes with two events, %d with a full history", uv, fv)
	}
}

// TestTombstoneCountKeepsLookupsExact: tombstone look-ups are skipped while the store
// holds none, so the count must follow every put, replacement and deletion, within a
// batch, across discarded batches, a reopen and a restore. Random batches over a few
// keys check every look-up (the batch's, the store's) against Pebble itself.
func TestTombstoneCountKeepsLookupsExact(t *testing.T) {
	dir := t.TempDir()
	s, closeNow := openClosable(t, dir)
	rng := rand.New(rand.NewPCG(3, 4))
	keys := []string{"a", "b", "c"}
	tenant := typicalTombstone("a", ts).Tenant
	check := func(step string, got *idemkv.Tombstone, err error, k string) {
		t.Helper()
		want, werr := getTombstone(s.db, tenant, k)
		if err != nil || werr != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: tombstone of %s read %+v (%v), Pebble holds %+v (%v)", step, k, got, err, want, werr)
		}
	}
	for round := range 300 {
		b := s.NewBatch()
		for range 1 + rng.IntN(4) {
			k := keys[rng.IntN(len(keys))]
			got, err := b.Tombstone(tenant, k)
			want, werr := getTombstone(b.b, tenant, k)
			if err != nil || werr != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("round %d: the batch read %+v (%v) for %s, it holds %+v (%v)", round, got, err, k, want, werr)
			}
			if rng.IntN(3) == 0 {
				if _, err := b.DeleteTombstone(tenant, k); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := b.PutTombstone(typicalTombstone(k, ts+idemkv.Timestamp(rng.IntN(3)))); err != nil {
				t.Fatal(err)
			}
		}
		if rng.IntN(5) == 0 {
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
		} else if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		if n, err := countKeys(s.db, prefixTomb); err != nil || n != s.tombs.Load() {
			t.Fatalf("round %d: %d tombstones counted, %d stored (%v)", round, s.tombs.Load(), n, err)
		}
		for _, k := range keys {
			got, err := s.Tombstone(tenant, k)
			check(fmt.Sprintf("round %d", round), got, err, k)
		}
	}
	// Leave one tombstone, then reopen: the count is taken from the store.
	commitBatch(t, s, func(b *Batch) error {
		for _, k := range keys {
			if _, err := b.DeleteTombstone(tenant, k); err != nil {
				return err
			}
		}
		return errors.Join(b.PutTombstone(typicalTombstone("b", ts)), b.SetApplied(5, 1))
	})
	data := snapshotOf(t, s)
	closeNow()
	s = openStore(t, dir)
	if got, err := s.Tombstone(tenant, "b"); err != nil || got == nil || s.tombs.Load() != 1 {
		t.Fatalf("after a reopen: %+v (%v), count %d", got, err, s.tombs.Load())
	}
	// A restore into a store that held none must count what it received.
	dst := openStore(t, t.TempDir())
	if err := dst.Restore(bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	b := dst.NewBatch()
	defer b.Close()
	if got, err := b.Tombstone(tenant, "b"); err != nil || got == nil {
		t.Fatalf("after a restore: %+v (%v), count %d", got, err, dst.tombs.Load())
	}
}
