package node_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
	dto "github.com/prometheus/client_model/go"
)

// TestVersionGateKeepsAMixedClusterUp is a rolling upgrade of a cluster that the
// release before history built: n1 runs "as that release" (Config.AsFormat: it
// advertises nothing, and halts on any entry or restored record of format 3), n2 and
// n3 run this build. While n1 is a member the cluster stays at format 2: writes that
// need format 3 are refused naming n1, a resolve is written without its token, no
// record gets a history, and all three nodes hold the same bytes (the state hash)
// through a snapshot install onto n1. Once n1 is upgraded and rejoins, the cluster
// rises to format 3 and histories appear; a node of the older release can no longer
// join.
func TestVersionGateKeepsAMixedClusterUp(t *testing.T) {
	var upgraded atomic.Bool
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.SnapshotThreshold, cfg.TrailingLogs = 16, 8
		// bolt drops compacted entries at once (raft-wal keeps serving a segment it
		// still has), so n1 below is sent a snapshot, not the entries.
		cfg.RaftLog = node.RaftLogBolt
		if i == 0 && !upgraded.Load() {
			cfg.AsFormat = fsm.FormatApprovals
		}
	}))
	ctx := ctxT(t)
	formats := func() string {
		var out []string
		for i := range c.Len() {
			if n := c.Node(i); n != nil {
				out = append(out, fmt.Sprintf("%s:%d", c.ID(i), n.ClusterFormat()))
			}
		}
		return strings.Join(out, " ")
	}
	if got := formats(); got != "n1:2 n2:2 n3:2" {
		t.Fatalf("cluster formats %s, want 2 everywhere", got)
	}
	// The gate is the upgraded leader's: move the leadership off n1.
	if err := testcluster.Eventually(20*time.Second, func() error {
		if li := c.LeaderIndex(t); li == 0 {
			_ = c.Node(0).TransferLeadership()
			return errors.New("n1 still leads")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	info, err := c.Node(c.LeaderIndex(t)).Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// n2 and n3 joined through n1, which recorded no format: they join again, as
	// `idemkv serve --join` does while AdvertisePending.
	readvertise := func() {
		t.Helper()
		for i := range c.Len() {
			if n := c.Node(i); n != nil && n.AdvertisePending() && !n.IsLeader() {
				if err := c.OnLeader(func(l *node.Node) error {
					ni := info.Nodes[i]
					_, err := l.Join(ctx, &idemkv.JoinRequest{ID: ni.ID, RaftAddr: ni.RaftAddr, APIAddr: ni.APIAddr, Format: n.Format()})
					return err
				}); err != nil {
					t.Fatalf("%s joining again: %v", c.ID(i), err)
				}
			}
		}
	}
	readvertise()
	if info, err = c.Node(c.LeaderIndex(t)).Cluster(ctx); err != nil {
		t.Fatal(err)
	}
	var n1 idemkv.NodeInfo
	for _, ni := range info.Nodes {
		want := fsm.FormatVersion
		if ni.ID == "n1" {
			n1, want = ni, fsm.FormatApprovals
		}
		if ni.Format != want {
			t.Errorf("%s advertised %d, want %d", ni.ID, ni.Format, want)
		}
	}
	if info.Format != fsm.FormatApprovals {
		t.Errorf("GET /v1/cluster says format %d", info.Format)
	}

	// What needs format 3 is refused, naming the member that holds it back.
	stored := reserveReq("stored", "a-stored", "")
	stored.Effect, stored.Fingerprint, stored.StoreEffect = json.RawMessage(`{"amount":40}`), "", true
	// Straight to the leader: a client retries a 503 until its deadline.
	leader := c.Node(c.LeaderIndex(t))
	_, err = leader.Reserve(ctx, stored)
	if !errors.Is(err, idemkv.ErrUnavailable) || !strings.Contains(err.Error(), "n1 (format 2)") || !strings.Contains(err.Error(), "store_effect") {
		t.Errorf("store_effect at format 2: %v", err)
	}
	_, err = leader.SetApprovalRule(ctx, &idemkv.SetApprovalRuleRequest{ApprovalRule: idemkv.ApprovalRule{Tenant: "acme", Tool: "refund", StoreEffect: true, Mask: []string{"/card"}}})
	if !errors.Is(err, idemkv.ErrUnavailable) || !strings.Contains(err.Error(), "n1 (format 2)") {
		t.Errorf("a rule with options at format 2: %v", err)
	}

	// What the older release reads goes through: a reserve and commit, an approval
	// rule as it knew them, and a doubt resolved by a named token.
	committed := runToCommit(t, c, "plain")
	var doubted *idemkv.ReserveResult
	if err := c.OnLeader(func(n *node.Node) (err error) {
		doubted, err = n.Reserve(ctx, reserveReq("doubted", "a-d", "sha256:d"))
		if err == nil {
			_, err = n.Doubt(ctx, &idemkv.DoubtRequest{Tenant: "acme", Key: "doubted", Fingerprint: "sha256:d", Fence: doubted.Fence})
		}
		if err == nil {
			_, err = n.Resolve(ctx, &idemkv.ResolveRequest{Tenant: "acme", Key: "doubted", Fingerprint: "sha256:d",
				Outcome: idemkv.ResolveCommitted, RemoteSystem: "stripe", RemoteID: "re_1", By: "oncall-ana (admin)"})
		}
		if err == nil {
			_, err = n.SetApprovalRule(ctx, &idemkv.SetApprovalRuleRequest{ApprovalRule: idemkv.ApprovalRule{Tenant: "acme", Tool: "wire", TTLMs: 60_000}})
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}

	// n1 away long enough to be sent a snapshot of the upgraded leader's store.
	lagApplied := c.Node(0).AppliedIndex()
	c.Stop(0)
	writeFillers(t, c, ctx, 60)
	ln := snapshotPast(t, c, lagApplied)
	sent := ln.RaftStats()["last_snapshot_index"]
	c.Restart(0)
	c.WaitConverged() // equal state hashes: n1, which could not read a history, was sent none
	// Raft notes the installed snapshot only after the state machine restored it, so
	// the hashes may agree a moment before the stats do; and the leader may have taken
	// a later snapshot since.
	if err := testcluster.Eventually(10*time.Second, func() error {
		got, _ := strconv.ParseUint(c.Node(0).RaftStats()["last_snapshot_index"], 10, 64)
		if want, _ := strconv.ParseUint(sent, 10, 64); got < want {
			return fmt.Errorf("n1's last snapshot is at %d, the leader's at %d: n1 was not sent it", got, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i := range c.Len() {
		if err := c.Node(i).Ready(); err != nil {
			t.Errorf("%s: %v", c.ID(i), err)
		}
		for _, key := range []string{committed, "doubted", "filler-39"} {
			rec, err := c.Node(i).Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: key, Consistency: idemkv.Stale})
			if err != nil || len(rec.History) != 0 {
				t.Errorf("%s %s at format 2: %+v (%v)", c.ID(i), key, rec, err)
			}
		}
	}

	// Upgrade n1: restart it without the knob; it rejoins, as `idemkv serve --join`
	// does at every start, with the format it reads.
	upgraded.Store(true)
	c.Stop(0)
	c.Restart(0)
	if err := c.OnLeader(func(n *node.Node) error {
		_, err := n.Join(ctx, &idemkv.JoinRequest{ID: n1.ID, RaftAddr: n1.RaftAddr, APIAddr: n1.APIAddr, Format: c.Node(0).Format()})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := testcluster.Eventually(20*time.Second, func() error {
		if got := formats(); got != "n1:3 n2:3 n3:3" {
			return fmt.Errorf("cluster formats %s", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i := range c.Len() {
		var m dto.Metric
		if err := c.Metrics(i).ClusterFormat.Write(&m); err != nil || m.GetGauge().GetValue() != 3 {
			t.Errorf("%s: idemkv_cluster_format %v (%v)", c.ID(i), m.GetGauge().GetValue(), err)
		}
	}
	after := runToCommit(t, c, "after-upgrade")
	stored.Key = "stored-after"
	if err := c.OnLeader(func(n *node.Node) error { _, err := n.Reserve(ctx, stored); return err }); err != nil {
		t.Errorf("store_effect at format 3: %v", err)
	}
	c.WaitConverged()
	for i := range c.Len() {
		rec, err := c.Node(i).Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: after, Consistency: idemkv.Stale})
		if err != nil || len(rec.History) != 2 || rec.History[0].Event != idemkv.EventExecute || rec.History[1].Event != idemkv.EventCommit {
			t.Errorf("%s %s at format 3: %+v (%v)", c.ID(i), after, rec, err)
		}
		rec, err = c.Node(i).Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: "stored-after", Consistency: idemkv.Stale})
		if err != nil || string(rec.Effect) != `{"amount":40}` {
			t.Errorf("%s: the stored effect at format 3: %+v (%v)", c.ID(i), rec, err)
		}
	}

	// A node of the older release can no longer join.
	err = c.OnLeader(func(n *node.Node) error {
		_, err := n.Join(ctx, &idemkv.JoinRequest{ID: "n9", RaftAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2"})
		return err
	})
	var ierr *idemkv.Error
	if !errors.As(err, &ierr) || ierr.Field != "format" || !strings.Contains(ierr.Message, "reads data format 2 and this cluster's is 3") {
		t.Errorf("a join of a format-2 node: %v", err)
	}
	info, err = c.Node(c.LeaderIndex(t)).Cluster(ctx)
	if err != nil || len(info.Nodes) != 3 || info.Format != 3 {
		t.Errorf("after the refused join: %+v (%v)", info, err)
	}
}

// runToCommit reserves and commits key on the leader and returns the key.
func runToCommit(t *testing.T, c *testcluster.Cluster, key string) string {
	t.Helper()
	ctx := ctxT(t)
	if err := c.OnLeader(func(n *node.Node) error {
		res, err := n.Reserve(ctx, reserveReq(key, "a-"+key, "sha256:"+key))
		if err == nil {
			_, err = n.Commit(ctx, &idemkv.CommitRequest{Tenant: "acme", Key: key, Fingerprint: "sha256:" + key, Fence: res.Fence,
				RemoteSystem: "stripe", RemoteID: "ch_" + key})
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return key
}
