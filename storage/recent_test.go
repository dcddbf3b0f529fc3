package storage

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkv/idemkv"
)

// TestRecentRecordsAgreeWithPebble runs random batches of puts, deletes and reads over
// a few keys with a cache far smaller than the key set, so that every path (own write,
// cached, evicted, deleted, read back from Pebble) is taken many times. After every
// step the batch, the store and Pebble itself (bypassing the cache) must all agree with
// a plain map of what was committed.
func TestRecentRecordsAgreeWithPebble(t *testing.T) {
	for _, capacity := range []int{1, 3, 64} {
		t.Run(fmt.Sprintf("capacity=%d", capacity), func(t *testing.T) {
			defer func(c int) { recentCapacity = c }(recentCapacity)
			recentCapacity = capacity
			s := openStore(t, t.TempDir())
			rng := rand.New(rand.NewPCG(1, uint64(capacity)))
			committed := map[string]*idemkv.Record{}
			keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
			check := func(step string, got *idemkv.Record, want *idemkv.Record) {
				t.Helper()
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%s: got %+v, want %+v", step, got, want)
				}
			}
			for round := range 400 {
				b := s.NewBatch()
				inBatch := map[string]*idemkv.Record{}
				for range 1 + rng.IntN(6) {
					k := keys[rng.IntN(len(keys))]
					want, ok := inBatch[k]
					if !ok {
						want = committed[k]
					}
					got, err := b.Record("acme", k)
					if err != nil {
						t.Fatal(err)
					}
					check(fmt.Sprintf("round %d: batch read of %s", round, k), got, want)
					if rng.IntN(4) == 0 {
						if _, err := b.DeleteRecord("acme", k); err != nil {
							t.Fatal(err)
						}
						inBatch[k] = nil
						continue
					}
					r := rec("acme", k, ts+idemkv.Timestamp(rng.IntN(5)))
					r.Fence = uint64(round)
					if rng.IntN(5) == 0 {
						// Too big for the cache: always read from Pebble.
						r.Status = idemkv.StatusCommitted
						r.Receipt = &idemkv.StoredReceipt{RemoteSystem: "s", RemoteID: k, CommittedAt: ts,
							Result: json.RawMessage(`"` + strings.Repeat("x", recentMaxValue) + `"`)}
					}
					if err := b.PutRecord(r); err != nil {
						t.Fatal(err)
					}
					inBatch[k] = r
				}
				if rng.IntN(5) == 0 {
					// A discarded batch changes nothing, cached or not.
					if err := b.Close(); err != nil {
						t.Fatal(err)
					}
				} else {
					if err := b.Commit(); err != nil {
						t.Fatal(err)
					}
					for k, r := range inBatch {
						committed[k] = r
					}
				}
				for _, k := range keys {
					got, err := s.Record("acme", k)
					if err != nil {
						t.Fatal(err)
					}
					check(fmt.Sprintf("round %d: store read of %s", round, k), got, committed[k])
					direct, err := getRecord(s.db, "acme", k)
					if err != nil {
						t.Fatal(err)
					}
					check(fmt.Sprintf("round %d: Pebble read of %s", round, k), direct, committed[k])
				}
			}
			if err := s.CheckExpiryIndex(); err != nil {
				t.Fatal(err)
			}
			live := 0
			for _, r := range committed {
				if r != nil {
					live++
				}
			}
			if got := s.RecordCount(); got != int64(live) {
				t.Fatalf("record count %d, want %d", got, live)
			}
			if n := len(s.recent.vals); n > capacity {
				t.Fatalf("cache holds %d records, capacity %d", n, capacity)
			}
			for k, v := range s.recent.vals {
				if len(v) > recentMaxValue {
					t.Fatalf("cache holds %q with a %d-byte value, more than %d", k, len(v), recentMaxValue)
				}
			}
		})
	}
}

// TestRestoreForgetsRecentRecords: a restore replaces the store underneath the cache;
// a record cached before it must not come back.
func TestRestoreForgetsRecentRecords(t *testing.T) {
	src := openStore(t, t.TempDir())
	b := src.NewBatch()
	if err := b.PutRecord(rec("acme", "kept", ts)); err != nil {
		t.Fatal(err)
	}
	if err := b.SetApplied(7, 1); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	// A stream from a store that kept no record count, as older versions wrote.
	if err := src.db.Delete(keyRecords, nil); err != nil {
		t.Fatal(err)
	}
	var stream bytes.Buffer
	snap := src.NewSnapshot()
	if _, err := snap.WriteRecordsTo(&stream); err != nil {
		t.Fatal(err)
	}
	if err := snap.Close(); err != nil {
		t.Fatal(err)
	}

	dst := openStore(t, t.TempDir())
	b = dst.NewBatch()
	if err := b.PutRecord(rec("acme", "gone", ts)); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if r, _ := dst.Record("acme", "gone"); r == nil {
		t.Fatal("record not readable before the restore")
	}
	if _, ok := dst.recent.get(recordKey("acme", "gone")); !ok {
		t.Fatal("a committed record is not among the recent records")
	}
	if err := dst.Restore(&stream); err != nil {
		t.Fatal(err)
	}
	if r, err := dst.Record("acme", "gone"); err != nil || r != nil {
		t.Fatalf("record from before the restore: %+v, %v", r, err)
	}
	if r, err := dst.Record("acme", "kept"); err != nil || r == nil {
		t.Fatalf("restored record: %+v, %v", r, err)
	}
	if got := dst.RecordCount(); got != 1 {
		t.Fatalf("record count after the restore %d, want 1", got)
	}
	if err := dst.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
}

// TestRecordCountSurvivesReopenAndIsRebuiltWhenMissing: the count is stored with the
// records, and a store that has none (written before it was kept) is counted at open.
func TestRecordCountSurvivesReopenAndIsRebuiltWhenMissing(t *testing.T) {
	dir := t.TempDir()
	s, closeNow := openClosable(t, dir)
	if got := s.RecordCount(); got != 0 {
		t.Fatalf("empty store counts %d", got)
	}
	b := s.NewBatch()
	for i := range 5 {
		if err := b.PutRecord(rec("acme", fmt.Sprint("k", i), ts)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.PutRecord(rec("acme", "k0", ts+1)); err != nil { // an update, not a new record
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	b = s.NewBatch()
	if _, err := b.DeleteRecord("acme", "k1"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DeleteRecord("acme", "never"); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := s.RecordCount(); got != 4 {
		t.Fatalf("count %d, want 4", got)
	}
	closeNow()

	s, closeNow = openClosable(t, dir)
	if got := s.RecordCount(); got != 4 {
		t.Fatalf("count after reopening %d, want 4", got)
	}
	if err := s.db.Delete(keyRecords, nil); err != nil {
		t.Fatal(err)
	}
	closeNow()
	s = openStore(t, dir)
	if got := s.RecordCount(); got != 4 {
		t.Fatalf("count rebuilt at open %d, want 4", got)
	}
	if err := s.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
}

// TestReadersNeverFillAnOlderValue: readers on other goroutines fill the cache with
// what they read from Pebble, while the state machine commits newer values of the same
// keys. A reader that read a value before a commit must not put it back after the
// commit updated the cache: every read that begins after a commit returned must see
// that commit's value or a newer one, never an older one, and never "no record" for a
// key that has one.
func TestReadersNeverFillAnOlderValue(t *testing.T) {
	defer func(c int) { recentCapacity = c }(recentCapacity)
	// Two slots for three keys: reads keep missing, so readers keep filling.
	recentCapacity = 2
	s := openStore(t, t.TempDir())
	keys := []string{"a", "b", "c"}
	var published [3]atomic.Uint64 // the fence last committed, per key
	var stop atomic.Bool
	var stale atomic.Value
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				k := (i + r) % len(keys)
				want := published[k].Load()
				got, err := s.Record("acme", keys[k])
				if err != nil {
					stale.Store(err.Error())
					return
				}
				if want > 0 && (got == nil || got.Fence < want) {
					stale.Store(fmt.Sprintf("key %s: read %+v after fence %d was committed", keys[k], got, want))
					return
				}
			}
		})
	}
	for fence := uint64(1); fence <= 3000 && stale.Load() == nil; fence++ {
		k := int(fence) % len(keys)
		b := s.NewBatch()
		r := rec("acme", keys[k], ts)
		r.Fence = fence
		if err := b.PutRecord(r); err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		published[k].Store(fence)
	}
	stop.Store(true)
	wg.Wait()
	if msg := stale.Load(); msg != nil {
		t.Fatal(msg)
	}
}
