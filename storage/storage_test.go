package storage

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testlog"
)

// openStore opens a store that t's cleanup closes; reopen tests close it earlier
// with the returned function.
func openStore(t *testing.T, dir string) *Store {
	s, _ := openClosable(t, dir)
	return s
}

func openClosable(t *testing.T, dir string) (*Store, func()) {
	t.Helper()
	s, err := Open(dir, testlog.NewLevel(t, "", slog.LevelInfo))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	closeNow := func() {
		if closed {
			return
		}
		closed = true
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(closeNow)
	return s, closeNow
}

const ts idemkv.Timestamp = 1_800_000_000_000

func fullRecord() *idemkv.Record {
	return &idemkv.Record{Tenant: "acme", Key: "conv:9/ticket ü", Fingerprint: "sha256:ab", Tool: "create_ticket",
		Actor: "w1", Status: idemkv.StatusCommitted, Fence: 1 << 50, AttemptID: "att", Attempts: 1<<32 - 1,
		CreatedAt: ts, UpdatedAt: ts + 1, LeaseExpiresAt: ts + 2, ExpiresAt: ts + 3,
		Receipt: &idemkv.StoredReceipt{RemoteSystem: "linear", RemoteID: "LIN-1", RemoteURL: "https://x/1",
			Result: json.RawMessage(`{"a":[1,2]}`), CommittedAt: ts + 1},
		Error: &idemkv.ErrorInfo{Code: "c", Message: "m", Details: json.RawMessage(`null`)}}
}

func TestRecordEncodingRoundTrip(t *testing.T) {
	recs := []*idemkv.Record{
		fullRecord(),
		{Tenant: "t", Key: "k", Status: idemkv.StatusPending, ExpiresAt: 1},
		{Tenant: "t", Key: "k", Status: idemkv.StatusFailed, Fence: 3, ExpiresAt: ts, Error: &idemkv.ErrorInfo{Code: "x"}},
		{Tenant: "t", Key: "k", Status: idemkv.StatusAwaitingApproval, ExpiresAt: ts, Effect: json.RawMessage(`{"order":17}`),
			Approval: &idemkv.Approval{ID: "apr_9", State: idemkv.ApprovalWaiting, Summary: "Refund\n40 EUR", RequestedAt: ts - 5, ExpiresAt: ts, ByRule: true}},
		{Tenant: "t", Key: "k", Status: idemkv.StatusFailed, ExpiresAt: ts, Error: idemkv.DeniedError("ana", "no"),
			Approval: &idemkv.Approval{ID: "apr_9", State: idemkv.ApprovalDenied, RequestedAt: ts - 5, ExpiresAt: ts, Approver: "ana", Reason: "no", DecidedAt: ts - 1}},
	}
	for _, r := range recs {
		b, err := encodeRecord(nil, r)
		if err != nil {
			t.Fatal(err)
		}
		if b[0] != recordVersion {
			t.Errorf("first byte %d, want the format version", b[0])
		}
		got, err := decodeRecord(r.Tenant, r.Key, b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, r)
		}
		if at, err := storedExpiry(b); err != nil || at != r.ExpiresAt {
			t.Errorf("storedExpiry = %s, %v; want %s", at, err, r.ExpiresAt)
		}
		for i := range b {
			if _, err := decodeRecord(r.Tenant, r.Key, b[:i]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("truncated at %d/%d: err = %v, want corrupt", i, len(b), err)
			}
		}
		if _, err := decodeRecord(r.Tenant, r.Key, append(b, 0)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("trailing byte: err = %v, want corrupt", err)
		}
	}
	if _, err := encodeRecord(nil, &idemkv.Record{Status: "weird"}); err == nil {
		t.Error("encoded an unknown status")
	}
	if _, err := encodeRecord(nil, &idemkv.Record{Status: idemkv.StatusPending, Approval: &idemkv.Approval{State: "maybe"}}); err == nil {
		t.Error("encoded an unknown approval state")
	}
}

// TestRecordEncodingReadsOlderRecords: a record written before approvals existed (this
// is the encoding of a committed record made by 3c10450) decodes as it did, without
// approval or effect.
func TestRecordEncodingReadsOlderRecords(t *testing.T) {
	old := []byte("\x01\x00\x00\x01\xa3\x1d\x82\xac\x00\x02\a\x01\x80\xc0\xe2\x85\xe3h\x8a\xc0\xe2\x85\xe3h\x00\vsha256:aaaa" +
		"\x06refund\x01w\x05att-1\x01\x06linear\bLIN-1842\x00\x02{}\x8a\xc0\xe2\x85\xe3h")
	got, err := decodeRecord("t", "k", old)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != idemkv.StatusCommitted || got.Receipt == nil || got.Receipt.RemoteID != "LIN-1842" || got.Approval != nil || got.Effect != nil {
		t.Fatalf("old record decoded as %+v", got)
	}
}

func putAll(t *testing.T, s *Store, recs ...*idemkv.Record) {
	t.Helper()
	b := s.NewBatch()
	defer b.Close()
	for _, r := range recs {
		if err := b.PutRecord(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
}

func rec(tenant, key string, expires idemkv.Timestamp) *idemkv.Record {
	return &idemkv.Record{Tenant: tenant, Key: key, Status: idemkv.StatusPending, Fence: 1, ExpiresAt: expires}
}

func TestScanRecordsIsolatesTenants(t *testing.T) {
	s := openStore(t, t.TempDir())
	// "a" < "a." < "a.b" < "ab" byte-wise: without the separator "a" would leak into
	// its neighbours' ranges.
	putAll(t, s, rec("a", "x", ts), rec("a", "x/1", ts), rec("a", "y", ts), rec("a.", "x", ts),
		rec("a.b", "x", ts), rec("ab", "x", ts), rec("b", "a", ts))
	scan := func(tenant, prefix, after string) []string {
		var keys []string
		err := s.ScanRecords(tenant, prefix, after, func(r *idemkv.Record) (bool, error) {
			keys = append(keys, r.Tenant+"|"+r.Key)
			return true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	tests := []struct {
		tenant, prefix, after string
		want                  []string
	}{
		{"a", "", "", []string{"a|x", "a|x/1", "a|y"}},
		{"a", "x", "", []string{"a|x", "a|x/1"}},
		{"a", "", "x", []string{"a|x/1", "a|y"}},
		{"a", "x", "x/1", nil},
		{"a.", "", "", []string{"a.|x"}},
		{"ab", "", "", []string{"ab|x"}},
		{"c", "", "", nil},
	}
	for _, tc := range tests {
		if got := scan(tc.tenant, tc.prefix, tc.after); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("scan(%q, %q, %q) = %v, want %v", tc.tenant, tc.prefix, tc.after, got, tc.want)
		}
	}
	stopped := 0
	if err := s.ScanRecords("a", "", "", func(*idemkv.Record) (bool, error) { stopped++; return false, nil }); err != nil || stopped != 1 {
		t.Errorf("scan did not stop when asked: %d calls, %v", stopped, err)
	}
	boom := errors.New("boom")
	if err := s.ScanRecords("a", "", "", func(*idemkv.Record) (bool, error) { return true, boom }); !errors.Is(err, boom) {
		t.Errorf("callback error not returned: %v", err)
	}
}

func TestExpiryIndexFollowsRecords(t *testing.T) {
	s := openStore(t, t.TempDir())
	putAll(t, s, rec("t", "a", ts+30), rec("t", "b", ts+10), rec("u", "c", ts+20), rec("t", "d", ts+1000))
	if n, oldest, err := s.Overdue(ts+20, 100); err != nil || n != 2 || oldest != ts+10 {
		t.Fatalf("overdue = %d, %s, %v; want 2, %s", n, oldest, err, ts+10)
	}
	if n, _, _ := s.Overdue(ts+1000, 3); n != 3 {
		t.Errorf("overdue with limit 3 counted %d", n)
	}
	// Moving a record's expiry moves its entry, within and across batches.
	b := s.NewBatch()
	if err := b.PutRecord(rec("t", "b", ts+500)); err != nil {
		t.Fatal(err)
	}
	if err := b.PutRecord(rec("t", "b", ts+600)); err != nil {
		t.Fatal(err)
	}
	got, err := b.Expired(ts+600, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []ExpiryEntry{{ts + 20, "u", "c"}, {ts + 30, "t", "a"}, {ts + 600, "t", "b"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("batch view of expired: %v, want %v", got, want)
	}
	if ok, err := b.DeleteRecord("u", "c"); err != nil || !ok {
		t.Fatalf("delete: %v %v", ok, err)
	}
	if ok, err := b.DeleteRecord("u", "nope"); err != nil || ok {
		t.Fatalf("delete of absent record: %v %v", ok, err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
	if n, oldest, _ := s.Overdue(ts+600, 10); n != 2 || oldest != ts+30 {
		t.Errorf("overdue after moves = %d, %s", n, oldest)
	}
	if r, err := s.Record("u", "c"); err != nil || r != nil {
		t.Errorf("deleted record still there: %+v %v", r, err)
	}
	// A stray entry is what CheckExpiryIndex exists to catch.
	b = s.NewBatch()
	if err := b.b.Set(expiryKey(ts, "t", "zz"), nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckExpiryIndex(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("CheckExpiryIndex = %v, want corrupt", err)
	}
}

func TestBookkeepingSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	s, closeNow := openClosable(t, dir)
	b := s.NewBatch()
	for _, err := range []error{b.SetApplied(77, 3), b.SetClock(ts), b.PutNode(idemkv.NodeInfo{ID: "n2", RaftAddr: "r2", APIAddr: "a2"}),
		b.PutNode(idemkv.NodeInfo{ID: "n1", RaftAddr: "r1", APIAddr: "a1", Suffrage: "voter"}), b.PutRecord(fullRecord())} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	hash, err := s.Hash()
	if err != nil {
		t.Fatal(err)
	}
	closeNow()
	s = openStore(t, dir)
	if i, term, err := s.Applied(); err != nil || i != 77 || term != 3 {
		t.Errorf("applied = %d/%d %v", i, term, err)
	}
	if c, err := s.Clock(); err != nil || c != ts {
		t.Errorf("clock = %s %v", c, err)
	}
	nodes, err := s.Nodes()
	want := []idemkv.NodeInfo{{ID: "n1", RaftAddr: "r1", APIAddr: "a1"}, {ID: "n2", RaftAddr: "r2", APIAddr: "a2"}}
	if err != nil || !reflect.DeepEqual(nodes, want) {
		t.Errorf("nodes = %+v %v, want %+v (no suffrage stored)", nodes, err, want)
	}
	r, err := s.Record("acme", fullRecord().Key)
	if err != nil || !reflect.DeepEqual(r, fullRecord()) {
		t.Errorf("record after reopen = %+v %v", r, err)
	}
	if h2, err := s.Hash(); err != nil || h2 != hash {
		t.Errorf("hash changed across reopen (%v)", err)
	}
	// The hash covers records and nodes but not bookkeeping.
	b = s.NewBatch()
	if err := errors.Join(b.SetApplied(99, 4), b.SetClock(ts+5), b.Commit()); err != nil {
		t.Fatal(err)
	}
	if h3, _ := s.Hash(); h3 != hash {
		t.Error("hash depends on the applied index or clock")
	}
	b = s.NewBatch()
	if err := errors.Join(b.DeleteNode("n2"), b.Commit()); err != nil {
		t.Fatal(err)
	}
	if h4, _ := s.Hash(); h4 == hash {
		t.Error("hash ignores node metadata")
	}
}

func snapshotOf(t *testing.T, s *Store) []byte {
	t.Helper()
	snap := s.NewSnapshot()
	defer snap.Close()
	var buf bytes.Buffer
	n, err := snap.WriteTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Errorf("WriteTo reported %d bytes, wrote %d", n, buf.Len())
	}
	return buf.Bytes()
}

// recordsOf is snapshotOf in the version-1 format.
func recordsOf(t *testing.T, s *Store) []byte {
	t.Helper()
	snap := s.NewSnapshot()
	defer snap.Close()
	var buf bytes.Buffer
	n, err := snap.WriteRecordsTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Errorf("WriteRecordsTo reported %d bytes, wrote %d", n, buf.Len())
	}
	return buf.Bytes()
}

// TestCutRestoreLeavesStoreAsItWas: a stream cut anywhere, in either format, fails
// and leaves the store exactly as it was, with nothing beside it; the version-1 loader
// commits in small batches here, so a cut stream has written some before it fails.
func TestCutRestoreLeavesStoreAsItWas(t *testing.T) {
	src := openStore(t, t.TempDir())
	b := src.NewBatch()
	if err := b.SetApplied(500, 2); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if err := b.PutRecord(rec("t", fmt.Sprintf("k%03d", i), ts+idemkv.Timestamp(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	defer func(n int) { restoreBatchBytes = n }(restoreBatchBytes)
	restoreBatchBytes = 512
	for name, data := range map[string][]byte{"version 1": recordsOf(t, src), "version 2": snapshotOf(t, src)} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			dst := openStore(t, filepath.Join(dir, "pebble"))
			b := dst.NewBatch()
			if err := errors.Join(b.PutRecord(rec("t", "before", ts)), b.SetApplied(3, 1), b.Commit()); err != nil {
				t.Fatal(err)
			}
			before, _ := dst.Hash()
			for _, cut := range []int{len(data) / 4, len(data) / 2, len(data) - 5} {
				if err := dst.Restore(bytes.NewReader(data[:cut])); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("cut at %d: err = %v", cut, err)
				}
				if i, _, err := dst.Applied(); err != nil || i != 3 {
					t.Errorf("cut at %d: applied index %d (%v), want the store's own 3", cut, i, err)
				}
				if h, _ := dst.Hash(); h != before || dst.RecordCount() != 1 {
					t.Errorf("cut at %d: the store changed (%d records)", cut, dst.RecordCount())
				}
				assertOnlyStore(t, dir)
			}
			if err := dst.Restore(bytes.NewReader(data)); err != nil {
				t.Fatal(err)
			}
			if i, term, _ := dst.Applied(); i != 500 || term != 2 {
				t.Errorf("applied after full restore = %d/%d", i, term)
			}
			if err := dst.CheckExpiryIndex(); err != nil {
				t.Error(err)
			}
			h1, _ := src.Hash()
			h2, _ := dst.Hash()
			if h1 != h2 || dst.RecordCount() != 200 {
				t.Errorf("hash differs after restore, or %d records", dst.RecordCount())
			}
			if v1 := recordsOf(t, src); !bytes.Equal(recordsOf(t, dst), v1) {
				t.Error("the restored store holds other pairs than the one snapshotted")
			}
			assertOnlyStore(t, dir)
		})
	}
}

func TestRestoreRejectsOversizedFields(t *testing.T) {
	s := openStore(t, t.TempDir())
	stream := []byte(snapMagic + "\x01\x01")              // version 1, a pair
	stream = append(stream, 0xff, 0xff, 0xff, 0xff, 0x0f) // key length 4 GiB
	if err := s.Restore(bytes.NewReader(stream)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("err = %v, want corrupt", err)
	}
}
