package storage

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/idemkv/idemkv"
)

func put(t *testing.T, s *Store, recs ...*idemkv.Record) {
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

func inDoubtKeys(t *testing.T, s *Store, tenant string) []string {
	t.Helper()
	var keys []string
	if err := s.ScanInDoubt(tenant, "", "", func(r *idemkv.Record) (bool, error) {
		keys = append(keys, r.Key)
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestInDoubtIndex: the index names exactly the pending records marked in doubt,
// through marking, settling, deleting and a snapshot restore; its stats and scans
// read the index alone.
func TestInDoubtIndex(t *testing.T) {
	s := openStore(t, t.TempDir())
	pending := func(key string, since idemkv.Timestamp) *idemkv.Record {
		return &idemkv.Record{Tenant: "acme", Key: key, Fingerprint: "sha256:ab", Tool: "create_ticket",
			Status: idemkv.StatusPending, Fence: 7, Attempts: 2, CreatedAt: ts, UpdatedAt: ts, ExpiresAt: ts + 1000,
			InDoubt: since != 0, InDoubtSince: since}
	}
	put(t, s, pending("a", ts+5), pending("b", 0), pending("c", ts+2), pending("d", ts+9))
	// The flag survives the encoding.
	if got, err := s.Record("acme", "c"); err != nil || !reflect.DeepEqual(got, pending("c", ts+2)) {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	if n, oldest, err := s.InDoubtStats(); err != nil || n != 3 || oldest != ts+2 {
		t.Fatalf("stats %d %s %v, want 3 since %s", n, oldest, err, ts+2)
	}
	if got := inDoubtKeys(t, s, "acme"); !reflect.DeepEqual(got, []string{"a", "c", "d"}) {
		t.Fatalf("scan %v", got)
	}
	if got := inDoubtKeys(t, s, "other"); got != nil {
		t.Fatalf("another tenant's scan %v", got)
	}
	// Settle c (committed), delete d, mark b: the index follows.
	c := pending("c", 0)
	c.Status, c.Receipt = idemkv.StatusCommitted, &idemkv.StoredReceipt{RemoteSystem: "l", RemoteID: "1"}
	b := s.NewBatch()
	if err := b.PutRecord(c); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DeleteRecord("acme", "d"); err != nil {
		t.Fatal(err)
	}
	if err := b.PutRecord(pending("b", ts+7)); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if got := inDoubtKeys(t, s, "acme"); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Fatalf("scan after settling %v", got)
	}
	if n, oldest, _ := s.InDoubtStats(); n != 2 || oldest != ts+5 {
		t.Fatalf("stats %d %s", n, oldest)
	}
	if err := s.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
	// A follower restoring a snapshot gets the index with the records.
	var buf bytes.Buffer
	snap := s.NewSnapshot()
	if _, err := snap.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	snap.Close()
	dst := openStore(t, t.TempDir())
	if err := dst.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	if got := inDoubtKeys(t, dst, "acme"); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Fatalf("restored scan %v", got)
	}
	if err := dst.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
}
