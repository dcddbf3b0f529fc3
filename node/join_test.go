package node_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
)

// TestJoinNeverMovesAMember: a join with a live member's ID and a new api_addr made
// every follower forward requests, with the callers' bearer tokens, to that address
// (issue 13, defect 1). A join that would change a member's addresses is refused; the
// same join again is still a no-op, and followers keep naming the real leader.
func TestJoinNeverMovesAMember(t *testing.T) {
	c := testcluster.Start(t, 3)
	li := c.WaitLeader()
	leader := c.Node(li)
	fi := (li + 1) % 3
	infoOf := func(id string) idemkv.NodeInfo {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		info, err := leader.Cluster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ni := range info.Nodes {
			if ni.ID == id {
				return ni
			}
		}
		t.Fatalf("no member %s in %+v", id, info.Nodes)
		return idemkv.NodeInfo{}
	}
	self, follower := infoOf(c.ID(li)), infoOf(c.ID(fi))
	const evil = "127.0.0.1:9"
	attacks := []struct {
		name string
		req  idemkv.JoinRequest
	}{
		{"the leader's ID, a new api_addr", idemkv.JoinRequest{ID: self.ID, RaftAddr: self.RaftAddr, APIAddr: evil}},
		{"a follower's ID, a new api_addr", idemkv.JoinRequest{ID: follower.ID, RaftAddr: follower.RaftAddr, APIAddr: evil}},
		{"a follower's ID, a new raft_addr", idemkv.JoinRequest{ID: follower.ID, RaftAddr: evil, APIAddr: evil}},
		{"a new ID at the leader's raft_addr", idemkv.JoinRequest{ID: "intruder", RaftAddr: self.RaftAddr, APIAddr: evil}},
	}
	for _, a := range attacks {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := leader.Join(ctx, &a.req)
		cancel()
		if !errors.Is(err, idemkv.ErrInvalidArgument) {
			t.Errorf("%s: join answered %v, want invalid_argument", a.name, err)
		}
	}
	for _, id := range []string{self.ID, follower.ID} {
		ni := infoOf(id)
		if ni.APIAddr == evil || ni.RaftAddr == evil {
			t.Errorf("member %s moved to %+v", id, ni)
		}
	}
	for i := range 3 {
		if i == li {
			continue
		}
		if addr, _ := c.Node(i).Leader(); addr != c.Endpoint(li) {
			t.Errorf("%s names the leader at %q, want %s", c.ID(i), addr, c.Endpoint(li))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := leader.Join(ctx, &idemkv.JoinRequest{ID: follower.ID, RaftAddr: follower.RaftAddr, APIAddr: follower.APIAddr, Format: follower.Format}); err != nil {
		t.Errorf("joining again with the same addresses: %v", err)
	}
}

// TestJoinRefusesAStrangerWithState: a node that is not a member and holds state of
// its own (another cluster's data dir: an audit rebuilt a cluster on the same
// addresses, joined a node of the old one, which led with its longer log, and a key
// the new cluster had committed got execute again) is refused; a member's join, state
// or not, is the no-op it was; a node says whether it started with state.
func TestJoinRefusesAStrangerWithState(t *testing.T) {
	c := testcluster.Start(t, 3)
	li := c.WaitLeader()
	leader := c.Node(li)
	fi := (li + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, fresh := true, false
	stranger := idemkv.JoinRequest{ID: "stranger", RaftAddr: "127.0.0.1:9", APIAddr: "127.0.0.1:9", Format: leader.Format(), HoldsState: &held}
	var ie *idemkv.Error
	if _, err := leader.Join(ctx, &stranger); !errors.As(err, &ie) || ie.Code != idemkv.CodeInvalidArgument || ie.Field != "holds_state" {
		t.Fatalf("a stranger holding state: %v, want invalid_argument on holds_state", err)
	}
	info, err := leader.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ni := range info.Nodes {
		if ni.ID == stranger.ID {
			t.Fatalf("the stranger is a member: %+v", info.Nodes)
		}
	}
	var follower idemkv.NodeInfo
	for _, ni := range info.Nodes {
		if ni.ID == c.ID(fi) {
			follower = ni
		}
	}
	for _, state := range []*bool{&held, &fresh, nil} {
		req := idemkv.JoinRequest{ID: follower.ID, RaftAddr: follower.RaftAddr, APIAddr: follower.APIAddr, Format: follower.Format, HoldsState: state}
		if _, err := leader.Join(ctx, &req); err != nil {
			t.Errorf("a member joining again (holds_state %v): %v", state, err)
		}
	}
	if c.Node(fi).HeldState() {
		t.Error("a node that joined with an empty data dir says it started with state")
	}
	c.Stop(fi)
	c.Restart(fi)
	if !c.Node(fi).HeldState() {
		t.Error("a node restarted on its data dir says it started without state")
	}
}

// TestMembershipChangesKeepAQuorum: with one of three voters down, a node that joins
// as a learner, whose raft_addr nobody can reach, leaves the others committing (a
// voter added at once left them a candidate for good: an audit's case), and it cannot
// be promoted without being a member; a removal that would leave the voters the
// leader reaches short of their quorum is refused unless forced, while removing the
// voter that is down is not.
func TestMembershipChangesKeepAQuorum(t *testing.T) {
	c := testcluster.Start(t, 3)
	li := c.WaitLeader()
	leader := c.Node(li)
	up, down := (li+1)%3, (li+2)%3
	c.Stop(down)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The leader notices the voter that is down once its heartbeats fail.
	if err := testcluster.Eventually(20*time.Second, func() error {
		info, err := leader.Cluster(ctx)
		if err != nil {
			return err
		}
		for _, ni := range info.Nodes {
			if ni.ID == c.ID(down) && ni.State != "unreachable" {
				return fmt.Errorf("%s is %s", ni.ID, ni.State)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	const nowhere = "127.0.0.1:9"
	learner := idemkv.JoinRequest{ID: "n-learner", RaftAddr: nowhere, APIAddr: nowhere, Format: leader.Format(), Stage: idemkv.JoinLearner}
	if _, err := leader.Join(ctx, &learner); err != nil {
		t.Fatalf("joining a learner: %v", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	_, err := leader.Reserve(wctx, reserveReq("after-learner", "a1", "fp1"))
	wcancel()
	if err != nil {
		t.Fatalf("a write after a learner joined, one voter down: %v", err)
	}
	stranger := idemkv.JoinRequest{ID: "n-stranger", RaftAddr: "127.0.0.1:8", APIAddr: "127.0.0.1:8", Format: leader.Format(), Stage: idemkv.JoinPromote}
	if _, err := leader.Join(ctx, &stranger); !errors.Is(err, idemkv.ErrInvalidArgument) {
		t.Errorf("promoting a node that is not a member: %v, want invalid_argument", err)
	}
	var ie *idemkv.Error
	if _, err := leader.Remove(ctx, &idemkv.RemoveRequest{ID: c.ID(up)}); !errors.As(err, &ie) || ie.Code != idemkv.CodeInvalidArgument {
		t.Fatalf("removing the one live follower while another voter is down: %v, want invalid_argument", err)
	}
	for _, id := range []string{"n-learner", c.ID(down)} {
		if _, err := leader.Remove(ctx, &idemkv.RemoveRequest{ID: id}); err != nil {
			t.Errorf("removing %s: %v", id, err)
		}
	}
	wctx, wcancel = context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if _, err := leader.Reserve(wctx, reserveReq("after-removals", "a2", "fp2")); err != nil {
		t.Fatalf("a write after the removals: %v", err)
	}
}
