package fsm

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/idemkv/idemkv"
)

const (
	t0     idemkv.Timestamp = 1_800_000_000_000
	fpA                     = "sha256:aaaa"
	fpB                     = "sha256:bbbb"
	lease                   = 30_000
	ttl                     = 86_400_000
	tenant                  = "acme"
	key                     = "conv_9:approval_17:create_ticket"
)

func reserveReq(mod ...func(*idemkv.ReserveRequest)) *idemkv.ReserveRequest {
	r := &idemkv.ReserveRequest{Tenant: tenant, Key: key, Tool: "create_ticket", Actor: "worker-2",
		Fingerprint: fpA, AttemptID: "att-2", LeaseTTLMs: lease, TTLMs: ttl}
	for _, m := range mod {
		m(r)
	}
	return r
}

// pendingRec is a pending record granted at fence 7 to att-1, at t0.
func pendingRec(mod ...func(*idemkv.Record)) *idemkv.Record {
	r := &idemkv.Record{Tenant: tenant, Key: key, Fingerprint: fpA, Tool: "create_ticket", Actor: "worker-1",
		Status: idemkv.StatusPending, Fence: 7, AttemptID: "att-1", Attempts: 1,
		CreatedAt: t0, UpdatedAt: t0, LeaseExpiresAt: t0 + lease, ExpiresAt: t0 + ttl}
	for _, m := range mod {
		m(r)
	}
	return r
}

func committedRec() *idemkv.Record {
	return pendingRec(func(r *idemkv.Record) {
		r.Status = idemkv.StatusCommitted
		r.LeaseExpiresAt = 0
		r.UpdatedAt = t0 + 5
		r.Receipt = &idemkv.StoredReceipt{RemoteSystem: "linear", RemoteID: "LIN-1842",
			RemoteURL: "https://linear.example/issue/LIN-1842", Result: json.RawMessage(`{"ok":true}`), CommittedAt: t0 + 5}
	})
}

func failedRec() *idemkv.Record {
	return pendingRec(func(r *idemkv.Record) {
		r.Status = idemkv.StatusFailed
		r.LeaseExpiresAt = 0
		r.UpdatedAt = t0 + 5
		r.Error = &idemkv.ErrorInfo{Code: "rejected", Message: "project archived", Details: json.RawMessage(`{"p":1}`)}
	})
}

// TestDecide has one row per row of the reserve table in docs/protocol.md section 1, then the
// variants around each boundary.
func TestDecide(t *testing.T) {
	const index = 42
	tests := []struct {
		name     string
		cur      *idemkv.Record
		req      *idemkv.ReserveRequest
		now      idemkv.Timestamp
		decision idemkv.Decision
		// next is the record that must be stored; nil means no state change.
		next *idemkv.Record
		// fence is the fence the answer must carry (0: omitted).
		fence    uint64
		conflict *idemkv.Conflict
		receipt  *idemkv.Receipt
		// event is the history event the change appends (none when empty); it tells of
		// next: its fence, attempt and actor, at now.
		event idemkv.EventKind
	}{
		{
			name: "absent: execute with a new record", cur: nil, req: reserveReq(), now: t0 + 100,
			event: idemkv.EventExecute, decision: idemkv.DecisionExecute, fence: index,
			next: &idemkv.Record{Tenant: tenant, Key: key, Fingerprint: fpA, Tool: "create_ticket", Actor: "worker-2",
				Status: idemkv.StatusPending, Fence: index, AttemptID: "att-2", Attempts: 1, CreatedAt: t0 + 100,
				UpdatedAt: t0 + 100, LeaseExpiresAt: t0 + 100 + lease, ExpiresAt: t0 + 100 + ttl},
		},
		{
			name: "absent, expires_at beyond the ceiling: capped", cur: nil,
			req: reserveReq(func(r *idemkv.ReserveRequest) { r.TTLMs = 0; r.ExpiresAt = 1 << 52 }), now: t0,
			event: idemkv.EventExecute, decision: idemkv.DecisionExecute, fence: index,
			next: &idemkv.Record{Tenant: tenant, Key: key, Fingerprint: fpA, Tool: "create_ticket", Actor: "worker-2",
				Status: idemkv.StatusPending, Fence: index, AttemptID: "att-2", Attempts: 1, CreatedAt: t0,
				UpdatedAt: t0, LeaseExpiresAt: t0 + lease, ExpiresAt: t0 + idemkv.Timestamp(idemkv.CeilingTTL.Milliseconds())},
		},
		{
			name: "absent with expires_at instead of ttl", cur: nil,
			req: reserveReq(func(r *idemkv.ReserveRequest) { r.TTLMs = 0; r.ExpiresAt = t0 + 3_600_000 }), now: t0,
			event: idemkv.EventExecute, decision: idemkv.DecisionExecute, fence: index,
			next: &idemkv.Record{Tenant: tenant, Key: key, Fingerprint: fpA, Tool: "create_ticket", Actor: "worker-2",
				Status: idemkv.StatusPending, Fence: index, AttemptID: "att-2", Attempts: 1, CreatedAt: t0,
				UpdatedAt: t0, LeaseExpiresAt: t0 + lease, ExpiresAt: t0 + 3_600_000},
		},
		{
			name: "expires_at before the lease end is raised to it", cur: nil,
			req: reserveReq(func(r *idemkv.ReserveRequest) { r.TTLMs = 0; r.ExpiresAt = t0 + 10 }), now: t0,
			event: idemkv.EventExecute, decision: idemkv.DecisionExecute, fence: index,
			next: &idemkv.Record{Tenant: tenant, Key: key, Fingerprint: fpA, Tool: "create_ticket", Actor: "worker-2",
				Status: idemkv.StatusPending, Fence: index, AttemptID: "att-2", Attempts: 1, CreatedAt: t0,
				UpdatedAt: t0, LeaseExpiresAt: t0 + lease, ExpiresAt: t0 + lease},
		},
		{
			name: "past expires_at (committed, other tool): treated as absent", cur: committedRec(),
			req: reserveReq(func(r *idemkv.ReserveRequest) { r.Tool = "send_email"; r.Fingerprint = fpB }), now: t0 + ttl,
			event: idemkv.EventExecute, decision: idemkv.DecisionExecute, fence: index,
			next: &idemkv.Record{Tenant: tenant, Key: key, Fingerprint: fpB, Tool: "send_email", Actor: "worker-2",
				Status: idemkv.StatusPending, Fence: index, AttemptID: "att-2", Attempts: 1, CreatedAt: t0 + ttl,
				UpdatedAt: t0 + ttl, LeaseExpiresAt: t0 + ttl + lease, ExpiresAt: t0 + 2*ttl},
		},
		{
			name: "pending, same attempt_id: execute with the same fence, lease extended",
			cur:  pendingRec(), req: reserveReq(func(r *idemkv.ReserveRequest) { r.AttemptID = "att-1" }), now: t0 + 1000,
			decision: idemkv.DecisionExecute, fence: 7,
			next: pendingRec(func(r *idemkv.Record) {
				r.UpdatedAt = t0 + 1000
				r.LeaseExpiresAt = t0 + 1000 + lease
				r.ExpiresAt = t0 + 1000 + ttl
			}),
		},
		{
			name: "pending, same attempt_id, lease already expired: still execute, not recover",
			cur:  pendingRec(), req: reserveReq(func(r *idemkv.ReserveRequest) { r.AttemptID = "att-1" }), now: t0 + lease + 1,
			decision: idemkv.DecisionExecute, fence: 7,
			next: pendingRec(func(r *idemkv.Record) {
				r.UpdatedAt = t0 + lease + 1
				r.LeaseExpiresAt = t0 + 2*lease + 1
				r.ExpiresAt = t0 + lease + 1 + ttl
			}),
		},
		{
			name: "pending, same attempt_id, shorter lease asked: the lease is not shortened",
			cur:  pendingRec(), req: reserveReq(func(r *idemkv.ReserveRequest) { r.AttemptID = "att-1"; r.LeaseTTLMs = 1000 }), now: t0 + 10,
			decision: idemkv.DecisionExecute, fence: 7,
			next: pendingRec(func(r *idemkv.Record) {
				r.UpdatedAt = t0 + 10
				r.ExpiresAt = t0 + 10 + ttl
			}),
		},
		{
			name: "pending after a recover, same attempt_id asks again: recover again, same fence",
			cur:  pendingRec(func(r *idemkv.Record) { r.Attempts = 2 }), req: reserveReq(func(r *idemkv.ReserveRequest) { r.AttemptID = "att-1" }), now: t0 + 1000,
			decision: idemkv.DecisionRecover, fence: 7,
			next: pendingRec(func(r *idemkv.Record) {
				r.Attempts = 2
				r.UpdatedAt = t0 + 1000
				r.LeaseExpiresAt = t0 + 1000 + lease
				r.ExpiresAt = t0 + 1000 + ttl
			}),
		},
		{
			name: "pending, same effect, lease live: in_progress", cur: pendingRec(), req: reserveReq(), now: t0 + lease - 1,
			decision: idemkv.DecisionInProgress,
		},
		{
			name: "pending, same effect, lease expired: recover with a new fence and attempt",
			cur:  pendingRec(), req: reserveReq(), now: t0 + lease,
			event: idemkv.EventRecover, decision: idemkv.DecisionRecover, fence: index,
			next: pendingRec(func(r *idemkv.Record) {
				r.Fence = index
				r.AttemptID = "att-2"
				r.Actor = "worker-2"
				r.Attempts = 2
				r.UpdatedAt = t0 + lease
				r.LeaseExpiresAt = t0 + 2*lease
				r.ExpiresAt = t0 + lease + ttl
			}),
		},
		{
			name: "recover increments attempts from where they are",
			cur:  pendingRec(func(r *idemkv.Record) { r.Attempts = 4 }), req: reserveReq(), now: t0 + lease + 5,
			event: idemkv.EventRecover, decision: idemkv.DecisionRecover, fence: index,
			next: pendingRec(func(r *idemkv.Record) {
				r.Fence = index
				r.AttemptID = "att-2"
				r.Actor = "worker-2"
				r.Attempts = 5
				r.UpdatedAt = t0 + lease + 5
				r.LeaseExpiresAt = t0 + 2*lease + 5
				r.ExpiresAt = t0 + lease + 5 + ttl
			}),
		},
		{
			name: "committed, same effect: replay (any actor)", cur: committedRec(),
			req: reserveReq(func(r *idemkv.ReserveRequest) { r.Actor = "someone-else" }), now: t0 + 10,
			decision: idemkv.DecisionReplay,
			receipt: &idemkv.Receipt{Key: key, Fingerprint: fpA, Status: idemkv.StatusCommitted, RemoteSystem: "linear",
				RemoteID: "LIN-1842", RemoteURL: "https://linear.example/issue/LIN-1842", CommittedAt: t0 + 5,
				Result: json.RawMessage(`{"ok":true}`)},
		},
		{
			name: "failed, same effect: replay of the failure", cur: failedRec(), req: reserveReq(), now: t0 + 10,
			decision: idemkv.DecisionReplay,
			receipt: &idemkv.Receipt{Key: key, Fingerprint: fpA, Status: idemkv.StatusFailed, CommittedAt: t0 + 5,
				Error: &idemkv.ErrorInfo{Code: "rejected", Message: "project archived", Details: json.RawMessage(`{"p":1}`)}},
		},
		{
			name: "pending, different fingerprint: conflict", cur: pendingRec(),
			req: reserveReq(func(r *idemkv.ReserveRequest) { r.Fingerprint = fpB }), now: t0 + lease + 1,
			decision: idemkv.DecisionConflict,
			conflict: &idemkv.Conflict{Status: "conflict", Reason: idemkv.ReasonDifferentEffect,
				ExistingFingerprint: fpA, ReceivedFingerprint: fpB},
		},
		{
			name: "committed, different fingerprint: conflict naming the remote id", cur: committedRec(),
			req: reserveReq(func(r *idemkv.ReserveRequest) { r.Fingerprint = fpB }), now: t0 + 10,
			decision: idemkv.DecisionConflict,
			conflict: &idemkv.Conflict{Status: "conflict", Reason: idemkv.ReasonDifferentEffect,
				ExistingFingerprint: fpA, ReceivedFingerprint: fpB, ExistingRemoteID: "LIN-1842"},
		},
		{
			name: "failed, different tool same fingerprint: conflict on the tool", cur: failedRec(),
			req: reserveReq(func(r *idemkv.ReserveRequest) { r.Tool = "send_email" }), now: t0 + 10,
			decision: idemkv.DecisionConflict,
			conflict: &idemkv.Conflict{Status: "conflict", Reason: idemkv.ReasonDifferentTool,
				ExistingFingerprint: fpA, ReceivedFingerprint: fpA, ExistingTool: "create_ticket", ReceivedTool: "send_email"},
		},
		{
			name: "in doubt, same tool and fingerprint, lease live: recover with no fence and no change",
			cur:  inDoubtRec(), req: reserveReq(), now: t0 + 10,
			decision: idemkv.DecisionRecover,
		},
		{
			name: "in doubt, lease long expired: still recover with no fence, never a new lease",
			cur:  inDoubtRec(), req: reserveReq(), now: t0 + 10*lease,
			decision: idemkv.DecisionRecover,
		},
		{
			name: "in doubt, the attempt that marked it asks again: recover with no fence",
			cur:  inDoubtRec(), req: reserveReq(func(r *idemkv.ReserveRequest) { r.AttemptID = "att-1" }), now: t0 + 10,
			decision: idemkv.DecisionRecover,
		},
		{
			name: "in doubt, different fingerprint: conflict as always", cur: inDoubtRec(),
			req: reserveReq(func(r *idemkv.ReserveRequest) { r.Fingerprint = fpB }), now: t0 + 10,
			decision: idemkv.DecisionConflict,
			conflict: &idemkv.Conflict{Status: "conflict", Reason: idemkv.ReasonDifferentEffect,
				ExistingFingerprint: fpA, ReceivedFingerprint: fpB},
		},
		{
			name: "in doubt, past expires_at: absent, execute afresh", cur: inDoubtRec(), req: reserveReq(), now: t0 + ttl,
			event: idemkv.EventExecute, decision: idemkv.DecisionExecute, fence: index,
			next: &idemkv.Record{Tenant: tenant, Key: key, Fingerprint: fpA, Tool: "create_ticket", Actor: "worker-2",
				Status: idemkv.StatusPending, Fence: index, AttemptID: "att-2", Attempts: 1, CreatedAt: t0 + ttl,
				UpdatedAt: t0 + ttl, LeaseExpiresAt: t0 + ttl + lease, ExpiresAt: t0 + 2*ttl},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var before *idemkv.Record
			if tc.cur != nil {
				before = tc.cur.Clone()
			}
			next, res := Decide(tc.cur, tc.req, tc.now, index)
			if res.Decision != tc.decision {
				t.Fatalf("decision = %s, want %s", res.Decision, tc.decision)
			}
			if next != nil {
				want := idemkv.HistoryEvent{}
				if tc.event != "" {
					want = idemkv.HistoryEvent{At: tc.now, Event: tc.event, Fence: tc.next.Fence, AttemptID: tc.next.AttemptID, Actor: tc.next.Actor}
				}
				next = withoutEvent(t, "next", next, priorHistory(tc.cur, tc.now), want)
				if res.Record.Fence == next.Fence {
					r := *res
					r.Record = res.Record.WithoutHistory()
					res = &r
				}
			} else if tc.event != "" {
				t.Errorf("no change, but the row expects event %s", tc.event)
			}
			if !reflect.DeepEqual(next, tc.next) {
				t.Errorf("next record:\n got %+v\nwant %+v", next, tc.next)
			}
			if !reflect.DeepEqual(tc.cur, before) {
				t.Errorf("Decide mutated its input: %+v", tc.cur)
			}
			if res.Fence != tc.fence {
				t.Errorf("fence = %d, want %d", res.Fence, tc.fence)
			}
			if !reflect.DeepEqual(res.Conflict, tc.conflict) {
				t.Errorf("conflict = %+v, want %+v", res.Conflict, tc.conflict)
			}
			if !reflect.DeepEqual(res.Receipt, tc.receipt) {
				t.Errorf("receipt = %+v, want %+v", res.Receipt, tc.receipt)
			}
			wantRecord := tc.next
			if wantRecord == nil {
				wantRecord = tc.cur
			}
			if !reflect.DeepEqual(res.Record, wantRecord) {
				t.Errorf("answer record = %+v, want %+v", res.Record, wantRecord)
			}
			switch tc.decision {
			case idemkv.DecisionExecute, idemkv.DecisionRecover:
				if tc.next == nil {
					// An in-doubt record: recover grants nothing.
					if res.Fence != 0 || res.AttemptID != "" || res.LeaseExpiresAt != 0 || !res.Record.InDoubt {
						t.Errorf("in-doubt recover carries fence %d attempt %q lease %s, record %+v",
							res.Fence, res.AttemptID, res.LeaseExpiresAt, res.Record)
					}
					return
				}
				if res.AttemptID != tc.next.AttemptID || res.LeaseExpiresAt != tc.next.LeaseExpiresAt {
					t.Errorf("grant carries attempt %q lease %s, record has %q %s",
						res.AttemptID, res.LeaseExpiresAt, tc.next.AttemptID, tc.next.LeaseExpiresAt)
				}
			case idemkv.DecisionInProgress:
				if res.LeaseExpiresAt != tc.cur.LeaseExpiresAt || res.AttemptID != "" {
					t.Errorf("in_progress carries lease %s attempt %q, want %s and none",
						res.LeaseExpiresAt, res.AttemptID, tc.cur.LeaseExpiresAt)
				}
			}
		})
	}
}

// TestDecideFenceGrowsAcrossExpiry: a key reserved again after it expired gets the
// index of the new grant, above any fence ever granted for it.
func TestDecideFenceGrowsAcrossExpiry(t *testing.T) {
	old := pendingRec()
	next, res := Decide(old, reserveReq(), old.ExpiresAt, 900)
	if res.Decision != idemkv.DecisionExecute || next.Fence != 900 || next.Fence <= old.Fence || next.Attempts != 1 {
		t.Fatalf("got %s fence %d attempts %d, want execute with fence 900 and 1 attempt", res.Decision, next.Fence, next.Attempts)
	}
}

func commitReq(fence uint64, mod ...func(*idemkv.CommitRequest)) *idemkv.CommitRequest {
	r := &idemkv.CommitRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Fence: fence,
		RemoteSystem: "jira", RemoteID: "J-1", Result: json.RawMessage(`[1]`)}
	for _, m := range mod {
		m(r)
	}
	return r
}

func TestDecideCommit(t *testing.T) {
	now := t0 + 500
	committedByJ1 := pendingRec(func(r *idemkv.Record) {
		r.Status = idemkv.StatusCommitted
		r.UpdatedAt = now
		r.LeaseExpiresAt = 0
		r.Receipt = &idemkv.StoredReceipt{RemoteSystem: "jira", RemoteID: "J-1", Result: json.RawMessage(`[1]`), CommittedAt: now}
	})
	tests := []struct {
		name    string
		cur     *idemkv.Record
		req     *idemkv.CommitRequest
		now     idemkv.Timestamp
		next    *idemkv.Record
		receipt *idemkv.Receipt
		err     error
	}{
		{name: "pending, current fence: committed", cur: pendingRec(), req: commitReq(7), now: now,
			next: committedByJ1, receipt: committedByJ1.Outcome()},
		{name: "pending, current fence, lease expired, nobody recovered: lands", cur: pendingRec(), req: commitReq(7),
			now: t0 + lease + 10,
			next: pendingRec(func(r *idemkv.Record) {
				r.Status = idemkv.StatusCommitted
				r.UpdatedAt = t0 + lease + 10
				r.LeaseExpiresAt = 0
				r.Receipt = &idemkv.StoredReceipt{RemoteSystem: "jira", RemoteID: "J-1", Result: json.RawMessage(`[1]`), CommittedAt: t0 + lease + 10}
			})},
		{name: "pending, stale fence", cur: pendingRec(), req: commitReq(6), now: now, err: idemkv.ErrFenced},
		{name: "pending, higher (never granted) fence", cur: pendingRec(), req: commitReq(8), now: now, err: idemkv.ErrFenced},
		{name: "pending, unknown huge fence", cur: pendingRec(), req: commitReq(1 << 60), now: now, err: idemkv.ErrFenced},
		{name: "wrong fingerprint", cur: pendingRec(), req: commitReq(7, func(r *idemkv.CommitRequest) { r.Fingerprint = fpB }),
			now: now, err: idemkv.ErrFingerprintMismatch},
		{name: "wrong fingerprint beats stale fence", cur: pendingRec(), req: commitReq(1, func(r *idemkv.CommitRequest) { r.Fingerprint = fpB }),
			now: now, err: idemkv.ErrFingerprintMismatch},
		{name: "absent", cur: nil, req: commitReq(7), now: now, err: idemkv.ErrNotFound},
		{name: "expired", cur: pendingRec(), req: commitReq(7), now: t0 + ttl, err: idemkv.ErrNotFound},
		{name: "committed, same fence: stored receipt back, unchanged", cur: committedRec(),
			req: commitReq(7, func(r *idemkv.CommitRequest) { r.RemoteID = "OTHER" }), now: now, receipt: committedRec().Outcome()},
		{name: "failed, same fence: the failure wins", cur: failedRec(), req: commitReq(7), now: now, receipt: failedRec().Outcome()},
		{name: "committed, stale fence", cur: committedRec(), req: commitReq(3), now: now, err: idemkv.ErrFenced},
		{name: "committed, higher fence", cur: committedRec(), req: commitReq(9), now: now, err: idemkv.ErrFenced},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			next, receipt, err := DecideCommit(tc.cur, tc.req, tc.now)
			checkErr(t, err, tc.err)
			if tc.next != nil {
				next = withoutEvent(t, "next", next, tc.cur.History, idemkv.HistoryEvent{At: tc.now, Event: idemkv.EventCommit,
					Fence: tc.cur.Fence, AttemptID: tc.cur.AttemptID, Actor: tc.cur.Actor, Detail: tc.req.RemoteSystem + " " + tc.req.RemoteID})
			}
			if !reflect.DeepEqual(next, tc.next) {
				t.Errorf("next:\n got %+v\nwant %+v", next, tc.next)
			}
			if tc.receipt != nil && !reflect.DeepEqual(receipt, tc.receipt) {
				t.Errorf("receipt:\n got %+v\nwant %+v", receipt, tc.receipt)
			}
			if tc.err == nil && receipt == nil {
				t.Error("no receipt on success")
			}
			if tc.next != nil && !reflect.DeepEqual(receipt, tc.next.Outcome()) {
				t.Errorf("receipt %+v is not the outcome of the stored record", receipt)
			}
		})
	}
}

func checkErr(t *testing.T, got, want error) {
	t.Helper()
	if want == nil {
		if got != nil {
			t.Fatalf("err = %v, want none", got)
		}
		return
	}
	if !errors.Is(got, want) {
		t.Fatalf("err = %v, want %v", got, want)
	}
}

func failReq(fence uint64, mod ...func(*idemkv.FailRequest)) *idemkv.FailRequest {
	r := &idemkv.FailRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Fence: fence,
		Error: idemkv.ErrorInfo{Code: "quota", Message: "over quota"}}
	for _, m := range mod {
		m(r)
	}
	return r
}

func TestDecideFail(t *testing.T) {
	now := t0 + 500
	failedNow := pendingRec(func(r *idemkv.Record) {
		r.Status = idemkv.StatusFailed
		r.UpdatedAt = now
		r.LeaseExpiresAt = 0
		r.Error = &idemkv.ErrorInfo{Code: "quota", Message: "over quota"}
	})
	tests := []struct {
		name string
		cur  *idemkv.Record
		req  *idemkv.FailRequest
		now  idemkv.Timestamp
		next *idemkv.Record
		rec  *idemkv.Record
		err  error
	}{
		{name: "pending, current fence: failed", cur: pendingRec(), req: failReq(7), now: now, next: failedNow, rec: failedNow},
		{name: "pending, stale fence", cur: pendingRec(), req: failReq(2), now: now, err: idemkv.ErrFenced},
		{name: "pending, higher fence", cur: pendingRec(), req: failReq(70), now: now, err: idemkv.ErrFenced},
		{name: "wrong fingerprint", cur: pendingRec(), req: failReq(7, func(r *idemkv.FailRequest) { r.Fingerprint = fpB }),
			now: now, err: idemkv.ErrFingerprintMismatch},
		{name: "absent", req: failReq(7), now: now, err: idemkv.ErrNotFound},
		{name: "expired", cur: pendingRec(), req: failReq(7), now: t0 + ttl + 1, err: idemkv.ErrNotFound},
		{name: "committed, same fence: the commit wins", cur: committedRec(), req: failReq(7), now: now, rec: committedRec()},
		{name: "failed, same fence: unchanged", cur: failedRec(), req: failReq(7), now: now, rec: failedRec()},
		{name: "failed, stale fence", cur: failedRec(), req: failReq(6), now: now, err: idemkv.ErrFenced},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			next, rec, err := DecideFail(tc.cur, tc.req, tc.now)
			checkErr(t, err, tc.err)
			if tc.next != nil {
				next = withoutEvent(t, "next", next, tc.cur.History, idemkv.HistoryEvent{At: tc.now, Event: idemkv.EventFail,
					Fence: tc.cur.Fence, AttemptID: tc.cur.AttemptID, Actor: tc.cur.Actor, Detail: tc.req.Error.Code})
				rec = rec.WithoutHistory()
			}
			if !reflect.DeepEqual(next, tc.next) {
				t.Errorf("next:\n got %+v\nwant %+v", next, tc.next)
			}
			if !reflect.DeepEqual(rec, tc.rec) {
				t.Errorf("record:\n got %+v\nwant %+v", rec, tc.rec)
			}
		})
	}
}

func TestDecideRelease(t *testing.T) {
	req := func(fence uint64, fp string) *idemkv.ReleaseRequest {
		return &idemkv.ReleaseRequest{Tenant: tenant, Key: key, Fingerprint: fp, Fence: fence}
	}
	tests := []struct {
		name    string
		cur     *idemkv.Record
		req     *idemkv.ReleaseRequest
		now     idemkv.Timestamp
		release bool
		err     error
	}{
		{name: "pending, current fence: released", cur: pendingRec(), req: req(7, fpA), now: t0 + 1, release: true},
		{name: "pending, current fence, lease expired: released", cur: pendingRec(), req: req(7, fpA), now: t0 + lease + 1, release: true},
		{name: "pending, stale fence", cur: pendingRec(), req: req(6, fpA), now: t0 + 1, err: idemkv.ErrFenced},
		{name: "pending, higher fence", cur: pendingRec(), req: req(8, fpA), now: t0 + 1, err: idemkv.ErrFenced},
		{name: "wrong fingerprint", cur: pendingRec(), req: req(7, fpB), now: t0 + 1, err: idemkv.ErrFingerprintMismatch},
		{name: "absent", req: req(7, fpA), now: t0 + 1, err: idemkv.ErrNotFound},
		{name: "expired", cur: pendingRec(), req: req(7, fpA), now: t0 + ttl, err: idemkv.ErrNotFound},
		{name: "committed, current fence: not pending", cur: committedRec(), req: req(7, fpA), now: t0 + 1, err: idemkv.ErrNotPending},
		{name: "failed, current fence: not pending", cur: failedRec(), req: req(7, fpA), now: t0 + 1, err: idemkv.ErrNotPending},
		{name: "committed, stale fence: fenced", cur: committedRec(), req: req(1, fpA), now: t0 + 1, err: idemkv.ErrFenced},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			release, err := DecideRelease(tc.cur, tc.req, tc.now)
			checkErr(t, err, tc.err)
			if release != tc.release {
				t.Errorf("release = %v, want %v", release, tc.release)
			}
		})
	}
}

func TestDecideHeartbeat(t *testing.T) {
	req := func(fence uint64, ms int64) *idemkv.HeartbeatRequest {
		return &idemkv.HeartbeatRequest{Tenant: tenant, Key: key, Fence: fence, LeaseTTLMs: ms}
	}
	tests := []struct {
		name string
		cur  *idemkv.Record
		req  *idemkv.HeartbeatRequest
		now  idemkv.Timestamp
		next *idemkv.Record
		err  error
	}{
		{name: "pending, current fence: lease = now + ttl", cur: pendingRec(), req: req(7, lease), now: t0 + 20_000,
			next: pendingRec(func(r *idemkv.Record) { r.UpdatedAt = t0 + 20_000; r.LeaseExpiresAt = t0 + 20_000 + lease })},
		{name: "shorter ttl never shortens the lease", cur: pendingRec(), req: req(7, 1000), now: t0 + 1000,
			next: pendingRec(func(r *idemkv.Record) { r.UpdatedAt = t0 + 1000 })},
		{name: "lease expired, nobody recovered: extended", cur: pendingRec(), req: req(7, lease), now: t0 + 2*lease,
			next: pendingRec(func(r *idemkv.Record) { r.UpdatedAt = t0 + 2*lease; r.LeaseExpiresAt = t0 + 3*lease })},
		{name: "lease beyond expires_at pushes expiry along",
			cur: pendingRec(func(r *idemkv.Record) { r.ExpiresAt = t0 + 60_000 }), req: req(7, 3_600_000), now: t0 + 1000,
			next: pendingRec(func(r *idemkv.Record) {
				r.UpdatedAt = t0 + 1000
				r.LeaseExpiresAt = t0 + 3_601_000
				r.ExpiresAt = t0 + 3_601_000
			})},
		{name: "a lease beyond the ceiling is capped (defect 3 of issue 13)",
			cur: pendingRec(), req: req(7, 166020696664386), now: t0 + 1000,
			next: pendingRec(func(r *idemkv.Record) {
				r.UpdatedAt = t0 + 1000
				r.LeaseExpiresAt = t0 + 1000 + idemkv.Timestamp(idemkv.CeilingTTL.Milliseconds())
				r.ExpiresAt = r.LeaseExpiresAt
			})},
		{name: "stale fence", cur: pendingRec(), req: req(6, lease), now: t0 + 1, err: idemkv.ErrFenced},
		{name: "higher fence", cur: pendingRec(), req: req(8, lease), now: t0 + 1, err: idemkv.ErrFenced},
		{name: "absent", req: req(7, lease), now: t0 + 1, err: idemkv.ErrNotFound},
		{name: "expired", cur: pendingRec(), req: req(7, lease), now: t0 + ttl, err: idemkv.ErrNotFound},
		{name: "committed: not pending", cur: committedRec(), req: req(7, lease), now: t0 + 1, err: idemkv.ErrNotPending},
		{name: "failed, stale fence: fenced", cur: failedRec(), req: req(2, lease), now: t0 + 1, err: idemkv.ErrFenced},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			next, err := DecideHeartbeat(tc.cur, tc.req, tc.now)
			checkErr(t, err, tc.err)
			if !reflect.DeepEqual(next, tc.next) {
				t.Errorf("next:\n got %+v\nwant %+v", next, tc.next)
			}
		})
	}
}
