package node

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	walmetrics "github.com/hashicorp/raft-wal/metrics"
	"github.com/hashicorp/raft-wal/verifier"
	"github.com/segmentio/fasthash/fnv1a"

	"github.com/idemkv/idemkv/fsm"
)

// DefaultRaftLogVerifyInterval is how often the leader appends a log checkpoint for
// raft-wal's verifier (Consul's default): each node then checksums the entries since
// the previous one, as written and as read back from its own log store, against the
// leader's. It catches a log store that silently lost or changed entries (a lost tail
// segment, a disk that returns other bytes) before a snapshot hides it.
const DefaultRaftLogVerifyInterval = time.Minute

// DefaultRaftLogVerifyEntries bounds a checkpoint's range: the leader also appends a
// checkpoint once this many entries followed its last one, so that no node reads back
// more at once. raft-wal read every entry back with a 64 KiB pread, about 4 µs here
// (walread.go now reads a page of it, 1.3 µs): a minute of writes at 10,000 entries a
// second took each node 1.8 s of CPU in one go, and halved a two-core machine's
// throughput for 6 s every minute. 16,384 entries are about 20 ms of it now.
const DefaultRaftLogVerifyEntries = 16384

// verifyPoll is how often, at most, the leader checks whether a range is due.
const verifyPoll = time.Second

// Results of a verified range (the result label of idemkv_raft_log_verifications_total).
const (
	logVerifyOK        = "ok"
	logVerifyMismatch  = "mismatch"
	logVerifyUnchecked = "unchecked"
)

// verifyLog puts raft-wal's verifier between Raft and store. The verifier closes the
// store it wraps when that is an io.Closer; the node closes its stores itself, so it
// gets the store without Close (keeping the promise of a monotonic log).
func (n *Node) verifyLog(store raft.LogStore) *verifier.LogStore {
	inner := keepMonotonic(n.raftLog, tailCutLog{logOnly{store}, &n.logCuts})
	n.verifiedLog = inner
	isCheckpoint := func(l *raft.Log) (bool, error) {
		return l.Type == raft.LogCommand && fsm.IsLogCheckpoint(l.Data), nil
	}
	return verifier.NewLogStore(inner, isCheckpoint, n.reportLogVerification, &walmetrics.NoOpCollector{})
}

// logOnly is a log store without its Close.
type logOnly struct{ raft.LogStore }

// tailCutLog records where Raft cut the tail of the log (tailCuts) before it cuts.
type tailCutLog struct {
	raft.LogStore
	cuts *tailCuts
}

func (l tailCutLog) DeleteRange(min, max uint64) error {
	if last, err := l.LogStore.LastIndex(); err == nil && max >= last {
		l.cuts.add(min)
	}
	return l.LogStore.DeleteRange(min, max)
}

// tailCuts remembers the last few indexes from which Raft deleted the tail of this
// node's log: a follower holding entries a new leader never had drops them and takes
// the leader's. raft-wal's verifier keeps its running checksum of what the node wrote
// across the cut, so the range the cut falls in reports "in-flight corruption" though
// the log now holds exactly the leader's entries (its read-back sum is the leader's).
// Such a range is unchecked, not a mismatch: it would send an operator to rebuild a
// healthy node.
type tailCuts struct {
	mu   sync.Mutex
	at   [8]uint64
	next int
}

func (c *tailCuts) add(index uint64) {
	c.mu.Lock()
	c.at[c.next%len(c.at)] = index
	c.next++
	c.mu.Unlock()
}

// within reports whether a cut fell in [start, end).
func (c *tailCuts) within(start, end uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range min(c.next, len(c.at)) {
		if c.at[i] >= start && c.at[i] < end {
			return true
		}
	}
	return false
}

// rewritten reports whether r is a mismatch of what this node wrote in a range whose
// tail Raft cut (a new leader's entries replacing others, or a snapshot install
// emptying the log), where the written sum proves nothing: the entries it reads back
// from log are the leader's, or are compacted away, as the verifier itself says of a
// range it cannot read back (ErrRangeMismatch: unchecked). (The verifier does not
// read a range back once the written sum differs, so this does.) Entries that read
// back otherwise than the leader wrote them stay a mismatch.
func (c *tailCuts) rewritten(r verifier.VerificationReport, log raft.LogStore) bool {
	var mismatch verifier.ErrChecksumMismatch
	if !errors.As(r.Err, &mismatch) || r.WrittenSum == r.ExpectedSum || !c.within(r.Range.Start, r.Range.End) {
		return false
	}
	sum, err := walRangeSum(log, r.Range.Start, r.Range.End)
	if errors.Is(err, raft.ErrLogNotFound) {
		return true
	}
	return err == nil && sum == r.ExpectedSum
}

// walRangeSum is the checksum raft-wal's verifier takes of the entries [start, end):
// FNV-1a over each entry's index, term, type, data and extensions, from zero (its
// bootstrap configuration counts as nothing). TestVerifierRangeRewrittenByANewLeaderIsNoMismatch
// holds it to the verifier's.
func walRangeSum(store raft.LogStore, start, end uint64) (uint64, error) {
	var sum uint64
	var l raft.Log
	for i := start; i < end; i++ {
		if err := store.GetLog(i, &l); err != nil {
			return 0, err
		}
		if l.Index == 1 && l.Type == raft.LogConfiguration {
			sum = 0
			continue
		}
		sum = fnv1a.AddUint64(sum, l.Index)
		sum = fnv1a.AddUint64(sum, l.Term)
		sum = fnv1a.AddUint64(sum, uint64(l.Type))
		sum = fnv1a.AddBytes64(sum, l.Data)
		if len(l.Extensions) > 0 {
			sum = fnv1a.AddBytes64(sum, l.Extensions)
		}
	}
	return sum, nil
}

// RaftLogMismatchMessage is the message of the ERROR line that reports a Raft log
// that differs from the leader's (jepsen-lite reads the nodes' logs for it).
const RaftLogMismatchMessage = "raft log verification failed: this node's raft log differs from the leader's; replace its data dir (docs/operations.md, \"The Raft log verifier\")"

// reportLogVerification logs and counts what the verifier found in one range. A
// mismatch means this node's log is not the leader's: docs/operations.md ("The Raft log
// verifier") says what to do.
func (n *Node) reportLogVerification(r verifier.VerificationReport) {
	var mismatch verifier.ErrChecksumMismatch
	switch {
	case n.logCuts.rewritten(r, n.verifiedLog):
		n.metrics.RaftLogVerifications.WithLabelValues(logVerifyUnchecked).Inc()
		n.log.Info("raft log range not verified: Raft cut this node's log inside it (a new leader's entries, a snapshot install), so its written checksum proves nothing, and what it reads back is the leader's or compacted",
			"range", r.Range.String())
	case errors.As(r.Err, &mismatch):
		n.metrics.RaftLogVerifications.WithLabelValues(logVerifyMismatch).Inc()
		n.log.Error(RaftLogMismatchMessage,
			"range", r.Range.String(), "err", r.Err, "expected_sum", r.ExpectedSum, "written_sum", r.WrittenSum, "read_sum", r.ReadSum)
	case errors.Is(r.Err, verifier.ErrRangeMismatch):
		// Compacted away before the check (a snapshot, or a node that started or
		// installed a snapshot inside the range): nothing left to compare.
		n.metrics.RaftLogVerifications.WithLabelValues(logVerifyUnchecked).Inc()
		n.log.Debug("raft log range not verified: compacted", "range", r.Range.String())
	case r.Err != nil:
		n.metrics.RaftLogVerifications.WithLabelValues(logVerifyUnchecked).Inc()
		n.log.Warn("raft log range not verified", "range", r.Range.String(), "err", r.Err)
	default:
		n.metrics.RaftLogVerifications.WithLabelValues(logVerifyOK).Inc()
		n.log.Debug("raft log range verified", "range", r.Range.String(), "elapsed", r.Elapsed)
	}
}

// watchLogChecksums appends a log checkpoint (fsm.OpLogCheckpoint) while this node
// leads: RaftLogVerifyInterval after the last one, or sooner once RaftLogVerifyEntries
// entries followed it. It is proposed as every command is, stamped: the stamp clock
// takes each entry the state machine applies for a fresh stamp.
func (n *Node) watchLogChecksums() {
	defer n.wg.Done()
	if n.verifier == nil {
		return
	}
	t := time.NewTicker(min(n.cfg.RaftLogVerifyInterval, verifyPoll))
	defer t.Stop()
	// The last checkpoint this node appended as leader, by index and time; zero while it
	// has not led, or lost the lead since.
	var lastIndex uint64
	var lastAt time.Time
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		if n.raft.State() != raft.Leader {
			lastIndex, lastAt = 0, time.Time{}
			continue
		}
		now, last := time.Now(), n.raft.LastIndex()
		if lastAt.IsZero() {
			// Newly leading: the interval counts from here; the entries from the start
			// of the log, so a log that already holds a whole range gets its checkpoint
			// at once.
			lastAt = now
		}
		if now.Sub(lastAt) < n.cfg.RaftLogVerifyInterval && last-lastIndex < uint64(n.cfg.RaftLogVerifyEntries) {
			continue
		}
		ctx, cancel := context.WithTimeout(n.ctx, n.cfg.ApplyTimeout)
		_, err := n.propose(ctx, &fsm.Command{Op: fsm.OpLogCheckpoint})
		cancel()
		if err != nil && n.ctx.Err() == nil {
			n.log.Warn("appending a raft log checkpoint", "err", err)
		}
		lastIndex, lastAt = last, now
	}
}
