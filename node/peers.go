package node

import (
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// peerHealth is what this node, while it leads, knows of each follower: whose
// heartbeats fail, and when each last answered. hashicorp/raft reports both through
// observations from the leader's replication loops; a follower knows only its leader.
type peerHealth struct {
	mu      sync.Mutex
	failing map[raft.ServerID]time.Time // a follower whose heartbeats fail → its last contact
	// added is when each peer was last added: a failure reported afterwards by the
	// replication of its earlier membership is stale (staleFailure).
	added map[raft.ServerID]time.Time
}

// staleFailure bounds how far before a peer's addition the last contact of a failure
// may lie and still be the new replication's: Raft starts a replication with its last
// contact at that moment, while the heartbeat of a replication stopped by the removal
// may fail later, with a contact from before the peer went down.
const staleFailure = time.Second

// watchPeers follows the leader's heartbeat observations until the node closes. The
// observer never blocks Raft: observations that find the channel full are dropped, and
// the next failure or recovery (heartbeats run every few hundred milliseconds) corrects
// the view.
func (n *Node) watchPeers() {
	defer n.wg.Done()
	ch := make(chan raft.Observation, 64)
	obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation, raft.LeaderObservation, raft.PeerObservation:
			return true
		}
		return false
	})
	n.raft.RegisterObserver(obs)
	defer n.raft.DeregisterObserver(obs)
	for {
		select {
		case <-n.ctx.Done():
			return
		case o := <-ch:
			n.peers.observe(o.Data)
		}
	}
}

func (p *peerHealth) observe(data any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch d := data.(type) {
	case raft.FailedHeartbeatObservation:
		if at, ok := p.added[d.PeerID]; ok && d.LastContact.Before(at.Add(-staleFailure)) {
			return // the replication before the peer was removed and added again
		}
		if p.failing == nil {
			p.failing = map[raft.ServerID]time.Time{}
		}
		p.failing[d.PeerID] = d.LastContact
	case raft.ResumedHeartbeatObservation:
		delete(p.failing, d.PeerID)
	case raft.LeaderObservation:
		// What a former leader saw of its followers says nothing now.
		p.failing = nil
	case raft.PeerObservation:
		// A peer removed, or added again, starts afresh: Raft says a peer's heartbeats
		// resumed only to the replication that saw them fail, so a voter removed while
		// down and joined again stayed failing, and removals that left a quorum were
		// refused.
		delete(p.failing, d.Peer.ID)
		if d.Removed {
			delete(p.added, d.Peer.ID)
			break
		}
		if p.added == nil {
			p.added = map[raft.ServerID]time.Time{}
		}
		p.added[d.Peer.ID] = time.Now()
	}
}

// unreachable reports whether the leader's heartbeats to id fail, and when id last
// answered (zero if never).
func (p *peerHealth) unreachable(id raft.ServerID) (lastContact time.Time, failing bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	lastContact, failing = p.failing[id]
	return lastContact, failing
}
