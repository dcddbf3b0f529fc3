package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/node"
	"github.com/idemkv/idemkv/storage"
)

func TestSeedRestoresAsCommittedBenchRecords(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "seed.backup")
	const n = 1000
	o := seedOptions{records: n, out: out, tenant: "bench", batch: 300, ttl: 30 * 24 * time.Hour}
	before := idemkv.TimestampOf(time.Now())
	info, err := seed(context.Background(), o, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	if info.Records != n || info.Index != 2*n || info.Term != 1 {
		t.Errorf("seed info %+v, want %d records at index %d, term 1", info, n, 2*n)
	}

	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dataDir := filepath.Join(dir, "n1")
	cfg := node.DefaultConfig()
	cfg.ID, cfg.DataDir = "n1", dataDir
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	restored, err := node.Restore(cfg, f)
	if err != nil {
		t.Fatal(err)
	}
	if restored.Records != n || restored.Index != 2*n || restored.Term != 1 {
		t.Errorf("restored %+v, want %d records at index %d, term 1", restored, n, 2*n)
	}

	st, err := storage.Open(filepath.Join(dataDir, "pebble"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.CheckExpiryIndex(); err != nil {
		t.Error(err)
	}
	overdue, _, err := st.Overdue(before+idemkv.Timestamp(29*24*time.Hour/time.Millisecond), n)
	if err != nil || overdue != 0 {
		t.Errorf("%d records expire within 29 days (err %v); none may expire during a run", overdue, err)
	}

	// The last record, field by field, as `idemkv bench` would have left it.
	runIDs := seedRunIDs(n)
	key := seedKey(runIDs, n-1)
	got, err := st.Record("bench", key)
	if err != nil || got == nil {
		t.Fatalf("record %q: %v, %v", key, got, err)
	}
	if got.CreatedAt < before || got.CreatedAt > idemkv.TimestampOf(time.Now()) {
		t.Errorf("created at %s, want during the seeding", got.CreatedAt)
	}
	want := &idemkv.Record{Tenant: "bench", Key: key, Fingerprint: benchFingerprint(key), Tool: "create_ticket",
		Actor: "bench", Status: idemkv.StatusCommitted, Fence: 2*n - 1, AttemptID: key + "/1", Attempts: 1,
		CreatedAt: got.CreatedAt, UpdatedAt: got.CreatedAt + 2, ExpiresAt: got.CreatedAt + idemkv.Timestamp(30*24*time.Hour/time.Millisecond),
		Receipt: &idemkv.StoredReceipt{RemoteSystem: "bench", RemoteID: "R-1999", CommittedAt: got.CreatedAt + 2}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("record\n got %+v %+v\nwant %+v %+v", got, got.Receipt, want, want.Receipt)
	}
	clock, err := st.Clock()
	if err != nil || clock != got.UpdatedAt {
		t.Errorf("clock %s (%v), want the last commit's %s", clock, err, got.UpdatedAt)
	}

	// Every fence distinct and below the applied index; no key loadgen could generate.
	loadgenKey := regexp.MustCompile(`^[0-9a-f]{8}/(new/[0-9]+/[0-9]+|seed/[0-9]+|hot/[0-9]+)$`)
	shape := regexp.MustCompile(`^[0-9a-f]{8}/new/s[0-9]+/[0-9]+$`)
	fences := map[uint64]bool{}
	err = st.ScanRecords("bench", "", "", func(r *idemkv.Record) (bool, error) {
		if fences[r.Fence] || r.Fence == 0 || r.Fence >= restored.Index {
			t.Errorf("record %q: fence %d repeated or not below the applied index %d", r.Key, r.Fence, restored.Index)
		}
		fences[r.Fence] = true
		if loadgenKey.MatchString(r.Key) || !shape.MatchString(r.Key) {
			t.Errorf("key %q: not a seeded key, or one loadgen could generate", r.Key)
		}
		return true, nil
	})
	if err != nil || len(fences) != n {
		t.Errorf("scanned %d records (%v), want %d", len(fences), err, n)
	}
}

func TestSeedRefusesAnExistingFile(t *testing.T) {
	out := filepath.Join(t.TempDir(), "seed.backup")
	if err := os.WriteFile(out, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := seed(context.Background(), seedOptions{records: 10, out: out, tenant: "bench", batch: 10, ttl: time.Hour}, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("seed over an existing file: %v", err)
	}
	if b, _ := os.ReadFile(out); string(b) != "keep me" {
		t.Errorf("existing file now holds %q", b)
	}
	entries, _ := os.ReadDir(filepath.Dir(out))
	if len(entries) != 1 {
		t.Errorf("left behind %v", entries)
	}
}

func TestSeedRunIDsSpreadAndRepeat(t *testing.T) {
	ids := seedRunIDs(10_000_000)
	if len(ids) != 100 {
		t.Fatalf("%d run IDs for 10 million records, want 100", len(ids))
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] || len(id) != 8 {
			t.Errorf("run ID %q repeated or not 8 hex digits", id)
		}
		seen[id] = true
	}
	if again := seedRunIDs(150_000); !reflect.DeepEqual(again, ids[:2]) {
		t.Errorf("run IDs %v for 150,000 records, want the first two of %v", again, ids[:2])
	}
	if k := seedKey(ids, 100_017); k != ids[1]+"/new/s1/2" {
		t.Errorf("key of record 100017: %q", k)
	}
}

func TestParseSeedFlags(t *testing.T) {
	o, err := parseSeedFlags([]string{"--records", "10000", "--out", "x.backup"})
	if err != nil || o.records != 10000 || o.out != "x.backup" || o.ttl != 30*24*time.Hour || o.batch != 10_000 {
		t.Errorf("parseSeedFlags: %+v, %v", o, err)
	}
	for _, args := range [][]string{
		{"--out", "x"},
		{"--records", "10"},
		{"--records", "0", "--out", "x"},
		{"--records", "10", "--out", "x", "--ttl", "800h"},
	} {
		if _, err := parseSeedFlags(args); err == nil {
			t.Errorf("parseSeedFlags(%q) accepted", args)
		}
	}
}

// testWriter sends log lines to t.Log, so they show only when a test fails.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
