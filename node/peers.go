package node

import (
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// peerContacts is when each peer last answered one of this node's Raft RPCs: what a
// leader knows of whom it reaches. It is positive evidence only. Raft's own
// FailedHeartbeatObservation, which this used to follow, comes once a heartbeat fails:
// a refused dial fails at once, but a paused or partitioned peer holds the RPC until the
// transport's 10 s timeout, and a new leader knows nothing of its followers until then.
// Meanwhile the removal guard counted such a peer as reachable and allowed a removal
// that left the cluster without a quorum.
type peerContacts struct {
	last sync.Map // raft.ServerID → *atomic.Int64, the Unix nanoseconds of the last answer
}

// answered records that id answered an RPC at t.
func (p *peerContacts) answered(id raft.ServerID, t time.Time) {
	v, ok := p.last.Load(id)
	if !ok {
		v, _ = p.last.LoadOrStore(id, new(atomic.Int64))
	}
	v.(*atomic.Int64).Store(t.UnixNano())
}

// lastAnswer is when id last answered, zero if never.
func (p *peerContacts) lastAnswer(id raft.ServerID) time.Time {
	v, ok := p.last.Load(id)
	if !ok {
		return time.Time{}
	}
	return time.Unix(0, v.(*atomic.Int64).Load())
}

// reachWindow is how recently a peer must have answered to count as reached: twice
// the heartbeat timeout. A leader heartbeats every follower ten times per timeout, on
// a goroutine of its own that a busy replication does not hold up, and a follower not
// heard for a whole timeout starts an election of its own.
func (n *Node) reachWindow() time.Duration { return 2 * n.cfg.HeartbeatTimeout }

// reaches reports whether this node reaches id: itself, or a peer that answered within
// reachWindow, and when id last answered.
func (n *Node) reaches(id raft.ServerID, now time.Time) (last time.Time, ok bool) {
	if string(id) == n.cfg.ID {
		return now, true
	}
	last = n.peers.lastAnswer(id)
	return last, !last.IsZero() && now.Sub(last) <= n.reachWindow()
}

// AppendEntries sends an append (or a heartbeat: Raft sends both through here) and
// records an answer, whatever it says: a refusal still shows the peer is there.
func (t *heartbeatTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	err := t.NetworkTransport.AppendEntries(id, target, args, resp)
	if err == nil && t.contacts != nil {
		t.contacts.answered(id, time.Now())
	}
	return err
}

// InstallSnapshot sends a snapshot and records an answer, as AppendEntries does.
func (t *heartbeatTransport) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	err := t.NetworkTransport.InstallSnapshot(id, target, args, resp, data)
	if err == nil && t.contacts != nil {
		t.contacts.answered(id, time.Now())
	}
	return err
}
