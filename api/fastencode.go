package api

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/idemkv/idemkv"
)

// appendAnswer appends the JSON of the answers every write returns (a reserve's
// result, a commit's or fail's receipt), byte for byte as encoding/json writes them,
// and reports whether it knew v: parts it does not write itself (an approval, a
// conflict, a history) send the whole answer to encoding/json. Strings and raw JSON that
// encoding/json would escape or compact are handed to it one by one.
//
// encoding/json walks an answer by reflection and writes each timestamp through
// MarshalText; this cost a replay's answer more than its read (BenchmarkAppendAnswer).
// TestAppendAnswerIsEncodingJSON and FuzzAppendAnswer hold it to encoding/json.
func appendAnswer(dst []byte, v any) ([]byte, bool) {
	var e answerEncoder
	b, ok := e.answer(dst, v)
	if !ok || e.failed {
		return dst, false
	}
	return b, true
}

// answerEncoder writes one answer; failed is set by a part it cannot write as
// encoding/json would (raw JSON that is not JSON), which sends the answer to
// encoding/json.
type answerEncoder struct {
	failed    bool
	validated []byte // the raw JSON last found valid
}

// isValidated says whether raw is the very bytes last found valid (not a copy).
func (e *answerEncoder) isValidated(raw []byte) bool {
	return len(raw) == len(e.validated) && len(raw) > 0 && &raw[0] == &e.validated[0]
}

func (e *answerEncoder) answer(b []byte, v any) ([]byte, bool) {
	switch a := v.(type) {
	case *idemkv.ReserveResult:
		if a == nil || a.Conflict != nil || a.Approval != nil || !simpleRecord(a.Record) {
			return b, false
		}
		b = append(b, `{"decision":`...)
		b = appendString(b, string(a.Decision))
		if a.Fence != 0 {
			b = append(b, `,"fence":`...)
			b = strconv.AppendUint(b, a.Fence, 10)
		}
		if a.AttemptID != "" {
			b = append(b, `,"attempt_id":`...)
			b = appendString(b, a.AttemptID)
		}
		if a.LeaseExpiresAt != 0 {
			b = append(b, `,"lease_expires_at":`...)
			b = appendTime(b, a.LeaseExpiresAt)
		}
		if a.Receipt != nil {
			b = append(b, `,"receipt":`...)
			b = e.appendReceipt(b, a.Receipt)
		}
		b = append(b, `,"record":`...)
		b = e.appendRecord(b, a.Record)
		return append(b, '}'), true
	case *idemkv.Receipt:
		if a == nil {
			return b, false
		}
		return e.appendReceipt(b, a), true
	case *idemkv.Record:
		if a == nil || !simpleRecord(a) {
			return b, false
		}
		return e.appendRecord(b, a), true
	}
	return b, false
}

// simpleRecord says whether appendRecord writes r (nil included).
func simpleRecord(r *idemkv.Record) bool {
	return r == nil || (r.Approval == nil && len(r.History) == 0)
}

func (e *answerEncoder) appendRecord(b []byte, r *idemkv.Record) []byte {
	if r == nil {
		return append(b, "null"...)
	}
	b = append(b, `{"tenant":`...)
	b = appendString(b, r.Tenant)
	b = append(b, `,"idempotency_key":`...)
	b = appendString(b, r.Key)
	b = append(b, `,"effect_fingerprint":`...)
	b = appendString(b, r.Fingerprint)
	b = append(b, `,"tool":`...)
	b = appendString(b, r.Tool)
	if r.Actor != "" {
		b = append(b, `,"actor":`...)
		b = appendString(b, r.Actor)
	}
	b = append(b, `,"status":`...)
	b = appendString(b, string(r.Status))
	b = append(b, `,"fence":`...)
	b = strconv.AppendUint(b, r.Fence, 10)
	if r.AttemptID != "" {
		b = append(b, `,"attempt_id":`...)
		b = appendString(b, r.AttemptID)
	}
	b = append(b, `,"attempts":`...)
	b = strconv.AppendUint(b, uint64(r.Attempts), 10)
	b = append(b, `,"created_at":`...)
	b = appendTime(b, r.CreatedAt)
	b = append(b, `,"updated_at":`...)
	b = appendTime(b, r.UpdatedAt)
	if r.LeaseExpiresAt != 0 {
		b = append(b, `,"lease_expires_at":`...)
		b = appendTime(b, r.LeaseExpiresAt)
	}
	b = append(b, `,"expires_at":`...)
	b = appendTime(b, r.ExpiresAt)
	if s := r.Receipt; s != nil {
		b = append(b, `,"receipt":{"remote_system":`...)
		b = appendString(b, s.RemoteSystem)
		b = append(b, `,"remote_id":`...)
		b = appendString(b, s.RemoteID)
		if s.RemoteURL != "" {
			b = append(b, `,"remote_url":`...)
			b = appendString(b, s.RemoteURL)
		}
		if len(s.Result) != 0 {
			b = append(b, `,"result":`...)
			b = e.appendRaw(b, s.Result)
		}
		b = append(b, `,"committed_at":`...)
		b = appendTime(b, s.CommittedAt)
		b = append(b, '}')
	}
	if r.Error != nil {
		b = append(b, `,"error":`...)
		b = e.appendErrorInfo(b, r.Error)
	}
	if r.InDoubt {
		b = append(b, `,"in_doubt":true`...)
	}
	if r.InDoubtSince != 0 {
		b = append(b, `,"in_doubt_since":`...)
		b = appendTime(b, r.InDoubtSince)
	}
	if len(r.Effect) != 0 {
		b = append(b, `,"effect":`...)
		b = e.appendRaw(b, r.Effect)
	}
	if len(r.EffectMask) != 0 {
		b = append(b, `,"effect_mask":[`...)
		for i, p := range r.EffectMask {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, p)
		}
		b = append(b, ']')
	}
	if r.HistoryDropped != 0 {
		b = append(b, `,"history_dropped":`...)
		b = strconv.AppendUint(b, uint64(r.HistoryDropped), 10)
	}
	return append(b, '}')
}

func (e *answerEncoder) appendReceipt(b []byte, r *idemkv.Receipt) []byte {
	b = append(b, `{"idempotency_key":`...)
	b = appendString(b, r.Key)
	b = append(b, `,"effect_fingerprint":`...)
	b = appendString(b, r.Fingerprint)
	b = append(b, `,"status":`...)
	b = appendString(b, string(r.Status))
	if r.RemoteSystem != "" {
		b = append(b, `,"remote_system":`...)
		b = appendString(b, r.RemoteSystem)
	}
	if r.RemoteID != "" {
		b = append(b, `,"remote_id":`...)
		b = appendString(b, r.RemoteID)
	}
	if r.RemoteURL != "" {
		b = append(b, `,"remote_url":`...)
		b = appendString(b, r.RemoteURL)
	}
	if r.CommittedAt != 0 {
		b = append(b, `,"committed_at":`...)
		b = appendTime(b, r.CommittedAt)
	}
	if len(r.Result) != 0 {
		b = append(b, `,"result":`...)
		b = e.appendRaw(b, r.Result)
	}
	if r.Error != nil {
		b = append(b, `,"error":`...)
		b = e.appendErrorInfo(b, r.Error)
	}
	return append(b, '}')
}

func (e *answerEncoder) appendErrorInfo(b []byte, info *idemkv.ErrorInfo) []byte {
	b = append(b, `{"code":`...)
	b = appendString(b, info.Code)
	b = append(b, `,"message":`...)
	b = appendString(b, info.Message)
	if len(info.Details) != 0 {
		b = append(b, `,"details":`...)
		b = e.appendRaw(b, info.Details)
	}
	return append(b, '}')
}

func appendTime(b []byte, t idemkv.Timestamp) []byte {
	b = append(b, '"')
	b, _ = t.AppendText(b)
	return append(b, '"')
}

// appendString appends s quoted. A string of printable ASCII that encoding/json
// writes as it is (no quote, backslash or HTML character) is copied; any other is
// quoted by encoding/json itself.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendRaw appends raw JSON as encoding/json writes a RawMessage: compacted, with
// HTML characters and U+2028/U+2029 escaped, or refused if it is not JSON. Valid JSON
// with none of the bytes that either changes (whitespace, <, >, &, the lead byte of
// U+2028) is copied; the rest is compacted and escaped by encoding/json's own
// functions.
func (e *answerEncoder) appendRaw(b []byte, raw []byte) []byte {
	if !bytes.ContainsAny(raw, " \t\r\n<>&\xe2") {
		// A replay's receipt and its record's share their result: check it once.
		if !e.isValidated(raw) {
			if !json.Valid(raw) {
				e.failed = true // encoding/json refuses the answer, and says why
				return b
			}
			e.validated = raw
		}
		return append(b, raw...)
	}
	var c bytes.Buffer
	if err := json.Compact(&c, raw); err != nil {
		e.failed = true // encoding/json refuses the answer, and says why
		return b
	}
	var h bytes.Buffer
	json.HTMLEscape(&h, c.Bytes())
	return append(b, h.Bytes()...)
}
