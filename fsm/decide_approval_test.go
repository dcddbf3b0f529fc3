package fsm

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/idemkv/idemkv"
)

const (
	approvalTTL = 3_600_000
	effectA     = `{"amount":40,"order":17}`
)

// askReq is a reserve asking for approval, with the effect whose fingerprint is fpA.
func askReq(mod ...func(*idemkv.ReserveRequest)) *idemkv.ReserveRequest {
	return reserveReq(append([]func(*idemkv.ReserveRequest){func(r *idemkv.ReserveRequest) {
		r.Effect = json.RawMessage(effectA)
		r.Approval = &idemkv.ApprovalAsk{Required: true, TTLMs: approvalTTL, Summary: "Refund 40 EUR to order 17"}
	}}, mod...)...)
}

// waitingRec is the record asked for at t0 by the entry at index 40.
func waitingRec(mod ...func(*idemkv.Record)) *idemkv.Record {
	r := &idemkv.Record{Tenant: tenant, Key: key, Fingerprint: fpA, Tool: "create_ticket", Actor: "worker-1",
		Status: idemkv.StatusAwaitingApproval, CreatedAt: t0, UpdatedAt: t0, ExpiresAt: t0 + ttl,
		Effect: json.RawMessage(effectA),
		Approval: &idemkv.Approval{ID: "apr_40", State: idemkv.ApprovalWaiting, Summary: "Refund 40 EUR to order 17",
			RequestedAt: t0, ExpiresAt: t0 + approvalTTL}}
	for _, m := range mod {
		m(r)
	}
	return r
}

func approvedRec() *idemkv.Record {
	return waitingRec(func(r *idemkv.Record) {
		r.UpdatedAt = t0 + 50
		r.Approval.State, r.Approval.Approver, r.Approval.Reason, r.Approval.DecidedAt = idemkv.ApprovalApproved, "ana", "ok", t0+50
	})
}

func deniedRec() *idemkv.Record {
	return waitingRec(func(r *idemkv.Record) {
		r.UpdatedAt = t0 + 50
		r.Status = idemkv.StatusFailed
		r.Error = idemkv.DeniedError("ana", "not this one")
		r.Approval.State, r.Approval.Approver, r.Approval.Reason, r.Approval.DecidedAt = idemkv.ApprovalDenied, "ana", "not this one", t0+50
	})
}

// TestDecideApprovalRows has one case per approval row of the reserve table in
// docs/protocol.md ("Approvals"), and the boundaries around them.
func TestDecideApprovalRows(t *testing.T) {
	const index = 42
	fresh := func(now idemkv.Timestamp) *idemkv.Record {
		return &idemkv.Record{Tenant: tenant, Key: key, Fingerprint: fpA, Tool: "create_ticket", Actor: "worker-2",
			Status: idemkv.StatusAwaitingApproval, CreatedAt: now, UpdatedAt: now, ExpiresAt: now + ttl,
			Effect: json.RawMessage(effectA),
			Approval: &idemkv.Approval{ID: "apr_42", State: idemkv.ApprovalWaiting, Summary: "Refund 40 EUR to order 17",
				RequestedAt: now, ExpiresAt: now + approvalTTL}}
	}
	consumed := approvedRec()
	consumed.Status, consumed.Fence, consumed.AttemptID, consumed.Actor, consumed.Attempts = idemkv.StatusPending, index, "att-2", "worker-2", 1
	consumed.UpdatedAt, consumed.LeaseExpiresAt = t0+100, t0+100+lease
	consumed.ExpiresAt = t0 + 100 + ttl

	tests := []struct {
		name     string
		cur      *idemkv.Record
		req      *idemkv.ReserveRequest
		now      idemkv.Timestamp
		decision idemkv.Decision
		next     *idemkv.Record // nil: no state change
		approval string         // the approval id the answer must carry ("" none)
		receipt  *idemkv.Receipt
	}{
		{name: "absent, approval required: needs_approval, a new waiting record with no fence or lease",
			cur: nil, req: askReq(), now: t0 + 100, decision: idemkv.DecisionNeedsApproval, next: fresh(t0 + 100), approval: "apr_42"},
		{name: "absent, approval asked but not required: execute as always",
			cur: nil, req: askReq(func(r *idemkv.ReserveRequest) { r.Approval.Required = false; r.Effect = nil }), now: t0 + 100,
			decision: idemkv.DecisionExecute,
			next: &idemkv.Record{Tenant: tenant, Key: key, Fingerprint: fpA, Tool: "create_ticket", Actor: "worker-2",
				Status: idemkv.StatusPending, Fence: index, AttemptID: "att-2", Attempts: 1, CreatedAt: t0 + 100,
				UpdatedAt: t0 + 100, LeaseExpiresAt: t0 + 100 + lease, ExpiresAt: t0 + 100 + ttl}},
		{name: "past expires_at, approval required: as absent",
			cur: committedRec(), req: askReq(), now: t0 + ttl + 100, decision: idemkv.DecisionNeedsApproval, next: fresh(t0 + ttl + 100), approval: "apr_42"},
		{name: "awaiting, same tool and fingerprint: needs_approval with the same id, nothing changes",
			cur: waitingRec(), req: askReq(), now: t0 + 100, decision: idemkv.DecisionNeedsApproval, approval: "apr_40"},
		{name: "awaiting, a retry that no longer asks: still the same request",
			cur: waitingRec(), req: reserveReq(), now: t0 + 100, decision: idemkv.DecisionNeedsApproval, approval: "apr_40"},
		{name: "awaiting, another fingerprint: conflict; the approval never stretches to another call",
			cur: waitingRec(), req: askReq(func(r *idemkv.ReserveRequest) { r.Fingerprint = fpB }), now: t0 + 100,
			decision: idemkv.DecisionConflict},
		{name: "awaiting, another tool: conflict",
			cur: waitingRec(), req: askReq(func(r *idemkv.ReserveRequest) { r.Tool = "send_email" }), now: t0 + 100,
			decision: idemkv.DecisionConflict},
		{name: "approved, same tool and fingerprint: execute, pending with a new fence and lease; the approval is consumed",
			cur: approvedRec(), req: askReq(), now: t0 + 100, decision: idemkv.DecisionExecute, next: consumed},
		{name: "approved, another fingerprint: conflict",
			cur: approvedRec(), req: askReq(func(r *idemkv.ReserveRequest) { r.Fingerprint = fpB }), now: t0 + 100,
			decision: idemkv.DecisionConflict},
		{name: "approved and consumed, lease live: in_progress (a second worker gets no second execute)",
			cur: consumed, req: askReq(func(r *idemkv.ReserveRequest) { r.AttemptID = "att-3" }), now: t0 + 200,
			decision: idemkv.DecisionInProgress},
		{name: "denied, same tool and fingerprint: replay of a failed receipt with approval_denied",
			cur: deniedRec(), req: askReq(), now: t0 + 100, decision: idemkv.DecisionReplay,
			receipt: &idemkv.Receipt{Key: key, Fingerprint: fpA, Status: idemkv.StatusFailed, CommittedAt: t0 + 50,
				Error: idemkv.DeniedError("ana", "not this one")}},
		{name: "denied, another fingerprint: conflict",
			cur: deniedRec(), req: askReq(func(r *idemkv.ReserveRequest) { r.Fingerprint = fpB }), now: t0 + 100,
			decision: idemkv.DecisionConflict},
		{name: "approval expired unanswered: as absent, a new request with a new id",
			cur: waitingRec(), req: askReq(), now: t0 + approvalTTL, decision: idemkv.DecisionNeedsApproval,
			next: fresh(t0 + approvalTTL), approval: "apr_42"},
		{name: "approval expired unanswered, another fingerprint: as absent too",
			cur: waitingRec(), req: askReq(func(r *idemkv.ReserveRequest) { r.Fingerprint = fpB }), now: t0 + approvalTTL,
			decision: idemkv.DecisionNeedsApproval,
			next:     func() *idemkv.Record { r := fresh(t0 + approvalTTL); r.Fingerprint = fpB; return r }(), approval: "apr_42"},
		{name: "approval expired unanswered, no approval asked now: as absent, execute",
			cur: waitingRec(), req: reserveReq(), now: t0 + approvalTTL, decision: idemkv.DecisionExecute,
			next: &idemkv.Record{Tenant: tenant, Key: key, Fingerprint: fpA, Tool: "create_ticket", Actor: "worker-2",
				Status: idemkv.StatusPending, Fence: index, AttemptID: "att-2", Attempts: 1, CreatedAt: t0 + approvalTTL,
				UpdatedAt: t0 + approvalTTL, LeaseExpiresAt: t0 + approvalTTL + lease, ExpiresAt: t0 + approvalTTL + ttl}},
		{name: "approved, past its approval's wait: an approval once given does not lapse",
			cur: approvedRec(), req: askReq(), now: t0 + approvalTTL + 1, decision: idemkv.DecisionExecute,
			next: func() *idemkv.Record {
				r := consumed.Clone()
				now := idemkv.Timestamp(t0 + approvalTTL + 1)
				r.UpdatedAt, r.LeaseExpiresAt, r.ExpiresAt = now, now+lease, now+ttl
				return r
			}()},
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
			if next != nil && tc.next != nil {
				// Every change in these rows is one event: the request, or the grant.
				want := idemkv.HistoryEvent{At: tc.now, Event: idemkv.EventExecute, Fence: tc.next.Fence, AttemptID: tc.next.AttemptID, Actor: tc.next.Actor}
				if tc.decision == idemkv.DecisionNeedsApproval {
					want = idemkv.HistoryEvent{At: tc.now, Event: idemkv.EventApprovalRequested, AttemptID: tc.req.AttemptID, Actor: tc.next.Actor, Detail: tc.next.Approval.ID}
				}
				next = withoutEvent(t, "next", next, priorHistory(tc.cur, tc.now), want)
			}
			if !reflect.DeepEqual(next, tc.next) {
				t.Errorf("next record:\n got %+v %+v\nwant %+v %+v", next, approvalOf(next), tc.next, approvalOf(tc.next))
			}
			if !reflect.DeepEqual(tc.cur, before) {
				t.Errorf("Decide mutated its input: %+v", tc.cur)
			}
			if !reflect.DeepEqual(res.Receipt, tc.receipt) {
				t.Errorf("receipt = %+v, want %+v", res.Receipt, tc.receipt)
			}
			switch {
			case tc.approval == "" && res.Approval != nil:
				t.Errorf("answer carries approval %+v, want none", res.Approval)
			case tc.approval != "" && (res.Approval == nil || res.Approval.ID != tc.approval || res.Approval.State != idemkv.ApprovalWaiting):
				t.Errorf("answer approval = %+v, want %s waiting", res.Approval, tc.approval)
			}
			if tc.decision == idemkv.DecisionNeedsApproval && (res.Fence != 0 || res.LeaseExpiresAt != 0 || res.Record.Fence != 0 || res.Record.LeaseExpiresAt != 0) {
				t.Errorf("needs_approval grants fence %d lease %s (record %d %s)", res.Fence, res.LeaseExpiresAt, res.Record.Fence, res.Record.LeaseExpiresAt)
			}
			if tc.decision == idemkv.DecisionConflict && res.Conflict == nil {
				t.Errorf("conflict without its explanation")
			}
		})
	}
}

func approvalOf(r *idemkv.Record) *idemkv.Approval {
	if r == nil {
		return nil
	}
	return r.Approval
}

func decideReq(mod ...func(*idemkv.DecideApprovalRequest)) *idemkv.DecideApprovalRequest {
	r := &idemkv.DecideApprovalRequest{Tenant: tenant, Key: key, ApprovalID: "apr_40", Fingerprint: fpA,
		Decision: idemkv.VerdictApprove, Approver: "ana", Reason: "ok"}
	for _, m := range mod {
		m(r)
	}
	return r
}

func TestDecideApproval(t *testing.T) {
	now := idemkv.Timestamp(t0 + 50)
	consumed := approvedRec()
	consumed.Status, consumed.Fence = idemkv.StatusPending, 42
	tests := []struct {
		name string
		cur  *idemkv.Record
		req  *idemkv.DecideApprovalRequest
		now  idemkv.Timestamp
		next *idemkv.Record
		err  error
	}{
		{name: "approve a waiting approval: approved, who, when and why kept", cur: waitingRec(), req: decideReq(), now: now, next: approvedRec()},
		{name: "deny: failed with approval_denied", cur: waitingRec(),
			req: decideReq(func(r *idemkv.DecideApprovalRequest) { r.Decision, r.Reason = idemkv.VerdictDeny, "not this one" }), now: now, next: deniedRec()},
		{name: "a second decision on an approved one: not_pending", cur: approvedRec(), req: decideReq(), now: now + 1, err: idemkv.ErrNotPending},
		{name: "a second decision on a denied one: not_pending", cur: deniedRec(), req: decideReq(), now: now + 1, err: idemkv.ErrNotPending},
		{name: "a decision on a consumed approval: not_pending", cur: consumed, req: decideReq(), now: now + 1, err: idemkv.ErrNotPending},
		{name: "a decision after the approval lapsed: not_pending", cur: waitingRec(), req: decideReq(), now: t0 + approvalTTL, err: idemkv.ErrNotPending},
		{name: "another approval id: fingerprint_mismatch", cur: waitingRec(),
			req: decideReq(func(r *idemkv.DecideApprovalRequest) { r.ApprovalID = "apr_41" }), now: now, err: idemkv.ErrFingerprintMismatch},
		{name: "another fingerprint: fingerprint_mismatch", cur: waitingRec(),
			req: decideReq(func(r *idemkv.DecideApprovalRequest) { r.Fingerprint = fpB }), now: now, err: idemkv.ErrFingerprintMismatch},
		{name: "a record that asked for none: not_pending", cur: pendingRec(), req: decideReq(), now: now, err: idemkv.ErrNotPending},
		{name: "absent: not_found", cur: nil, req: decideReq(), now: now, err: idemkv.ErrNotFound},
		{name: "past expires_at, its approval lapsed and unswept: not_pending", cur: waitingRec(), req: decideReq(), now: t0 + ttl, err: idemkv.ErrNotPending},
		{name: "record and approval expiring together (the defaults): not_pending", cur: waitingRec(func(r *idemkv.Record) { r.ExpiresAt = r.Approval.ExpiresAt }),
			req: decideReq(), now: t0 + approvalTTL, err: idemkv.ErrNotPending},
		{name: "past expires_at, another approval id: not_found", cur: waitingRec(),
			req: decideReq(func(r *idemkv.DecideApprovalRequest) { r.ApprovalID = "apr_41" }), now: t0 + ttl, err: idemkv.ErrNotFound},
		{name: "past expires_at, an approved one: not_found", cur: approvedRec(), req: decideReq(), now: t0 + ttl, err: idemkv.ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var before *idemkv.Record
			if tc.cur != nil {
				before = tc.cur.Clone()
			}
			next, err := DecideApproval(tc.cur, tc.req, tc.now)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if tc.next != nil {
				next = withoutEvent(t, "next", next, tc.cur.History, idemkv.HistoryEvent{At: tc.now, Event: idemkv.EventApprovalDecided,
					Actor: tc.req.Approver, Detail: string(tc.next.Approval.State) + " " + tc.req.ApprovalID + ": " + tc.req.Reason})
			}
			if !reflect.DeepEqual(next, tc.next) {
				t.Errorf("next:\n got %+v %+v\nwant %+v %+v", next, approvalOf(next), tc.next, approvalOf(tc.next))
			}
			if tc.cur != nil && !reflect.DeepEqual(tc.cur, before) {
				t.Errorf("DecideApproval mutated its input")
			}
		})
	}
}

// TestFencedOpsOnAwaitingRecord: nobody holds a fence of a record awaiting approval, so
// commit, fail, release, heartbeat and doubt are all not_pending, whatever fence they
// carry.
func TestFencedOpsOnAwaitingRecord(t *testing.T) {
	for _, cur := range []*idemkv.Record{waitingRec(), approvedRec()} {
		now := idemkv.Timestamp(t0 + 100)
		if _, _, err := DecideCommit(cur, commitReq(1), now); !errors.Is(err, idemkv.ErrNotPending) {
			t.Errorf("commit on %s: %v, want not_pending", cur.Approval.State, err)
		}
		if _, _, err := DecideFail(cur, &idemkv.FailRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Fence: 1}, now); !errors.Is(err, idemkv.ErrNotPending) {
			t.Errorf("fail on %s: %v", cur.Approval.State, err)
		}
		if _, err := DecideRelease(cur, &idemkv.ReleaseRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Fence: 1}, now); !errors.Is(err, idemkv.ErrNotPending) {
			t.Errorf("release on %s: %v", cur.Approval.State, err)
		}
		if _, err := DecideHeartbeat(cur, &idemkv.HeartbeatRequest{Tenant: tenant, Key: key, Fence: 1, LeaseTTLMs: lease}, now); !errors.Is(err, idemkv.ErrNotPending) {
			t.Errorf("heartbeat on %s: %v", cur.Approval.State, err)
		}
		if _, _, err := DecideDoubt(cur, &idemkv.DoubtRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Fence: 1}, now); !errors.Is(err, idemkv.ErrNotPending) {
			t.Errorf("doubt on %s: %v", cur.Approval.State, err)
		}
	}
}

// A waiting approval that lapsed leaves the key absent (docs/protocol.md section 7):
// every fenced operation on it is not_found, as on a key with no record.
func TestFencedOpsOnALapsedApprovalAreNotFound(t *testing.T) {
	cur := waitingRec()
	now := idemkv.Timestamp(t0 + approvalTTL)
	if _, _, err := DecideCommit(cur, commitReq(1), now); !errors.Is(err, idemkv.ErrNotFound) {
		t.Errorf("commit: %v, want not_found", err)
	}
	if _, _, err := DecideFail(cur, &idemkv.FailRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Fence: 1}, now); !errors.Is(err, idemkv.ErrNotFound) {
		t.Errorf("fail: %v", err)
	}
	if _, err := DecideRelease(cur, &idemkv.ReleaseRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Fence: 1}, now); !errors.Is(err, idemkv.ErrNotFound) {
		t.Errorf("release: %v", err)
	}
	if _, err := DecideHeartbeat(cur, &idemkv.HeartbeatRequest{Tenant: tenant, Key: key, Fence: 1, LeaseTTLMs: lease}, now); !errors.Is(err, idemkv.ErrNotFound) {
		t.Errorf("heartbeat: %v", err)
	}
	if _, _, err := DecideDoubt(cur, &idemkv.DoubtRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Fence: 1}, now); !errors.Is(err, idemkv.ErrNotFound) {
		t.Errorf("doubt: %v", err)
	}
}
