package storage

import (
	"encoding/binary"
	"fmt"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/wire"
)

// Key layout. Tenants are [A-Za-z0-9._:-] and keys printable UTF-8, so neither holds a
// 0x00 byte: the separator keeps (tenant, key) pairs in key order per tenant, and one
// tenant's range never interleaves with another's.
//
//	r/<tenant>\x00<key>                          record
//	x/<8-byte big-endian expires_at><tenant>\x00<key>  expiry index (empty value)
//	d/<tenant>\x00<key>                           in-doubt index: pending records marked in doubt (value: in_doubt_since, 8 bytes)
//	w/<tenant>\x00<8-byte big-endian requested_at><key>  waiting-approval index (value: the approval's expires_at, 8 bytes)
//	a/<tenant>\x00<tool>                          approval rule (replicated state, like records)
//	m/applied                                    applied index + term (16 bytes)
//	m/clock                                      state machine clock (8 bytes)
//	m/swept                                      expiry key of the last entry swept
//	m/records                                    number of records (8 bytes), kept in step by batches
//	m/tswept                                     tombstone expiry key of the last tombstone swept
//	n/<id>                                       replicated node metadata
//	t/<tenant>\x00<key>                          tombstone of a released record (replicated state, like records)
//	y/<8-byte big-endian expires_at><tenant>\x00<key>  tombstone expiry index (empty value)
//	f/<id>                                       the data format node id advertised (uvarint)
//	m/format                                     the cluster's data format (uvarint; absent: none was ever set)
//
// The tombstone prefixes sort after m/applied, which a version-1 snapshot stream must
// reach among its first pairs (appliedInRecords). f/ sorts before it, but no version-1
// stream holds one: only versions before formats wrote that stream.
const (
	prefixRecord     = "r/"
	prefixExpiry     = "x/"
	prefixNode       = "n/"
	prefixDoubt      = "d/"
	prefixWait       = "w/"
	prefixRule       = "a/"
	prefixTomb       = "t/"
	prefixTombExpiry = "y/"
	prefixFormat     = "f/"
)

var (
	keyApplied   = []byte("m/applied")
	keyClock     = []byte("m/clock")
	keySwept     = []byte("m/swept")
	keyRecords   = []byte("m/records")
	keyTombSwept = []byte("m/tswept")
	keyFormat    = []byte("m/format")
)

func recordKey(tenant, key string) []byte { return pairKey(prefixRecord, tenant, key) }

func tombKey(tenant, key string) []byte { return pairKey(prefixTomb, tenant, key) }

// pairKey is prefix, tenant, 0x00, key.
func pairKey(prefix, tenant, key string) []byte {
	b := make([]byte, 0, len(prefix)+len(tenant)+1+len(key))
	b = append(b, prefix...)
	b = append(b, tenant...)
	b = append(b, 0)
	return append(b, key...)
}

// parseRecordKey parses a record's key, or a tombstone's (the prefixes are as long).
func parseRecordKey(k []byte) (tenant, key string, err error) {
	rest := k[len(prefixRecord):]
	for i, c := range rest {
		if c == 0 {
			return string(rest[:i]), string(rest[i+1:]), nil
		}
	}
	return "", "", fmt.Errorf("%w: record key without separator", ErrCorrupt)
}

// expiryIndex is one of the two expiry indexes: the records' and the tombstones'. Each
// has its own swept mark, so that a sweep of one never steps over what was swept of the
// other.
type expiryIndex struct {
	prefix string
	mark   []byte
}

var (
	recordExpiry = expiryIndex{prefix: prefixExpiry, mark: keySwept}
	tombExpiry   = expiryIndex{prefix: prefixTombExpiry, mark: keyTombSwept}
)

func expiryKey(at idemkv.Timestamp, tenant, key string) []byte {
	return recordExpiry.key(at, tenant, key)
}

func (x expiryIndex) key(at idemkv.Timestamp, tenant, key string) []byte {
	b := make([]byte, 0, len(x.prefix)+8+len(tenant)+1+len(key))
	b = append(b, x.prefix...)
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	b = append(b, tenant...)
	b = append(b, 0)
	return append(b, key...)
}

// bound is the first key of the index strictly after every entry expiring at or
// before at. Expiry times are positive Unix milliseconds, so unsigned big-endian order
// is time order.
func (x expiryIndex) bound(at idemkv.Timestamp) []byte {
	b := append([]byte(x.prefix), make([]byte, 8)...)
	binary.BigEndian.PutUint64(b[len(x.prefix):], uint64(at)+1)
	return b
}

// parseExpiryKey parses a key of either index (the prefixes are as long).
func parseExpiryKey(k []byte) (ExpiryEntry, error) {
	rest := k[len(prefixExpiry):]
	if len(rest) < 8 {
		return ExpiryEntry{}, fmt.Errorf("%w: short expiry key", ErrCorrupt)
	}
	at := idemkv.Timestamp(binary.BigEndian.Uint64(rest))
	for i, c := range rest[8:] {
		if c == 0 {
			return ExpiryEntry{ExpiresAt: at, Tenant: string(rest[8 : 8+i]), Key: string(rest[9+i:])}, nil
		}
	}
	return ExpiryEntry{}, fmt.Errorf("%w: expiry key without separator", ErrCorrupt)
}

func doubtKey(tenant, key string) []byte {
	b := make([]byte, 0, len(prefixDoubt)+len(tenant)+1+len(key))
	b = append(b, prefixDoubt...)
	b = append(b, tenant...)
	b = append(b, 0)
	return append(b, key...)
}

// waitKey orders a tenant's waiting approvals by requested_at, then key.
func waitKey(tenant string, requestedAt idemkv.Timestamp, key string) []byte {
	b := make([]byte, 0, len(prefixWait)+len(tenant)+1+8+len(key))
	b = append(b, prefixWait...)
	b = append(b, tenant...)
	b = append(b, 0)
	b = binary.BigEndian.AppendUint64(b, uint64(requestedAt))
	return append(b, key...)
}

func parseWaitKey(k []byte) (tenant string, requestedAt idemkv.Timestamp, key string, err error) {
	rest := k[len(prefixWait):]
	for i, c := range rest {
		if c == 0 {
			if len(rest) < i+1+8 {
				break
			}
			at := idemkv.Timestamp(binary.BigEndian.Uint64(rest[i+1:]))
			return string(rest[:i]), at, string(rest[i+9:]), nil
		}
	}
	return "", 0, "", fmt.Errorf("%w: malformed waiting-approval key", ErrCorrupt)
}

func ruleKey(tenant, tool string) []byte {
	b := make([]byte, 0, len(prefixRule)+len(tenant)+1+len(tool))
	b = append(b, prefixRule...)
	b = append(b, tenant...)
	b = append(b, 0)
	return append(b, tool...)
}

func nodeKey(id string) []byte { return append([]byte(prefixNode), id...) }

func formatKey(id string) []byte { return append([]byte(prefixFormat), id...) }

// decodeFormat reads a data format value (the cluster's, or one a node advertised).
func decodeFormat(what string, v []byte) (int, error) {
	d := wire.NewDecoder(v, ErrCorrupt)
	f := d.Uvarint()
	if d.Err() == nil && (f == 0 || f > 255) {
		d.Fail("format %d out of range", f)
	}
	if err := d.Finish(); err != nil {
		return 0, fmt.Errorf("%w: %s", err, what)
	}
	return int(f), nil
}

// prefixEnd returns the smallest key greater than every key starting with p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// recordVersion is the first byte of a stored record. expires_at follows at a fixed
// offset so that maintaining the expiry index needs no full decode of the old value.
const recordVersion = 1

const (
	flagReceipt = 1 << iota
	flagError
	// flagInDoubt: in_doubt_since follows the error. Records written before it
	// existed lack the flag and decode as not in doubt.
	flagInDoubt
	// flagApproval: the approval follows in_doubt_since; flagEffect: the effect's
	// canonical JSON follows the approval. A new optional section takes the next bit
	// and goes after the last one, so every record written before it still decodes.
	flagApproval
	flagEffect
	// flagHistory: the history follows the effect (history_dropped, then the events,
	// oldest first); flagEffectMask: the masked paths of the stored effect follow it.
	flagHistory
	flagEffectMask
	knownFlags = flagReceipt | flagError | flagInDoubt | flagApproval | flagEffect | flagHistory | flagEffectMask
)

// eventCodes number the history's event kinds on disk; a code is never reused.
var eventCodes = map[idemkv.EventKind]byte{idemkv.EventExecute: 1, idemkv.EventRecover: 2, idemkv.EventCommit: 3,
	idemkv.EventFail: 4, idemkv.EventRelease: 5, idemkv.EventDoubt: 6, idemkv.EventResolve: 7,
	idemkv.EventApprovalRequested: 8, idemkv.EventApprovalDecided: 9}
var eventByCode = [...]idemkv.EventKind{1: idemkv.EventExecute, 2: idemkv.EventRecover, 3: idemkv.EventCommit,
	4: idemkv.EventFail, 5: idemkv.EventRelease, 6: idemkv.EventDoubt, 7: idemkv.EventResolve,
	8: idemkv.EventApprovalRequested, 9: idemkv.EventApprovalDecided}

var approvalStateCodes = map[idemkv.ApprovalState]byte{idemkv.ApprovalWaiting: 1, idemkv.ApprovalApproved: 2, idemkv.ApprovalDenied: 3}
var approvalStateByCode = [...]idemkv.ApprovalState{1: idemkv.ApprovalWaiting, 2: idemkv.ApprovalApproved, 3: idemkv.ApprovalDenied}

var statusCodes = map[idemkv.Status]byte{idemkv.StatusPending: 1, idemkv.StatusCommitted: 2, idemkv.StatusFailed: 3, idemkv.StatusAwaitingApproval: 4}
var statusByCode = [...]idemkv.Status{1: idemkv.StatusPending, 2: idemkv.StatusCommitted, 3: idemkv.StatusFailed, 4: idemkv.StatusAwaitingApproval}

// encodeRecord is deterministic (replicas must hash equal states to equal bytes).
// Tenant and key live in the Pebble key and are not repeated.
func encodeRecord(dst []byte, r *idemkv.Record) (_ []byte, err error) {
	st, ok := statusCodes[r.Status]
	if !ok {
		return nil, fmt.Errorf("storage: cannot store status %q", r.Status)
	}
	dst = append(dst, recordVersion)
	dst = binary.BigEndian.AppendUint64(dst, uint64(r.ExpiresAt))
	dst = append(dst, st)
	dst = wire.AppendUvarint(dst, r.Fence)
	dst = wire.AppendUvarint(dst, uint64(r.Attempts))
	dst = wire.AppendVarint(dst, int64(r.CreatedAt))
	dst = wire.AppendVarint(dst, int64(r.UpdatedAt))
	dst = wire.AppendVarint(dst, int64(r.LeaseExpiresAt))
	dst = wire.AppendString(dst, r.Fingerprint)
	dst = wire.AppendString(dst, r.Tool)
	dst = wire.AppendString(dst, r.Actor)
	dst = wire.AppendString(dst, r.AttemptID)
	var flags byte
	if r.Receipt != nil {
		flags |= flagReceipt
	}
	if r.Error != nil {
		flags |= flagError
	}
	if r.InDoubt {
		flags |= flagInDoubt
	}
	var approvalState byte
	if a := r.Approval; a != nil {
		if approvalState, ok = approvalStateCodes[a.State]; !ok {
			return nil, fmt.Errorf("storage: cannot store approval state %q", a.State)
		}
		flags |= flagApproval
	}
	if len(r.Effect) > 0 {
		flags |= flagEffect
	}
	if r.HasHistory() {
		flags |= flagHistory
	}
	if len(r.EffectMask) > 0 {
		flags |= flagEffectMask
	}
	dst = append(dst, flags)
	if rc := r.Receipt; rc != nil {
		dst = wire.AppendString(dst, rc.RemoteSystem)
		dst = wire.AppendString(dst, rc.RemoteID)
		dst = wire.AppendString(dst, rc.RemoteURL)
		dst = wire.AppendBytes(dst, rc.Result)
		dst = wire.AppendVarint(dst, int64(rc.CommittedAt))
	}
	if e := r.Error; e != nil {
		dst = wire.AppendString(dst, e.Code)
		dst = wire.AppendString(dst, e.Message)
		dst = wire.AppendBytes(dst, e.Details)
	}
	if r.InDoubt {
		dst = wire.AppendVarint(dst, int64(r.InDoubtSince))
	}
	if a := r.Approval; a != nil {
		dst = wire.AppendString(dst, a.ID)
		dst = append(dst, approvalState)
		var byRule byte
		if a.ByRule {
			byRule = 1
		}
		dst = append(dst, byRule)
		dst = wire.AppendString(dst, a.Summary)
		dst = wire.AppendVarint(dst, int64(a.RequestedAt))
		dst = wire.AppendVarint(dst, int64(a.ExpiresAt))
		dst = wire.AppendString(dst, a.Approver)
		dst = wire.AppendString(dst, a.Reason)
		dst = wire.AppendVarint(dst, int64(a.DecidedAt))
	}
	if len(r.Effect) > 0 {
		dst = wire.AppendBytes(dst, r.Effect)
	}
	if flags&flagHistory != 0 {
		if dst, err = appendHistory(dst, r.History, r.HistoryDropped); err != nil {
			return nil, err
		}
	}
	if flags&flagEffectMask != 0 {
		dst = wire.AppendUvarint(dst, uint64(len(r.EffectMask)))
		for _, m := range r.EffectMask {
			dst = wire.AppendString(dst, m)
		}
	}
	return dst, nil
}

// ErrCorrupt is wrapped by every error about bytes on disk or in a snapshot stream that
// do not parse. It wraps idemkv.ErrInternal: no client can cause it.
var ErrCorrupt = fmt.Errorf("%w: storage corrupt", idemkv.ErrInternal)

// storedExpiry reads expires_at from an encoded record without decoding the rest.
func storedExpiry(v []byte) (idemkv.Timestamp, error) {
	if len(v) < 9 || v[0] != recordVersion {
		return 0, fmt.Errorf("%w: bad record header", ErrCorrupt)
	}
	return idemkv.Timestamp(binary.BigEndian.Uint64(v[1:9])), nil
}

// decodeRecord decodes a stored record, its history included.
func decodeRecord(tenant, key string, v []byte) (*idemkv.Record, error) {
	return decodeRecordKeeping(tenant, key, v, true)
}

// decodeRecordKeeping is decodeRecord that keeps the record's history only when
// history is set. Without it the history's bytes are still checked as they are read,
// so the same stored bytes are corrupt either way; only its events and their strings
// are not built.
func decodeRecordKeeping(tenant, key string, v []byte, history bool) (*idemkv.Record, error) {
	at, err := storedExpiry(v)
	if err != nil {
		return nil, err
	}
	d := wire.NewDecoder(v[9:], ErrCorrupt)
	r := &idemkv.Record{Tenant: tenant, Key: key, ExpiresAt: at}
	st := d.Byte()
	if d.Err() == nil && (int(st) >= len(statusByCode) || statusByCode[st] == "") {
		d.Fail("unknown status code %d", st)
	}
	if d.Err() == nil {
		r.Status = statusByCode[st]
	}
	r.Fence = d.Uvarint()
	attempts := d.Uvarint()
	if attempts > 1<<32-1 {
		d.Fail("attempt count %d out of range", attempts)
	}
	r.Attempts = uint32(attempts)
	r.CreatedAt = idemkv.Timestamp(d.Varint())
	r.UpdatedAt = idemkv.Timestamp(d.Varint())
	r.LeaseExpiresAt = idemkv.Timestamp(d.Varint())
	r.Fingerprint = d.Text()
	r.Tool = d.Text()
	r.Actor = d.Text()
	r.AttemptID = d.Text()
	flags := d.Byte()
	if unknown := flags &^ knownFlags; unknown != 0 {
		d.Fail("unknown flags %#x", unknown)
	}
	if flags&flagReceipt != 0 {
		rc := &idemkv.StoredReceipt{}
		rc.RemoteSystem = d.Text()
		rc.RemoteID = d.Text()
		rc.RemoteURL = d.Text()
		rc.Result = d.Bytes()
		rc.CommittedAt = idemkv.Timestamp(d.Varint())
		r.Receipt = rc
	}
	if flags&flagError != 0 {
		e := &idemkv.ErrorInfo{}
		e.Code = d.Text()
		e.Message = d.Text()
		e.Details = d.Bytes()
		r.Error = e
	}
	if flags&flagInDoubt != 0 {
		r.InDoubt = true
		r.InDoubtSince = idemkv.Timestamp(d.Varint())
	}
	if flags&flagApproval != 0 {
		r.Approval = decodeApproval(&d)
	}
	if flags&flagEffect != 0 {
		r.Effect = d.Bytes()
	}
	if flags&flagHistory != 0 {
		r.History, r.HistoryDropped = scanHistory(&d, history)
	}
	if flags&flagEffectMask != 0 {
		n := d.Uvarint()
		if d.Err() == nil && (n == 0 || n > idemkv.MaxEffectMasks) {
			d.Fail("%d masked paths", n)
		}
		for i := uint64(0); i < n && d.Err() == nil; i++ {
			r.EffectMask = append(r.EffectMask, d.Text())
		}
	}
	if err := d.Finish(); err != nil {
		return nil, fmt.Errorf("%w: record %q/%q", err, tenant, key)
	}
	return r, nil
}

// appendHistory appends a history (a record's, a tombstone's): history_dropped, the
// number of events, then the events, oldest first.
func appendHistory(dst []byte, h []idemkv.HistoryEvent, dropped uint32) ([]byte, error) {
	dst = wire.AppendUvarint(dst, uint64(dropped))
	dst = wire.AppendUvarint(dst, uint64(len(h)))
	for _, ev := range h {
		code, ok := eventCodes[ev.Event]
		if !ok {
			return nil, fmt.Errorf("storage: cannot store history event %q", ev.Event)
		}
		dst = append(dst, code)
		dst = wire.AppendVarint(dst, int64(ev.At))
		dst = wire.AppendUvarint(dst, ev.Fence)
		dst = wire.AppendString(dst, ev.AttemptID)
		dst = wire.AppendString(dst, ev.Actor)
		dst = wire.AppendString(dst, ev.Detail)
	}
	return dst, nil
}

// readHistory reads what appendHistory wrote.
func readHistory(d *wire.Decoder) (h []idemkv.HistoryEvent, dropped uint32) {
	return scanHistory(d, true)
}

// scanHistory reads a history and checks it: the one reader of the format. It returns
// the events and history_dropped only when keep is set, and otherwise (nil, 0),
// without building the events.
func scanHistory(d *wire.Decoder, keep bool) (h []idemkv.HistoryEvent, dropped uint32) {
	n64 := d.Uvarint()
	if n64 > 1<<32-1 {
		d.Fail("history_dropped %d out of range", n64)
	}
	dropped = uint32(n64)
	n := d.Uvarint()
	if d.Err() == nil && n > idemkv.MaxHistory {
		d.Fail("%d history events", n)
	}
	if d.Err() != nil {
		return nil, 0
	}
	if keep {
		h = make([]idemkv.HistoryEvent, 0, n)
	}
	for i := uint64(0); i < n && d.Err() == nil; i++ {
		code := d.Byte()
		if d.Err() == nil && (int(code) >= len(eventByCode) || eventByCode[code] == "") {
			d.Fail("unknown history event %d", code)
			return nil, 0
		}
		at, fence := d.Varint(), d.Uvarint()
		attempt, actor, detail := d.Raw(), d.Raw(), d.Raw()
		if keep {
			h = append(h, idemkv.HistoryEvent{Event: eventByCode[code], At: idemkv.Timestamp(at), Fence: fence,
				AttemptID: string(attempt), Actor: string(actor), Detail: string(detail)})
		}
	}
	if !keep {
		return nil, 0
	}
	return h, dropped
}

// tombVersion is the first byte of a stored tombstone. expires_at follows at a fixed
// offset, as in a record, then released_at, the tool, the fingerprint and the history
// (appendHistory), which holds at least the event that made the tombstone.
const tombVersion = 1

func encodeTombstone(dst []byte, t *idemkv.Tombstone) ([]byte, error) {
	if len(t.History) == 0 {
		return nil, fmt.Errorf("storage: a tombstone of %q/%q without history", t.Tenant, t.Key)
	}
	dst = append(dst, tombVersion)
	dst = binary.BigEndian.AppendUint64(dst, uint64(t.ExpiresAt))
	dst = wire.AppendVarint(dst, int64(t.ReleasedAt))
	dst = wire.AppendString(dst, t.Tool)
	dst = wire.AppendString(dst, t.Fingerprint)
	return appendHistory(dst, t.History, t.HistoryDropped)
}

func decodeTombstone(tenant, key string, v []byte) (*idemkv.Tombstone, error) {
	if len(v) < 9 || v[0] != tombVersion {
		return nil, fmt.Errorf("%w: bad tombstone header of %q/%q", ErrCorrupt, tenant, key)
	}
	t := &idemkv.Tombstone{Tenant: tenant, Key: key, ExpiresAt: idemkv.Timestamp(binary.BigEndian.Uint64(v[1:9]))}
	d := wire.NewDecoder(v[9:], ErrCorrupt)
	t.ReleasedAt = idemkv.Timestamp(d.Varint())
	t.Tool = d.Text()
	t.Fingerprint = d.Text()
	t.History, t.HistoryDropped = readHistory(&d)
	if d.Err() == nil && len(t.History) == 0 {
		d.Fail("a tombstone without history")
	}
	if err := d.Finish(); err != nil {
		return nil, fmt.Errorf("%w: tombstone %q/%q", err, tenant, key)
	}
	return t, nil
}

func decodeApproval(d *wire.Decoder) *idemkv.Approval {
	a := &idemkv.Approval{ID: d.Text()}
	st := d.Byte()
	if d.Err() == nil && (int(st) >= len(approvalStateByCode) || approvalStateByCode[st] == "") {
		d.Fail("unknown approval state %d", st)
	}
	if d.Err() == nil {
		a.State = approvalStateByCode[st]
	}
	switch byRule := d.Byte(); {
	case d.Err() != nil:
	case byRule > 1:
		d.Fail("approval by_rule byte %d", byRule)
	default:
		a.ByRule = byRule == 1
	}
	a.Summary = d.Text()
	a.RequestedAt = idemkv.Timestamp(d.Varint())
	a.ExpiresAt = idemkv.Timestamp(d.Varint())
	a.Approver = d.Text()
	a.Reason = d.Text()
	a.DecidedAt = idemkv.Timestamp(d.Varint())
	return a
}

// ruleVersion is the first byte of a stored approval rule: version 1 holds the wait
// alone (every rule required an approval); version 2 adds the rule's options
// (AppendRuleOptions) and is written only for a rule that has any, so a rule set
// before they existed is stored as it always was.
const (
	ruleVersion        = 1
	ruleVersionOptions = 2
)

// Option bits of a rule, stored and in the log.
const (
	ruleNoApproval  = 1 << 0
	ruleStoreEffect = 1 << 1
	knownRuleFlags  = ruleNoApproval | ruleStoreEffect
)

// RuleHasOptions reports whether r needs more than the wait to be written.
func RuleHasOptions(r idemkv.ApprovalRule) bool {
	return !r.RequiresApproval() || r.StoreEffect || len(r.Mask) > 0
}

// AppendRuleOptions appends r's options (the log's and the store's one layout): a
// flags byte, then the masked paths.
func AppendRuleOptions(dst []byte, r idemkv.ApprovalRule) []byte {
	var f byte
	if !r.RequiresApproval() {
		f |= ruleNoApproval
	}
	if r.StoreEffect {
		f |= ruleStoreEffect
	}
	dst = append(dst, f)
	dst = wire.AppendUvarint(dst, uint64(len(r.Mask)))
	for _, m := range r.Mask {
		dst = wire.AppendString(dst, m)
	}
	return dst
}

// DecodeRuleOptions reads what AppendRuleOptions wrote into r.
func DecodeRuleOptions(d *wire.Decoder, r *idemkv.ApprovalRule) {
	f := d.Byte()
	if d.Err() == nil && f&^knownRuleFlags != 0 {
		d.Fail("unknown rule flags %#x", f)
	}
	if f&ruleNoApproval != 0 {
		no := false
		r.RequireApproval = &no
	}
	r.StoreEffect = f&ruleStoreEffect != 0
	n := d.Uvarint()
	if d.Err() == nil && n > idemkv.MaxEffectMasks {
		d.Fail("%d masked paths", n)
	}
	for i := uint64(0); i < n && d.Err() == nil; i++ {
		r.Mask = append(r.Mask, d.Text())
	}
}

func encodeRule(r idemkv.ApprovalRule) []byte {
	if !RuleHasOptions(r) {
		return wire.AppendVarint([]byte{ruleVersion}, r.TTLMs)
	}
	return AppendRuleOptions(wire.AppendVarint([]byte{ruleVersionOptions}, r.TTLMs), r)
}

func decodeRule(tenant, tool string, v []byte) (idemkv.ApprovalRule, error) {
	if len(v) == 0 || (v[0] != ruleVersion && v[0] != ruleVersionOptions) {
		return idemkv.ApprovalRule{}, fmt.Errorf("%w: bad approval rule header", ErrCorrupt)
	}
	d := wire.NewDecoder(v[1:], ErrCorrupt)
	r := idemkv.ApprovalRule{Tenant: tenant, Tool: tool, TTLMs: d.Varint()}
	if v[0] == ruleVersionOptions {
		DecodeRuleOptions(&d, &r)
	}
	if err := d.Finish(); err != nil {
		return idemkv.ApprovalRule{}, fmt.Errorf("%w: approval rule %q/%q", err, tenant, tool)
	}
	return r, nil
}

func encodeNode(n idemkv.NodeInfo) []byte {
	b := []byte{recordVersion}
	b = wire.AppendString(b, n.RaftAddr)
	return wire.AppendString(b, n.APIAddr)
}

func decodeNode(id string, v []byte) (idemkv.NodeInfo, error) {
	if len(v) == 0 || v[0] != recordVersion {
		return idemkv.NodeInfo{}, fmt.Errorf("%w: bad node header", ErrCorrupt)
	}
	d := wire.NewDecoder(v[1:], ErrCorrupt)
	n := idemkv.NodeInfo{ID: id, RaftAddr: d.Text(), APIAddr: d.Text()}
	if err := d.Finish(); err != nil {
		return idemkv.NodeInfo{}, fmt.Errorf("%w: node %q", err, id)
	}
	return n, nil
}
