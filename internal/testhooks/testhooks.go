// Package testhooks holds the fault hooks that jepsen-lite uses to prove that its
// checkers can fail: a clock offset for the node's stamped time and sabotage modes that
// break a guarantee on purpose.
//
// The hooks exist only in a binary built with `-tags idemkv_testhooks`. In every other
// build Enabled is the constant false and every hook is a constant no-op that the
// compiler removes, so a production binary cannot be switched into a broken mode by an
// environment variable or a request. Server code calls the hooks unconditionally.
//
// With the tag, the hooks are set at start from the environment (EnvClockOffset,
// EnvSabotage) and changed at run time through the HTTP endpoints that Mount registers.
package testhooks

import (
	"fmt"
	"strings"
	"time"
)

// Mode is a set of sabotage modes.
type Mode uint32

const (
	// StaleReads makes a node answer linearizable reads from its local state, without
	// asking the leader for a read index.
	StaleReads Mode = 1 << iota
	// IgnoreFences makes the state machine accept a commit whatever fence it carries.
	IgnoreFences
	// EarlyAck makes a node acknowledge a write before Raft has committed it.
	EarlyAck
	// FailWrites makes every node answer every record write with 503 unavailable,
	// before doing anything: a cluster that makes no progress at all.
	FailWrites
	// InternalErrors makes the leader answer one record write in eight with 500
	// internal after the write went through.
	InternalErrors
	// EarlyRecover makes the leader store a quarter of the lease a reserve asked for
	// and answer as if the whole lease had been granted: another attempt recovers the
	// key while the holder still believes its lease live.
	EarlyRecover
	// OrphanEffects makes the leader turn one commit in five into a release of the
	// key and answer 503 unavailable: the effect happened downstream, and its record
	// is gone.
	OrphanEffects
	// SkipFailedRestore makes a node tell Raft that a snapshot restore succeeded when
	// it failed: the replica goes on from a wiped store (issue 12, defect 2, made
	// certain). jepsen-lite's storage nemesis must catch it.
	SkipFailedRestore
	// WedgeGap restores the code before the fix of issue 12's defect 1: a new leader
	// establishes with a barrier that never reaches the state machine, and a node whose
	// state machine trails an index by more than 64 entries is behind, however many of
	// them are no-ops and barriers: reads and /readyz wedged after about 32 elections
	// without a write. jepsen-lite's churn nemesis must catch it.
	WedgeGap
	// UnboundedClock restores the code before the fix of issue 12's defect 5: a node
	// stamps commands with its wall clock however far it jumped, so a leader minutes
	// ahead drags the state machine's clock along and, once reset, leases stop
	// running out. jepsen-lite's clock-jump nemesis must catch it.
	UnboundedClock
	// LocalPending makes every node answer a reserve of a pending record from its own
	// state, as it may for a committed or failed one (docs/protocol.md "Followers"):
	// a follower that has not applied the commit answers in_progress where the leader
	// replays. jepsen-lite's register workload must catch it behind a partition.
	LocalPending
	// UnanchoredStamps restores the code before the fix of issue 22's point 1: a node
	// that has applied no live entry since it started stamps with its wall clock, so a
	// node restarted with a clock hours fast that wins an election moves the state
	// machine clock by hours at once. jepsen-lite's clock-restart nemesis must catch it.
	UnanchoredStamps
	// LegacyListenPolicy restores the Raft listener's policy before the fix of issue
	// 22's point 7: one cap of 64 connections in their handshake, the newest refused
	// when it is reached, each held for up to 10 s. Idle sockets from a stranger keep
	// peers out and a new leader from being elected. jepsen-lite's Raft-port nemesis
	// must catch it.
	LegacyListenPolicy
	// UnboundApproval unbinds an approval from its effect: a reserve of another
	// fingerprint under a key whose approval was granted is proposed as if it carried
	// the approved fingerprint, so it gets execute and runs an effect nobody approved.
	// jepsen-lite's approvals workload must catch it.
	UnboundApproval
	// RotRaftLog makes a node's disk change what it stored, silently: the
	// RotEntry-th Raft log command a process writes is stored with one byte added to
	// its extensions, which neither Raft nor the state machine reads, so nothing but
	// raft-wal's verifier, which reads the entry back, can see it. jepsen-lite's check
	// of the nodes' logs for verifier mismatches must catch it.
	RotRaftLog
	// DropLateCommits makes the state machine acknowledge a commit that lands on a
	// pending record whose lease ran out and which nobody recovered (its fence is
	// still current, so the commit lands: docs/protocol.md section 1) and store
	// nothing: the receipt is answered, the record stays pending, and the next
	// reserve recovers it. jepsen-lite's check of acknowledged outcomes must catch it
	// (ack-then-executed).
	DropLateCommits
	// ReplayDropsResult makes a follower that answers a replay from its own state
	// (docs/protocol.md "Followers") leave the receipt's result out; the leader's
	// answers stay whole. jepsen-lite's receipt checks must catch it
	// (receipt-mismatch).
	ReplayDropsResult
	// UnboundedForwardClock removes only the upper bound of the stamp band
	// (fsm.BoundStamp's case wall.After(hi)): a leader whose clock jumps minutes ahead
	// stamps minutes ahead at once, while stamps still never fall behind the band, so
	// the state machine clock keeps moving after the reset and no lease freezes: every
	// lease live at the jump ends at once, and the next attempt is granted while its
	// holder still runs. jepsen-lite's clock-jump nemesis must catch it by real time
	// (clock-ahead, lease-cut-short), since every stamp agrees with every other.
	UnboundedForwardClock
	// CrashesAlone makes node n2 panic on a goroutine of its own once it has applied
	// CrashAfter entries since its process started, as a background goroutine (the
	// sweeper, a snapshot's persist) that dies would: quorum carries on and the run's
	// final heal starts n2 again. jepsen-lite must catch it (node-exited).
	CrashesAlone
	// ShortDefaultRetention makes the leader keep a record whose reserve left its
	// retention to the server (ttl_ms and expires_at absent, so the default filled in)
	// only as long as its lease, at least the shortest retention accepted
	// (--min-ttl): the default clamped as if it were a request below the minimum. A
	// committed receipt then expires seconds after it was acknowledged, and the key
	// may be granted again. jepsen-lite's agent checks must catch it (lost-receipt).
	ShortDefaultRetention
	// ApprovalRecoverExecutes makes the leader answer a recover of a record that an
	// approval let run with execute, the decision of the reserve that consumed the
	// approval: the new attempt runs the approved effect again as if it were the first
	// run (no probe), so one approval covers two executions. jepsen-lite's approvals
	// checks must catch it (approval-reused).
	ApprovalRecoverExecutes
	// LocalReplayAnyEffect makes a node that answers a reserve from its own state
	// (docs/protocol.md "Followers") replay a committed or failed record whatever
	// effect the reserve carries: the key is looked up and its outcome returned,
	// without comparing the tool and fingerprint. A call with other arguments is told
	// its effect happened. jepsen-lite's agent checks must catch it (missed-conflict,
	// missing-effect).
	LocalReplayAnyEffect
	// RedecideAnswersOK makes the state machine answer a decision on an approval
	// that was already decided (or consumed) as a retry of one that went through: the
	// record as it stands (200) instead of 409 not_pending, so a second approver is
	// told their approve or deny stood while the first decision did. jepsen-lite's
	// approvals checks must catch it (lost-decision).
	RedecideAnswersOK
	// CrossedReplays makes a node answer one local replay in eight with the receipt
	// of the local replay it answered before, as a pooled answer buffer handed to the
	// next request before the previous one was written would: a caller gets a receipt
	// of another key. jepsen-lite's agent checks must catch it (phantom-receipt).
	CrossedReplays
	// InProgressConflict makes the leader answer a reserve that finds the key held by
	// a live lease of the same effect (in_progress) with a conflict naming the
	// holder's fingerprint, the caller's own: a retried delivery is told another
	// effect owns the key and gives up. jepsen-lite's agent checks must catch it
	// (wrong-conflict).
	InProgressConflict
	// IgnoreDiskStall restores the node before its watch on its own log appends: a
	// leader whose disk stopped completing writes goes on sending heartbeats from
	// beside its held loop, no follower stands for election, and the cluster commits
	// nothing until the disk comes back. jepsen-lite's raft-log-stall fault must catch
	// it (stalled-leader-kept).
	IgnoreDiskStall
)

// CrashAfter is how many entries node n2 applies, from its process's start, before
// CrashesAlone makes it panic.
const CrashAfter = 2000

// RotEntry is the Raft log command that RotRaftLog changes on disk, counted from a
// process's start.
const RotEntry = 256

var modeNames = []struct {
	mode Mode
	name string
}{
	{StaleReads, "stale-reads"},
	{IgnoreFences, "ignore-fences"},
	{EarlyAck, "early-ack"},
	{FailWrites, "fail-writes"},
	{InternalErrors, "internal-errors"},
	{EarlyRecover, "early-recover"},
	{OrphanEffects, "orphan-effects"},
	{SkipFailedRestore, "skip-failed-restore"},
	{WedgeGap, "wedge-gap"},
	{UnboundedClock, "unbounded-clock"},
	{LocalPending, "local-pending"},
	{UnanchoredStamps, "unanchored-stamps"},
	{LegacyListenPolicy, "legacy-listen-policy"},
	{UnboundApproval, "unbound-approval"},
	{RotRaftLog, "rot-raft-log"},
	{DropLateCommits, "drop-late-commits"},
	{ReplayDropsResult, "replay-drops-result"},
	{UnboundedForwardClock, "unbounded-forward-clock"},
	{CrashesAlone, "crashes-alone"},
	{ShortDefaultRetention, "short-default-retention"},
	{ApprovalRecoverExecutes, "approval-recover-executes"},
	{LocalReplayAnyEffect, "local-replay-any-effect"},
	{RedecideAnswersOK, "redecide-answers-ok"},
	{CrossedReplays, "crossed-replays"},
	{InProgressConflict, "in-progress-conflict"},
	{IgnoreDiskStall, "ignore-disk-stall"},
}

// Environment variables read once at start by a binary built with the tag.
const (
	// EnvClockOffset is a Go duration ("-90s", "2m") added to the node's stamped time.
	EnvClockOffset = "IDEMKV_TESTHOOK_CLOCK_OFFSET"
	// EnvSabotage is a comma-separated list of sabotage mode names.
	EnvSabotage = "IDEMKV_TESTHOOK_SABOTAGE"
)

// Paths of the debug endpoints that Mount registers.
const (
	// PathHooks: GET returns the State; POST a StateUpdate changes it and returns the new State.
	PathHooks = "/debug/testhooks"
	// PathStateHash: GET returns the node's Snapshot of applied index and state hash.
	PathStateHash = "/debug/state-hash"
)

// State is what the hooks are set to, as it travels on PathHooks.
type State struct {
	ClockOffsetMs int64    `json:"clock_offset_ms"`
	Sabotage      []string `json:"sabotage"`
}

// StateUpdate changes the hooks; a nil field is left as it is.
type StateUpdate struct {
	ClockOffsetMs *int64    `json:"clock_offset_ms,omitempty"`
	Sabotage      *[]string `json:"sabotage,omitempty"`
}

// Snapshot is a node's replicated state in brief, for convergence checks: nodes that
// applied the same log have the same hash.
type Snapshot struct {
	AppliedIndex uint64 `json:"applied_index"`
	StateHash    string `json:"state_hash"`
}

// SnapshotFunc reads a node's Snapshot; the node supplies it to Mount.
type SnapshotFunc func() (Snapshot, error)

// String names the modes in m, comma-separated.
func (m Mode) String() string {
	var names []string
	for _, n := range modeNames {
		if m&n.mode != 0 {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ",")
}

// Names lists the names of the modes in m.
func (m Mode) Names() []string {
	names := []string{}
	for _, n := range modeNames {
		if m&n.mode != 0 {
			names = append(names, n.name)
		}
	}
	return names
}

// ParseModes parses mode names (each may itself be comma-separated); empty names are
// ignored, unknown ones are an error.
func ParseModes(names ...string) (Mode, error) {
	var m Mode
	for _, list := range names {
		for _, name := range strings.Split(list, ",") {
			name = strings.TrimSpace(name)
			if name == "" {
				continue
			}
			found := false
			for _, n := range modeNames {
				if n.name == name {
					m |= n.mode
					found = true
				}
			}
			if !found {
				return 0, fmt.Errorf("testhooks: unknown sabotage mode %q (known: %s)", name, AllModes)
			}
		}
	}
	return m, nil
}

// AllModes is every sabotage mode.
const AllModes = StaleReads | IgnoreFences | EarlyAck | FailWrites | InternalErrors | EarlyRecover | OrphanEffects | SkipFailedRestore | WedgeGap | UnboundedClock | LocalPending | UnanchoredStamps | LegacyListenPolicy | UnboundApproval | RotRaftLog | DropLateCommits | ReplayDropsResult | UnboundedForwardClock | CrashesAlone |
	ShortDefaultRetention | ApprovalRecoverExecutes | LocalReplayAnyEffect | RedecideAnswersOK | CrossedReplays | InProgressConflict | IgnoreDiskStall

// ParseClockOffset parses a clock offset as a Go duration; empty means zero.
func ParseClockOffset(s string) (time.Duration, error) {
	if strings.TrimSpace(s) == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("testhooks: clock offset %q: %w", s, err)
	}
	return d, nil
}
