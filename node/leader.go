package node

import (
	"context"
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
// leader's commit index may lag until an entry of its own term commits, so a barrier
// must apply before the commit index serves as a read index.
func (n *Node) establish(ctx context.Context) bool {
	for ctx.Err() == nil {
		term := n.raft.CurrentTerm()
		err := n.raft.Barrier(n.cfg.ApplyTimeout).Error()
		if err == nil && n.raft.State() == raft.Leader && n.raft.CurrentTerm() == term {
			n.readyTerm.Store(term)
			n.log.Info("leader ready", "term", term, "applied_index", n.fsm.AppliedIndex())
			break
		}
		if n.raft.State() != raft.Leader {
			return false
		}
		n.log.Warn("leader barrier failed; retrying", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	if ctx.Err() != nil {
		return false
	}
	n.registerSelf(ctx)
	return true
}

// registerSelf records this node's addresses in the replicated metadata when they are
// missing or changed, so every node can tell clients the leader's API address.
func (n *Node) registerSelf(ctx context.Context) {
	self := idemkv.NodeInfo{ID: n.cfg.ID, RaftAddr: string(n.transport.LocalAddr()), APIAddr: n.cfg.APIAddr}
	for _, ni := range n.fsm.Nodes() {
		if ni.ID == self.ID && ni.RaftAddr == self.RaftAddr && ni.APIAddr == self.APIAddr {
			return
		}
	}
	if _, err := n.propose(ctx, &fsm.Command{Op: fsm.OpSetNode, Node: &self}); err != nil {
		n.log.Warn("registering this node's addresses failed", "err", err)
	}
}
