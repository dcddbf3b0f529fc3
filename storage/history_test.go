package storage

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"testing"

	"github.com/idemkv/idemkv"
)

// Records as the binary before histories (commit 8ddf4d1) encoded them: a committed
// record with its receipt, approval and effect, and a pending one in doubt.
const (
	goldenBeforeHistory        = "01000001a31d82ac00022a0280c0e285e368e8c7e285e368000b7368613235363a6161616106726566756e6408776f726b65722d31056174742d3119067374726970650472655f31000b7b226f6b223a747275657de8c7e285e368066170725f343002000d526566756e642034302045555280c0e285e36880fa9989e36803616e61026f6bc8c1e285e368187b22616d6f756e74223a34302c226f72646572223a31377d"
	goldenInDoubtBeforeHistory = "01000001a31d82ac0001070180c0e285e36880c0e285e368e094e685e3680b7368613235363a626262620d6372656174655f7469636b657400056174742d390480b1e785e368"
)

// TestDecodeRecordWrittenBeforeHistory: a record stored by the previous binary decodes
// with no history, and encodes back to the same bytes, so that a node upgraded in
// place hashes its unchanged records as before.
func TestDecodeRecordWrittenBeforeHistory(t *testing.T) {
	for _, tc := range []struct {
		hex  string
		want *idemkv.Record
	}{
		{goldenBeforeHistory, &idemkv.Record{Tenant: "acme", Key: "k1", Fingerprint: "sha256:aaaa", Tool: "refund", Actor: "worker-1",
			Status: idemkv.StatusCommitted, Fence: 42, AttemptID: "att-1", Attempts: 2, CreatedAt: 1800000000000, UpdatedAt: 1800000000500,
			ExpiresAt: 1800086400000,
			Receipt:   &idemkv.StoredReceipt{RemoteSystem: "stripe", RemoteID: "re_1", Result: json.RawMessage(`{"ok":true}`), CommittedAt: 1800000000500},
			Approval: &idemkv.Approval{ID: "apr_40", State: idemkv.ApprovalApproved, Summary: "Refund 40 EUR", RequestedAt: 1800000000000,
				ExpiresAt: 1800003600000, Approver: "ana", Reason: "ok", DecidedAt: 1800000000100},
			Effect: json.RawMessage(`{"amount":40,"order":17}`)}},
		{goldenInDoubtBeforeHistory, &idemkv.Record{Tenant: "acme", Key: "k1", Status: idemkv.StatusPending, Fence: 7, AttemptID: "att-9",
			Attempts: 1, CreatedAt: 1800000000000, UpdatedAt: 1800000000000, LeaseExpiresAt: 1800000030000, ExpiresAt: 1800086400000,
			Fingerprint: "sha256:bbbb", Tool: "create_ticket", InDoubt: true, InDoubtSince: 1800000040000}},
	} {
		v, _ := hex.DecodeString(tc.hex)
		got, err := decodeRecord("acme", "k1", v)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Fatalf("decoded\n %+v\nwant\n %+v", got, tc.want)
		}
		again, err := encodeRecord(nil, got)
		if err != nil || !bytes.Equal(again, v) {
			t.Fatalf("re-encoded %x (%v), stored %x", again, err, v)
		}
	}
}

// TestRestoreSnapshotWrittenBeforeHistory restores a snapshot the previous binary
// wrote (a committed record and an approval rule of version 1) and reads both.
func TestRestoreSnapshotWrittenBeforeHistory(t *testing.T) {
	snap, err := os.ReadFile("testdata/snapshot-before-history.bin")
	if err != nil {
		t.Fatal(err)
	}
	s := openStore(t, t.TempDir())
	if err := s.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Record("acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != idemkv.StatusCommitted || rec.Receipt == nil || rec.Receipt.RemoteID != "re_1" || rec.History != nil || rec.HistoryDropped != 0 {
		t.Fatalf("restored record %+v", rec)
	}
	rule, ok, err := s.ApprovalRule("acme", "refund")
	if err != nil || !ok || !rule.RequiresApproval() || rule.StoreEffect || rule.Mask != nil || rule.TTLMs != 3600000 {
		t.Fatalf("restored rule %+v %v %v", rule, ok, err)
	}
	// The restored record takes a history like any other.
	rec.AddEvent(idemkv.HistoryEvent{At: 1800000000600, Event: idemkv.EventCommit, Fence: 42})
	b := s.NewBatch()
	defer b.Close()
	if err := b.PutRecord(rec); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Record("acme", "k1"); len(got.History) != 1 {
		t.Fatalf("history after restore: %+v", got.History)
	}
}

// fullHistory is the history of a record that recovered often enough to fill it.
func fullHistory(rec *idemkv.Record) {
	at := rec.CreatedAt
	for i := range idemkv.MaxHistory + 3 {
		at += 30_000
		rec.AddEvent(idemkv.HistoryEvent{At: at, Event: idemkv.EventRecover, Fence: rec.Fence + uint64(i), AttemptID: "att_01JDQ8Z3K4M5N6P7Q8R9S0T1V2",
			Actor: "worker-7", Detail: fmt.Sprintf("replaced fence %d", rec.Fence+uint64(i)-1)})
	}
}

func TestRecordHistoryRoundTrip(t *testing.T) {
	rec := typicalRecord()
	fullHistory(rec)
	rec.Effect = json.RawMessage(`{"card":"***","amount":40}`)
	rec.EffectMask = []string{"/card", "/items/*/token"}
	v, err := encodeRecord(nil, rec)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeRecord(rec.Tenant, rec.Key, v)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rec) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, rec)
	}
	// Every truncation of the bytes is refused, never misread.
	for n := 9; n < len(v); n++ {
		if _, err := decodeRecord(rec.Tenant, rec.Key, v[:n]); err == nil {
			t.Fatalf("a record cut at %d of %d bytes decoded", n, len(v))
		}
	}
	bad := rec.Clone()
	bad.History = append(bad.History[:1:1], idemkv.HistoryEvent{Event: "unheard_of"})
	if _, err := encodeRecord(nil, bad); err == nil {
		t.Fatal("an unknown event kind was stored")
	}
}

// typicalRecord is a committed record as agents leave them: a sha256 fingerprint, a
// generated attempt id, a receipt with a small result.
func typicalRecord() *idemkv.Record {
	return &idemkv.Record{Tenant: "acme-prod", Key: "conversation_9:approval_17:create_ticket",
		Fingerprint: "sha256:7f4c4a0e5b1c7d4e9a3f2b8c6d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e", Tool: "create_ticket", Actor: "worker-7",
		Status: idemkv.StatusCommitted, Fence: 1_234_567, AttemptID: "att_01JDQ8Z3K4M5N6P7Q8R9S0T1V2", Attempts: 1,
		CreatedAt: 1_800_000_000_000, UpdatedAt: 1_800_000_000_850, ExpiresAt: 1_800_086_400_000,
		Receipt: &idemkv.StoredReceipt{RemoteSystem: "linear", RemoteID: "LIN-1842", RemoteURL: "https://linear.example/issue/LIN-1842",
			Result: json.RawMessage(`{"id":"LIN-1842","state":"open"}`), CommittedAt: 1_800_000_000_850}}
}

// TestHistoryCost measures what the history adds to a stored record (docs/operations.md
// quotes it): none, the usual two events (execute, commit), and a full history. The
// bounds keep a full history under the recent-record cache's value limit, so that the
// records in flight stay cached.
func TestHistoryCost(t *testing.T) {
	size := func(r *idemkv.Record) int {
		v, err := encodeRecord(nil, r)
		if err != nil {
			t.Fatal(err)
		}
		return len(v)
	}
	bare := typicalRecord()
	usual := typicalRecord()
	usual.AddEvent(idemkv.HistoryEvent{At: usual.CreatedAt, Event: idemkv.EventExecute, Fence: usual.Fence, AttemptID: usual.AttemptID, Actor: usual.Actor})
	usual.AddEvent(idemkv.HistoryEvent{At: usual.UpdatedAt, Event: idemkv.EventCommit, Fence: usual.Fence, AttemptID: usual.AttemptID, Actor: usual.Actor, Detail: "linear LIN-1842"})
	full := typicalRecord()
	fullHistory(full)
	b, u, f := size(bare), size(usual), size(full)
	t.Logf("stored record: %d bytes without history, %d with execute+commit (+%d), %d with %d events (+%d, %d per event)",
		b, u, u-b, f, idemkv.MaxHistory, f-b, (f-b)/idemkv.MaxHistory)
	if u-b > 120 || f > recentMaxValue/2 {
		t.Fatalf("history costs %d bytes for two events, %d in all when full", u-b, f)
	}
}

// BenchmarkRecordCodecHistory: the CPU a history adds to each write (encode) and read
// (decode) of a record by the state machine, with none, the usual two events, and 16.
func BenchmarkRecordCodecHistory(b *testing.B) {
	usual := typicalRecord()
	usual.AddEvent(idemkv.HistoryEvent{At: usual.CreatedAt, Event: idemkv.EventExecute, Fence: usual.Fence, AttemptID: usual.AttemptID, Actor: usual.Actor})
	usual.AddEvent(idemkv.HistoryEvent{At: usual.UpdatedAt, Event: idemkv.EventCommit, Fence: usual.Fence, AttemptID: usual.AttemptID, Actor: usual.Actor, Detail: "linear LIN-1842"})
	full := typicalRecord()
	fullHistory(full)
	for _, bc := range []struct {
		name string
		rec  *idemkv.Record
	}{{"none", typicalRecord()}, {"two", usual}, {"full", full}} {
		b.Run(bc.name, func(b *testing.B) {
			buf := make([]byte, 0, 4096)
			b.ReportAllocs()
			for b.Loop() {
				v, err := encodeRecord(buf[:0], bc.rec)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := decodeRecord(bc.rec.Tenant, bc.rec.Key, v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestRecordWithoutHistoryChecksAsMuchAsWithIt: a record decoded without its history
// is the record decoded whole, history left out, and the same bytes are corrupt either
// way: every truncation, and every byte of the record replaced by each of a few values.
func TestRecordWithoutHistoryChecksAsMuchAsWithIt(t *testing.T) {
	rec := typicalRecord()
	fullHistory(rec)
	rec.Effect = json.RawMessage(`{"card":"***","amount":40}`)
	rec.EffectMask = []string{"/card"}
	v, err := encodeRecord(nil, rec)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeRecordKeeping(rec.Tenant, rec.Key, v, false)
	if err != nil {
		t.Fatal(err)
	}
	if got.History != nil || got.HistoryDropped != 0 || !reflect.DeepEqual(got, rec.WithoutHistory()) {
		t.Fatalf("without history:\n got %+v\nwant %+v", got, rec.WithoutHistory())
	}
	same := func(b []byte, what string) {
		t.Helper()
		whole, werr := decodeRecordKeeping(rec.Tenant, rec.Key, b, true)
		brief, berr := decodeRecordKeeping(rec.Tenant, rec.Key, b, false)
		if (werr == nil) != (berr == nil) {
			t.Fatalf("%s: decoded whole: %v; without history: %v", what, werr, berr)
		}
		if werr == nil && !reflect.DeepEqual(brief, whole.WithoutHistory()) {
			t.Fatalf("%s: without history %+v, whole %+v", what, brief, whole)
		}
	}
	for n := 9; n < len(v); n++ {
		same(v[:n], fmt.Sprintf("cut at %d of %d bytes", n, len(v)))
	}
	b := make([]byte, len(v))
	for i := 9; i < len(v); i++ {
		for _, x := range []byte{0x00, 0x01, 0x7f, 0x80, 0xff, v[i] + 1} {
			copy(b, v)
			b[i] = x
			same(b, fmt.Sprintf("byte %d set to %#x", i, x))
		}
	}
}

// TestRecordWithoutHistoryBuildsNoEvents: the store's RecordWithoutHistory leaves the
// events unbuilt (each event is three strings and the slice holds them all), and
// Record still reads them.
func TestRecordWithoutHistoryBuildsNoEvents(t *testing.T) {
	s := openStore(t, t.TempDir())
	rec := typicalRecord()
	fullHistory(rec)
	bt := s.NewBatch()
	if err := bt.PutRecord(rec); err != nil {
		t.Fatal(err)
	}
	if err := bt.Commit(); err != nil {
		t.Fatal(err)
	}
	whole, err := s.Record(rec.Tenant, rec.Key)
	if err != nil || !reflect.DeepEqual(whole, rec) {
		t.Fatalf("Record: %+v, %v", whole, err)
	}
	brief, err := s.RecordWithoutHistory(rec.Tenant, rec.Key)
	if err != nil || !reflect.DeepEqual(brief, rec.WithoutHistory()) {
		t.Fatalf("RecordWithoutHistory: %+v, %v", brief, err)
	}
	withAllocs := testing.AllocsPerRun(100, func() { _, _ = s.Record(rec.Tenant, rec.Key) })
	withoutAllocs := testing.AllocsPerRun(100, func() { _, _ = s.RecordWithoutHistory(rec.Tenant, rec.Key) })
	if withoutAllocs > withAllocs-float64(len(rec.History)) {
		t.Errorf("RecordWithoutHistory made %.0f allocations, Record %.0f, for %d events", withoutAllocs, withAllocs, len(rec.History))
	}
}

// BenchmarkDecodeRecordWithoutHistory: a replay's decoding of the record it answers
// from (two events, as an executed and committed record holds), whole and without its
// history.
func BenchmarkDecodeRecordWithoutHistory(b *testing.B) {
	rec := typicalRecord()
	rec.AddEvent(idemkv.HistoryEvent{At: rec.CreatedAt, Event: idemkv.EventExecute, Fence: rec.Fence, AttemptID: rec.AttemptID, Actor: rec.Actor})
	rec.AddEvent(idemkv.HistoryEvent{At: rec.UpdatedAt, Event: idemkv.EventCommit, Fence: rec.Fence, AttemptID: rec.AttemptID, Actor: rec.Actor, Detail: "linear LIN-1842"})
	v, err := encodeRecord(nil, rec)
	if err != nil {
		b.Fatal(err)
	}
	for _, history := range []bool{true, false} {
		b.Run(map[bool]string{true: "whole", false: "without-history"}[history], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := decodeRecordKeeping(rec.Tenant, rec.Key, v, history); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
