package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
)

// watchLeadership starts leader-only work when this node wins an election and stops
// it when the node loses leadership.
func (n *Node) watchLeadership() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case isLeader := <-n.leaderNotify:
			n.metrics.LeaderChanges.Inc()
			n.stopLeaderWork()
			if isLeader {
				n.startLeaderWork()
			}
		}
	}
}

func (n *Node) startLeaderWork() {
	n.leaderMu.Lock()
	defer n.leaderMu.Unlock()
	ctx, cancel := context.WithCancel(n.ctx)
	n.leaderCancel = cancel
	n.leaderWG.Add(1)
	go func() {
		defer n.leaderWG.Done()
		if !n.establish(ctx) {
			return
		}
		n.leaderWG.Add(1)
		go func() {
			defer n.leaderWG.Done()
			n.tickClock(ctx)
		}()
		n.sweeper.Run(ctx)
	}()
}

func (n *Node) stopLeaderWork() {
	n.leaderMu.Lock()
	cancel := n.leaderCancel
	n.leaderCancel = nil
	n.leaderMu.Unlock()
	if cancel != nil {
		cancel()
	}
	n.readyTerm.Store(0)
	n.leaderWG.Wait()
}

// establish makes a new leader safe to read from and known by its API address. A
// leader's commit index may lag until an entry of its own term commits, so an entry of
// this term must apply before the commit index serves as a read index.
//
// That entry is a command (this node's addresses), not a Raft barrier: barriers and
// Raft's own no-op never reach the state machine, so with a barrier per election the
// applied index fell two entries further behind the commit index on every election
// without a write, until reads wedged (issue 12, defect 1). A command that applies
// brings the applied index up to the commit index at every election, and it also
// keeps the replicated API address current. Every later entry of the term is a
// command or a configuration, both of which the state machine sees.
func (n *Node) establish(ctx context.Context) bool {
	self := idemkv.NodeInfo{ID: n.cfg.ID, RaftAddr: string(n.transport.LocalAddr()), APIAddr: n.cfg.APIAddr}
	for ctx.Err() == nil {
		term := n.raft.CurrentTerm()
		err := n.applyEstablish(ctx, &self)
		if err == nil && !n.establishByBarrier() {
			// Before the leader is ready, so a cluster whose members all read this
			// build's format writes it from the first request on.
			err = n.advanceFormat(func(cmd *fsm.Command) error { return n.applyDirect(ctx, cmd) })
		}
		if err == nil && n.raft.State() == raft.Leader && n.raft.CurrentTerm() == term {
			n.readyTerm.Store(term)
			n.log.Info("leader ready", "term", term, "applied_index", n.fsm.AppliedIndex())
			return true
		}
		if n.raft.State() != raft.Leader {
			return false
		}
		n.log.Warn("leader's first entry failed; retrying", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return false
}

// applyEstablish replicates and applies the establishing entry. It goes to Raft
// directly, not through propose: no sabotage of the test build may answer it early.
func (n *Node) applyEstablish(ctx context.Context, self *idemkv.NodeInfo) error {
	if n.establishByBarrier() {
		return waitEither(ctx, n.raft.Barrier(n.cfg.ApplyTimeout))
	}
	if err := n.anchorClock(ctx); err != nil {
		return err
	}
	return n.applyDirect(ctx, &fsm.Command{Op: fsm.OpSetNode, Node: self})
}

// waitFuture waits for f, or until ctx ends: it returns Raft's error, or ctx's cause
// as ended. Raft's timeouts bound only the enqueueing: an entry that applies after
// one the state machine is stuck in, or whose append the disk never completes, is
// never answered, and a leader's work that waited for it held Close before it shut
// Raft down, for good.
func waitFuture(ctx context.Context, f raft.Future) (err, ended error) {
	return waitFor(ctx, f.Error)
}

// waitFor runs call on a goroutine of its own and waits for it, or until ctx ends (see
// waitFuture): for a Raft call that may itself block, as VerifyLeader does once 64
// verifications are queued for a leader loop that is stuck.
func waitFor(ctx context.Context, call func() error) (err, ended error) {
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err, nil
	case <-ctx.Done():
		// An answer that is in as ctx ends is still the answer.
		select {
		case err := <-done:
			return err, nil
		default:
		}
		return nil, context.Cause(ctx)
	}
}

// waitEither is waitFuture for a caller to whom an end of ctx is an error like Raft's.
func waitEither(ctx context.Context, f raft.Future) error {
	err, ended := waitFuture(ctx, f)
	return errors.Join(err, ended)
}

// applyDirect stamps cmd, replicates it and waits for it to apply, straight through
// Raft (see applyEstablish).
func (n *Node) applyDirect(ctx context.Context, cmd *fsm.Command) error {
	cmd.Now = n.stampNow()
	buf, err := cmd.AppendBinary(nil)
	if err != nil {
		return fmt.Errorf("node: encode command: %w", err)
	}
	f := n.raft.Apply(buf, n.cfg.ApplyTimeout)
	if err := waitEither(ctx, f); err != nil {
		return err
	}
	if res, ok := f.Response().(*fsm.Result); ok && res.Err != nil {
		return res.Err
	}
	return nil
}
