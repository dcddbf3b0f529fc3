package storage

import (
	"fmt"

	"github.com/idemkv/idemkv/internal/wire"
)

// The cluster's data format and what each node advertised it reads (fsm/format.go
// says what the numbers mean). Both are replicated state, in snapshots like the rest;
// the advertisements stay out of Hash, since a node of the release before them skips
// the entries that carry them and must still hash equal to the others.

// ClusterFormat returns the stored cluster format; ok is false when none was ever set.
func (s *Store) ClusterFormat() (format int, ok bool, err error) {
	db, err := s.open()
	if err != nil {
		return 0, false, err
	}
	defer s.mu.RUnlock()
	v, err := getValue(db, keyFormat)
	if err != nil || v == nil {
		return 0, false, err
	}
	f, err := decodeFormat("cluster format", v)
	return f, err == nil, err
}

// NodeFormats returns the format each node advertised, by node id.
func (s *Store) NodeFormats() (map[string]int, error) {
	db, err := s.open()
	if err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	it, err := db.NewIter(prefixIter(prefixFormat))
	if err != nil {
		return nil, fmt.Errorf("storage: node formats: %w", err)
	}
	defer it.Close()
	out := map[string]int{}
	for it.First(); it.Valid(); it.Next() {
		id := string(it.Key()[len(prefixFormat):])
		f, err := decodeFormat("format of node "+id, it.Value())
		if err != nil {
			return nil, err
		}
		out[id] = f
	}
	return out, it.Error()
}

// SetClusterFormat stores the cluster format.
func (b *Batch) SetClusterFormat(format int) error {
	return b.b.Set(keyFormat, wire.AppendUvarint(nil, uint64(format)), nil)
}

// PutNodeFormat stores the format node id advertised.
func (b *Batch) PutNodeFormat(id string, format int) error {
	return b.b.Set(formatKey(id), wire.AppendUvarint(nil, uint64(format)), nil)
}

// HoldsNewerThanApprovals reports whether the store holds anything the release before
// history could not read: a record with a history or masked effect paths (record
// flags 1<<5 and 1<<6), an approval rule with options (rule version 2), or a
// tombstone. It reads
// every record; only a node standing for that release in a test asks it, after a
// restore.
func (s *Store) HoldsNewerThanApprovals() (what string, err error) {
	db, err := s.open()
	if err != nil {
		return "", err
	}
	defer s.mu.RUnlock()
	for _, p := range []string{prefixRecord, prefixRule, prefixTomb} {
		it, err := db.NewIter(prefixIter(p))
		if err != nil {
			return "", fmt.Errorf("storage: scan: %w", err)
		}
		for it.First(); it.Valid() && what == ""; it.Next() {
			what = newerThanApprovals(p, it.Key(), it.Value())
		}
		if err := it.Close(); err != nil {
			return "", fmt.Errorf("storage: scan: %w", err)
		}
		if what != "" {
			return what, nil
		}
	}
	return "", nil
}

// newerThanApprovals names what in one stored value the release before history could
// not decode ("" if nothing).
func newerThanApprovals(prefix string, k, v []byte) string {
	if prefix == prefixTomb {
		return fmt.Sprintf("tombstone %q", k[len(prefixTomb):])
	}
	if prefix == prefixRule {
		if len(v) > 0 && v[0] == ruleVersionOptions {
			return fmt.Sprintf("approval rule %q with options (rule version %d)", k[len(prefixRule):], ruleVersionOptions)
		}
		return ""
	}
	tenant, key, err := parseRecordKey(k)
	if err != nil {
		return err.Error()
	}
	rec, err := decodeRecord(tenant, key, v)
	if err != nil {
		return err.Error()
	}
	if len(rec.History) > 0 || rec.HistoryDropped > 0 || len(rec.EffectMask) > 0 {
		return fmt.Sprintf("record %q/%q with a history or masked effect (record flags %#x)", tenant, key, flagHistory|flagEffectMask)
	}
	return ""
}
