package storage

import (
	"bytes"
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idemkv"
)

// The in-doubt index (d/<tenant>\x00<key> -> in_doubt_since) names the pending records
// marked in doubt, so that listing them and the metrics of their number and age cost
// O(in-doubt records), never a scan of every record. It is derived state like the
// expiry index: batches keep it in step, snapshots carry it, Hash leaves it out.

// keepDoubtIndex updates the index entry of record key k, about to be replaced by next
// (nil: deleted). The old value is read only when the record is pending, the one state
// that can be in doubt.
func (b *Batch) keepDoubtIndex(k []byte, tenant, key string, next *idemkv.Record) error {
	wasInDoubt := false
	v, err := b.value(k)
	if err != nil {
		return err
	}
	if len(v) > 9 && v[9] == statusCodes[idemkv.StatusPending] {
		old, err := decodeRecord(tenant, key, v)
		if err != nil {
			return err
		}
		wasInDoubt = old.InDoubt
	}
	dk := doubtKey(tenant, key)
	switch {
	case next != nil && next.InDoubt && next.Status == idemkv.StatusPending:
		return b.b.Set(dk, binary.BigEndian.AppendUint64(nil, uint64(next.InDoubtSince)), nil)
	case wasInDoubt:
		return b.b.Delete(dk, nil)
	}
	return nil
}

// InDoubtStats returns the number of in-doubt records and the earliest in_doubt_since
// among them (0 if none).
func (s *Store) InDoubtStats() (count int, oldest idemkv.Timestamp, err error) {
	db, err := s.open()
	if err != nil {
		return 0, 0, err
	}
	defer s.mu.RUnlock()
	it, err := db.NewIter(prefixIter(prefixDoubt))
	if err != nil {
		return 0, 0, fmt.Errorf("storage: in-doubt index: %w", err)
	}
	for it.First(); it.Valid(); it.Next() {
		if len(it.Value()) != 8 {
			it.Close()
			return 0, 0, fmt.Errorf("%w: in-doubt entry of %d bytes", ErrCorrupt, len(it.Value()))
		}
		since := idemkv.Timestamp(binary.BigEndian.Uint64(it.Value()))
		if count == 0 || since < oldest {
			oldest = since
		}
		count++
	}
	return count, oldest, errors.Join(it.Error(), it.Close())
}

// ScanInDoubt calls fn for the in-doubt records of tenant whose key starts with prefix
// and is greater than after, in key order, until fn returns false or an error. Index
// and records are read from one Pebble snapshot: read from the live database, a record
// resolved during the scan was missing behind its index entry (a false corruption) or
// listed committed.
func (s *Store) ScanInDoubt(tenant, prefix, after string, fn func(*idemkv.Record) (bool, error)) error {
	lower := doubtKey(tenant, prefix)
	if after != "" {
		if k := doubtKey(tenant, after+"\x00"); bytes.Compare(k, lower) > 0 {
			lower = k
		}
	}
	db, err := s.open()
	if err != nil {
		return err
	}
	// fn runs with the store held shared: it must not call back into the store.
	defer s.mu.RUnlock()
	snap := db.NewSnapshot()
	defer snap.Close()
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(doubtKey(tenant, prefix))})
	if err != nil {
		return fmt.Errorf("storage: scan in doubt: %w", err)
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		rest := it.Key()[len(prefixDoubt):]
		i := bytes.IndexByte(rest, 0)
		if i < 0 {
			return fmt.Errorf("%w: in-doubt key without separator", ErrCorrupt)
		}
		rec, err := getRecord(snap, string(rest[:i]), string(rest[i+1:]))
		if err != nil {
			return err
		}
		if rec == nil {
			return fmt.Errorf("%w: in-doubt entry %q without a record", ErrCorrupt, rest)
		}
		more, err := fn(rec)
		if err != nil || !more {
			return err
		}
	}
	return it.Error()
}

// OldestInDoubt returns the in-doubt records of every tenant that come after after
// (nil: from the first) in idemkv.DoubtPosition order, oldest in_doubt_since first, at
// most limit of them, and whether more follow. The index is kept in tenant and key
// order, so it reads the whole index, holding only the limit earliest entries, as
// InDoubtStats does for every scrape of the metrics: O(in-doubt records), never a scan
// of every record. Index and records are read from one Pebble snapshot, so a resolve
// applied meanwhile cannot leave an entry without its record.
func (s *Store) OldestInDoubt(after *idemkv.DoubtPosition, limit int) (recs []*idemkv.Record, more bool, err error) {
	if limit <= 0 {
		return nil, false, fmt.Errorf("storage: in-doubt page of %d records", limit)
	}
	db, err := s.open()
	if err != nil {
		return nil, false, err
	}
	defer s.mu.RUnlock()
	snap := db.NewSnapshot()
	defer snap.Close()
	it, err := snap.NewIter(prefixIter(prefixDoubt))
	if err != nil {
		return nil, false, fmt.Errorf("storage: in-doubt index: %w", err)
	}
	// earliest is a max-heap of the limit earliest positions seen: its root is the one
	// a later, earlier entry pushes out.
	earliest := &positionHeap{}
	for it.First(); it.Valid(); it.Next() {
		p, err := parseDoubtEntry(it.Key(), it.Value())
		if err != nil {
			it.Close()
			return nil, false, err
		}
		switch {
		case after != nil && p.Compare(*after) <= 0:
		case earliest.Len() < limit:
			heap.Push(earliest, p)
		case p.Compare((*earliest)[0]) < 0:
			(*earliest)[0] = p
			heap.Fix(earliest, 0)
			more = true
		default:
			more = true
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return nil, false, fmt.Errorf("storage: in-doubt index: %w", err)
	}
	page := slices.SortedFunc(slices.Values(*earliest), idemkv.DoubtPosition.Compare)
	recs = make([]*idemkv.Record, 0, len(page))
	for _, p := range page {
		rec, err := getRecord(snap, p.Tenant, p.Key)
		if err != nil {
			return nil, false, err
		}
		if rec == nil || !rec.InDoubt || rec.InDoubtSince != p.Since {
			return nil, false, fmt.Errorf("%w: in-doubt entry %q/%q does not match its record", ErrCorrupt, p.Tenant, p.Key)
		}
		recs = append(recs, rec)
	}
	return recs, more, nil
}

// parseDoubtEntry reads the position an in-doubt index entry names.
func parseDoubtEntry(k, v []byte) (idemkv.DoubtPosition, error) {
	rest := k[len(prefixDoubt):]
	i := bytes.IndexByte(rest, 0)
	if i < 0 {
		return idemkv.DoubtPosition{}, fmt.Errorf("%w: in-doubt key without separator", ErrCorrupt)
	}
	if len(v) != 8 {
		return idemkv.DoubtPosition{}, fmt.Errorf("%w: in-doubt entry of %d bytes", ErrCorrupt, len(v))
	}
	return idemkv.DoubtPosition{Since: idemkv.Timestamp(binary.BigEndian.Uint64(v)), Tenant: string(rest[:i]), Key: string(rest[i+1:])}, nil
}

// positionHeap is a max-heap of positions (container/heap).
type positionHeap []idemkv.DoubtPosition

func (h positionHeap) Len() int           { return len(h) }
func (h positionHeap) Less(i, j int) bool { return h[i].Compare(h[j]) > 0 }
func (h positionHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *positionHeap) Push(x any)        { *h = append(*h, x.(idemkv.DoubtPosition)) }
func (h *positionHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// checkDoubtIndex verifies that the in-doubt index and the records agree one to one.
func checkDoubtIndex(snap *pebble.Snapshot) error {
	marked := 0
	it, err := snap.NewIter(prefixIter(prefixRecord))
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		t, k, err := parseRecordKey(it.Key())
		if err == nil {
			var rec *idemkv.Record
			if rec, err = decodeRecord(t, k, it.Value()); err == nil && rec.InDoubt && rec.Status == idemkv.StatusPending {
				marked++
				var v []byte
				if v, err = getValue(snap, doubtKey(t, k)); err == nil && (len(v) != 8 || idemkv.Timestamp(binary.BigEndian.Uint64(v)) != rec.InDoubtSince) {
					err = fmt.Errorf("%w: in-doubt record %q/%q has no matching index entry", ErrCorrupt, t, k)
				}
			}
		}
		if err != nil {
			it.Close()
			return err
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	entries := 0
	di, err := snap.NewIter(prefixIter(prefixDoubt))
	if err != nil {
		return err
	}
	defer di.Close()
	for di.First(); di.Valid(); di.Next() {
		entries++
	}
	if marked != entries {
		return fmt.Errorf("%w: %d in-doubt records but %d in-doubt index entries", ErrCorrupt, marked, entries)
	}
	return di.Error()
}
