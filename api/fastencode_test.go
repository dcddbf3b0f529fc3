package api

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/idemkv/idemkv"
)

// Strings an answer may carry: plain ones, and ones encoding/json escapes (quotes,
// backslashes, control and HTML characters, U+2028, invalid UTF-8).
var answerStrings = []string{"", "acme", "conv_9:approval_17:create_ticket", "sha256:661bfd353cfa", `a"b`, `a\b`, "a\nb\tc\x01",
	"<script>&", "ü €", "\u2028\u2029", "\xff\xfe", "x\x7f"}

// Raw JSON a record may hold: compact, with spaces, with HTML characters, with U+2028,
// and one that is not JSON (which encoding/json refuses the answer for).
var answerRaws = []json.RawMessage{nil, json.RawMessage(`{"state":"open"}`), json.RawMessage(`{ "a" : [1, 2, "<b>"] }`),
	json.RawMessage(`"\u2028 ` + "\u2028" + `"`), json.RawMessage(`[true,null,1.5e3]`), json.RawMessage(`{"a":`)}

func randomAnswer(rng *rand.Rand) any {
	str := func() string { return answerStrings[rng.IntN(len(answerStrings))] }
	raw := func() json.RawMessage { return answerRaws[rng.IntN(len(answerRaws))] }
	ts := func() idemkv.Timestamp {
		return [...]idemkv.Timestamp{0, 1764633600123, 253402300799999, 253402300800000, -62135596800001}[rng.IntN(5)]
	}
	info := func() *idemkv.ErrorInfo {
		if rng.IntN(3) > 0 {
			return nil
		}
		return &idemkv.ErrorInfo{Code: str(), Message: str(), Details: raw()}
	}
	var rec *idemkv.Record
	if rng.IntN(6) > 0 {
		rec = &idemkv.Record{Tenant: str(), Key: str(), Fingerprint: str(), Tool: str(), Actor: str(),
			Status: idemkv.Status(str()), Fence: rng.Uint64N(3) * 1e18, AttemptID: str(), Attempts: rng.Uint32N(3),
			CreatedAt: ts(), UpdatedAt: ts(), LeaseExpiresAt: ts(), ExpiresAt: ts(), Error: info(),
			InDoubt: rng.IntN(2) == 0, InDoubtSince: ts(), Effect: raw(), HistoryDropped: rng.Uint32N(2)}
		if rng.IntN(2) == 0 {
			rec.Receipt = &idemkv.StoredReceipt{RemoteSystem: str(), RemoteID: str(), RemoteURL: str(), Result: raw(), CommittedAt: ts()}
		}
		for range rng.IntN(3) {
			rec.EffectMask = append(rec.EffectMask, str())
		}
		if rng.IntN(10) == 0 {
			rec.History = []idemkv.HistoryEvent{{At: ts(), Event: idemkv.EventExecute}}
		}
		if rng.IntN(10) == 0 {
			rec.Approval = &idemkv.Approval{}
		}
	}
	receipt := func() *idemkv.Receipt {
		return &idemkv.Receipt{Key: str(), Fingerprint: str(), Status: idemkv.Status(str()), RemoteSystem: str(), RemoteID: str(),
			RemoteURL: str(), CommittedAt: ts(), Result: raw(), Error: info()}
	}
	switch rng.IntN(3) {
	case 0:
		res := &idemkv.ReserveResult{Decision: idemkv.Decision(str()), Fence: rng.Uint64N(2) * 42, AttemptID: str(),
			LeaseExpiresAt: ts(), Record: rec}
		if rng.IntN(2) == 0 {
			res.Receipt = receipt()
		}
		if rng.IntN(10) == 0 {
			res.Conflict = &idemkv.Conflict{Status: "conflict"}
		}
		return res
	case 1:
		return receipt()
	}
	return rec
}

// TestAppendAnswerIsEncodingJSON: every answer appendAnswer writes is json.Marshal's,
// byte for byte; what it leaves to encoding/json is what it does not know, and raw
// JSON that encoding/json refuses.
func TestAppendAnswerIsEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 1))
	written := 0
	for range 20000 {
		v := randomAnswer(rng)
		want, werr := json.Marshal(v)
		got, ok := appendAnswer(nil, v)
		if !ok {
			continue
		}
		written++
		if werr != nil {
			t.Fatalf("%+v: appended %s, encoding/json refuses it: %v", v, got, werr)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("appended\n%s\nencoding/json writes\n%s", got, want)
		}
	}
	if written < 10000 {
		t.Fatalf("appendAnswer wrote only %d of 20,000 answers", written)
	}
}

func FuzzAppendAnswer(f *testing.F) {
	f.Add("acme", "k", []byte(`{"a":[1, "<b>"]}`), int64(1764633600123))
	f.Fuzz(func(t *testing.T, s, key string, raw []byte, at int64) {
		if !json.Valid(raw) {
			raw = nil
		}
		rec := &idemkv.Record{Tenant: s, Key: key, Status: idemkv.StatusCommitted, CreatedAt: idemkv.Timestamp(at), Effect: raw,
			Receipt: &idemkv.StoredReceipt{RemoteID: s, Result: raw, CommittedAt: idemkv.Timestamp(at)}}
		for _, v := range []any{rec, &idemkv.ReserveResult{Decision: idemkv.DecisionReplay, AttemptID: key, Record: rec}} {
			want, err := json.Marshal(v)
			got, ok := appendAnswer(nil, v)
			if ok && (err != nil || !bytes.Equal(got, want)) {
				t.Fatalf("appended\n%s\nencoding/json writes\n%s (%v)", got, want, err)
			}
		}
	})
}

// BenchmarkAppendAnswer compares a replay's answer written by appendAnswer and by
// encoding/json.
func BenchmarkAppendAnswer(b *testing.B) {
	rec := &idemkv.Record{Tenant: "bench", Key: "run/seed/17", Fingerprint: "sha256:661bfd353cfa132f40d698e6654a7b6e0c32ecfbe16d60bbf190d576c1156406",
		Tool: "create_ticket", Actor: "bench", Status: idemkv.StatusCommitted, Fence: 1842, AttemptID: "att_0123456789abcdef01234567",
		Attempts: 1, CreatedAt: 1764633600123, UpdatedAt: 1764633600456, ExpiresAt: 1764720000123,
		Receipt: &idemkv.StoredReceipt{RemoteSystem: "linear", RemoteID: "LIN-1842", Result: json.RawMessage(`{"state":"open"}`), CommittedAt: 1764633600456}}
	res := &idemkv.ReserveResult{Decision: idemkv.DecisionReplay, AttemptID: "att_x", Receipt: rec.Outcome(), Record: rec}
	var buf bytes.Buffer
	b.Run("appendAnswer", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf.Reset()
			out, _ := appendAnswer(buf.AvailableBuffer(), res)
			buf.Write(out)
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf.Reset()
			_ = json.NewEncoder(&buf).Encode(res)
		}
	})
}
