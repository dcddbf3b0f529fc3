package storage

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
)

// TestHoldsNewerThanApprovals: what the release before history could not decode is
// found (a record with a history, one with masked paths, a rule with options), and
// nothing else is taken for it.
func TestHoldsNewerThanApprovals(t *testing.T) {
	no := false
	rows := []struct {
		name string
		put  func(b *Batch) error
		want string
	}{
		{"plain record", func(b *Batch) error { return b.PutRecord(rec("t0", "k", ts)) }, ""},
		{"record with an approval and its effect", func(b *Batch) error {
			r := rec("t0", "k", ts)
			r.Approval = &idemkv.Approval{ID: "apr_1", State: idemkv.ApprovalWaiting}
			r.Effect = json.RawMessage(`{"a":1}`)
			return b.PutRecord(r)
		}, ""},
		{"rule without options", func(b *Batch) error {
			return b.PutApprovalRule(idemkv.ApprovalRule{Tenant: "t0", Tool: "x", TTLMs: 1000})
		}, ""},
		{"record with a history", func(b *Batch) error {
			r := rec("t0", "k", ts)
			r.History = []idemkv.HistoryEvent{{At: 1, Event: idemkv.EventExecute}}
			return b.PutRecord(r)
		}, "with a history"},
		{"record with masked paths", func(b *Batch) error {
			r := rec("t0", "k", ts)
			r.Effect, r.EffectMask = json.RawMessage(`{"a":"***"}`), []string{"/a"}
			return b.PutRecord(r)
		}, "masked effect"},
		{"tombstone", func(b *Batch) error {
			return b.PutTombstone(&idemkv.Tombstone{Tenant: "t0", Key: "k", ExpiresAt: ts,
				History: []idemkv.HistoryEvent{{At: 1, Event: idemkv.EventRelease}}})
		}, "tombstone"},
		{"rule with options", func(b *Batch) error {
			return b.PutApprovalRule(idemkv.ApprovalRule{Tenant: "t0", Tool: "x", RequireApproval: &no, StoreEffect: true})
		}, "with options"},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			st := openStore(t, t.TempDir())
			b := st.NewBatch()
			if err := r.put(b); err != nil {
				t.Fatal(err)
			}
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
			got, err := st.HoldsNewerThanApprovals()
			if err != nil || (r.want == "") != (got == "") || !strings.Contains(got, r.want) {
				t.Errorf("HoldsNewerThanApprovals = %q, %v; want %q", got, err, r.want)
			}
		})
	}
}
