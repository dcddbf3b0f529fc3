//go:build idemkv_testhooks

package node

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
	"github.com/idemkv/idemkv/internal/connlimit"
	"github.com/idemkv/idemkv/internal/testhooks"
	"github.com/idemkv/idemkv/storage"
)

// earlyAck is the EarlyAck sabotage of the test build (internal/testhooks): it answers
// a write from the leader's local state, as if the entry it has just handed to Raft
// were already committed and applied, and does not wait for the quorum. jepsen-lite
// must catch it. The fence it reports is a guess (the next log index), and a second
// write to the same key before the first applies is answered from the same state.
// Outside the sabotage, and for writes it does not speculate on, handled is false and
// the write takes the normal path.
func (n *Node) earlyAck(cmd *fsm.Command) (res *fsm.Result, handled bool, err error) {
	if !testhooks.Sabotaged(testhooks.EarlyAck) {
		return nil, false, nil
	}
	get := func(tenant, key string) *idemkv.Record {
		rec, err := n.fsm.Get(tenant, key, cmd.Now)
		if err != nil && !errors.Is(err, idemkv.ErrNotFound) {
			return nil
		}
		return rec
	}
	switch cmd.Op {
	case fsm.OpReserve:
		_, r := fsm.Decide(get(cmd.Reserve.Tenant, cmd.Reserve.Key), cmd.Reserve, cmd.Now, n.raft.LastIndex()+1)
		return &fsm.Result{Reserve: r}, true, nil
	case fsm.OpCommit:
		_, rc, err := fsm.DecideCommit(get(cmd.Commit.Tenant, cmd.Commit.Key), cmd.Commit, cmd.Now)
		return &fsm.Result{Receipt: rc}, true, err
	case fsm.OpFail:
		_, rec, err := fsm.DecideFail(get(cmd.Fail.Tenant, cmd.Fail.Key), cmd.Fail, cmd.Now)
		return &fsm.Result{Record: rec}, true, err
	case fsm.OpRelease:
		released, err := fsm.DecideRelease(get(cmd.Release.Tenant, cmd.Release.Key), cmd.Release, cmd.Now)
		return &fsm.Result{Released: released}, true, err
	}
	return nil, false, nil
}

// raftFSM is the state machine as Raft sees it: in this build the FSM behind the
// IgnoreFences, DropLateCommits, RedecideAnswersOK and SkipFailedRestore sabotages,
// which live here, at the apply seam, so that fsm itself stays free of test hooks.
func (n *Node) raftFSM() raft.FSM {
	return applySaboteur{FSM: n.fsm, log: n.log, id: n.cfg.ID, applied: new(atomic.Uint64)}
}

// applySaboteur is the FSM as Raft drives it in the test build.
type applySaboteur struct {
	*fsm.FSM
	log     *slog.Logger
	id      string
	applied *atomic.Uint64 // entries applied since the process started (CrashesAlone)
}

// crashAlone is CrashesAlone: node n2 panics on a goroutine of its own once it has
// applied testhooks.CrashAfter entries since its process started.
func (s applySaboteur) crashAlone(n int) {
	if !testhooks.Sabotaged(testhooks.CrashesAlone) || s.id != "n2" {
		return
	}
	if after := s.applied.Add(uint64(n)); after >= testhooks.CrashAfter && after-uint64(n) < testhooks.CrashAfter {
		go panic(fmt.Sprintf("sabotage crashes-alone: %s dies on a goroutine of its own after %d entries", s.id, after))
	}
}

// Apply and ApplyBatch apply as the FSM does. Under IgnoreFences a commit whose fence
// is not the record's current one is rewritten to carry the current fence before the
// FSM sees it, so the decision table accepts it: a stale holder completes someone
// else's attempt. A commit whose record is gone, expired or of another fingerprint is
// refused as before: the decision table checks those ahead of the fence. Under
// DropLateCommits a commit that would land on a lease that ran out is applied as a
// commit nobody was granted (refused, nothing stored) and answered with the receipt it
// would have stored. While a sabotage is on, entries apply one at a time, so the
// record read for an entry includes every entry before it; every replica decides the
// same from the same log, so the replicas stay alike.
func (s applySaboteur) Apply(l *raft.Log) any { return s.ApplyBatch([]*raft.Log{l})[0] }

func (s applySaboteur) ApplyBatch(logs []*raft.Log) []any {
	s.crashAlone(len(logs))
	ignore, drop := testhooks.Sabotaged(testhooks.IgnoreFences), testhooks.Sabotaged(testhooks.DropLateCommits)
	redecide := testhooks.Sabotaged(testhooks.RedecideAnswersOK)
	if !ignore && !drop && !redecide {
		return s.FSM.ApplyBatch(logs)
	}
	out := make([]any, len(logs))
	for i, l := range logs {
		if ignore {
			l = s.ignoreFence(l)
		}
		var acked *idemkv.Receipt
		if drop {
			l, acked = s.dropLateCommit(l)
		}
		out[i] = s.FSM.ApplyBatch([]*raft.Log{l})[0]
		if res, ok := out[i].(*fsm.Result); ok && acked != nil && errors.Is(res.Err, idemkv.ErrFenced) {
			out[i] = &fsm.Result{Receipt: acked}
		}
		if redecide {
			out[i] = s.redecideAnswersOK(l, out[i])
		}
	}
	return out
}

// redecideAnswersOK is RedecideAnswersOK: the answer to a decision on an approval that
// no longer waits (decided, consumed) is the record as it stands, as if the decision
// were a retry of one that went through, not not_pending. Only the answer changes,
// which every replica computes alike; nothing is stored.
func (s applySaboteur) redecideAnswersOK(l *raft.Log, out any) any {
	res, ok := out.(*fsm.Result)
	if !ok || !errors.Is(res.Err, idemkv.ErrNotPending) || l.Type != raft.LogCommand {
		return out
	}
	cmd, err := fsm.DecodeCommand(l.Data)
	if err != nil || cmd.Op != fsm.OpDecideApproval || cmd.Approval == nil {
		return out
	}
	cur, err := s.FSM.Get(cmd.Approval.Tenant, cmd.Approval.Key, max(s.FSM.Clock(), cmd.Now))
	if err != nil || cur.Approval == nil || cur.Approval.ID != cmd.Approval.ApprovalID {
		return out
	}
	s.log.Warn("sabotage redecide-answers-ok: answering a decision on an approval already decided with success",
		"approval_id", cur.Approval.ID, "state", cur.Approval.State, "decision", cmd.Approval.Decision)
	return &fsm.Result{Record: cur}
}

// dropLateCommit returns l, or, when l is a commit that lands on a pending record
// whose lease ran out (nobody recovered it: the fence is still current), a copy of it
// with a fence never granted, which the state machine refuses and stores nothing of,
// and the receipt the commit would have stored.
func (s applySaboteur) dropLateCommit(l *raft.Log) (*raft.Log, *idemkv.Receipt) {
	if l.Type != raft.LogCommand || l.Index <= s.FSM.AppliedIndex() {
		return l, nil
	}
	cmd, err := fsm.DecodeCommand(l.Data)
	if err != nil || cmd.Op != fsm.OpCommit {
		return l, nil
	}
	now := max(s.FSM.Clock(), cmd.Now)
	cur, err := s.FSM.Get(cmd.Commit.Tenant, cmd.Commit.Key, now)
	if err != nil || cur.Status != idemkv.StatusPending || cur.InDoubt || cur.Fence != cmd.Commit.Fence || cur.LeaseExpiresAt > now {
		return l, nil
	}
	_, receipt, err := fsm.DecideCommit(cur, cmd.Commit, now)
	if err != nil {
		return l, nil
	}
	c := *cmd.Commit
	c.Fence = cur.Fence + 1
	cmd.Commit = &c
	data, err := cmd.AppendBinary(nil)
	if err != nil {
		return l, nil
	}
	s.log.Warn("sabotage drop-late-commits: acknowledging a commit on a lease that ran out and storing nothing", "fence", cur.Fence,
		"lease_expired_ms_ago", now-cur.LeaseExpiresAt)
	cp := *l
	cp.Data = data
	return &cp, receipt
}

// ignoreFence returns l, or a copy of it whose commit carries the record's fence.
func (s applySaboteur) ignoreFence(l *raft.Log) *raft.Log {
	if l.Type != raft.LogCommand {
		return l
	}
	cmd, err := fsm.DecodeCommand(l.Data)
	if err != nil || cmd.Op != fsm.OpCommit {
		return l
	}
	cur, err := s.FSM.Get(cmd.Commit.Tenant, cmd.Commit.Key, cmd.Now)
	if err != nil || cur.Fence == cmd.Commit.Fence {
		return l
	}
	c := *cmd.Commit
	c.Fence = cur.Fence
	cmd.Commit = &c
	data, err := cmd.AppendBinary(nil)
	if err != nil {
		return l
	}
	s.log.Warn("sabotage ignore-fences: accepting a commit with fence", "fence", cmd.Commit.Fence, "current", cur.Fence)
	cp := *l
	cp.Data = data
	return &cp
}

// unbindApproval is the UnboundApproval sabotage of the test build, at the reserve
// seam of the leader: a reserve of another fingerprint under a key whose approval was
// granted is proposed as if it carried the approved fingerprint and tool, so it gets
// execute and its caller runs an effect nobody approved. Outside the sabotage r is
// returned as it is.
func (n *Node) unbindApproval(r *idemkv.ReserveRequest) *idemkv.ReserveRequest {
	if !testhooks.Sabotaged(testhooks.UnboundApproval) {
		return r
	}
	cur, err := n.fsm.Get(r.Tenant, r.Key, n.now())
	if err != nil || cur.Status != idemkv.StatusAwaitingApproval || cur.Approval == nil ||
		cur.Approval.State != idemkv.ApprovalApproved || cur.Fingerprint == r.Fingerprint {
		return r
	}
	n.log.Warn("sabotage unbound-approval: executing another effect under an approval", "approved", cur.Fingerprint, "received", r.Fingerprint)
	c := *r
	c.Fingerprint, c.Tool = cur.Fingerprint, cur.Tool
	return &c
}

// Restore answers a failed snapshot restore with success while the SkipFailedRestore
// sabotage is on, and puts the state machine where the code before issue 12's defect 2
// left it: an empty store at applied index 0 that goes on applying (it restores an
// empty snapshot, which also lifts the halt a failed restore now causes).
func (s applySaboteur) Restore(rc io.ReadCloser) error {
	err := s.FSM.Restore(rc)
	if err != nil && testhooks.Sabotaged(testhooks.SkipFailedRestore) {
		s.log.Error("sabotage skip-failed-restore: reporting a failed restore as done, on an empty store", "err", err)
		empty, eerr := emptySnapshot()
		if eerr == nil {
			eerr = s.FSM.Restore(io.NopCloser(bytes.NewReader(empty)))
		}
		if eerr != nil {
			s.log.Error("sabotage skip-failed-restore: could not wipe the store", "err", eerr)
		}
		return nil
	}
	return err
}

// emptySnapshot is the snapshot stream of a store with nothing in it.
func emptySnapshot() ([]byte, error) {
	dir, err := os.MkdirTemp("", "idemkv-empty-snapshot-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	st, err := storage.Open(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	defer st.Close()
	sn := st.NewSnapshot()
	defer sn.Close()
	var buf bytes.Buffer
	if _, err := sn.WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// wedgeGap and establishByBarrier are the WedgeGap sabotage of the test build, the
// code before the fix of issue 12's defect 1: a new leader establishes with a Raft
// barrier, which never reaches the state machine, and the state machine counts as
// behind an index more than 64 entries ahead of it whatever those entries are. That
// code had no quiet-period clock tick either (tickClock), whose writes would end the
// wedge within Config.ClockTick and hide it from the churn family's probe.
func (n *Node) wedgeGap(index uint64) bool {
	return testhooks.Sabotaged(testhooks.WedgeGap) && index > n.fsm.AppliedIndex()+64
}

func (n *Node) establishByBarrier() bool { return testhooks.Sabotaged(testhooks.WedgeGap) }

// unboundedClock is the UnboundedClock sabotage of the test build, the code before the
// fix of issue 12's defect 5: stamps follow the wall clock wherever it jumps (never
// behind the previous stamp).
func unboundedClock() bool { return testhooks.Sabotaged(testhooks.UnboundedClock) }

// unanchoredStamps is the UnanchoredStamps sabotage of the test build, the code before
// the fix of issue 22's point 1: until it applies a live entry, a node stamps with its
// wall clock (never behind the state machine clock), so a node restarted with a clock
// hours fast moves the state machine clock by hours with its first stamp.
func unanchoredStamps() bool { return testhooks.Sabotaged(testhooks.UnanchoredStamps) }

// unboundedForwardClock is the UnboundedForwardClock sabotage of the test build: the
// stamp band of fsm.BoundStamp without its upper bound, so a wall clock ahead of the
// band is stamped as it reads, while one behind it is still held to the band. It lives
// here, at the seam where a node stamps, so that fsm.BoundStamp stays pure.
func unboundedForwardClock() bool { return testhooks.Sabotaged(testhooks.UnboundedForwardClock) }

// sabotageLocalAnswer is the seam where a node answers a reserve from its own state
// (docs/protocol.md "Followers"), in the test build: cur is the record the answer was
// decided from, res the answer. Outside the sabotages below res is returned as it is.
//
//   - LocalReplayAnyEffect: a conflict with a committed or failed record is answered
//     as its replay, as a lookup by key that never compares the effect would.
//   - ReplayDropsResult: a follower's replay receipt, and the record it carries, lose
//     their result (the leader's stay whole).
//   - CrossedReplays: one local replay in eight is answered with the answer of the
//     local replay before it, of another key, as a pooled answer buffer handed to the
//     next request before the previous one was written would.
func (n *Node) sabotageLocalAnswer(cur *idemkv.Record, res *idemkv.ReserveResult) *idemkv.ReserveResult {
	if res == nil {
		return res
	}
	if testhooks.Sabotaged(testhooks.LocalReplayAnyEffect) && res.Decision == idemkv.DecisionConflict && cur.Status.Terminal() {
		res = &idemkv.ReserveResult{Decision: idemkv.DecisionReplay, Receipt: cur.Outcome(), Record: cur}
	}
	res = n.crossReplay(cur, res)
	return n.replayDropsResult(res)
}

// lastReplay is the local replay answered last, for CrossedReplays: one process is one
// node.
var lastReplay atomic.Pointer[idemkv.ReserveResult]

// crossReplay is CrossedReplays.
func (n *Node) crossReplay(cur *idemkv.Record, res *idemkv.ReserveResult) *idemkv.ReserveResult {
	if !testhooks.Sabotaged(testhooks.CrossedReplays) || res.Decision != idemkv.DecisionReplay {
		return res
	}
	prev := lastReplay.Swap(res)
	if prev == nil || prev.Record == nil || prev.Record.Key == cur.Key || mrand.IntN(8) != 0 {
		return res
	}
	n.log.Warn("sabotage crossed-replays: answering a replay with another key's", "key", cur.Key, "answered", prev.Record.Key)
	return prev
}

// replayDropsResult is ReplayDropsResult.
func (n *Node) replayDropsResult(res *idemkv.ReserveResult) *idemkv.ReserveResult {
	if !testhooks.Sabotaged(testhooks.ReplayDropsResult) || res.Decision != idemkv.DecisionReplay ||
		n.raft.State() == raft.Leader {
		return res
	}
	c := *res
	if c.Receipt != nil {
		rc := *c.Receipt
		rc.Result = nil
		c.Receipt = &rc
	}
	if c.Record != nil && c.Record.Receipt != nil {
		c.Record = c.Record.Clone() // the record may be the state machine's own
		c.Record.Receipt.Result = nil
	}
	return &c
}

// localPending is the LocalPending sabotage of the test build: a node answers reserves
// of pending records from its own state too (in_progress, conflict), which a follower
// that has not applied the latest entries gets wrong.
func localPending() bool { return testhooks.Sabotaged(testhooks.LocalPending) }

// The listener's policy before issue 22, point 7: one cap on pending handshakes, the
// newest connection refused when it is reached, each held for up to 10 s.
const (
	legacyMaxPending       = 64
	legacyHandshakeTimeout = 10 * time.Second
)

// admitLegacy is the LegacyListenPolicy sabotage of the test build: under it the Raft
// listener admits c by the old policy (handled is true); otherwise it admits by its
// own.
func (g *guardedListener) admitLegacy(c net.Conn) (admitted, handled bool) {
	if !testhooks.Sabotaged(testhooks.LegacyListenPolicy) {
		return false, false
	}
	g.mu.Lock()
	full := len(g.pending) >= legacyMaxPending
	if !full {
		g.seq++
		p := &pendingConn{conn: c, source: connlimit.Source(c.RemoteAddr()), seq: g.seq}
		g.pending[c] = p
		g.bySource[p.source] = append(g.bySource[p.source], p)
	}
	g.mu.Unlock()
	if full {
		c.Close()
		g.count(closedRefused)
	}
	return !full, true
}

// legacyHandshake is the handshake bound: 10 s under the LegacyListenPolicy sabotage,
// d otherwise.
func legacyHandshake(d time.Duration) time.Duration {
	if testhooks.Sabotaged(testhooks.LegacyListenPolicy) {
		return legacyHandshakeTimeout
	}
	return d
}

// ignoreDiskStall is the IgnoreDiskStall sabotage: the node keeps sending appends and
// heartbeats while its own log append is held.
func ignoreDiskStall() bool { return testhooks.Sabotaged(testhooks.IgnoreDiskStall) }
