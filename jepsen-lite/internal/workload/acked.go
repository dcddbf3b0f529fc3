package workload

import (
	"fmt"
	"maps"
	"slices"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// CheckAcknowledged holds the short-lease and approvals workloads to their
// acknowledged outcomes, as the register's model and durability check hold the
// register workload (whose model knows no time) and CheckAgents the agents.
//
// A commit, a fail or a denial answered with success stored a terminal record, and a
// terminal record changes only by expiring (docs/protocol.md section 1). So every
// answer to an operation begun after the acknowledgement came back either shows that
// record, with exactly the receipt acknowledged (a replay, a retried commit, a
// conflict, a read), or shows a record made after it expired. A record's created_at
// is the stamp of the entry that made it, and the state machine clock never runs
// backwards, so a record made after the acknowledged one expired was created at or
// past its expires_at; anything else it shows (the key granted again under the
// acknowledged fence or another, pending, awaiting an approval, or another outcome)
// is AnomalyAckThenExecuted. The expires_at is the largest any answer showed for the
// acknowledged record: it only grows, so it is a bound from below, and no record
// that may have legitimately replaced the acknowledged one is ever flagged.
//
// The final read after the heal must show the acknowledged record too, unless it may
// have expired by then: the short-lease records live 3 s, the approvals' an hour.
// That is judged by the harness's clock, since the final read's answer carries no
// time: the state machine clock runs at most fsm.ClockSlew faster than real time, and
// the check allows twice that, plus finalReadSlack, from the stamp of the first grant
// of the run.
//
// An operation whose outcome is unknown acknowledged nothing and refused nothing: it
// is judged by the answers of others.

// Anomaly kinds of CheckAcknowledged.
const (
	// AnomalyAckThenExecuted: after a commit, fail or denial was acknowledged, an
	// operation begun later saw the key in another state before the record's
	// expires_at: granted again (execute or recover), pending, awaiting an approval,
	// or with another outcome stored.
	AnomalyAckThenExecuted = "ack-then-executed"
	// AnomalyLostAcknowledgedWrite: the final read of a key does not show the
	// outcome acknowledged, and the record cannot have expired (the register
	// workload's kind, for these workloads' final reads).
	AnomalyLostAcknowledgedWrite = "lost-acknowledged-write"
)

// finalReadSlack is added to the bound on the state machine clock at a final read.
const finalReadSlack = 30_000 // ms

// ackedWorkloads are the workloads CheckAcknowledged judges.
var ackedWorkloads = map[string]bool{"lease": true, "approvals": true}

// acked is one acknowledged outcome.
type acked struct {
	op *history.Op
	// fence names the record (a fence is the Raft index of a grant, unique per
	// key); a denied approval's record, never granted, is named by its approval id.
	fence    uint64
	approval string
	receipt  *history.Receipt
	// expires is the largest expires_at any answer showed for the record.
	expires int64
}

// holds reports whether r is the record a acknowledged an outcome of.
func (a *acked) holds(r *history.Record) bool {
	if a.fence != 0 {
		return r.Fence == a.fence
	}
	return r.Fence == 0 && a.approval != "" && r.ApprovalID == a.approval
}

// outcomeOf is the receipt a terminal record replays.
func outcomeOf(r *history.Record) *history.Receipt {
	rc := &history.Receipt{Status: r.Status, Fingerprint: r.Fingerprint, RemoteID: r.RemoteID, RemoteURL: r.RemoteURL,
		ResultDigest: r.ResultDigest, ErrorCode: r.ErrorCode, CommittedAt: r.CommittedAt}
	if r.Status == string(idemkv.StatusFailed) {
		rc.CommittedAt = r.UpdatedAt
	}
	return rc
}

// ackOf returns the outcome op acknowledged, or nil.
func ackOf(op *history.Op) *acked {
	if op.Type != history.OK || op.Out == nil || op.Out.Err != "" {
		return nil
	}
	rec := op.Out.Record
	switch {
	case op.F == history.FCommit && op.Out.Receipt != nil:
		return &acked{op: op, fence: op.In.Fence, receipt: op.Out.Receipt}
	case op.F == history.FFail && rec != nil && rec.Status == string(idemkv.StatusFailed):
		return &acked{op: op, fence: op.In.Fence, receipt: outcomeOf(rec)}
	case op.F == history.FDecide && op.In.Verdict == string(idemkv.VerdictDeny) && rec != nil && rec.Status == string(idemkv.StatusFailed):
		return &acked{op: op, fence: rec.Fence, approval: rec.ApprovalID, receipt: outcomeOf(rec)}
	}
	return nil
}

// CheckAcknowledged judges the short-lease and approvals workloads' acknowledged
// outcomes (see above).
func CheckAcknowledged(ops []history.Op) []AgentAnomaly {
	var out []AgentAnomaly
	add := func(kind, key, format string, args ...any) {
		out = append(out, AgentAnomaly{Kind: kind, Key: key, Detail: fmt.Sprintf(format, args...)})
	}
	clockBound := stateClockBound(ops)
	byKey := map[string][]*history.Op{}
	for i := range ops {
		if op := &ops[i]; ackedWorkloads[op.Workload] {
			byKey[op.Key] = append(byKey[op.Key], op)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(byKey)) {
		list := byKey[key]
		var acks []*acked
		for _, op := range list {
			if a := ackOf(op); a != nil {
				acks = append(acks, a)
			}
		}
		for _, a := range acks {
			for _, op := range list {
				if r := answered(op); r != nil && a.holds(r) {
					a.expires = max(a.expires, r.ExpiresAt)
				}
			}
		}
		for _, a := range acks {
			// One anomaly of each kind per acknowledged outcome, at the first answer
			// that betrays it; the others are counted.
			first, more := map[string]string{}, map[string]int{}
			var kinds []string
			note := func(kind, detail string) {
				if _, seen := first[kind]; seen {
					more[kind]++
					return
				}
				first[kind] = detail
				kinds = append(kinds, kind)
			}
			for _, op := range list {
				if op.Call <= a.op.Return || op.Type != history.OK || op.Out == nil {
					continue
				}
				if op.In.Final && op.F == history.FGet {
					if kind, detail := judgeFinal(a, op, clockBound); kind != "" {
						note(kind, fmt.Sprintf("the final read (op %d) %s", op.ID, detail))
					}
					continue
				}
				if op.Out.Err != "" {
					continue
				}
				if kind, detail := judgeLater(a, op); kind != "" {
					note(kind, fmt.Sprintf("op %d (%s, begun after) %s", op.ID, op.F, detail))
				}
			}
			for _, kind := range kinds {
				add(kind, key, "op %d acknowledged %s %s at fence %d (committed_at %d, expires_at >= %d); %s, and %d later answers alike",
					a.op.ID, a.receipt.Status, a.receipt.RemoteID+a.receipt.ErrorCode, a.fence, a.receipt.CommittedAt, a.expires, first[kind], more[kind])
			}
		}
	}
	return out
}

// answered is the record op's answer shows, if any.
func answered(op *history.Op) *history.Record {
	if op.Type != history.OK || op.Out == nil || op.Out.Err != "" {
		return nil
	}
	return op.Out.Record
}

// judgeLater judges an answer to an operation begun after a came back.
func judgeLater(a *acked, op *history.Op) (kind, detail string) {
	r, rc := op.Out.Record, op.Out.Receipt
	switch {
	case r != nil && a.holds(r):
		if r.Status != a.receipt.Status {
			return AnomalyAckThenExecuted, fmt.Sprintf("shows the record %s (decision %q)", r.Status, op.Out.Decision)
		}
		if got := outcomeOf(r); !got.Same(a.receipt) {
			return AnomalyReceiptMismatch, "shows the record with " + describeReceipt(got)
		}
		if rc != nil && !rc.Same(a.receipt) {
			return AnomalyReceiptMismatch, "replays " + describeReceipt(rc)
		}
	case r != nil:
		if a.expires != 0 && r.CreatedAt < a.expires {
			return AnomalyAckThenExecuted, fmt.Sprintf("shows another record (decision %q, %s, fence %d, created_at %d) before the acknowledged one expired",
				op.Out.Decision, r.Status, r.Fence, r.CreatedAt)
		}
	case rc != nil && op.F == history.FCommit && a.fence != 0 && op.In.Fence == a.fence:
		if !rc.Same(a.receipt) {
			return AnomalyReceiptMismatch, "a retried commit answered " + describeReceipt(rc)
		}
	case rc != nil && op.F == history.FCommit:
		// Another fence's commit succeeded: its record replaced the acknowledged one.
		if a.expires != 0 && rc.CommittedAt < a.expires {
			return AnomalyAckThenExecuted, fmt.Sprintf("committed fence %d (%s) before the acknowledged record expired", op.In.Fence, describeReceipt(rc))
		}
	}
	return "", ""
}

// judgeFinal judges the final read op of a's key; bound is the bound on the state
// machine clock at a time of the run (ok false: unknown).
func judgeFinal(a *acked, op *history.Op, bound func(int64) (int64, bool)) (kind, detail string) {
	if limit, ok := bound(op.Return); !ok || a.expires == 0 || limit >= a.expires {
		return "", "" // it may have expired
	}
	r := answered(op)
	switch {
	case r == nil:
		return AnomalyLostAcknowledgedWrite, "answered " + op.Out.Err
	case !a.holds(r) || r.Status != a.receipt.Status:
		return AnomalyLostAcknowledgedWrite, fmt.Sprintf("shows %s at fence %d", r.Status, r.Fence)
	case !outcomeOf(r).Same(a.receipt):
		return AnomalyReceiptMismatch, "shows " + describeReceipt(outcomeOf(r))
	}
	return "", ""
}

// stateClockBound returns a bound from above on the state machine clock at a time of
// the run (ok false when the history has no grant to start from): the stamp of the
// first grant invoked, which is no earlier than the state machine clock when it was
// invoked, plus twice (1 + fsm.ClockSlew) the real time since, plus finalReadSlack:
// the state machine clock runs at most fsm.ClockSlew faster than real time.
func stateClockBound(ops []history.Op) func(t int64) (int64, bool) {
	var first *history.Op
	for i := range ops {
		op := &ops[i]
		if op.F != history.FReserve || op.Type != history.OK || op.Out == nil || op.Out.Err != "" || op.Out.Record == nil ||
			(op.Out.Decision != string(idemkv.DecisionExecute) && op.Out.Decision != string(idemkv.DecisionRecover)) {
			continue
		}
		if first == nil || op.Call < first.Call {
			first = op
		}
	}
	rate := 2 * (1 + fsm.ClockSlew)
	return func(t int64) (int64, bool) {
		if first == nil {
			return 0, false
		}
		elapsedMs := float64(t-first.Call) / 1e6
		return first.Out.Record.UpdatedAt + int64(rate*elapsedMs) + finalReadSlack, true
	}
}
