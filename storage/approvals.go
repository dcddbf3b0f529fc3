package storage

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idemkv"
)

// The waiting-approval index (w/<tenant>\x00<requested_at><key> -> the approval's
// expires_at) names the records whose approval nobody has answered yet, oldest first
// per tenant, so that listing them and the metrics of their number and age cost
// O(waiting approvals), never a scan of every record. It is derived state like the
// in-doubt index: batches keep it in step, snapshots carry it, Hash leaves it out. An
// entry stays until its record is decided, replaced or swept; readers skip the ones
// whose expires_at has passed.
//
// Approval rules (a/<tenant>\x00<tool>) are replicated state: Hash covers them.

// waitingOf returns the index key and value rec needs, or nil if it needs none.
func waitingOf(rec *idemkv.Record) (k, v []byte) {
	if rec == nil || rec.Status != idemkv.StatusAwaitingApproval || rec.Approval == nil || rec.Approval.State != idemkv.ApprovalWaiting {
		return nil, nil
	}
	return waitKey(rec.Tenant, rec.Approval.RequestedAt, rec.Key), binary.BigEndian.AppendUint64(nil, uint64(rec.Approval.ExpiresAt))
}

// keepWaitIndex updates the index entry of record key k, about to be replaced by next
// (nil: deleted). The old value is decoded only when it awaits approval.
func (b *Batch) keepWaitIndex(k []byte, tenant, key string, next *idemkv.Record) error {
	v, err := b.value(k)
	if err != nil {
		return err
	}
	var oldKey []byte
	if len(v) > 9 && v[9] == statusCodes[idemkv.StatusAwaitingApproval] {
		old, err := decodeRecord(tenant, key, v)
		if err != nil {
			return err
		}
		oldKey, _ = waitingOf(old)
	}
	newKey, newVal := waitingOf(next)
	if oldKey != nil && string(oldKey) != string(newKey) {
		if err := b.b.Delete(oldKey, nil); err != nil {
			return err
		}
	}
	if newKey != nil {
		return b.b.Set(newKey, newVal, nil)
	}
	return nil
}

// WaitingApprovals returns up to limit records of tenant whose approval waits at now,
// oldest requested_at first, after the position after (nil: from the first), and
// whether more index entries follow. Index and records come from one Pebble snapshot.
func (s *Store) WaitingApprovals(tenant string, after *idemkv.ApprovalPosition, limit int, now idemkv.Timestamp) (recs []*idemkv.Record, more bool, err error) {
	if limit <= 0 {
		return nil, false, fmt.Errorf("storage: approvals page of %d records", limit)
	}
	lower := waitKey(tenant, 0, "")
	if after != nil {
		lower = waitKey(tenant, after.RequestedAt, after.Key+"\x00")
	}
	db, err := s.open()
	if err != nil {
		return nil, false, err
	}
	defer s.mu.RUnlock()
	snap := db.NewSnapshot()
	defer snap.Close()
	upper := prefixEnd(append(append([]byte(prefixWait), tenant...), 0))
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, false, fmt.Errorf("storage: waiting approvals: %w", err)
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		if len(recs) == limit {
			return recs, true, nil
		}
		_, _, key, err := parseWaitKey(it.Key())
		if err != nil {
			return nil, false, err
		}
		if len(it.Value()) != 8 || idemkv.Timestamp(binary.BigEndian.Uint64(it.Value())) <= now {
			continue // lapsed: its record is decided anew by the next reserve
		}
		rec, err := getRecord(snap, tenant, key)
		if err != nil {
			return nil, false, err
		}
		if rec == nil {
			return nil, false, fmt.Errorf("%w: waiting approval %q/%q without a record", ErrCorrupt, tenant, key)
		}
		recs = append(recs, rec)
	}
	return recs, false, it.Error()
}

// ApprovalStats returns how many approvals wait at now, in every tenant, and the
// earliest requested_at among them (0 if none). It reads the index only.
func (s *Store) ApprovalStats(now idemkv.Timestamp) (count int, oldest idemkv.Timestamp, err error) {
	db, err := s.open()
	if err != nil {
		return 0, 0, err
	}
	defer s.mu.RUnlock()
	it, err := db.NewIter(prefixIter(prefixWait))
	if err != nil {
		return 0, 0, fmt.Errorf("storage: waiting-approval index: %w", err)
	}
	for it.First(); it.Valid(); it.Next() {
		_, at, _, err := parseWaitKey(it.Key())
		if err != nil {
			it.Close()
			return 0, 0, err
		}
		if len(it.Value()) != 8 || idemkv.Timestamp(binary.BigEndian.Uint64(it.Value())) <= now {
			continue
		}
		if count == 0 || at < oldest {
			oldest = at
		}
		count++
	}
	return count, oldest, errors.Join(it.Error(), it.Close())
}

// checkWaitIndex verifies that the waiting-approval index and the records agree one
// to one.
func checkWaitIndex(snap *pebble.Snapshot) error {
	waiting := 0
	it, err := snap.NewIter(prefixIter(prefixRecord))
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		t, k, err := parseRecordKey(it.Key())
		if err == nil {
			var rec *idemkv.Record
			if rec, err = decodeRecord(t, k, it.Value()); err == nil {
				if wk, wv := waitingOf(rec); wk != nil {
					waiting++
					var v []byte
					if v, err = getValue(snap, wk); err == nil && string(v) != string(wv) {
						err = fmt.Errorf("%w: record %q/%q awaiting approval has no matching index entry", ErrCorrupt, t, k)
					}
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
	wi, err := snap.NewIter(prefixIter(prefixWait))
	if err != nil {
		return err
	}
	defer wi.Close()
	for wi.First(); wi.Valid(); wi.Next() {
		entries++
	}
	if waiting != entries {
		return fmt.Errorf("%w: %d records await approval but the index holds %d entries", ErrCorrupt, waiting, entries)
	}
	return wi.Error()
}

// ApprovalRule returns the rule of (tenant, tool) as the batch sees it.
func (b *Batch) ApprovalRule(tenant, tool string) (rule idemkv.ApprovalRule, ok bool, err error) {
	k := ruleKey(tenant, tool)
	v, written := b.ruleWrites[string(k)]
	if !written {
		// The state machine's goroutine: no restore swaps the database under it.
		b.s.mu.RLock()
		v, err = b.s.rules.get(b.s.db, k)
		b.s.mu.RUnlock()
	}
	if err != nil || v == nil {
		return idemkv.ApprovalRule{}, false, err
	}
	rule, err = decodeRule(tenant, tool, v)
	return rule, err == nil, err
}

// PutApprovalRule sets a rule.
func (b *Batch) PutApprovalRule(r idemkv.ApprovalRule) error {
	k, v := ruleKey(r.Tenant, r.Tool), encodeRule(r)
	if err := b.b.Set(k, v, nil); err != nil {
		return err
	}
	b.noteRule(k, v)
	return nil
}

// DeleteApprovalRule removes the rule of (tenant, tool).
func (b *Batch) DeleteApprovalRule(tenant, tool string) error {
	k := ruleKey(tenant, tool)
	if err := b.b.Delete(k, nil); err != nil {
		return err
	}
	b.noteRule(k, nil)
	return nil
}

func (b *Batch) noteRule(k, v []byte) {
	if b.ruleWrites == nil {
		b.ruleWrites = make(map[string][]byte)
	}
	b.ruleWrites[string(k)] = v
}

// ApprovalRule returns the committed rule of (tenant, tool).
func (s *Store) ApprovalRule(tenant, tool string) (rule idemkv.ApprovalRule, ok bool, err error) {
	db, err := s.open()
	if err != nil {
		return idemkv.ApprovalRule{}, false, err
	}
	defer s.mu.RUnlock()
	v, err := s.rules.get(db, ruleKey(tenant, tool))
	if err != nil || v == nil {
		return idemkv.ApprovalRule{}, false, err
	}
	rule, err = decodeRule(tenant, tool, v)
	return rule, err == nil, err
}

// ApprovalRules returns the rules of tenant in tool order.
func (s *Store) ApprovalRules(tenant string) ([]idemkv.ApprovalRule, error) {
	db, err := s.open()
	if err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	p := string(ruleKey(tenant, ""))
	it, err := db.NewIter(prefixIter(p))
	if err != nil {
		return nil, fmt.Errorf("storage: approval rules: %w", err)
	}
	defer it.Close()
	rules := []idemkv.ApprovalRule{}
	for it.First(); it.Valid(); it.Next() {
		r, err := decodeRule(tenant, string(it.Key()[len(p):]), it.Value())
		if err != nil {
			return nil, err
		}
		rules = append(rules, r)
	}
	return rules, it.Error()
}
