package node

import (
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// appendWatch is Raft's log store as Raft calls it, noting when an append began that
// has not returned. Raft appends on its main loop, one batch at a time, so one mark
// is enough.
//
// It exists for a leader whose disk stopped completing writes. Its loop waits in the
// append for good, while hashicorp/raft's heartbeats, sent on goroutines beside that
// loop, keep telling the followers it is there: none stands for election, and the
// cluster commits nothing until the disk comes back (TestLeaderWithAStuckDiskGivesWay).
// The transport asks it before every append and heartbeat it sends.
type appendWatch struct {
	raft.LogStore
	since  atomic.Int64 // the append in flight: nanoseconds since contactBase, +1; 0: none
	limit  time.Duration
	log    *slog.Logger
	warned atomic.Bool // the held append is logged
}

// newAppendWatch watches s, calling an append held for longer than limit stalled.
func newAppendWatch(s raft.LogStore, limit time.Duration, log *slog.Logger) *appendWatch {
	return &appendWatch{LogStore: s, limit: limit, log: log}
}

// errOwnDiskStalled is what the transport answers Raft for an RPC it did not send.
var errOwnDiskStalled = errors.New("node: not sent: this node's own log append is held past the stall limit (a disk that stopped completing writes)")

func (w *appendWatch) begin() { w.since.Store(int64(time.Since(contactBase)) + 1) }

func (w *appendWatch) end() {
	w.since.Store(0)
	// A load first: every append ends here, and a swap would write the shared flag.
	if w.warned.Load() && w.warned.Swap(false) {
		w.log.Warn("the held log append completed; sending to peers again")
	}
}

func (w *appendWatch) StoreLog(l *raft.Log) error {
	w.begin()
	defer w.end()
	return w.LogStore.StoreLog(l)
}

func (w *appendWatch) StoreLogs(ls []*raft.Log) error {
	w.begin()
	defer w.end()
	return w.LogStore.StoreLogs(ls)
}

// IsMonotonic passes on what the store under it says: Raft asks, and a raft-wal
// store must be emptied before a snapshot install rather than cut.
func (w *appendWatch) IsMonotonic() bool {
	m, ok := w.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// held reports whether an append has been in flight for longer than the limit.
func (w *appendWatch) held() bool {
	s := w.since.Load()
	if s == 0 || ignoreDiskStall() {
		return false
	}
	d := time.Since(contactBase) - time.Duration(s-1)
	if d <= w.limit {
		return false
	}
	if !w.warned.Swap(true) {
		w.log.Error("a log append has been held past the stall limit: sending no appends or heartbeats, so that the others can elect a leader whose disk works",
			"held", d.Round(time.Millisecond), "limit", w.limit)
	}
	return true
}

// appendStallLimit is how long this node's own log append may be held before it stops
// sending appends and heartbeats: five election timeouts, and never under
// minAppendStallLimit (5 s either way by default), far past any fsync of a disk that
// still works, and short of what a person notices as an outage.
func (n *Node) appendStallLimit() time.Duration {
	return max(5*n.cfg.ElectionTimeout, minAppendStallLimit)
}

// minAppendStallLimit is the least stall limit. How long a disk that works may take
// over one append does not shrink with the election timeout, which is tuned to the
// network: at five election timeouts alone, a cluster tuned to 200 ms called a
// 1.5 s append stalled, and its leader, whose disk was slow but worked, stopped sending
// heartbeats during each one, and lost its leadership over and over
// (TestLeaderWithASlowDiskKeepsLeading).
const minAppendStallLimit = 5 * time.Second
