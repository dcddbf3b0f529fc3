package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

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
// and is greater than after, in key order, until fn returns false or an error.
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
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(doubtKey(tenant, prefix))})
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
		rec, err := getRecord(db, string(rest[:i]), string(rest[i+1:]))
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
