package fsm

import (
	"fmt"

	"github.com/idemkv/idemkv"
)

// This file is the decision table of docs/protocol.md section 1, as pure functions: no I/O, no
// clock. The state machine feeds them the stored record, the request, the stamped time
// and the Raft index, and stores what they return. Nothing else in idemkv decides.
//
// Invariants they keep, which the rest of the system relies on:
//   - A record is visible only while now < expires_at; at or past it, it counts as
//     absent everywhere (Get, List, reserve, commit).
//   - A pending record never expires while its lease is live (expires_at >=
//     lease_expires_at), so the sweeper can never hand a key to a second attempt while
//     the first one still holds a lease.
//   - A lease only grows while the same fence holds it: idempotent reserves and
//     heartbeats never shorten it, so an in_progress answer stays true until the
//     lease_expires_at it reported.

// Expired reports whether rec counts as absent at now.
func Expired(rec *idemkv.Record, now idemkv.Timestamp) bool {
	return rec == nil || rec.ExpiresAt <= now
}

// Decide answers a reserve. next is the record to store, or nil when nothing changes;
// res.Record is the record as it stands after the decision. index is the Raft index of
// the entry, and becomes the fence of every new grant: it grows with every entry, so a
// fence is higher than any fence granted before for the same key, even across expiry.
//
// req must have its defaults filled (idemkv.ReserveRequest.EnsureDefaults, from the
// limits the node owns): Decide takes the lease and the TTL as given and owns no
// defaults, so that a changed default cannot be applied by two owners.
//
// Approvals (docs/protocol.md "Approvals") are rows of the same table: a request that
// requires one (req.Approval, with a server-side rule already folded in by the state
// machine) on an absent record stores a record awaiting approval instead of granting
// anything; a waiting approval that lapsed counts as absent.
func Decide(cur *idemkv.Record, req *idemkv.ReserveRequest, now idemkv.Timestamp, index uint64) (next *idemkv.Record, res *idemkv.ReserveResult) {
	return DecideOver(cur, nil, req, now, index)
}

// DecideOver is Decide on a key that may hold the tombstone of a record released
// before (tomb, nil: none). The tombstone never changes the decision: the key is absent
// whatever it holds. It only gives the record the reserve makes on the absent key its
// history to continue, as long as it lives (TombstoneExpired); the state machine
// deletes it once a record takes the key again.
func DecideOver(cur *idemkv.Record, tomb *idemkv.Tombstone, req *idemkv.ReserveRequest, now idemkv.Timestamp, index uint64) (next *idemkv.Record, res *idemkv.ReserveResult) {
	if Expired(cur, now) || (cur.Status == idemkv.StatusAwaitingApproval && cur.Approval.Lapsed(now)) {
		// A request that lapsed unanswered is absent, but its history is the key's
		// story: the new record continues it, as it does a released record's. An
		// expired record's is gone with it.
		prior := inherited{}
		if !Expired(cur, now) {
			prior = inherited{cur.History, cur.HistoryDropped}
		} else if !TombstoneExpired(tomb, now) {
			prior = inherited{tomb.History, tomb.HistoryDropped}
		}
		if req.Approval != nil && req.Approval.Required {
			next = askApproval(req, prior, now, index)
			return next, needsApproval(next)
		}
		lease := now + idemkv.Timestamp(req.LeaseTTLMs)
		next = &idemkv.Record{
			Tenant:         req.Tenant,
			Key:            req.Key,
			Fingerprint:    req.Fingerprint,
			Tool:           req.Tool,
			Actor:          req.Actor,
			Status:         idemkv.StatusPending,
			Fence:          index,
			AttemptID:      req.AttemptID,
			Attempts:       1,
			CreatedAt:      now,
			UpdatedAt:      now,
			LeaseExpiresAt: lease,
			ExpiresAt:      max(requestedExpiry(req, now), lease),
			Effect:         req.Effect,
			EffectMask:     req.EffectMask,
		}
		capExpiry(next, now)
		next.History, next.HistoryDropped = prior.events, prior.dropped
		next.AddEvent(grantEvent(idemkv.EventExecute, next, now, ""))
		return next, granted(idemkv.DecisionExecute, next)
	}
	if cur.Tool != req.Tool || cur.Fingerprint != req.Fingerprint {
		return nil, &idemkv.ReserveResult{Decision: idemkv.DecisionConflict, Conflict: conflictOf(cur, req), Record: cur}
	}
	if cur.Status.Terminal() {
		// A denied approval is a failed record: its receipt says approval_denied.
		return nil, &idemkv.ReserveResult{Decision: idemkv.DecisionReplay, Receipt: cur.Outcome(), Record: cur}
	}
	if cur.Status == idemkv.StatusAwaitingApproval {
		if cur.Approval == nil || cur.Approval.State != idemkv.ApprovalApproved {
			// Retries and resumes see the same request: the same approval id, never a
			// second card.
			return nil, needsApproval(cur)
		}
		// Approved: this reserve consumes the approval and runs the effect. Once
		// pending, the record follows the rows below, so recovering it after its
		// attempt died needs no second approval: the approval was of the operation,
		// not of an attempt.
		next = cur.Clone()
		next.Status = idemkv.StatusPending
		next.Fence = index
		next.AttemptID = req.AttemptID
		next.Actor = req.Actor
		next.Attempts = 1
		next.UpdatedAt = now
		next.LeaseExpiresAt = now + idemkv.Timestamp(req.LeaseTTLMs)
		next.ExpiresAt = max(cur.ExpiresAt, requestedExpiry(req, now), next.LeaseExpiresAt)
		capExpiry(next, now)
		next.AddEvent(grantEvent(idemkv.EventExecute, next, now, "approval "+cur.Approval.ID+" consumed"))
		return next, granted(idemkv.DecisionExecute, next)
	}
	if cur.InDoubt {
		// Nobody can learn the outcome by taking the key over, so nobody gets it: no
		// fence, no lease, no change. A caller with a probe looks the effect up and
		// resolves; one without returns in doubt at once. Before this row every retry
		// took a new fence and lease, blocked the next caller for a lease, and made
		// the fence an operator had noted stale.
		return nil, &idemkv.ReserveResult{Decision: idemkv.DecisionRecover, Record: cur}
	}
	switch {
	case req.AttemptID != "" && req.AttemptID == cur.AttemptID:
		// The same attempt asking again (its answer was lost): it keeps its fence,
		// even if its lease ran out meanwhile, since nobody else was granted one. It
		// gets the decision it was granted: an attempt that took over from a dead one
		// (attempts > 1) must still hear recover, or it would skip its probe.
		next = cur.Clone()
		next.UpdatedAt = now
		next.LeaseExpiresAt = max(cur.LeaseExpiresAt, now+idemkv.Timestamp(req.LeaseTTLMs))
		next.ExpiresAt = max(cur.ExpiresAt, requestedExpiry(req, now), next.LeaseExpiresAt)
		capExpiry(next, now)
		d := idemkv.DecisionExecute
		if cur.Attempts > 1 {
			d = idemkv.DecisionRecover
		}
		return next, granted(d, next)
	case cur.LeaseExpiresAt > now:
		return nil, &idemkv.ReserveResult{Decision: idemkv.DecisionInProgress, LeaseExpiresAt: cur.LeaseExpiresAt, Record: cur}
	default:
		// The holder's lease ran out: its outcome is unknown, so the new owner gets a
		// fence that makes any late commit of the old attempt fail with fenced.
		next = cur.Clone()
		next.Fence = index
		next.AttemptID = req.AttemptID
		next.Actor = req.Actor
		next.Attempts++
		next.UpdatedAt = now
		next.LeaseExpiresAt = now + idemkv.Timestamp(req.LeaseTTLMs)
		next.ExpiresAt = max(cur.ExpiresAt, requestedExpiry(req, now), next.LeaseExpiresAt)
		capExpiry(next, now)
		// The replaced attempt and its actor are in the event before, as long as it
		// is kept; the fence names it either way.
		next.AddEvent(grantEvent(idemkv.EventRecover, next, now, fmt.Sprintf("replaced fence %d", cur.Fence)))
		return next, granted(idemkv.DecisionRecover, next)
	}
}

// askApproval is the record of a new approval request: no fence, no lease, the
// effect's canonical JSON kept for the approver. Its id names the entry that asked,
// so a request after this one lapsed or was swept gets another id. The record lives at
// least as long as the request may wait.
func askApproval(req *idemkv.ReserveRequest, prior inherited, now idemkv.Timestamp, index uint64) *idemkv.Record {
	ask := req.Approval
	a := &idemkv.Approval{
		ID:          ApprovalID(index),
		State:       idemkv.ApprovalWaiting,
		Summary:     ask.Summary,
		RequestedAt: now,
		ExpiresAt:   now + idemkv.Timestamp(ask.TTLMs),
		ByRule:      ask.ByRule,
	}
	next := &idemkv.Record{
		Tenant:      req.Tenant,
		Key:         req.Key,
		Fingerprint: req.Fingerprint,
		Tool:        req.Tool,
		Actor:       req.Actor,
		Status:      idemkv.StatusAwaitingApproval,
		CreatedAt:   now,
		UpdatedAt:   now,
		ExpiresAt:   max(requestedExpiry(req, now), a.ExpiresAt),
		Approval:    a,
		Effect:      req.Effect,
		EffectMask:  req.EffectMask,
	}
	capExpiry(next, now)
	a.ExpiresAt = min(a.ExpiresAt, next.ExpiresAt)
	next.History, next.HistoryDropped = prior.events, prior.dropped
	detail := "approval " + a.ID
	if a.ByRule {
		detail += " (required by a rule)"
	}
	if a.Summary != "" {
		detail += ": " + a.Summary
	}
	next.AddEvent(idemkv.HistoryEvent{At: now, Event: idemkv.EventApprovalRequested, AttemptID: req.AttemptID, Actor: req.Actor, Detail: detail})
	return next
}

// inherited is the history a new record takes over: that of a record whose approval
// lapsed unanswered, or of a live tombstone; none otherwise. The new record's own first
// event then goes after it, and AddEvent keeps the latest MaxHistory.
type inherited struct {
	events  []idemkv.HistoryEvent
	dropped uint32
}

// TombstoneExpired reports whether t counts as gone at now: like a record, at or past
// its expires_at (the one its record had).
func TombstoneExpired(t *idemkv.Tombstone, now idemkv.Timestamp) bool {
	return t == nil || t.ExpiresAt <= now
}

// tombstoneOf is what cur, deleted by ev (its release, or a resolve not executed),
// leaves of itself: its history with ev appended, until cur's expires_at. A record that
// keeps no history (HasHistory, the one predicate) leaves none: nil.
func tombstoneOf(cur *idemkv.Record, ev idemkv.HistoryEvent) *idemkv.Tombstone {
	if !cur.HasHistory() {
		return nil
	}
	h, dropped := cur.WithEvent(ev)
	return &idemkv.Tombstone{Tenant: cur.Tenant, Key: cur.Key, Tool: cur.Tool, Fingerprint: cur.Fingerprint,
		ReleasedAt: ev.At, ExpiresAt: cur.ExpiresAt, History: h, HistoryDropped: dropped}
}

// ReleaseTombstone is the tombstone of cur, released at now by the attempt holding it
// (DecideRelease said to delete it); nil when cur keeps no history.
func ReleaseTombstone(cur *idemkv.Record, now idemkv.Timestamp) *idemkv.Tombstone {
	return tombstoneOf(cur, endEvent(idemkv.EventRelease, cur, now, cur.Actor, "the effect did not happen"))
}

// NotExecutedTombstone is the tombstone of cur, resolved not executed at now by req
// (DecideResolve said to delete it); nil when cur keeps no history.
func NotExecutedTombstone(cur *idemkv.Record, req *idemkv.ResolveRequest, now idemkv.Timestamp) *idemkv.Tombstone {
	return tombstoneOf(cur, endEvent(idemkv.EventResolve, cur, now, req.By, "not executed"))
}

// grantEvent is the event of a grant (execute, recover) that made rec as it is now.
func grantEvent(kind idemkv.EventKind, rec *idemkv.Record, now idemkv.Timestamp, detail string) idemkv.HistoryEvent {
	return idemkv.HistoryEvent{At: now, Event: kind, Fence: rec.Fence, AttemptID: rec.AttemptID, Actor: rec.Actor, Detail: detail}
}

// endEvent is the event of an end of ownership (commit, fail, doubt) by the attempt
// that holds cur, with actor as who ended it.
func endEvent(kind idemkv.EventKind, cur *idemkv.Record, now idemkv.Timestamp, actor, detail string) idemkv.HistoryEvent {
	return idemkv.HistoryEvent{At: now, Event: kind, Fence: cur.Fence, AttemptID: cur.AttemptID, Actor: actor, Detail: detail}
}

// receiptDetail names a receipt in an event: where the effect landed.
func receiptDetail(system, id string) string {
	if id == "" {
		return system
	}
	return system + " " + id
}

// ApprovalID is the id of the approval asked for by the log entry at index.
func ApprovalID(index uint64) string { return fmt.Sprintf("apr_%d", index) }

func needsApproval(rec *idemkv.Record) *idemkv.ReserveResult {
	a := *rec.Approval
	return &idemkv.ReserveResult{Decision: idemkv.DecisionNeedsApproval, Approval: &a, Record: rec}
}

func granted(d idemkv.Decision, rec *idemkv.Record) *idemkv.ReserveResult {
	return &idemkv.ReserveResult{Decision: d, Fence: rec.Fence, AttemptID: rec.AttemptID,
		LeaseExpiresAt: rec.LeaseExpiresAt, Record: rec}
}

func conflictOf(cur *idemkv.Record, req *idemkv.ReserveRequest) *idemkv.Conflict {
	c := &idemkv.Conflict{
		Status:              string(idemkv.DecisionConflict),
		Reason:              idemkv.ReasonDifferentEffect,
		ExistingFingerprint: cur.Fingerprint,
		ReceivedFingerprint: req.Fingerprint,
	}
	if cur.Tool != req.Tool {
		c.Reason = idemkv.ReasonDifferentTool
		c.ExistingTool = cur.Tool
		c.ReceivedTool = req.Tool
	}
	if cur.Status == idemkv.StatusCommitted && cur.Receipt != nil {
		c.ExistingRemoteID = cur.Receipt.RemoteID
	}
	return c
}

// requestedExpiry is expires_at when the caller set one, else now + ttl_ms.
func requestedExpiry(req *idemkv.ReserveRequest, now idemkv.Timestamp) idemkv.Timestamp {
	if req.ExpiresAt != 0 {
		return req.ExpiresAt
	}
	return now + idemkv.Timestamp(req.TTLMs)
}

// checkOwner applies the rules shared by commit, fail, release and heartbeat. fp is ""
// for heartbeat, which carries no fingerprint.
//
// A fence higher than the record's was never granted for this key: fences are Raft
// indexes of grants, the record holds the latest grant, and a key reserved again after
// a release or expiry gets a higher fence still. Such a fence can only come from a
// client bug or a forged request; accepting it would let a caller that never reserved
// complete someone else's attempt, so it is fenced like a stale one.
func checkOwner(cur *idemkv.Record, fp string, fence uint64, now idemkv.Timestamp) error {
	if Expired(cur, now) || (cur.Status == idemkv.StatusAwaitingApproval && cur.Approval.Lapsed(now)) {
		// An approval that lapsed unanswered leaves the key absent, as a reserve sees it.
		return fmt.Errorf("%w: no live record for this key", idemkv.ErrNotFound)
	}
	if fp != "" && fp != cur.Fingerprint {
		return fmt.Errorf("%w: the record holds %s", idemkv.ErrFingerprintMismatch, cur.Fingerprint)
	}
	if cur.Status == idemkv.StatusAwaitingApproval {
		// No attempt was granted, so no fence can own it.
		return fmt.Errorf("%w: the record awaits approval and no attempt holds it", idemkv.ErrNotPending)
	}
	switch {
	case fence < cur.Fence:
		return fmt.Errorf("%w: fence %d is older than the current fence %d", idemkv.ErrFenced, fence, cur.Fence)
	case fence > cur.Fence:
		return fmt.Errorf("%w: fence %d was never granted for this key (current %d)", idemkv.ErrFenced, fence, cur.Fence)
	}
	return nil
}

// DecideCommit stores the receipt of the attempt holding req.Fence. next is nil when
// nothing changes. A commit carrying the fence of a record that is already terminal gets
// the stored outcome back, whichever it is: the first outcome wins.
func DecideCommit(cur *idemkv.Record, req *idemkv.CommitRequest, now idemkv.Timestamp) (next *idemkv.Record, receipt *idemkv.Receipt, err error) {
	if err := checkOwner(cur, req.Fingerprint, req.Fence, now); err != nil {
		return nil, nil, err
	}
	if cur.Status.Terminal() {
		return nil, cur.Outcome(), nil
	}
	next = cur.Clone()
	next.Status = idemkv.StatusCommitted
	next.UpdatedAt = now
	next.LeaseExpiresAt = 0
	// The holder of an in-doubt record's fence may still learn its outcome and
	// commit it; a terminal record is never in doubt.
	next.InDoubt, next.InDoubtSince = false, 0
	next.Receipt = &idemkv.StoredReceipt{
		RemoteSystem: req.RemoteSystem,
		RemoteID:     req.RemoteID,
		RemoteURL:    req.RemoteURL,
		Result:       req.Result,
		CommittedAt:  now,
	}
	next.AddEvent(endEvent(idemkv.EventCommit, cur, now, cur.Actor, receiptDetail(req.RemoteSystem, req.RemoteID)))
	return next, next.Outcome(), nil
}

// DecideFail stores a permanent failure for the attempt holding req.Fence. rec is the
// record after the call; next is nil when nothing changes (a retried fail, or a fail
// after the record was committed with the same fence: the stored outcome stands).
func DecideFail(cur *idemkv.Record, req *idemkv.FailRequest, now idemkv.Timestamp) (next, rec *idemkv.Record, err error) {
	if err := checkOwner(cur, req.Fingerprint, req.Fence, now); err != nil {
		return nil, nil, err
	}
	if cur.Status.Terminal() {
		return nil, cur, nil
	}
	next = cur.Clone()
	next.Status = idemkv.StatusFailed
	next.UpdatedAt = now
	next.LeaseExpiresAt = 0
	next.InDoubt, next.InDoubtSince = false, 0
	errInfo := req.Error
	next.Error = &errInfo
	next.AddEvent(endEvent(idemkv.EventFail, cur, now, cur.Actor, errInfo.Code+": "+errInfo.Message))
	return next, next, nil
}

// DecideRelease reports whether the record must be deleted: the attempt holding
// req.Fence says its effect certainly did not happen. A stale fence is fenced even on a
// terminal record (a newer attempt owns the key, which is what the caller must learn);
// the current fence on a terminal record is not_pending.
func DecideRelease(cur *idemkv.Record, req *idemkv.ReleaseRequest, now idemkv.Timestamp) (release bool, err error) {
	if err := checkOwner(cur, req.Fingerprint, req.Fence, now); err != nil {
		return false, err
	}
	if cur.Status.Terminal() {
		return false, fmt.Errorf("%w: the record is %s", idemkv.ErrNotPending, cur.Status)
	}
	return true, nil
}

// DecideHeartbeat extends the lease of the attempt holding req.Fence to now +
// LeaseTTLMs, which the proposer filled (idemkv.HeartbeatRequest.EnsureDefaults). It
// never shortens the lease (see the invariants above) and pushes expires_at along when
// the lease would outlive it. A heartbeat after the lease ran out still lands when
// nobody recovered the key: the fence is still current.
func DecideHeartbeat(cur *idemkv.Record, req *idemkv.HeartbeatRequest, now idemkv.Timestamp) (next *idemkv.Record, err error) {
	if err := checkOwner(cur, "", req.Fence, now); err != nil {
		return nil, err
	}
	if cur.Status.Terminal() {
		return nil, fmt.Errorf("%w: the record is %s", idemkv.ErrNotPending, cur.Status)
	}
	if cur.InDoubt {
		// No attempt runs an in-doubt record's tool, so there is no lease to keep.
		return nil, fmt.Errorf("%w: the record is in doubt; only a resolve settles it", idemkv.ErrNotPending)
	}
	next = cur.Clone()
	next.UpdatedAt = now
	next.LeaseExpiresAt = max(cur.LeaseExpiresAt, now+idemkv.Timestamp(req.LeaseTTLMs))
	next.ExpiresAt = max(cur.ExpiresAt, next.LeaseExpiresAt)
	capExpiry(next, now)
	return next, nil
}

// capExpiry holds lease_expires_at and expires_at to now + idemkv.CeilingTTL. The
// request was validated against the node's limits, but a command is decided on every
// replica from whatever the log carries: an older node's, or one whose arithmetic
// overflowed, must not store a timestamp that no longer formats as RFC 3339.
func capExpiry(rec *idemkv.Record, now idemkv.Timestamp) {
	ceiling := now + idemkv.Timestamp(idemkv.CeilingTTL.Milliseconds())
	rec.LeaseExpiresAt = min(rec.LeaseExpiresAt, ceiling)
	rec.ExpiresAt = min(rec.ExpiresAt, ceiling)
}

// DecideDoubt marks the pending record held by req.Fence in doubt: its holder cannot
// learn whether the effect happened (a recover without a probe). From then on its lease
// does not matter; only a resolve settles it. next is nil when nothing changes: the
// record is already in doubt (a retried doubt keeps the first in_doubt_since).
func DecideDoubt(cur *idemkv.Record, req *idemkv.DoubtRequest, now idemkv.Timestamp) (next, rec *idemkv.Record, err error) {
	if err := checkOwner(cur, req.Fingerprint, req.Fence, now); err != nil {
		return nil, nil, err
	}
	if cur.Status.Terminal() {
		return nil, nil, fmt.Errorf("%w: the record is %s", idemkv.ErrNotPending, cur.Status)
	}
	if cur.InDoubt {
		return nil, cur, nil
	}
	next = cur.Clone()
	next.InDoubt = true
	next.InDoubtSince = now
	next.UpdatedAt = now
	next.LeaseExpiresAt = 0
	next.AddEvent(endEvent(idemkv.EventDoubt, cur, now, cur.Actor, "the attempt cannot learn whether the effect happened"))
	return next, next, nil
}

// DecideResolve settles an in-doubt record without a fence: an operator (or a caller
// whose probe answered) says the effect happened, with its receipt, or did not.
// Committed: next is the committed record and receipt its outcome. Not executed:
// release is true and the record is deleted. Anything but a pending, in-doubt record
// with this fingerprint is refused: not_found, fingerprint_mismatch or not_pending.
func DecideResolve(cur *idemkv.Record, req *idemkv.ResolveRequest, now idemkv.Timestamp) (next *idemkv.Record, receipt *idemkv.Receipt, release bool, err error) {
	if Expired(cur, now) {
		return nil, nil, false, fmt.Errorf("%w: no live record for this key", idemkv.ErrNotFound)
	}
	if req.Fingerprint != cur.Fingerprint {
		return nil, nil, false, fmt.Errorf("%w: the record holds %s", idemkv.ErrFingerprintMismatch, cur.Fingerprint)
	}
	if cur.Status.Terminal() || !cur.InDoubt {
		state := string(cur.Status)
		if !cur.Status.Terminal() {
			state = "pending and not in doubt (its attempt may still be running)"
		}
		return nil, nil, false, fmt.Errorf("%w: only an in-doubt record can be resolved; this one is %s", idemkv.ErrNotPending, state)
	}
	switch req.Outcome {
	case idemkv.ResolveNotExecuted:
		return nil, nil, true, nil
	case idemkv.ResolveCommitted:
		next = cur.Clone()
		next.Status = idemkv.StatusCommitted
		next.InDoubt, next.InDoubtSince = false, 0
		next.UpdatedAt = now
		next.LeaseExpiresAt = 0
		next.Receipt = &idemkv.StoredReceipt{
			RemoteSystem: req.RemoteSystem,
			RemoteID:     req.RemoteID,
			RemoteURL:    req.RemoteURL,
			Result:       req.Result,
			CommittedAt:  now,
		}
		next.AddEvent(endEvent(idemkv.EventResolve, cur, now, req.By, "committed: "+receiptDetail(req.RemoteSystem, req.RemoteID)))
		return next, next.Outcome(), false, nil
	default:
		return nil, nil, false, idemkv.Invalid("outcome", "outcome must be %q or %q", idemkv.ResolveCommitted, idemkv.ResolveNotExecuted)
	}
}

// DecideApproval approves or denies the approval cur waits for. The decision binds to
// the approval id and the fingerprint the approver saw: another id (a later request
// after this one lapsed) or another effect is fingerprint_mismatch, and an approval
// that is no longer waiting (decided, consumed or lapsed) is not_pending. Approved:
// the record waits for the reserve that consumes it. Denied: the record is failed with
// approval_denied, which every retry replays.
func DecideApproval(cur *idemkv.Record, req *idemkv.DecideApprovalRequest, now idemkv.Timestamp) (next *idemkv.Record, err error) {
	if Expired(cur, now) {
		// A record lives at least as long as its approval, and by default exactly as
		// long: a decision at or after that moment met not_found, where section 7
		// says an approval that lapsed is not_pending. Until the sweep takes the
		// record, the approval it names is known to have lapsed.
		if cur != nil {
			if a := cur.Approval; a != nil && a.ID == req.ApprovalID && a.State == idemkv.ApprovalWaiting && a.Lapsed(now) {
				return nil, fmt.Errorf("%w: approval %s expired unanswered at %s, and its record with it", idemkv.ErrNotPending, a.ID, a.ExpiresAt)
			}
		}
		return nil, fmt.Errorf("%w: no live record for this key", idemkv.ErrNotFound)
	}
	a := cur.Approval
	if a == nil {
		return nil, fmt.Errorf("%w: the record asked for no approval (it is %s)", idemkv.ErrNotPending, cur.Status)
	}
	if req.ApprovalID != a.ID {
		return nil, fmt.Errorf("%w: the record holds approval %s, not %s", idemkv.ErrFingerprintMismatch, a.ID, req.ApprovalID)
	}
	if req.Fingerprint != cur.Fingerprint {
		return nil, fmt.Errorf("%w: approval %s is of %s", idemkv.ErrFingerprintMismatch, a.ID, cur.Fingerprint)
	}
	switch {
	case a.State != idemkv.ApprovalWaiting:
		return nil, fmt.Errorf("%w: approval %s was already %s by %s at %s", idemkv.ErrNotPending, a.ID, a.State, a.Approver, a.DecidedAt)
	case a.Lapsed(now):
		return nil, fmt.Errorf("%w: approval %s expired unanswered at %s", idemkv.ErrNotPending, a.ID, a.ExpiresAt)
	}
	next = cur.Clone()
	next.UpdatedAt = now
	next.Approval.Approver = req.Approver
	next.Approval.Reason = req.Reason
	next.Approval.DecidedAt = now
	switch req.Decision {
	case idemkv.VerdictApprove:
		next.Approval.State = idemkv.ApprovalApproved
	case idemkv.VerdictDeny:
		next.Approval.State = idemkv.ApprovalDenied
		next.Status = idemkv.StatusFailed
		next.Error = idemkv.DeniedError(req.Approver, req.Reason)
	default:
		return nil, idemkv.Invalid("decision", "decision must be %q or %q", idemkv.VerdictApprove, idemkv.VerdictDeny)
	}
	detail := string(next.Approval.State) + " " + a.ID
	if req.Reason != "" {
		detail += ": " + req.Reason
	}
	next.AddEvent(idemkv.HistoryEvent{At: now, Event: idemkv.EventApprovalDecided, Actor: req.Approver, Detail: detail})
	return next, nil
}
