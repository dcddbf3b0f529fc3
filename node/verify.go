package node

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/raft"
	walmetrics "github.com/hashicorp/raft-wal/metrics"
	"github.com/hashicorp/raft-wal/verifier"

	"github.com/idemkv/idemkv/fsm"
)

// DefaultRaftLogVerifyInterval is how often the leader appends a log checkpoint for
// raft-wal's verifier (Consul's default): each node then checksums the entries since
// the previous one, as written and as read back from its own log store, against the
// leader's. It catches a log store that silently lost or changed entries (a lost tail
// segment, a disk that returns other bytes) before a snapshot hides it.
const DefaultRaftLogVerifyInterval = time.Minute

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
	inner := keepMonotonic(n.raftLog, logOnly{store})
	isCheckpoint := func(l *raft.Log) (bool, error) {
		return l.Type == raft.LogCommand && fsm.IsLogCheckpoint(l.Data), nil
	}
	return verifier.NewLogStore(inner, isCheckpoint, n.reportLogVerification, &walmetrics.NoOpCollector{})
}

// logOnly is a log store without its Close.
type logOnly struct{ raft.LogStore }

// reportLogVerification logs and counts what the verifier found in one range. A
// mismatch means this node's log is not the leader's: docs/operations.md ("The Raft log
// verifier") says what to do.
func (n *Node) reportLogVerification(r verifier.VerificationReport) {
	var mismatch verifier.ErrChecksumMismatch
	switch {
	case errors.As(r.Err, &mismatch):
		n.metrics.RaftLogVerifications.WithLabelValues(logVerifyMismatch).Inc()
		n.log.Error("raft log verification failed: this node's raft log differs from the leader's; replace its data dir (docs/operations.md, \"The Raft log verifier\")",
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

// watchLogChecksums appends a log checkpoint (fsm.OpLogCheckpoint) every
// RaftLogVerifyInterval while this node leads. It is proposed as every command is,
// stamped: the stamp clock takes each entry the state machine applies for a fresh
// stamp.
func (n *Node) watchLogChecksums() {
	defer n.wg.Done()
	if n.verifier == nil {
		return
	}
	t := time.NewTicker(n.cfg.RaftLogVerifyInterval)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		if n.raft.State() != raft.Leader {
			continue
		}
		ctx, cancel := context.WithTimeout(n.ctx, n.cfg.ApplyTimeout)
		_, err := n.propose(ctx, &fsm.Command{Op: fsm.OpLogCheckpoint})
		cancel()
		if err != nil && n.ctx.Err() == nil {
			n.log.Warn("appending a raft log checkpoint", "err", err)
		}
	}
}
