package node_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkv/idemkv/internal/testcluster"
)

var errNotYet = errors.New("not yet")

// TestCloseGoesOnWhileATakeoverWaits: a node that becomes leader while its disk
// stopped completing writes waits in its first entry of the term (Raft's applies are
// enqueued at once, and the leader's loop waits in the append). Close stopped the
// leader's work and waited for it before it shut Raft down, and that wait had no end:
// Raft's timeouts bound only the enqueueing, the node never shut down, and its 30 s
// guard on a stuck Raft never came into play. The takeover's waits now end with the
// leader's work.
func TestCloseGoesOnWhileATakeoverWaits(t *testing.T) {
	c, logs := startStalling(t, 1)
	ctx := ctxT(t)
	if _, err := reserveAndCommit(ctx, c.Node(c.WaitLeader()), "before", true); err != nil {
		t.Fatal(err)
	}
	c.Stop(0)
	c.Restart(0)
	// Stalled once the node is open, before it (a single voter: it waits a heartbeat
	// timeout) stands for election; its first entries as leader are then held.
	l := logs[0] // the restarted node's
	l.set(true)
	n := c.Node(0)
	if err := testcluster.Eventually(10*time.Second, func() error {
		if !n.IsLeader() || l.held() == 0 {
			return errNotYet
		}
		return nil
	}); err != nil {
		t.Fatalf("the restarted node did not lead with an append held (leader %v, held %d): the test shows less than it says", n.IsLeader(), l.held())
	}
	time.Sleep(200 * time.Millisecond) // let the takeover enqueue its entry and wait

	closed := make(chan error, 1)
	go func() { closed <- n.Close() }()
	// Raft is shut down (no longer the leader: Raft's state is shutdown at once) while
	// the append is still held: Close got past the leader's work.
	if err := testcluster.Eventually(10*time.Second, func() error {
		if n.IsLeader() {
			return errNotYet
		}
		return nil
	}); err != nil {
		t.Fatalf("Close did not shut Raft down within 10 s while the takeover waited on the stuck append")
	}
	l.set(false)
	select {
	case <-closed:
	case <-time.After(40 * time.Second):
		t.Fatal("Close did not return once the disk completed writes again")
	}
}
