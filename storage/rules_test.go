package storage

import (
	"bytes"
	"testing"

	"github.com/idemkv/idemkv"
)

// The in-memory approval rules are the committed ones: a rule put or deleted in a
// batch is seen by that batch at once and by the store once committed (not before, nor
// after a batch closed without committing), survives a reopen, and a restore replaces
// them with the snapshot's.
func TestApprovalRuleCacheFollowsCommits(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	want := func(st *Store, tool string, ttl int64) {
		t.Helper()
		r, ok, err := st.ApprovalRule("acme", tool)
		if err != nil {
			t.Fatal(err)
		}
		if ttl == 0 && ok {
			t.Errorf("%s: rule %+v, want none", tool, r)
		}
		if ttl != 0 && (!ok || r.TTLMs != ttl) {
			t.Errorf("%s: rule %+v (found %v), want TTL %d", tool, r, ok, ttl)
		}
	}
	want(s, "refund", 0) // loads the (empty) cache
	b := s.NewBatch()
	if err := b.PutApprovalRule(idemkv.ApprovalRule{Tenant: "acme", Tool: "refund", TTLMs: 60_000}); err != nil {
		t.Fatal(err)
	}
	if r, ok, err := b.ApprovalRule("acme", "refund"); err != nil || !ok || r.TTLMs != 60_000 {
		t.Fatalf("the batch does not see its own rule: %+v %v %v", r, ok, err)
	}
	want(s, "refund", 0)
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	want(s, "refund", 60_000)

	b = s.NewBatch()
	if err := b.DeleteApprovalRule("acme", "refund"); err != nil {
		t.Fatal(err)
	}
	if err := b.PutApprovalRule(idemkv.ApprovalRule{Tenant: "acme", Tool: "wire", TTLMs: 5_000}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := b.ApprovalRule("acme", "refund"); ok {
		t.Errorf("the batch sees the rule it deleted")
	}
	b.Close() // never committed
	want(s, "refund", 60_000)
	want(s, "wire", 0)

	b = s.NewBatch()
	if err := b.PutApprovalRule(idemkv.ApprovalRule{Tenant: "acme", Tool: "wire", TTLMs: 5_000}); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	var snap bytes.Buffer
	sn := s.NewSnapshot()
	if _, err := sn.WriteTo(&snap); err != nil {
		t.Fatal(err)
	}
	sn.Close()
	b = s.NewBatch()
	if err := b.DeleteApprovalRule("acme", "refund"); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	want(s, "refund", 0)
	want(s, "wire", 5_000)

	// The snapshot holds both rules: a restore brings the deleted one back.
	if err := s.Restore(&snap); err != nil {
		t.Fatal(err)
	}
	want(s, "refund", 60_000)
	want(s, "wire", 5_000)

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t, dir)
	want(s2, "refund", 60_000)
	want(s2, "wire", 5_000)
}
