package node

import (
	"testing"
	"time"
)

// A peer counts as reached only on an answer within the reach window: never heard,
// or heard too long ago, is not reached, whatever Raft has yet to notice.
func TestReachesNeedsARecentAnswer(t *testing.T) {
	n := &Node{cfg: Config{ID: "n1", HeartbeatTimeout: time.Second}}
	now := time.Now()
	if _, ok := n.reaches("n1", now); !ok {
		t.Error("a node does not reach itself")
	}
	if last, ok := n.reaches("n2", now); ok || !last.IsZero() {
		t.Errorf("a peer never heard from: reached %v, last %v", ok, last)
	}
	n.peers.answered("n2", now.Add(-time.Second))
	if _, ok := n.reaches("n2", now); !ok {
		t.Error("a peer that answered a second ago is not reached")
	}
	n.peers.answered("n2", now.Add(-3*time.Second))
	if last, ok := n.reaches("n2", now); ok || !last.Equal(now.Add(-3*time.Second)) {
		t.Errorf("a peer last heard 3 s ago (window %s): reached %v, last %v", n.reachWindow(), ok, last)
	}
}
