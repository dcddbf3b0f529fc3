package storage

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idemkv"
)

// Tombstones of released records (idemkv.Tombstone; not Pebble's deletion markers,
// which this package's comments call Pebble tombstones). They are replicated state like
// records: the state machine writes and deletes them in its batches, Hash covers them,
// and snapshots carry them, since a snapshot holds every key of the store. Their own
// expiry index (y/), with its own swept mark, lets the sweeper delete them as it deletes
// records, without their entries ever mixing with the records' (a key's next record and
// its tombstone may expire at the same millisecond).

// Tombstone returns the tombstone of (tenant, key), or nil if there is none. Expiry is
// not applied here, as Record does not apply it.
func (s *Store) Tombstone(tenant, key string) (*idemkv.Tombstone, error) {
	db, err := s.open()
	if err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	if s.tombs.Load() == 0 {
		return nil, nil
	}
	return getTombstone(db, tenant, key)
}

func getTombstone(r pebble.Reader, tenant, key string) (*idemkv.Tombstone, error) {
	v, err := getValue(r, tombKey(tenant, key))
	if err != nil || v == nil {
		return nil, err
	}
	return decodeTombstone(tenant, key, v)
}

// Tombstone returns the tombstone of (tenant, key) as the batch sees it, or nil.
func (b *Batch) Tombstone(tenant, key string) (*idemkv.Tombstone, error) {
	if !b.mayHoldTombstones() {
		return nil, nil
	}
	return getTombstone(b.b, tenant, key)
}

// mayHoldTombstones is false when the store as this batch sees it holds no tombstone:
// most stores never release a key, and every reserve of a new key would otherwise
// look its tombstone up, a walk down Pebble's memtables that ends in a miss.
func (b *Batch) mayHoldTombstones() bool {
	return b.s.tombs.Load()+b.tombsAdded > 0
}

// PutTombstone stores t and its expiry index entry, replacing any tombstone of the key.
func (b *Batch) PutTombstone(t *idemkv.Tombstone) error {
	old, err := b.Tombstone(t.Tenant, t.Key)
	if err != nil {
		return err
	}
	if old == nil {
		b.tombsAdded++
	}
	if old != nil && old.ExpiresAt != t.ExpiresAt {
		if err := b.b.Delete(tombExpiry.key(old.ExpiresAt, t.Tenant, t.Key), nil); err != nil {
			return err
		}
	}
	b.buf, err = encodeTombstone(b.buf[:0], t)
	if err != nil {
		return err
	}
	return errors.Join(b.b.Set(tombKey(t.Tenant, t.Key), b.buf, nil),
		b.b.Set(tombExpiry.key(t.ExpiresAt, t.Tenant, t.Key), nil, nil))
}

// DeleteTombstone removes the tombstone of (tenant, key) and its index entry. It
// reports whether there was one.
func (b *Batch) DeleteTombstone(tenant, key string) (bool, error) {
	if !b.mayHoldTombstones() {
		return false, nil
	}
	v, err := getValue(b.b, tombKey(tenant, key))
	if err != nil || v == nil {
		return false, err
	}
	if len(v) < 9 || v[0] != tombVersion {
		return false, fmt.Errorf("%w: bad tombstone header of %q/%q", ErrCorrupt, tenant, key)
	}
	at := idemkv.Timestamp(binary.BigEndian.Uint64(v[1:9]))
	b.tombsAdded--
	return true, errors.Join(b.b.Delete(tombExpiry.key(at, tenant, key), nil), b.b.Delete(tombKey(tenant, key), nil))
}

// ExpiredTombstones returns up to limit tombstone index entries at or before now,
// earliest first, after the last one marked swept.
func (b *Batch) ExpiredTombstones(now idemkv.Timestamp, limit int) ([]ExpiryEntry, error) {
	var out []ExpiryEntry
	err := tombExpiry.scan(b.b, now, limit, func(e ExpiryEntry) { out = append(out, e) })
	return out, err
}

// DeleteTombstoneExpiry removes one tombstone index entry alone: for an entry that no
// longer matches its tombstone, which only a bug could produce.
func (b *Batch) DeleteTombstoneExpiry(e ExpiryEntry) error {
	return b.b.Delete(tombExpiry.key(e.ExpiresAt, e.Tenant, e.Key), nil)
}

// MarkTombstonesSwept is MarkSwept for the tombstone index. The mark stays valid for
// the same reason: a tombstone is only written with its record's expiry, and a record
// is only released while it has not expired, so after the state machine clock.
func (b *Batch) MarkTombstonesSwept(e ExpiryEntry) error {
	return b.b.Set(keyTombSwept, tombExpiry.key(e.ExpiresAt, e.Tenant, e.Key), nil)
}

// checkTombIndex verifies that the tombstone index holds exactly one entry per
// tombstone, at its expires_at, none before the swept mark, and that no key holds both
// a record and a tombstone (a record that takes a key again removes its tombstone).
func checkTombIndex(snap *pebble.Snapshot) error {
	tombs := 0
	it, err := snap.NewIter(prefixIter(prefixTomb))
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		tombs++
		if err := checkTombstone(snap, it.Key(), it.Value()); err != nil {
			return errors.Join(err, it.Close())
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	entries, err := checkIndexEntries(snap, prefixTombExpiry, "tombstone index entry", "tombstone", func(tenant, key string) (idemkv.Timestamp, bool, error) {
		ts, err := getTombstone(snap, tenant, key)
		if err != nil || ts == nil {
			return 0, false, err
		}
		return ts.ExpiresAt, true, nil
	})
	if err != nil {
		return err
	}
	if tombs != entries {
		return fmt.Errorf("%w: %d tombstones but %d index entries", ErrCorrupt, tombs, entries)
	}
	bound, err := tombExpiry.sweptBound(snap)
	if err != nil {
		return err
	}
	below, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte(prefixTombExpiry), UpperBound: bound})
	if err != nil {
		return err
	}
	defer below.Close()
	if below.First() {
		e, _ := parseExpiryKey(below.Key())
		return fmt.Errorf("%w: tombstone index entry %q/%q at %s lies before the swept mark", ErrCorrupt, e.Tenant, e.Key, e.ExpiresAt)
	}
	return below.Error()
}

// checkTombstone checks one stored tombstone against its index entry and the records.
func checkTombstone(snap *pebble.Snapshot, key, value []byte) error {
	t, k, err := parseRecordKey(key)
	if err != nil {
		return err
	}
	ts, err := decodeTombstone(t, k, value)
	if err != nil {
		return err
	}
	entry, err := getValue(snap, tombExpiry.key(ts.ExpiresAt, t, k))
	if err != nil {
		return err
	}
	if entry == nil {
		return fmt.Errorf("%w: tombstone %q/%q expiring at %s has no index entry", ErrCorrupt, t, k, ts.ExpiresAt)
	}
	rec, err := getValue(snap, recordKey(t, k))
	if err != nil {
		return err
	}
	if rec != nil {
		return fmt.Errorf("%w: %q/%q holds a record and a tombstone", ErrCorrupt, t, k)
	}
	return nil
}
