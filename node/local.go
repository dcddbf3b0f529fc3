package node

import (
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
)

// LocalAnswerMargin is how far past this node's time a committed or failed record's
// expires_at must lie for the node to answer a replay of it, or a conflict with it,
// from its own applied state: no read index, no leader (docs/protocol.md "Followers").
//
// Why such an answer is linearizable: a terminal record changes only when it expires
// (every decision of fsm leaves it as it is; a reserve or a sweep replaces or deletes
// it only once the state machine clock reaches its expires_at). A node that applied it
// knows it was committed, and it is still the committed record as long as no entry
// committed so far was stamped at or past expires_at. The node cannot see the entries
// it has not applied yet, so it bounds their stamps by time. Stamps follow the
// leaders' wall clocks, never faster than fsm.ClockSlew past the time that went by, so
// the state machine clock runs at most one node's clock offset ahead of real time;
// this node's wall clock is at most its own offset behind real time. The margin covers
// both at 30 s each, far beyond the NTP-synchronised clocks that docs/expiry.md asks
// for. How far a follower lags does not enter: its wall clock, not the state it
// applied, says what time it is (localNow). Each clock's half is also the largest
// offset between this node's wall clock and the state machine clock (as the node
// measured it at the stamps it applied) at which it still answers locally: beyond it,
// one of the two is off by more than the margin allows, and the node cannot tell
// which (issue 22, point 2). Config.LocalAnswerMargin overrides it.
const LocalAnswerMargin = time.Minute

// localRefusal says why this node may not answer from its own state now, or "" if it
// may. The margin's argument needs the clocks it assumes: a node that has applied no
// live entry since it started has measured nothing, a follower that has heard no
// leader for longer than the margin may miss entries stamped past expires_at, an
// offset measured longer than the margin ago says nothing of now, and one beyond half
// the margin breaks the argument (Config.LocalAnswerMargin, default
// LocalAnswerMargin). A follower cut off from its leader also applies nothing, so its
// offset ages too: the lost contact, the cause, is named first.
func (n *Node) localRefusal() string {
	margin := n.cfg.LocalAnswerMargin
	s := n.clock.state()
	if !s.Anchored {
		return "unanchored"
	}
	if n.raft.State() != raft.Leader {
		if lc := n.raft.LastContact(); lc.IsZero() || time.Since(lc) > margin {
			return "no_leader_contact"
		}
	}
	switch {
	case !s.Measured || s.Age > margin:
		return "offset_unmeasured"
	case s.Offset > margin/2 || s.Offset < -margin/2:
		return "offset_beyond_margin"
	}
	return ""
}

// ClockInfo is this node's clock as GET /v1/cluster shows it.
func (n *Node) ClockInfo() *idemkv.ClockInfo {
	s := n.clock.state()
	ci := &idemkv.ClockInfo{Anchored: s.Anchored, LocalAnswersOff: n.localRefusal()}
	ci.LocalAnswers = ci.LocalAnswersOff == ""
	if s.Measured {
		off, ago := s.Offset.Milliseconds(), s.Age.Milliseconds()
		ci.OffsetMs, ci.MeasuredAgoMs = &off, &ago
	}
	return ci
}

// ReserveLocal answers req from this node's applied state when the answer is a replay
// of, or a conflict with, a committed or failed record that expires more than
// LocalAnswerMargin after this node's time, on a leader and a follower alike. ok is
// false otherwise, an invalid request included: the reserve then goes the leader's way
// (Reserve on the leader, a forward from a follower), which also answers its errors.
func (n *Node) ReserveLocal(req *idemkv.ReserveRequest) (res *idemkv.ReserveResult, ok bool) {
	r, err := n.reserveRequest(req)
	if err != nil {
		return nil, false
	}
	res = n.answerLocally(r)
	return explain(res, req), res != nil
}

// answerLocally is ReserveLocal for a request already checked by reserveRequest; nil
// when the state does not settle the answer. The decision is fsm.Decide's.
func (n *Node) answerLocally(r *idemkv.ReserveRequest) *idemkv.ReserveResult {
	if n.localRefusal() != "" {
		return nil
	}
	cur, err := n.fsm.Lookup(r.Tenant, r.Key, n.localNow())
	if err != nil || cur == nil {
		// Absent or expired (only the leader may grant it), or a halted state
		// machine, whose store may be empty or behind: none is answered here.
		return nil
	}
	return n.decideLocally(cur, r)
}

// answerFrom is answerLocally for cur, the record as this node's state holds it
// (live at the state machine's time at least): nil unless the node may answer from it
// by itself now.
func (n *Node) answerFrom(cur *idemkv.Record, r *idemkv.ReserveRequest) *idemkv.ReserveResult {
	if n.localRefusal() != "" {
		return nil
	}
	return n.decideLocally(cur, r)
}

// decideLocally is the decision of answerLocally and answerFrom once localRefusal
// let the node answer: nil unless cur settles the reserve without changing.
func (n *Node) decideLocally(cur *idemkv.Record, r *idemkv.ReserveRequest) *idemkv.ReserveResult {
	now := n.localNow()
	if !(cur.Status.Terminal() || localPending()) || cur.ExpiresAt <= now+idemkv.Timestamp(n.cfg.LocalAnswerMargin.Milliseconds()) {
		return nil
	}
	next, res := fsm.Decide(cur, r, now, 0)
	if next != nil || n.fsm.Err() != nil {
		// A decision that would change the record goes through the log; and a state
		// machine that halted while the record was read answers nothing.
		return nil
	}
	n.metrics.LocalAnswers.WithLabelValues(string(res.Decision)).Inc()
	return n.sabotageLocalAnswer(cur, res) // sabotages of the test build; res itself elsewhere
}

// localNow is the time a local answer is judged at: the latest of this node's wall
// clock, its bounded stamp clock and the state machine clock. The wall clock has to be
// in it: a follower that catches up applies old entries live, which anchors its stamp
// clock (and its state machine clock) at their old stamps, while the cluster's clock
// moved on by as much as the follower lags.
func (n *Node) localNow() idemkv.Timestamp {
	return max(idemkv.TimestampOf(n.clock.wall()), n.now())
}
