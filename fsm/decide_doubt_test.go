package fsm

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/idemkv/idemkv"
)

// inDoubtRec is pendingRec after its holder (fence 7) marked it in doubt at t0+100.
func inDoubtRec() *idemkv.Record {
	return pendingRec(func(r *idemkv.Record) {
		r.InDoubt = true
		r.InDoubtSince = t0 + 100
		r.UpdatedAt = t0 + 100
		r.LeaseExpiresAt = 0
	})
}

func TestDecideDoubt(t *testing.T) {
	req := func(fence uint64, fp string) *idemkv.DoubtRequest {
		return &idemkv.DoubtRequest{Tenant: tenant, Key: key, Fingerprint: fp, Fence: fence}
	}
	tests := []struct {
		name string
		cur  *idemkv.Record
		req  *idemkv.DoubtRequest
		now  idemkv.Timestamp
		next *idemkv.Record // nil: no change
		rec  *idemkv.Record // the answer
		err  error
	}{
		{name: "pending, current fence: marked, lease dropped", cur: pendingRec(), req: req(7, fpA), now: t0 + 100,
			next: inDoubtRec(), rec: inDoubtRec()},
		{name: "pending, current fence, lease expired: marked", cur: pendingRec(), req: req(7, fpA), now: t0 + 100,
			next: inDoubtRec(), rec: inDoubtRec()},
		{name: "already in doubt: unchanged, the first in_doubt_since stays", cur: inDoubtRec(), req: req(7, fpA), now: t0 + 900,
			rec: inDoubtRec()},
		{name: "stale fence: fenced", cur: pendingRec(), req: req(6, fpA), now: t0 + 1, err: idemkv.ErrFenced},
		{name: "fence never granted: fenced", cur: pendingRec(), req: req(8, fpA), now: t0 + 1, err: idemkv.ErrFenced},
		{name: "wrong fingerprint", cur: pendingRec(), req: req(7, fpB), now: t0 + 1, err: idemkv.ErrFingerprintMismatch},
		{name: "absent", req: req(7, fpA), now: t0 + 1, err: idemkv.ErrNotFound},
		{name: "expired", cur: pendingRec(), req: req(7, fpA), now: t0 + ttl, err: idemkv.ErrNotFound},
		{name: "committed: not pending", cur: committedRec(), req: req(7, fpA), now: t0 + 1, err: idemkv.ErrNotPending},
		{name: "failed: not pending", cur: failedRec(), req: req(7, fpA), now: t0 + 1, err: idemkv.ErrNotPending},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			next, rec, err := DecideDoubt(tc.cur, tc.req, tc.now)
			checkErr(t, err, tc.err)
			if tc.next != nil {
				next = withoutEvent(t, "next", next, tc.cur.History, idemkv.HistoryEvent{At: tc.now, Event: idemkv.EventDoubt,
					Fence: tc.cur.Fence, AttemptID: tc.cur.AttemptID, Actor: tc.cur.Actor})
				rec = rec.WithoutHistory()
			}
			if !reflect.DeepEqual(next, tc.next) || !reflect.DeepEqual(rec, tc.rec) {
				t.Fatalf("next %+v answer %+v\nwant %+v and %+v", next, rec, tc.next, tc.rec)
			}
		})
	}
}

// TestDecideOwnerSettlesInDoubt: the holder of an in-doubt record's fence may still
// commit or fail it (it learned the outcome after all); the terminal record is no
// longer in doubt. A stale fence stays fenced.
func TestDecideOwnerSettlesInDoubt(t *testing.T) {
	now := t0 + 900
	next, _, err := DecideCommit(inDoubtRec(), commitReq(7), now)
	if err != nil || next.Status != idemkv.StatusCommitted || next.InDoubt || next.InDoubtSince != 0 {
		t.Fatalf("commit: %+v, %v", next, err)
	}
	next, _, err = DecideFail(inDoubtRec(), failReq(7), now)
	if err != nil || next.Status != idemkv.StatusFailed || next.InDoubt || next.InDoubtSince != 0 {
		t.Fatalf("fail: %+v, %v", next, err)
	}
	if _, _, err := DecideCommit(inDoubtRec(), commitReq(6), now); err == nil {
		t.Fatal("a stale fence committed an in-doubt record")
	}
	if _, err := DecideHeartbeat(inDoubtRec(), &idemkv.HeartbeatRequest{Tenant: tenant, Key: key, Fence: 7}, now); !errors.Is(err, idemkv.ErrNotPending) {
		t.Fatalf("heartbeat of an in-doubt record: %v", err)
	}
	if release, err := DecideRelease(inDoubtRec(), &idemkv.ReleaseRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Fence: 7}, now); err != nil || !release {
		t.Fatalf("release: %v %v", release, err)
	}
}

func TestDecideResolve(t *testing.T) {
	committed := func(fp string) *idemkv.ResolveRequest {
		return &idemkv.ResolveRequest{Tenant: tenant, Key: key, Fingerprint: fp, Outcome: idemkv.ResolveCommitted,
			RemoteSystem: "linear", RemoteID: "LIN-7", RemoteURL: "https://linear.example/LIN-7", Result: json.RawMessage(`{"by":"operator"}`), By: "oncall (admin)"}
	}
	notExecuted := &idemkv.ResolveRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Outcome: idemkv.ResolveNotExecuted}
	now := t0 + 5000
	settled := inDoubtRec()
	settled.Status = idemkv.StatusCommitted
	settled.InDoubt, settled.InDoubtSince = false, 0
	settled.UpdatedAt = now
	settled.Receipt = &idemkv.StoredReceipt{RemoteSystem: "linear", RemoteID: "LIN-7", RemoteURL: "https://linear.example/LIN-7",
		Result: json.RawMessage(`{"by":"operator"}`), CommittedAt: now}
	tests := []struct {
		name    string
		cur     *idemkv.Record
		req     *idemkv.ResolveRequest
		next    *idemkv.Record
		release bool
		err     error
	}{
		{name: "in doubt, committed: the receipt is stored, no fence asked", cur: inDoubtRec(), req: committed(fpA), next: settled},
		{name: "in doubt, not executed: the key is released", cur: inDoubtRec(), req: notExecuted, release: true},
		{name: "pending but not in doubt: not pending (its attempt may still run)", cur: pendingRec(), req: committed(fpA), err: idemkv.ErrNotPending},
		{name: "pending, lease expired, not in doubt: not pending", cur: pendingRec(), req: notExecuted, err: idemkv.ErrNotPending},
		{name: "committed: not pending", cur: committedRec(), req: committed(fpA), err: idemkv.ErrNotPending},
		{name: "failed: not pending", cur: failedRec(), req: notExecuted, err: idemkv.ErrNotPending},
		{name: "wrong fingerprint", cur: inDoubtRec(), req: committed(fpB), err: idemkv.ErrFingerprintMismatch},
		{name: "absent", req: committed(fpA), err: idemkv.ErrNotFound},
		{name: "unknown outcome", cur: inDoubtRec(), req: &idemkv.ResolveRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Outcome: "maybe"},
			err: idemkv.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			next, receipt, release, err := DecideResolve(tc.cur, tc.req, now)
			checkErr(t, err, tc.err)
			if tc.next != nil {
				next = withoutEvent(t, "next", next, tc.cur.History, idemkv.HistoryEvent{At: now, Event: idemkv.EventResolve,
					Fence: tc.cur.Fence, AttemptID: tc.cur.AttemptID, Actor: "oncall (admin)", Detail: "committed: linear LIN-7"})
			}
			if !reflect.DeepEqual(next, tc.next) || release != tc.release {
				t.Fatalf("next %+v release %v\nwant %+v %v", next, release, tc.next, tc.release)
			}
			if tc.next != nil && !reflect.DeepEqual(receipt, tc.next.Outcome()) {
				t.Fatalf("receipt %+v", receipt)
			}
			if tc.next == nil && receipt != nil {
				t.Fatalf("receipt %+v without a commit", receipt)
			}
		})
	}
	// Expired in-doubt records are gone like any other.
	if _, _, _, err := DecideResolve(inDoubtRec(), notExecuted, t0+ttl); err == nil {
		t.Fatal("resolved an expired record")
	}
}
