package node

import (
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// A voter removed while its heartbeats failed, and joined again, is not failing: Raft
// says heartbeats resumed only to the replication that saw them fail, so it stayed
// unreachable for good and the removal guard refused removals that left a quorum.
func TestPeerHealthForgetsARemovedPeer(t *testing.T) {
	var p peerHealth
	p.observe(raft.FailedHeartbeatObservation{PeerID: "n3", LastContact: time.Now()})
	if _, failing := p.unreachable("n3"); !failing {
		t.Fatal("a peer whose heartbeats fail is not failing")
	}
	p.observe(raft.PeerObservation{Removed: true, Peer: raft.Server{ID: "n3"}})
	if _, failing := p.unreachable("n3"); failing {
		t.Fatal("a removed peer is still failing")
	}
	p.observe(raft.FailedHeartbeatObservation{PeerID: "n3", LastContact: time.Now()})
	p.observe(raft.PeerObservation{Peer: raft.Server{ID: "n3"}})
	if _, failing := p.unreachable("n3"); failing {
		t.Fatal("a peer added again is still failing")
	}
	// The removed membership's replication may still report a failure, with a contact
	// from before the peer went down: stale. The new replication's own failures count.
	p.observe(raft.FailedHeartbeatObservation{PeerID: "n3", LastContact: time.Now().Add(-time.Minute)})
	if _, failing := p.unreachable("n3"); failing {
		t.Fatal("a failure of the replication before the peer was added again counts")
	}
	p.observe(raft.FailedHeartbeatObservation{PeerID: "n3", LastContact: time.Now()})
	if _, failing := p.unreachable("n3"); !failing {
		t.Fatal("a failure of the new replication does not count")
	}
}
