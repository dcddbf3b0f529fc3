package node_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// stallingLog holds every append while stalled, as a disk that stopped completing
// writes does: the node's Raft loop waits in it, and nothing it is sent is stored.
type stallingLog struct {
	raft.LogStore
	mu      sync.Mutex
	cond    *sync.Cond
	stalled bool
	waiting int // appends held
}

func newStallingLog(s raft.LogStore) *stallingLog {
	l := &stallingLog{LogStore: s}
	l.cond = sync.NewCond(&l.mu)
	return l
}

func (l *stallingLog) set(stalled bool) {
	l.mu.Lock()
	l.stalled = stalled
	l.mu.Unlock()
	l.cond.Broadcast()
}

func (l *stallingLog) wait() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stalled {
		l.waiting++
		for l.stalled {
			l.cond.Wait()
		}
		l.waiting--
	}
}

func (l *stallingLog) held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting
}

func (l *stallingLog) StoreLog(e *raft.Log) error {
	l.wait()
	return l.LogStore.StoreLog(e)
}

func (l *stallingLog) StoreLogs(es []*raft.Log) error {
	l.wait()
	return l.LogStore.StoreLogs(es)
}

// startStalling starts a cluster of n nodes whose Raft logs the test can hold
// (logs[i] is node i's, replaced when it restarts); every log is released when the
// test ends, before the cluster stops.
func startStalling(t *testing.T, n int) (*testcluster.Cluster, []*stallingLog) {
	t.Helper()
	logs := make([]*stallingLog, n)
	c := testcluster.Start(t, n, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.WrapRaftStores = func(s node.RaftStores) node.RaftStores {
			logs[i] = newStallingLog(s.Log)
			s.Log = logs[i]
			return s
		}
	}))
	t.Cleanup(func() {
		for _, l := range logs {
			l.set(false)
		}
	})
	return c, logs
}

// holdAWrite holds l's appends and starts a write of key on n, which l then holds,
// returning once an append is held.
func holdAWrite(t *testing.T, ctx context.Context, n *node.Node, l *stallingLog, key string) {
	t.Helper()
	l.set(true)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, _ = reserveAndCommit(wctx, n, key, true)
	}()
	if err := testcluster.Eventually(5*time.Second, func() error {
		if l.held() == 0 {
			return errors.New("no append held yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestRemovalGuardSeesAStuckDisk: a voter whose disk stopped completing writes still
// answers the leader's heartbeats (Raft answers them beside its loop, which waits in
// the append), so a guard that counted any answer counted it, and removing the one
// healthy follower left {leader, stuck voter}: the removal itself could not commit, and
// nothing after it. The guard now counts a voter only once it stored an entry appended
// after the question, so the removal is refused and the cluster keeps committing; and
// a removal forced anyway answers outcome_unknown when its wait ends, where it waited
// for good.
func TestRemovalGuardSeesAStuckDisk(t *testing.T) {
	c, logs := startStalling(t, 3)
	li := c.WaitLeader()
	leader := c.Node(li)
	healthy, stuck := (li+1)%3, (li+2)%3
	ctx := ctxT(t)
	if _, err := reserveAndCommit(ctx, leader, "before", true); err != nil {
		t.Fatal(err)
	}

	logs[stuck].set(true)
	// The stuck voter stops storing; the healthy follower and the leader still commit.
	if _, err := reserveAndCommit(ctx, leader, "while-stuck", true); err != nil {
		t.Fatalf("a write with one voter stuck: %v", err)
	}
	// It still answers heartbeats: the status shows it reached.
	info, err := leader.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ni := range info.Nodes {
		if ni.ID == c.ID(stuck) && ni.State != "follower" {
			t.Fatalf("the stuck voter is %q in the status, want follower (it answers heartbeats): the test shows less than it says", ni.State)
		}
	}

	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = leader.Remove(rctx, &idemkv.RemoveRequest{ID: c.ID(healthy)})
	if !errors.Is(err, idemkv.ErrInvalidArgument) {
		t.Fatalf("removing the healthy follower while the other voter's disk is stuck: %v, want invalid_argument (a quorum of the voters left would not store anything)", err)
	}
	// Nothing changed: three voters, and the cluster still commits.
	if _, err := reserveAndCommit(ctx, leader, "after-refusal", true); err != nil {
		t.Fatalf("a write after the refused removal: %v", err)
	}
	info, err = leader.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Nodes) != 3 {
		t.Fatalf("%d members after the refused removal, want 3: %+v", len(info.Nodes), info.Nodes)
	}

	// Forced, the removal is proposed, and the voters it leaves cannot commit it: the
	// caller is told the outcome is unknown when its wait ends, not held for good (Raft's
	// timeout bounds only the enqueueing).
	fctx, fcancel := context.WithTimeout(ctx, 3*time.Second)
	defer fcancel()
	start := time.Now()
	_, err = leader.Remove(fctx, &idemkv.RemoveRequest{ID: c.ID(healthy), Force: true})
	if !errors.Is(err, idemkv.ErrOutcomeUnknown) {
		t.Fatalf("a forced removal the voters left cannot commit: %v, want outcome_unknown", err)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("the forced removal answered after %s, its wait was 3 s", d)
	}

	// Once the disk completes writes again, the removal commits and so do writes.
	logs[stuck].set(false)
	if err := testcluster.Eventually(15*time.Second, func() error {
		info, err := leader.Cluster(ctx)
		if err != nil {
			return err
		}
		for _, ni := range info.Nodes {
			if ni.ID == c.ID(healthy) {
				return errors.New("the removed follower is still a member")
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := reserveAndCommit(ctx, leader, "after-removal", true); err != nil {
		t.Fatalf("a write after the removal: %v", err)
	}
}

// TestLeaderWithAStuckDiskGivesWay: a leader whose disk stopped completing writes
// waits in its append for good, and hashicorp/raft's heartbeats, sent beside that
// loop, kept telling the followers it was there: no follower stood for election, and
// the cluster committed nothing until the disk came back. The leader now sends no
// heartbeat or append while one of its own appends has been held past the stall
// limit, so the others elect a leader among themselves and commit; once the disk
// completes the write, the old leader learns the newer term and follows.
func TestLeaderWithAStuckDiskGivesWay(t *testing.T) {
	c, logs := startStalling(t, 3)
	li := c.WaitLeader()
	ctx := ctxT(t)
	if _, err := reserveAndCommit(ctx, c.Node(li), "before", true); err != nil {
		t.Fatal(err)
	}

	// A write on the stuck leader: its append is held.
	holdAWrite(t, ctx, c.Node(li), logs[li], "on-the-stuck-leader")
	var other int
	if err := testcluster.Eventually(20*time.Second, func() error {
		for i := range 3 {
			if i != li && c.Node(i).IsLeader() {
				other = i
				return nil
			}
		}
		return errors.New("no other node leads")
	}); err != nil {
		t.Fatalf("20 s after the leader's disk stopped completing writes: %v", err)
	}
	if _, err := reserveAndCommit(ctx, c.Node(other), "after-the-new-leader", true); err != nil {
		t.Fatalf("a write on the new leader %s: %v", c.ID(other), err)
	}
	// The old leader, its loop held in the append, learnt the new term from the new
	// leader's heartbeat: a linearizable read there is refused at once.
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := c.Node(li).Get(rctx, &idemkv.GetRequest{Tenant: "acme", Key: "before"})
	if d := time.Since(start); err == nil || d > 5*time.Second {
		t.Fatalf("a linearizable read on the stuck old leader: %v after %s, want an error within its 2 s", err, d)
	}

	logs[li].set(false)
	if err := testcluster.Eventually(20*time.Second, func() error {
		if c.Node(li).IsLeader() {
			return errors.New("the old leader still leads")
		}
		return c.Converged(time.Second)
	}); err != nil {
		t.Fatalf("once the old leader's disk works: %v", err)
	}
}

// TestReadOnAStuckLeaderEnds: a linearizable read confirms leadership through Raft's
// loop, which a disk that stopped completing writes holds in an append; with no other
// node to take over (a single node), the read waited for good, and every read after
// it. It now ends with its context, unavailable: nothing was read.
func TestReadOnAStuckLeaderEnds(t *testing.T) {
	c, logs := startStalling(t, 1)
	n := c.Node(c.WaitLeader())
	ctx := ctxT(t)
	if _, err := reserveAndCommit(ctx, n, "before", true); err != nil {
		t.Fatal(err)
	}
	holdAWrite(t, ctx, n, logs[0], "held")
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	start := time.Now()
	_, err := n.Get(rctx, &idemkv.GetRequest{Tenant: "acme", Key: "before"})
	if d := time.Since(start); !errors.Is(err, idemkv.ErrUnavailable) || d > 4*time.Second {
		t.Fatalf("a linearizable read on a leader held in its append: %v after %s, want unavailable within its 1 s", err, d)
	}
}
