package node_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

func memberByID(info *idemkv.ClusterInfo, id string) (idemkv.NodeInfo, bool) {
	for _, ni := range info.Nodes {
		if ni.ID == id {
			return ni, true
		}
	}
	return idemkv.NodeInfo{}, false
}

// A stopped member is reported as unreachable by the leader, with when it last
// answered, and as unknown by a follower, which cannot see it; it used to be listed as
// a follower by everyone. Once it is back, the leader sees it again.
func TestClusterReportsAStoppedMember(t *testing.T) {
	c := testcluster.Start(t, 3)
	leader := c.WaitLeader()
	stopped := (leader + 1) % 3
	other := (leader + 2) % 3
	c.Stop(stopped)

	if err := testcluster.Eventually(15*time.Second, func() error {
		info, err := c.Node(leader).Cluster(context.Background())
		if err != nil {
			return err
		}
		ni, ok := memberByID(info, c.ID(stopped))
		if !ok {
			return fmt.Errorf("%s not listed: %+v", c.ID(stopped), info.Nodes)
		}
		if ni.State != "unreachable" || ni.Reachable == nil || *ni.Reachable || ni.LastContact == "" {
			return fmt.Errorf("leader's view of the stopped %s: %+v", ni.ID, ni)
		}
		self, _ := memberByID(info, c.ID(leader))
		if self.State != "leader" || self.Reachable == nil || !*self.Reachable {
			return fmt.Errorf("leader's view of itself: %+v", self)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	info, err := c.Node(other).Cluster(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ni, _ := memberByID(info, c.ID(stopped)); ni.State != "unknown" || ni.Reachable != nil {
		t.Errorf("a follower's view of the stopped %s: %+v; want unknown", ni.ID, ni)
	}
	if ni, _ := memberByID(info, c.ID(leader)); ni.State != "leader" || ni.LastContact == "" {
		t.Errorf("a follower's view of its leader: %+v; want leader with a last contact", ni)
	}

	c.Restart(stopped)
	if err := testcluster.Eventually(20*time.Second, func() error {
		l := c.WaitLeader()
		info, err := c.Node(l).Cluster(context.Background())
		if err != nil {
			return err
		}
		for _, ni := range info.Nodes {
			if ni.Reachable == nil || !*ni.Reachable {
				return fmt.Errorf("after the restart: %+v", ni)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// A bootstrapped node's Raft address goes into the configuration as it was advertised:
// a name stays a name, so that after the network changes (containers recreated on a new
// network, with new IPs) peers resolve it afresh instead of dialling a dead IP.
func TestAdvertisedRaftNameIsKept(t *testing.T) {
	c := testcluster.Start(t, 1, testcluster.WithConfig(func(i int, cfg *node.Config) {
		_, port, err := net.SplitHostPort(cfg.RaftAddr)
		if err != nil {
			t.Fatal(err)
		}
		cfg.RaftAdvertise = net.JoinHostPort("localhost", port)
	}))
	check := func(when string) {
		t.Helper()
		info, err := c.Node(0).Cluster(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got := info.Nodes[0].RaftAddr; !strings.HasPrefix(got, "localhost:") {
			t.Fatalf("%s: raft_addr %q, want the advertised name localhost:…", when, got)
		}
	}
	check("after bootstrap")
	c.Stop(0)
	c.Restart(0)
	c.WaitLeader()
	check("after a restart")
	if _, err := c.Node(0).Reserve(context.Background(), &idemkv.ReserveRequest{Tenant: "t", Key: "k", Tool: "x", Fingerprint: "sha256:ab"}); err != nil {
		t.Fatalf("a write after the restart: %v", err)
	}
}
