package node_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// quickTimings makes elections fast enough to run a hundred of them in a test, and
// snapshots frequent enough that some are labelled at entries the state machine never
// sees.
func quickTimings(cfg *node.Config) {
	cfg.HeartbeatTimeout = 100 * time.Millisecond
	cfg.ElectionTimeout = 100 * time.Millisecond
	cfg.LeaderLeaseTimeout = 50 * time.Millisecond
	cfg.SnapshotThreshold = 8
	cfg.TrailingLogs = 4
	cfg.SnapshotInterval = 50 * time.Millisecond
}

// readyz asks n's HTTP API for /readyz, as a load balancer would.
func readyz(n *node.Node) error { return probe(n, "/readyz") }

// probe asks n's API for path (/readyz, /healthz): an error unless 200.
func probe(n *node.Node, path string) error {
	w := httptest.NewRecorder()
	api.New(api.Config{Store: n}).Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
	if w.Code != http.StatusOK {
		return fmt.Errorf("%s answered %d: %s", path, w.Code, w.Body)
	}
	return nil
}

// serveReads checks that the leader n serves every linearizable read: /readyz, GET,
// list, backup, and a reserve of a committed key answered replay from a read.
func serveReads(ctx context.Context, n *node.Node, key string) error {
	if err := readyz(n); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if rec, err := n.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: key}); err != nil || rec.Status != idemkv.StatusCommitted {
		return fmt.Errorf("get: %v %+v", err, rec)
	}
	if l, err := n.List(ctx, &idemkv.ListRequest{Tenant: "acme"}); err != nil || len(l.Records) != 1 {
		return fmt.Errorf("list: %v %+v", err, l)
	}
	if err := n.Backup(ctx, io.Discard); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	res, err := n.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "acme", Key: key, Tool: "create_ticket",
		Fingerprint: fp(key), AttemptID: "a-" + key})
	if err != nil || res.Decision != idemkv.DecisionReplay {
		return fmt.Errorf("reserve of a committed key: %v %+v", err, res)
	}
	return nil
}

// TestRestartsWithoutWritesStayReady: a single node restarted a hundred times with no
// write in between stays ready and serves linearizable reads. Every election used to
// add two entries the state machine never sees (Raft's no-op and idemkv's barrier);
// past 64 of them (33 restarts), /readyz, reads, backups and replays all answered 503
// until a write landed, which behind a load balancer gating on /readyz never did
// (issue 12, defect 1).
func TestRestartsWithoutWritesStayReady(t *testing.T) {
	dir := t.TempDir()
	cfg := opsNodeConfig(t, "n1", dir)
	cfg.Bootstrap = true
	quickTimings(&cfg)
	ctx := opsCtx(t)
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = n.Close() }()
	waitLeaderReady(t, n)
	if _, err := reserveAndCommit(ctx, n, "k1", true); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if err := n.Close(); err != nil {
			t.Fatalf("restart %d: close: %v", i, err)
		}
		if n, err = node.Open(cfg); err != nil {
			t.Fatalf("restart %d: open: %v", i, err)
		}
		if err := testcluster.Eventually(10*time.Second, func() error {
			if !n.IsLeader() {
				return errors.New("not the leader yet")
			}
			return serveReads(ctx, n, "k1")
		}); err != nil {
			t.Fatalf("restart %d (applied index %d): %v", i+1, n.AppliedIndex(), err)
		}
	}
}

// TestLeadershipTransfersWithoutWritesStayReady: the same for a three-node cluster put
// through a hundred leadership transfers with no write: the leader serves every read
// and every node reports ready.
func TestLeadershipTransfersWithoutWritesStayReady(t *testing.T) {
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(_ int, cfg *node.Config) { quickTimings(cfg) }))
	ctx := opsCtx(t)
	if _, err := reserveAndCommit(ctx, c.Node(c.WaitLeader()), "k1", true); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		leader := c.WaitLeader()
		if err := c.Node(leader).TransferLeadership(); err != nil {
			t.Logf("transfer %d: %v", i, err) // an election may have moved it already
		}
		if err := testcluster.Eventually(10*time.Second, func() error {
			l := -1
			for j := range c.Len() {
				if c.Node(j).IsLeader() {
					l = j
				}
			}
			if l < 0 {
				return errors.New("no leader")
			}
			if err := serveReads(ctx, c.Node(l), "k1"); err != nil {
				return fmt.Errorf("leader %s: %w", c.ID(l), err)
			}
			for j := range c.Len() {
				if err := readyz(c.Node(j)); err != nil {
					return fmt.Errorf("%s (applied index %d): %w", c.ID(j), c.Node(j).AppliedIndex(), err)
				}
			}
			return nil
		}); err != nil {
			t.Fatalf("transfer %d: %v", i+1, err)
		}
	}
}
