package node

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
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

// A change of the membership counts a peer only once it stored an entry appended after
// it asked: a voter that went silent a moment ago was still within the window of
// reaches, and removing the other follower left {leader, silent voter}, which commits
// nothing. A heartbeat's answer is not storing (a voter whose disk stopped still
// answers them), nor is a store from before the question, or of entries it already had.
// A store that comes while it waits counts; an ended wait is an error, not a lost
// quorum.
func TestReachQuorumNeedsAFreshStore(t *testing.T) {
	n := &Node{cfg: Config{ID: "n1", HeartbeatTimeout: 100 * time.Millisecond}}
	voters := []raft.ServerID{"n1", "n3"}
	n.peers.answered("n3", time.Now().Add(-50*time.Millisecond))
	n.peers.stored("n3", 10, time.Now().Add(-50*time.Millisecond))
	if _, ok := n.reaches("n3", time.Now()); !ok {
		t.Fatal("n3, heard 50 ms ago, is not reached for the status")
	}
	asked := time.Now()
	reach, quorum, err := n.awaitStored(context.Background(), voters, asked, 10)
	if err != nil || reach >= quorum {
		t.Fatalf("n3 silent since it was asked: reach %d of quorum %d, %v", reach, quorum, err)
	}
	asked = time.Now()
	go func() {
		time.Sleep(20 * time.Millisecond)
		n.peers.answered("n3", time.Now())   // a heartbeat
		n.peers.stored("n3", 10, time.Now()) // an entry it had before the question
	}()
	if reach, quorum, err := n.awaitStored(context.Background(), voters, asked, 10); err != nil || reach >= quorum {
		t.Fatalf("n3 answering a heartbeat and storing nothing new: reach %d of quorum %d, %v", reach, quorum, err)
	}
	asked = time.Now()
	go func() {
		time.Sleep(30 * time.Millisecond)
		n.peers.stored("n3", 11, time.Now())
	}()
	if reach, quorum, err := n.awaitStored(context.Background(), voters, asked, 10); err != nil || reach < quorum {
		t.Fatalf("n3 storing the new entry while asked: reach %d of quorum %d, %v", reach, quorum, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := n.awaitStored(ctx, []raft.ServerID{"n1", "n2", "n3"}, time.Now(), 11); idemkv.CodeOf(err) != idemkv.CodeUnavailable {
		t.Fatalf("an ended wait: %v, want unavailable", err)
	}
}

// Answers are timed on the monotonic clock: a reading earlier than the last answer (a
// wall clock stepped back, as it reads) never makes a peer reached.
func TestReachesIgnoresAnswersFromTheFuture(t *testing.T) {
	n := &Node{cfg: Config{ID: "n1", HeartbeatTimeout: time.Second}}
	now := time.Now()
	n.peers.answered("n2", now)
	if _, ok := n.reaches("n2", now.Add(-time.Hour+5*time.Second)); ok {
		t.Fatal("an answer after now counts as reached")
	}
}
