package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/fsm"
	"github.com/idemkv/idemkv/metrics"
)

// Limits returns the limits this node enforces, defaults filled: the node owns them,
// and the HTTP layer asks for them rather than keeping a copy that could disagree.
func (n *Node) Limits() idemkv.Limits { return n.cfg.Limits }

// Reserve asks for the right to run an effect (docs/protocol.md section 1). A replay
// of, or a conflict with, a committed or failed record is answered from this node's
// state, on any node (see ReserveLocal); anything else needs the leader, and a follower
// refuses it with ErrNotLeader.
func (n *Node) Reserve(ctx context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
	begin := time.Now()
	r, err := n.reserveRequest(req)
	if err != nil {
		return nil, err
	}
	// One look at the local state serves both questions asked before proposing: may
	// this node answer by itself, and does the decision change nothing.
	now := n.now()
	cur, err := n.fsm.Lookup(r.Tenant, r.Key, now)
	if err != nil {
		if n.raft.State() != raft.Leader {
			return nil, idemkv.ErrNotLeader
		}
		return nil, err
	}
	if cur != nil {
		if res := n.answerFrom(cur, r); res != nil {
			idemkv.NoteLocalAnswer(ctx)
			return explain(res, req), nil
		}
	}
	if n.raft.State() != raft.Leader {
		return nil, idemkv.ErrNotLeader
	}
	r = n.unbindApproval(r) // a sabotage of the test build; r itself elsewhere
	if r.AttemptID == "" {
		r.AttemptID = idemkv.NewAttemptID()
	}
	// A decision that changes nothing (replay, conflict, in_progress) is answered
	// from a linearizable read, without a log append. The local state only picks the
	// path: proposing is always correct, so a stale local view costs nothing but the
	// append, and the read answer is decided again after the read index.
	if cur != nil {
		if next, _ := fsm.Decide(cur, r, now, 0); next == nil {
			if err := n.readIndex(ctx); err != nil {
				return nil, err
			}
			if res, err := n.decideUnchanged(r); err != nil || res != nil {
				return explain(res, req), err
			}
		}
	}
	res, err := n.proposeFrom(ctx, begin, &fsm.Command{Op: fsm.OpReserve, Reserve: r})
	if err != nil {
		return nil, err
	}
	if res.Asked {
		n.metrics.ApprovalRequests.WithLabelValues(n.metrics.Tools.Value(r.Tenant, r.Tool)).Inc()
	}
	return explain(res.Reserve, req), nil
}

// reserveRequest returns a copy of req, validated against this node's limits, its
// defaults filled and its effect replaced by the effect's fingerprint.
func (n *Node) reserveRequest(req *idemkv.ReserveRequest) (*idemkv.ReserveRequest, error) {
	r := *req
	if err := r.Validate(n.cfg.Limits, n.now()); err != nil {
		return nil, err
	}
	r.EnsureDefaults(n.cfg.Limits)
	if len(r.Effect) > 0 {
		fp, err := fingerprint.Of(r.Effect)
		if err != nil {
			return nil, idemkv.Invalid("effect", "effect: %v", err)
		}
		if r.Fingerprint != "" && r.Fingerprint != fp {
			return nil, idemkv.Invalid("effect_fingerprint", "effect_fingerprint %s does not match the fingerprint of effect %s", r.Fingerprint, fp)
		}
		r.Fingerprint = fp
	}
	rule, ruled, err := n.fsm.ApprovalRule(r.Tenant, r.Tool)
	if err != nil {
		return nil, err
	}
	var ruleWait time.Duration
	if ruled && rule.RequiresApproval() {
		ruleWait = time.Duration(rule.TTLMs) * time.Millisecond
	}
	r.WithApprovalWait(ruleWait)
	effect, err := n.effectToKeep(&r, rule, ruled)
	if err != nil {
		return nil, err
	}
	r.Effect = effect
	return &r, nil
}

// decideUnchanged decides r against the local state. It returns the answer only when
// the decision changes nothing; res is nil when the reserve must go through the log.
func (n *Node) decideUnchanged(r *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
	now := n.now()
	cur, err := n.fsm.Lookup(r.Tenant, r.Key, now)
	if err != nil || cur == nil {
		return nil, err
	}
	if next, res := fsm.Decide(cur, r, now, 0); next == nil {
		return res, nil
	}
	return nil, nil
}

// Commit stores the receipt of an executed effect.
func (n *Node) Commit(ctx context.Context, req *idemkv.CommitRequest) (*idemkv.Receipt, error) {
	begin := time.Now()
	if err := req.Validate(n.cfg.Limits); err != nil {
		return nil, err
	}
	r := *req
	res, err := n.proposeFrom(ctx, begin, &fsm.Command{Op: fsm.OpCommit, Commit: &r})
	if err != nil {
		return nil, err
	}
	return res.Receipt, nil
}

// Fail stores a permanent failure.
func (n *Node) Fail(ctx context.Context, req *idemkv.FailRequest) (*idemkv.Record, error) {
	if err := req.Validate(n.cfg.Limits); err != nil {
		return nil, err
	}
	r := *req
	res, err := n.propose(ctx, &fsm.Command{Op: fsm.OpFail, Fail: &r})
	if err != nil {
		return nil, err
	}
	return res.Record, nil
}

// Release gives the key back: the effect certainly did not happen.
func (n *Node) Release(ctx context.Context, req *idemkv.ReleaseRequest) (*idemkv.ReleaseResult, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	r := *req
	res, err := n.propose(ctx, &fsm.Command{Op: fsm.OpRelease, Release: &r})
	if err != nil {
		return nil, err
	}
	return &idemkv.ReleaseResult{Released: res.Released}, nil
}

// Heartbeat extends the lease of the attempt that holds the fence.
func (n *Node) Heartbeat(ctx context.Context, req *idemkv.HeartbeatRequest) (*idemkv.Record, error) {
	r := *req
	if err := r.Validate(n.cfg.Limits); err != nil {
		return nil, err
	}
	r.EnsureDefaults(n.cfg.Limits)
	res, err := n.propose(ctx, &fsm.Command{Op: fsm.OpHeartbeat, Heartbeat: &r})
	if err != nil {
		return nil, err
	}
	return res.Record, nil
}

// Doubt marks the pending record held by req.Fence in doubt: its holder cannot learn
// whether the effect happened. Every reserve then answers recover without a fence
// until Resolve settles it.
func (n *Node) Doubt(ctx context.Context, req *idemkv.DoubtRequest) (*idemkv.Record, error) {
	r := *req
	if err := r.Validate(); err != nil {
		return nil, err
	}
	res, err := n.propose(ctx, &fsm.Command{Op: fsm.OpDoubt, Doubt: &r})
	if err != nil {
		return nil, err
	}
	return res.Record, nil
}

// Resolve settles an in-doubt record without a fence: committed stores the receipt,
// not_executed releases the key.
func (n *Node) Resolve(ctx context.Context, req *idemkv.ResolveRequest) (*idemkv.ResolveResult, error) {
	r := *req
	if err := r.Validate(n.cfg.Limits); err != nil {
		return nil, err
	}
	if !fsm.RecordsHistory(n.fsm.Format()) {
		// Who resolved goes only into the history, which the cluster does not record
		// yet: the entry is written as the release before history reads it.
		r.By = ""
	}
	res, err := n.propose(ctx, &fsm.Command{Op: fsm.OpResolve, Resolve: &r})
	if err != nil {
		return nil, err
	}
	return &idemkv.ResolveResult{Receipt: res.Receipt, Released: res.Released}, nil
}

// Get reads a record. With Wait it long-polls until the record is no longer pending
// (or absent), its lease has run out, or Wait has passed, and returns it as it is then.
func (n *Node) Get(ctx context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
	r := *req
	if err := r.Validate(); err != nil {
		return nil, err
	}
	r.EnsureDefaults()
	deadline := time.Now().Add(r.Wait)
	for {
		rec, done, err := n.pollOnce(ctx, &r, deadline)
		if done || err != nil {
			return rec, err
		}
	}
}

// released is the answer to a read of r's history that found no record: the
// tombstone of a record released there, as the not_found's details, when there is one;
// notFound, the plain answer, otherwise.
func (n *Node) released(r *idemkv.GetRequest, now idemkv.Timestamp, notFound error) error {
	t, err := n.fsm.Tombstone(r.Tenant, r.Key, now)
	switch {
	case err == nil:
		return idemkv.ReleasedNotFound(t)
	case errors.Is(err, idemkv.ErrNotFound):
		return notFound
	default:
		return err
	}
}

// pollOnce reads the record once and, unless the answer is final (done), waits until
// the record may have changed, its lease runs out or the deadline passes.
func (n *Node) pollOnce(ctx context.Context, r *idemkv.GetRequest, deadline time.Time) (rec *idemkv.Record, done bool, err error) {
	// Watch before reading, so an apply between the read and the wait is not missed.
	// Only entries that touch this record wake it: see fsm.Watch.
	changed, stop := n.fsm.Watch(r.Tenant, r.Key)
	defer stop()
	if r.Consistency != idemkv.Stale {
		if err := n.readIndex(ctx); err != nil {
			return nil, true, err
		}
	}
	now := n.now()
	rec, err = n.fsm.Get(r.Tenant, r.Key, now)
	if errors.Is(err, idemkv.ErrNotFound) && r.History {
		err = n.released(r, now, err)
	}
	if err != nil || r.Wait <= 0 {
		return rec, true, err
	}
	// A pending record waits for its outcome until its lease runs out; one awaiting
	// approval waits for the decision until the request lapses.
	var until idemkv.Timestamp
	switch {
	case rec.Status == idemkv.StatusPending && rec.LeaseExpiresAt > now:
		until = rec.LeaseExpiresAt
	case rec.Status == idemkv.StatusAwaitingApproval && rec.Approval.Waiting(now):
		until = rec.Approval.ExpiresAt
	default:
		return rec, true, nil
	}
	wait := time.Until(deadline)
	if wait <= 0 {
		return rec, true, nil
	}
	if untilEnd := until.Time().Sub(now.Time()); untilEnd < wait {
		wait = untilEnd
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-changed:
		n.metrics.LongPollWakeups.Inc()
	case <-timer.C:
		if time.Now().After(deadline) {
			// One more read: the answer reflects the state at the deadline.
			r.Wait = 0
		}
	case <-ctx.Done():
		return nil, true, idemkv.Errorf(idemkv.ErrUnavailable, "wait cancelled: %v", ctx.Err())
	}
	return nil, false, nil
}

// List pages through a tenant's records in key order, linearizably unless stale.
func (n *Node) List(ctx context.Context, req *idemkv.ListRequest) (*idemkv.ListResult, error) {
	r := *req
	if err := r.Validate(); err != nil {
		return nil, err
	}
	r.EnsureDefaults()
	if err := n.readAt(ctx, r.Consistency); err != nil {
		return nil, err
	}
	return n.fsm.List(&r, n.now())
}

// ListInDoubt pages through the in-doubt records of every tenant, oldest first, read
// as List reads: linearizably unless stale. It reads the in-doubt index alone.
func (n *Node) ListInDoubt(ctx context.Context, req *idemkv.InDoubtRequest) (*idemkv.ListResult, error) {
	r := *req
	if err := r.Validate(); err != nil {
		return nil, err
	}
	r.EnsureDefaults()
	if err := n.readAt(ctx, r.Consistency); err != nil {
		return nil, err
	}
	return n.fsm.ListInDoubt(&r, n.now())
}

// readAt readies a local read of consistency c: a linearizable one takes a read index
// (on the leader alone, ErrNotLeader elsewhere); a stale one reads what is applied.
func (n *Node) readAt(ctx context.Context, c idemkv.Consistency) error {
	if c == idemkv.Stale {
		return nil
	}
	return n.readIndex(ctx)
}

// propose replicates cmd and returns the state machine's answer. An error wrapping
// ErrUnavailable (ErrNotLeader among them) means the command was certainly not
// appended; ErrOutcomeUnknown means it may still apply (every idemkv write is safe to
// retry with the same attempt_id).
func (n *Node) propose(ctx context.Context, cmd *fsm.Command) (*fsm.Result, error) {
	return n.proposeFrom(ctx, time.Time{}, cmd)
}

// proposeFrom is propose for a write whose checks began at begin: the time until it
// is handed to Raft is the write's prepare stage (metrics.StagePrepare). A zero begin
// times nothing.
func (n *Node) proposeFrom(ctx context.Context, begin time.Time, cmd *fsm.Command) (*fsm.Result, error) {
	if n.raft.State() != raft.Leader {
		return nil, idemkv.ErrNotLeader
	}
	// A new leader stamps nothing before it is ready: until it has applied the entries
	// of earlier terms it may know no state-machine time at all (a store that lost its
	// unsynced writes to a kill), and a stamp then followed its wall clock, however far
	// off (TestWriteBeforeEstablishDoesNotFollowAFastClock). establish anchors the clock
	// first; a write that cannot wait is refused before it is proposed.
	if term := n.raft.CurrentTerm(); n.readyTerm.Load() != term {
		if err := n.waitReady(ctx, term); err != nil {
			return nil, err
		}
	}
	if err := n.checkFormat(cmd); err != nil {
		return nil, err
	}
	cmd.Now = n.stampNow()
	buf, err := cmd.AppendBinary(nil)
	if err != nil {
		return nil, fmt.Errorf("node: encode command: %w: %w", idemkv.ErrInternal, err)
	}
	timeout := n.cfg.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
		if timeout <= 0 {
			return nil, idemkv.Errorf(idemkv.ErrUnavailable, "deadline passed before proposing")
		}
	}
	start := time.Now()
	if !begin.IsZero() {
		n.metrics.Stage(metrics.StagePrepare).Observe(start.Sub(begin).Seconds())
	}
	f := n.raft.Apply(buf, timeout)
	if res, handled, err := n.earlyAck(cmd); handled {
		return res, err
	}
	if err := n.waitProposed(ctx, f); err != nil {
		return nil, err
	}
	n.metrics.ApplyLatency.Observe(time.Since(start).Seconds())
	res, ok := f.Response().(*fsm.Result)
	if !ok || res == nil {
		return nil, fmt.Errorf("node: state machine answered %T: %w", f.Response(), idemkv.ErrInternal)
	}
	if res.Err != nil {
		return nil, res.Err
	}
	return res, nil
}

// waitProposed waits for an entry handed to Raft. From here on a failure leaves the
// write's outcome unknown, unless Raft says it never appended the entry; a caller that
// gives up waiting gets outcome_unknown too, since the entry may still commit.
func (n *Node) waitProposed(ctx context.Context, f raft.ApplyFuture) error {
	// Raft's future has only a blocking Error(), so waitFuture's goroutine turns it
	// into a channel to select on beside ctx. One waiter goroutine for every write
	// measured worse end to end (issue 27, bench/README.md): the park and wake-up,
	// most of this goroutine's cost, stay either way.
	err, ended := waitFuture(ctx, f)
	switch {
	case ended != nil:
		return idemkv.Errorf(idemkv.ErrOutcomeUnknown, "gave up waiting for the write after proposing it (%v); it may still apply, retry with the same attempt_id", ctx.Err())
	case err != nil:
		return n.raftError(err)
	}
	return nil
}

// raftError maps Raft's errors about a write to idemkv's: certainly not appended
// (unavailable: not the leader, not enqueued) or indeterminate (outcome_unknown:
// leadership lost while replicating, a shutdown with the entry in flight, anything
// else after proposing). A node that is already shut down is refused before proposing,
// as not the leader.
func (n *Node) raftError(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return fmt.Errorf("%w (%v)", idemkv.ErrNotLeader, err)
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return idemkv.Errorf(idemkv.ErrUnavailable, "raft is overloaded: %v", err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return idemkv.Errorf(idemkv.ErrOutcomeUnknown, "node shut down with the write in flight; it may still apply, retry with the same attempt_id")
	case errors.Is(err, raft.ErrLeadershipLost):
		return idemkv.Errorf(idemkv.ErrOutcomeUnknown, "leadership lost while replicating; the write may have happened, retry with the same attempt_id")
	default:
		return idemkv.Errorf(idemkv.ErrOutcomeUnknown, "replication did not finish: %v; the write may have happened, retry with the same attempt_id", err)
	}
}

// readError maps Raft's errors about a read or a look at the configuration: nothing
// was written, so nothing is in doubt.
func (n *Node) readError(err error) error {
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
		return fmt.Errorf("%w (%v)", idemkv.ErrNotLeader, err)
	}
	return idemkv.Errorf(idemkv.ErrUnavailable, "%v", err)
}

// readIndex makes the next local read linearizable: it takes the commit index,
// confirms with a quorum that this node is still the leader of the same term, and
// waits until the state machine has applied up to that index.
func (n *Node) readIndex(ctx context.Context) error {
	if err := n.fsm.Err(); err != nil {
		return idemkv.Errorf(idemkv.ErrUnavailable, "%v", err)
	}
	if n.raft.State() != raft.Leader {
		return idemkv.ErrNotLeader
	}
	term := n.raft.CurrentTerm()
	if n.readyTerm.Load() != term {
		if err := n.waitReady(ctx, term); err != nil {
			return err
		}
	}
	index := n.raft.CommitIndex()
	if err := n.verifyLeader(ctx); err != nil {
		return err
	}
	if n.raft.CurrentTerm() != term {
		return idemkv.ErrNotLeader
	}
	return n.waitApplied(ctx, index)
}

// verifyLeader confirms with a quorum that this node still leads. Raft answers it on
// the leader's loop, which a disk that stopped completing writes holds in an append
// for good, and every read waited with it; it waits for ctx, or ApplyTimeout without
// a deadline. Nothing is written, so a wait that ends is unavailable.
func (n *Node) verifyLeader(ctx context.Context) error {
	ctx, cancel := n.bounded(ctx)
	defer cancel()
	err, ended := waitFor(ctx, func() error { return n.raft.VerifyLeader().Error() })
	switch {
	case ended != nil:
		return idemkv.Errorf(idemkv.ErrUnavailable, "could not confirm this node still leads (%v): nothing was read", ended)
	case err != nil:
		return n.readError(err)
	}
	return nil
}

func (n *Node) waitReady(ctx context.Context, term uint64) error {
	deadline := time.NewTimer(n.cfg.ApplyTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for n.readyTerm.Load() != term {
		if n.raft.CurrentTerm() != term || n.raft.State() != raft.Leader {
			return idemkv.ErrNotLeader
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return idemkv.Errorf(idemkv.ErrUnavailable, "new leader not ready yet")
		case <-ctx.Done():
			return idemkv.Errorf(idemkv.ErrUnavailable, "%v", ctx.Err())
		}
	}
	return nil
}

// waitApplied waits until the state machine reflects every entry up to index.
func (n *Node) waitApplied(ctx context.Context, index uint64) error {
	for {
		changed := n.fsm.Changed()
		if n.caughtUp(index) {
			return nil
		}
		if err := n.fsm.Err(); err != nil {
			return idemkv.Errorf(idemkv.ErrUnavailable, "%v", err)
		}
		// Every entry the wait depends on reaches the state machine, which signals
		// changed; the timer only retries a Raft log read that failed.
		timer := time.NewTimer(50 * time.Millisecond)
		select {
		case <-changed:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return idemkv.Errorf(idemkv.ErrUnavailable, "waiting for apply: %v", ctx.Err())
		case <-n.ctx.Done():
			timer.Stop()
			return idemkv.Errorf(idemkv.ErrUnavailable, "node is shutting down")
		}
		timer.Stop()
	}
}

// caughtUp reports whether the state machine reflects every entry up to index.
//
// Raft hands the state machine commands and configurations only; its no-op (one per
// election) and barriers never reach it, so the applied index can stay behind the
// commit index with nothing left to apply. The state is current exactly when no entry
// in (applied, index] reaches the state machine. Entries compacted out of the log are
// never among those: a compacted entry is covered by a snapshot, which the state
// machine either took after applying every entry it covers or restored, so every
// command it covers is at or below the applied index. Only the entries still in the
// log need looking at, and since every leader's first entry is a command
// (establish), the ones past the applied index that are not commands are the few
// no-ops of leaders that never established: the scan is short.
func (n *Node) caughtUp(index uint64) bool {
	if n.wedgeGap(index) {
		return false
	}
	if n.fsm.Err() != nil {
		return false // a halted state machine reflects nothing
	}
	applied := n.fsm.AppliedIndex()
	if applied >= index {
		return true
	}
	first, err := n.logs.FirstIndex()
	if err != nil {
		return false
	}
	if first == 0 {
		return true // an empty log: everything up to index is compacted
	}
	var l raft.Log
	for i := max(applied+1, first); i <= index; i++ {
		if err := n.logs.GetLog(i, &l); err != nil {
			return false
		}
		if l.Type == raft.LogCommand || l.Type == raft.LogConfiguration {
			return false
		}
	}
	return true
}
