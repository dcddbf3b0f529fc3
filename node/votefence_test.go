package node_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// TestWipedMemberVotesOnlyOnceCaughtUp: a member whose data dir was lost and that came
// back empty at the same id and address granted any vote at once (its log was empty and
// hashicorp/raft grants votes while its configuration is empty). An entry E committed on
// the leader and on that member while the third lagged was then on the leader alone, and
// with the leader down, the lagging node won an election without E through the wiped
// member's vote: an acknowledged commit was lost. Here the wiped member refuses votes
// and pre-votes (taking up no term) until it has caught up with a leader, so the lagging
// node cannot lead; the leader comes back with E, the wiped member catches up, and then
// it votes as before: with the leader stopped, it and the once-lagging node elect one.
func TestWipedMemberVotesOnlyOnceCaughtUp(t *testing.T) {
	ctx := opsCtx(t)
	c := testcluster.Start(t, 3)
	raftAddr := raftAddrs(t, c)
	for i := range 5 {
		if _, err := reserveAndCommit(ctx, c.Node(c.WaitLeader()), fmt.Sprintf("before-%d", i), true); err != nil {
			t.Fatal(err)
		}
	}
	lag := (c.WaitLeader() + 1) % 3
	c.Stop(lag)
	lead := c.WaitLeader()
	wiped := 3 - lead - lag
	if _, err := reserveAndCommit(ctx, c.Node(lead), "E", true); err != nil {
		t.Fatal(err)
	}

	c.Stop(wiped)
	if err := os.RemoveAll(c.DataDir(wiped)); err != nil {
		t.Fatal(err)
	}
	c.Stop(lead)
	c.Restart(wiped) // empty, as the same member at the same addresses
	w := c.Node(wiped)
	if w.HeldState() || !w.WithholdsVotes() {
		t.Fatalf("the wiped member: held state %v, withholds votes %v; want false, true", w.HeldState(), w.WithholdsVotes())
	}

	// A candidate whose log is far behind the cluster's commit index, posing as the
	// lagging member, before the wiped member has heard from any leader.
	tr, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 5*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close() //nolint:errcheck // a test's transport
	header := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(c.ID(lag)), Addr: []byte(tr.LocalAddr())}
	target := raft.ServerAddress(raftAddr[c.ID(wiped)])
	var pre raft.RequestPreVoteResponse
	if err := tr.RequestPreVote(raft.ServerID(c.ID(wiped)), target, &raft.RequestPreVoteRequest{RPCHeader: header, Term: 100, LastLogIndex: 1, LastLogTerm: 1}, &pre); err != nil {
		t.Fatal(err)
	}
	var vote raft.RequestVoteResponse
	if err := tr.RequestVote(raft.ServerID(c.ID(wiped)), target, &raft.RequestVoteRequest{RPCHeader: header, Term: 100, LastLogIndex: 1, LastLogTerm: 1}, &vote); err != nil {
		t.Fatal(err)
	}
	if pre.Granted || vote.Granted {
		t.Fatalf("the wiped member granted a candidate at index 1: pre-vote %v, vote %v", pre.Granted, vote.Granted)
	}

	// The lagging member, without E, and the wiped one must not elect a leader.
	c.Restart(lag)
	deadline := time.Now().Add(3 * time.Second) // six election timeouts
	for time.Now().Before(deadline) {
		for _, i := range []int{lag, wiped} {
			if c.Node(i).IsLeader() {
				t.Fatalf("%s leads without E, elected with the vote of the wiped %s", c.ID(i), c.ID(wiped))
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := w.RaftStats()["term"]; got != "0" {
		t.Fatalf("the wiped member took up term %s while refusing, want 0", got)
	}

	c.Restart(lead)
	if err := testcluster.Eventually(20*time.Second, func() error {
		if w.WithholdsVotes() {
			return errors.New("the wiped member still withholds its votes")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c.WaitConverged()
	checkCommitted(ctx, t, c, "E")

	// Caught up, it votes: with the other two down at first, a leader needs its vote
	// (or, if it is the candidate, its vote requests must leave it).
	c.Stop(lead)
	c.Stop(lag)
	c.Restart(lag)
	c.WaitLeader()
	checkCommitted(ctx, t, c, "E")
}

// TestNewMemberJoinsAndVotes: members that join with an empty data dir (serve --join)
// start behind the same fence, and it opens: they join, catch up and vote, so that the
// two that joined elect a leader by themselves once the first member is gone. The
// member that bootstrapped the cluster never withholds its vote.
func TestNewMemberJoinsAndVotes(t *testing.T) {
	ctx := opsCtx(t)
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) { cfg.Joining = i > 0 }))
	if c.Node(0).WithholdsVotes() {
		t.Fatal("the member that bootstrapped the cluster withholds its votes")
	}
	for i := 1; i < 3; i++ {
		if c.Node(i).HeldState() {
			t.Fatalf("%s joined with state", c.ID(i))
		}
		if err := testcluster.Eventually(20*time.Second, func() error {
			if c.Node(i).WithholdsVotes() {
				return fmt.Errorf("%s still withholds its votes", c.ID(i))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := reserveAndCommit(ctx, c.Node(c.WaitLeader()), "k", true); err != nil {
		t.Fatal(err)
	}
	c.WaitConverged()
	c.Stop(0)
	c.Stop(1)
	c.Restart(1) // with its state: it votes at once
	if c.Node(1).WithholdsVotes() {
		t.Fatal("a member restarted with its state withholds its votes")
	}
	c.WaitLeader()
	checkCommitted(ctx, t, c, "k")
}

// TestBootstrapNeverWithholdsVotes: a single node that bootstraps a new cluster leads
// it at once, and says it votes.
func TestBootstrapNeverWithholdsVotes(t *testing.T) {
	cfg := opsNodeConfig(t, "n1", t.TempDir())
	cfg.Bootstrap = true
	n := openNode(t, cfg)
	if n.WithholdsVotes() {
		t.Fatal("a bootstrapping node withholds its votes")
	}
	waitLeaderReady(t, n)
	if _, err := reserveAndCommit(opsCtx(t), n, "k", true); err != nil {
		t.Fatal(err)
	}
}

// checkCommitted fails t unless the leader holds key committed.
func checkCommitted(ctx context.Context, t *testing.T, c *testcluster.Cluster, key string) {
	t.Helper()
	var rec *idemkv.Record
	if err := c.OnLeader(func(n *node.Node) (err error) {
		rec, err = n.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: key})
		return err
	}); err != nil || rec.Status != idemkv.StatusCommitted {
		t.Fatalf("%s on the leader: %v %+v, want committed", key, err, rec)
	}
}
