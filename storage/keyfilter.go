package storage

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// keyFilter is a Bloom filter over the record keys the store holds: a key it has not
// seen has no record, and the look-up that would have proved so (a walk down every
// Pebble memtable, each step a likely cache miss, and a filter probe per table) is
// skipped. Almost every reserve is of a new key, looked up once by the node that takes
// it and once by every replica's state machine: those walks were the largest single
// CPU cost of three nodes under load (about 14%, 10 µs and more a walk in a 64 MiB
// memtable).
//
// It may answer "maybe" for a key that has no record (a false positive, about 1 in
// 100, or a record deleted since), never "no" for one that has: every record key in
// the database was either there when the filter's scan began, and the scan adds it,
// or was put by a batch after the filter was made, and PutRecord adds it before the
// batch commits. Until its scan is done a filter answers "maybe" to every key.
//
// Its bits are set and read atomically: the state machine adds while readers ask.
type keyFilter struct {
	seed maphash.Seed
	// words holds the bits, blockWords to a block; a key's bits all fall in one block
	// (one cache line), chosen by its hash.
	words  []atomic.Uint64
	blocks uint64
	// capacity is the number of keys it was sized for; keys counts those added (the
	// scan's and the new ones since), and past capacity a bigger filter is built.
	capacity int64
	keys     atomic.Int64
	// complete is set once the scan of the store is done.
	complete atomic.Bool
}

const (
	blockWords = 8 // 512 bits, one 64-byte cache line
	// filterBitsPerKey and filterProbes give about 1% false positives.
	filterBitsPerKey = 10
	filterProbes     = 6
	// filterScanChunk is how many keys the scan reads per hold of the store's lock:
	// a restore that swaps the database waits for one chunk at most.
	filterScanChunk = 4096
)

// minFilterKeys is the smallest capacity (1.25 MiB of bits): a store that grows from
// nothing rebuilds its filter only once it passes a million records. A variable so
// that tests can make rebuilds happen often.
var minFilterKeys int64 = 1 << 20

// filterCapacity is the capacity of a filter built for a store of records records:
// room to double before the next rebuild.
func filterCapacity(records int64) int64 {
	return max(minFilterKeys, 2*records)
}

func newKeyFilter(capacity int64) *keyFilter {
	blocks := uint64(capacity*filterBitsPerKey+blockWords*64-1) / (blockWords * 64)
	return &keyFilter{
		seed:     maphash.MakeSeed(),
		words:    make([]atomic.Uint64, blocks*blockWords),
		blocks:   blocks,
		capacity: capacity,
	}
}

// masks returns where k's block starts in words and, for each word of the block, the
// bits of k in it.
func (f *keyFilter) masks(k []byte) (base int, m [blockWords]uint64) {
	h := maphash.Bytes(f.seed, k)
	block, _ := bits.Mul64(h, f.blocks) // the high half: h scaled to [0, blocks)
	h1, h2 := uint32(h), uint32(h>>32)|1
	for i := range uint32(filterProbes) {
		bit := (h1 + i*h2) % (blockWords * 64)
		m[bit/64] |= 1 << (bit % 64)
	}
	return int(block) * blockWords, m
}

// add records that the store may hold record key k.
func (f *keyFilter) add(k []byte) {
	base, m := f.masks(k)
	for i, mask := range m {
		if w := &f.words[base+i]; w.Load()&mask != mask {
			w.Or(mask)
		}
	}
}

// mayHold is false only if the store, as of the last batch committed, holds no record
// under key k. A filter still scanning answers true.
func (f *keyFilter) mayHold(k []byte) bool {
	if !f.complete.Load() {
		return true
	}
	base, m := f.masks(k)
	for i, mask := range m {
		if f.words[base+i].Load()&mask != mask {
			return false
		}
	}
	return true
}

// mayHoldRecord is false only if the store holds no record under key k (mu held, at
// least shared, or on the state machine's goroutine).
func (s *Store) mayHoldRecord(k []byte) bool {
	f := s.filter.Load()
	return f == nil || f.mayHold(k)
}

// filterPut is told of every record key a batch puts, before the batch commits; isNew
// says the key held no record. Only the state machine's goroutine calls it.
func (s *Store) filterPut(k []byte, isNew bool) {
	// The filter being built first: once it is in service, nextFilter is nil and
	// filter is it (keepFilter runs on this goroutine too, so neither moves here).
	for _, f := range [2]*keyFilter{s.nextFilter.Load(), s.filter.Load()} {
		if f == nil {
			continue
		}
		f.add(k)
		if isNew {
			f.keys.Add(1)
		}
	}
}

// keepFilter runs after each batch commit, on the state machine's goroutine: it puts
// a filter whose scan is done in service, and starts a bigger one once the filter in
// service holds more keys than it was sized for (its false positives climb past 1%).
func (s *Store) keepFilter() {
	if next := s.nextFilter.Load(); next != nil {
		if next.complete.Load() {
			s.filter.Store(next)
			s.nextFilter.Store(nil)
		}
		return
	}
	if f := s.filter.Load(); f != nil && f.keys.Load() > f.capacity {
		s.mu.RLock()
		s.buildFilter(s.db)
		s.mu.RUnlock()
	}
}

// buildFilter makes a filter for db (s.db, mu held) and scans db's record keys into
// it on a goroutine of its own. Batches add to it meanwhile (filterPut); keepFilter
// puts it in service once the scan is done. A swap or a close of the database ends
// the scan, and its filter is dropped.
func (s *Store) buildFilter(db *pebble.DB) {
	if db == nil {
		return
	}
	next := newKeyFilter(filterCapacity(s.records.Load()))
	s.nextFilter.Store(next)
	s.filterScans.Add(1)
	go func() {
		defer s.filterScans.Done()
		start := time.Now()
		n, err := s.scanRecordKeys(db, next)
		switch {
		case errors.Is(err, errFilterAbandoned):
			return
		case err != nil:
			// The filter in service (or none) stays; lookups go to Pebble meanwhile.
			s.logger.Warn("the record key filter could not be built; record look-ups read the store", logKeyErr, err)
			return
		}
		next.complete.Store(true)
		s.logger.Info("record key filter built", logKeyKeys, n, "elapsed", time.Since(start).Round(time.Millisecond))
	}()
}

// errFilterAbandoned ends a scan whose database was swapped or closed under it.
var errFilterAbandoned = errors.New("storage: the record key filter's database is gone")

// scanRecordKeys adds every record key of db to f, a chunk of keys per hold of mu.
func (s *Store) scanRecordKeys(db *pebble.DB, f *keyFilter) (int64, error) {
	var n int64
	for from := []byte(prefixRecord); from != nil; {
		var read int
		var err error
		from, read, err = s.scanChunk(db, f, from)
		n += int64(read)
		if errors.Is(err, errFilterAbandoned) {
			return n, err
		}
		if err != nil {
			return n, fmt.Errorf("storage: record key filter: %w", err)
		}
	}
	return n, nil
}

// scanChunk adds up to filterScanChunk record keys of db, from key from on, to f (mu
// held shared meanwhile), and returns the key to go on from, nil after the last.
func (s *Store) scanChunk(db *pebble.DB, f *keyFilter, from []byte) (next []byte, read int, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db != db || s.nextFilter.Load() != f {
		return nil, 0, errFilterAbandoned
	}
	err = guard(func() error {
		opts := prefixIter(prefixRecord)
		opts.LowerBound = from
		it, err := db.NewIter(opts)
		if err != nil {
			return err
		}
		for it.First(); it.Valid() && read < filterScanChunk; it.Next() {
			f.add(it.Key())
			read++
		}
		if it.Valid() {
			next = slices.Clone(it.Key())
		}
		return errors.Join(it.Error(), it.Close())
	})
	f.keys.Add(int64(read))
	return next, read, err
}
