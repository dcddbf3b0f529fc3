package storage

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
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

// TestOldestInDoubt: the in-doubt records of every tenant come oldest first (ties by
// tenant, then key), and paging from each page's last position walks every one of them
// exactly once, whatever the page size, past entries settled between pages too.
func TestOldestInDoubt(t *testing.T) {
	s := openStore(t, t.TempDir())
	rng := rand.New(rand.NewPCG(1, 2))
	var want []idemkv.DoubtPosition
	var recs []*idemkv.Record
	for i := range 60 {
		tenant := []string{"acme", "beta", "a", "zeta"}[rng.IntN(4)]
		key := fmt.Sprintf("k%02d", rng.IntN(100))
		since := ts + idemkv.Timestamp(rng.IntN(20)) // many ties
		rec := &idemkv.Record{Tenant: tenant, Key: key, Fingerprint: "sha256:ab", Tool: "create_ticket",
			Status: idemkv.StatusPending, Fence: 1, Attempts: 2, CreatedAt: ts, UpdatedAt: ts, ExpiresAt: ts + 1000,
			InDoubt: i%5 != 0, InDoubtSince: since}
		if !rec.InDoubt {
			rec.InDoubtSince = 0
		}
		recs = append(recs, rec)
	}
	put(t, s, recs...)
	// Later puts of a key replace earlier ones: what is stored decides what is wanted.
	for _, tenant := range []string{"a", "acme", "beta", "zeta"} {
		if err := s.ScanRecords(tenant, "", "", func(r *idemkv.Record) (bool, error) {
			if r.InDoubt {
				want = append(want, idemkv.DoubtPositionOf(r))
			}
			return true, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	slices.SortFunc(want, idemkv.DoubtPosition.Compare)
	if len(want) < 20 {
		t.Fatalf("only %d records in doubt", len(want))
	}

	walk := func(limit int) []idemkv.DoubtPosition {
		t.Helper()
		var got []idemkv.DoubtPosition
		var after *idemkv.DoubtPosition
		for pages := 0; ; pages++ {
			page, more, err := s.OldestInDoubt(after, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) > limit || (more && len(page) != limit) {
				t.Fatalf("limit %d: a page of %d, more %v", limit, len(page), more)
			}
			for _, r := range page {
				if !r.InDoubt || r.Tool != "create_ticket" {
					t.Fatalf("listed %+v", r)
				}
				got = append(got, idemkv.DoubtPositionOf(r))
			}
			if !more {
				return got
			}
			if pages > len(want) {
				t.Fatalf("limit %d: no end after %d pages", limit, pages)
			}
			last := idemkv.DoubtPositionOf(page[len(page)-1])
			after = &last
		}
	}
	for _, limit := range []int{1, 2, 7, len(want) - 1, len(want), len(want) + 1, 1000} {
		if got := walk(limit); !slices.Equal(got, want) {
			t.Fatalf("limit %d: walked\n%v\nwant\n%v", limit, got, want)
		}
	}

	// A page resumes after its cursor even when the record there was settled since.
	first, _, err := s.OldestInDoubt(nil, 3)
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	if _, err := b.DeleteRecord(first[2].Tenant, first[2].Key); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	b.Close()
	after := idemkv.DoubtPositionOf(first[2])
	next, _, err := s.OldestInDoubt(&after, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := []idemkv.DoubtPosition{idemkv.DoubtPositionOf(next[0]), idemkv.DoubtPositionOf(next[1])}; !slices.Equal(got, want[3:5]) {
		t.Fatalf("after a settled cursor: %v, want %v", got, want[3:5])
	}
	if _, _, err := s.OldestInDoubt(nil, 0); err == nil {
		t.Fatal("a page of 0 records")
	}
}

// TestScanInDoubtIsOneView: a listing of a tenant's in-doubt records reads the index
// and the records at one point. A resolve applied during the scan (here: in the
// callback, between two records) used to leave it an index entry whose record was
// gone, which it reported as corruption, or a committed record listed as in doubt.
func TestScanInDoubtIsOneView(t *testing.T) {
	s := openStore(t, t.TempDir())
	rec := func(key string, status idemkv.Status) *idemkv.Record {
		r := &idemkv.Record{Tenant: "acme", Key: key, Fingerprint: "sha256:ab", Tool: "create_ticket",
			Status: status, Fence: 1, Attempts: 1, CreatedAt: ts, UpdatedAt: ts, ExpiresAt: ts + 1000}
		if status == idemkv.StatusPending {
			r.InDoubt, r.InDoubtSince = true, ts+1
		} else {
			r.Receipt = &idemkv.StoredReceipt{RemoteSystem: "linear", RemoteID: "LIN-1"}
		}
		return r
	}
	put(t, s, rec("a", idemkv.StatusPending), rec("b", idemkv.StatusPending), rec("c", idemkv.StatusPending))
	var seen []string
	err := s.ScanInDoubt("acme", "", "", func(r *idemkv.Record) (bool, error) {
		if !r.InDoubt || r.Status != idemkv.StatusPending {
			t.Errorf("listed %+v", r)
		}
		seen = append(seen, r.Key)
		if r.Key == "a" {
			// Released and committed while the scan is between a and b.
			b := s.NewBatch()
			defer b.Close()
			if _, err := b.DeleteRecord("acme", "b"); err != nil {
				return false, err
			}
			if err := b.PutRecord(rec("c", idemkv.StatusCommitted)); err != nil {
				return false, err
			}
			if err := b.Commit(); err != nil {
				return false, err
			}
		}
		return true, nil
	})
	if err != nil || !slices.Equal(seen, []string{"a", "b", "c"}) {
		t.Fatalf("scan saw %v, %v; want the three records as they were when it began", seen, err)
	}
	if got := inDoubtKeys(t, s, "acme"); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("the next scan: %v", got)
	}
}
