package node_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// slowLog completes every append, each after a delay while slow is set: a disk that
// still works, slowly (a throttled cloud volume).
type slowLog struct {
	raft.LogStore
	slow  *atomic.Bool
	delay time.Duration
}

func (l slowLog) StoreLog(e *raft.Log) error { return l.StoreLogs([]*raft.Log{e}) }

func (l slowLog) StoreLogs(es []*raft.Log) error {
	if l.slow.Load() {
		time.Sleep(l.delay)
	}
	return l.LogStore.StoreLogs(es)
}

// TestLeaderWithASlowDiskKeepsLeading: the stall watch (stall.go) is for a disk that
// stopped completing writes, and must leave a disk that completes them slowly alone. Its
// limit was five election timeouts alone, so a cluster tuned for a fast network (200
// ms here) called an append of just over a second stalled: the leader stopped sending
// heartbeats during each of them, and the followers elected another leader, again and
// again, while its disk worked and its writes committed. Before the watch, hashicorp's
// heartbeats went on beside the slow append and nothing changed leader.
func TestLeaderWithASlowDiskKeepsLeading(t *testing.T) {
	var slow [3]atomic.Bool
	const appendTakes = 1500 * time.Millisecond
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.HeartbeatTimeout = 200 * time.Millisecond
		cfg.ElectionTimeout = 200 * time.Millisecond
		cfg.LeaderLeaseTimeout = 100 * time.Millisecond
		cfg.WrapRaftStores = func(s node.RaftStores) node.RaftStores {
			s.Log = slowLog{LogStore: s.Log, slow: &slow[i], delay: appendTakes}
			return s
		}
	}))
	li := c.WaitLeader()
	leader := c.Node(li)
	ctx := ctxT(t)
	if _, err := reserveAndCommit(ctx, leader, "before", true); err != nil {
		t.Fatal(err)
	}

	slow[li].Store(true)
	t.Cleanup(func() { slow[li].Store(false) })
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wrote := make(chan error, 1)
	go func() {
		var err error
		for i := 0; wctx.Err() == nil; i++ {
			if _, err = reserveAndCommit(wctx, leader, fmt.Sprint("slow-", i), true); err != nil {
				break
			}
		}
		wrote <- err
	}()
	// Several slow appends: each alone is past five election timeouts (1 s).
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) {
		for i := range 3 {
			if i != li && c.Node(i).IsLeader() {
				t.Fatalf("%s leads while the leader %s's disk completes every append in %s: the stall watch took a slow disk for a stopped one",
					c.ID(i), c.ID(li), appendTakes)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !leader.IsLeader() {
		t.Fatalf("the leader %s with a slow disk stepped down", c.ID(li))
	}
	cancel()
	if err := <-wrote; err != nil && wctx.Err() == nil {
		t.Fatalf("a write on the slow leader: %v", err)
	}
}
