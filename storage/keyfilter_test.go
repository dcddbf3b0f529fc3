package storage

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// TestKeyFilterHasNoFalseNegatives: every key added is held, at and well past the
// capacity the filter was sized for, and at capacity about 1% of other keys are too.
func TestKeyFilterHasNoFalseNegatives(t *testing.T) {
	const capacity = 10000
	f := newKeyFilter(capacity)
	if f.mayHold([]byte("anything")) != true {
		t.Fatal("a filter whose scan is not done answered no")
	}
	f.complete.Store(true)
	key := func(i int) []byte { return recordKey("acme", fmt.Sprintf("conv:%d/ticket", i)) }
	for i := range 3 * capacity {
		f.add(key(i))
		if i == capacity-1 {
			fp := 0
			for j := range capacity {
				if f.mayHold(key(-1 - j)) {
					fp++
				}
			}
			if rate := float64(fp) / capacity; rate > 0.02 {
				t.Errorf("at capacity, %.2f%% of keys never added are held; want about 1%%", 100*rate)
			}
		}
	}
	for i := range 3 * capacity {
		if !f.mayHold(key(i)) {
			t.Fatalf("key %d was added and is not held", i)
		}
	}
}

// settleFilter commits empty batches until the store has a filter in service and
// none being built.
func settleFilter(t *testing.T, s *Store) *keyFilter {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.filter.Load() == nil || s.nextFilter.Load() != nil {
		if time.Now().After(deadline) {
			t.Fatal("no record key filter came into service")
		}
		putAll(t, s)
		time.Sleep(time.Millisecond)
	}
	return s.filter.Load()
}

// absentSkipped counts, of n keys that were never written, those the store answers
// without reading Pebble.
func absentSkipped(s *Store, n int) int {
	skipped := 0
	for i := range n {
		if !s.mayHoldRecord(recordKey("acme", fmt.Sprintf("never-%d", i))) {
			skipped++
		}
	}
	return skipped
}

// TestRecordsFoundAfterReopenAndRestore: records written before an open, put by
// batches while the filter is scanned and after it is in service, and swapped in by a
// restore are all found, by the store and by a batch, with the recent-record cache
// kept to one record so that every read asks the filter; keys never written are
// answered without Pebble once the filter is in service.
func TestRecordsFoundAfterReopenAndRestore(t *testing.T) {
	defer func(c int) { recentCapacity = c }(recentCapacity)
	recentCapacity = 1
	dir := t.TempDir()
	s, closeNow := openClosable(t, dir)
	var written []string
	write := func(s *Store, prefix string, n int) {
		t.Helper()
		for i := 0; i < n; i += 100 {
			var recs []*idemkv.Record
			for j := i; j < min(n, i+100); j++ {
				k := fmt.Sprintf("%s-%d", prefix, j)
				recs = append(recs, rec("acme", k, ts))
				written = append(written, k)
			}
			putAll(t, s, recs...)
		}
	}
	check := func(s *Store, when string) {
		t.Helper()
		b := s.NewBatch()
		defer b.Close()
		for _, k := range written {
			if r, err := s.Record("acme", k); err != nil || r == nil {
				t.Fatalf("%s: the store lost record %s (%v, %v)", when, k, r, err)
			}
			if r, err := b.Record("acme", k); err != nil || r == nil {
				t.Fatalf("%s: a batch lost record %s (%v, %v)", when, k, r, err)
			}
		}
		if got := absentSkipped(s, 1000); got < 950 {
			t.Errorf("%s: %d of 1000 keys never written skipped Pebble; want about 990", when, got)
		}
	}

	write(s, "first", 5000)
	settleFilter(t, s)
	check(s, "fresh store")
	closeNow()

	// Reopened: the scan runs while batches put more; some of them land before it is
	// done (the scan reads 4,096 keys per chunk).
	s = openStore(t, dir)
	write(s, "during-scan", 300)
	settleFilter(t, s)
	write(s, "after-scan", 300)
	check(s, "reopened")

	// A restore swaps in another store's database: its records are found, and so are
	// those written after it.
	other := openStore(t, t.TempDir())
	mark := len(written)
	write(other, "other", 3000)
	restored := written[mark:]
	if err := s.Restore(bytes.NewReader(snapshotOf(t, other))); err != nil {
		t.Fatal(err)
	}
	written = restored
	write(s, "after-restore", 300)
	settleFilter(t, s)
	check(s, "restored")
}

// TestKeyFilterRebuiltPastItsCapacity: a store that outgrows its filter builds a
// bigger one while batches keep putting records, and finds every record throughout,
// from readers running beside the state machine.
func TestKeyFilterRebuiltPastItsCapacity(t *testing.T) {
	defer func(c int) { recentCapacity = c }(recentCapacity)
	recentCapacity = 1
	defer func(c int64) { minFilterKeys = c }(minFilterKeys)
	minFilterKeys = 500
	s := openStore(t, t.TempDir())
	first := settleFilter(t, s)

	var committed atomic.Int64 // records 0..committed-1 are in the store
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := committed.Load()
				if n == 0 {
					continue
				}
				i := rng.Int64N(n)
				if got, err := s.Record("acme", fmt.Sprintf("k-%d", i)); err != nil || got == nil {
					t.Errorf("record %d of %d committed not found (%v, %v)", i, n, got, err)
					return
				}
			}
		}()
	}
	filters := map[*keyFilter]bool{first: true}
	for i := 0; i < 20000; i += 50 {
		var recs []*idemkv.Record
		for j := i; j < i+50; j++ {
			recs = append(recs, rec("acme", fmt.Sprintf("k-%d", j), ts))
		}
		putAll(t, s, recs...)
		committed.Store(int64(i + 50))
		if f := s.filter.Load(); f != nil {
			filters[f] = true
		}
	}
	close(stop)
	wg.Wait()
	last := settleFilter(t, s)
	if len(filters) < 3 {
		t.Errorf("%d filters served 20,000 records from a first capacity of 500; want the filter rebuilt as the store grew", len(filters))
	}
	if last.capacity < 20000 {
		t.Errorf("the last filter holds %d keys; want room for the 20,000 records", last.capacity)
	}
	for i := range 20000 {
		if !last.mayHold(recordKey("acme", fmt.Sprintf("k-%d", i))) {
			t.Fatalf("the last filter lost record %d", i)
		}
	}
}

// TestCloseEndsTheFilterScan: a store closed while its filter is scanned waits for
// the scan to stop, and leaves no goroutine reading the closed database.
func TestCloseEndsTheFilterScan(t *testing.T) {
	dir := t.TempDir()
	s, closeNow := openClosable(t, dir)
	for i := 0; i < 50000; i += 1000 {
		var recs []*idemkv.Record
		for j := i; j < i+1000; j++ {
			recs = append(recs, rec("acme", fmt.Sprintf("k-%d", j), ts))
		}
		putAll(t, s, recs...)
	}
	closeNow()
	abandoned := 0
	for range 5 {
		s, err := Open(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		scan := s.nextFilter.Load()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if scan != nil && !scan.complete.Load() {
			abandoned++
		}
	}
	if abandoned == 0 {
		t.Error("every scan of 50,000 keys finished before its store closed; the test checks nothing")
	}
}
