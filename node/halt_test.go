package node_test

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// waitHalted waits until node n reports a halted state machine on /readyz, and checks
// that /healthz fails too: a liveness probe restarts a halted node (it answered 200, and
// the node waited halted for a person).
func waitHalted(t *testing.T, n *node.Node) {
	t.Helper()
	defer func() {
		if err := probe(n, "/healthz"); err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "must restart") {
			t.Errorf("/healthz of a halted node: %v, want 503 saying it must restart", err)
		}
	}()
	if err := testcluster.Eventually(20*time.Second, func() error {
		err := readyz(n)
		if err == nil || !strings.Contains(err.Error(), "halted") {
			return fmt.Errorf("not halted: %v", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestStorageReadErrorStopsReplicaThenConverges: a follower whose store fails a read
// while applying a commit stops (its /readyz says why) instead of skipping the entry
// while the others apply it; restarted on a healthy store it replays the entry from
// Raft's log and holds the same state as the others (issue 12, defect 3).
func TestStorageReadErrorStopsReplicaThenConverges(t *testing.T) {
	var armed atomic.Bool
	faulty := true
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && (op.Kind == errorfs.OpFileReadAt || op.Kind == errorfs.OpFileRead) && strings.HasSuffix(op.Path, ".sst") {
			return errorfs.ErrInjected
		}
		return nil
	}))
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.SnapshotThreshold = 1 << 20 // keep the log: the replay after the restart needs it
		if i == 2 && faulty {
			cfg.PebbleFS = fs
			cfg.CacheBytes = 1 // reads go to the files
		}
	}))
	ctx := opsCtx(t)
	if c.WaitLeader() == 2 {
		c.Stop(2) // hands leadership over
		c.Restart(2)
		c.WaitLeader()
	}
	fences := map[string]uint64{}
	for i := range 300 {
		key := fmt.Sprintf("k%03d", i)
		// Through whichever node leads: under load, leadership may move mid-test.
		if err := c.OnLeader(func(n *node.Node) error {
			res, err := n.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "acme", Key: key, Tool: "create_ticket",
				Fingerprint: fp(key), AttemptID: "a-" + key})
			if err == nil {
				fences[key] = res.Fence
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	// A restart flushes node 3's store into tables, so a later read goes to the files.
	c.Stop(2)
	c.Restart(2)
	c.WaitConverged()
	c.WaitLeader()

	// A committed record the replica holds before it halts.
	settled := "k001"
	if err := c.OnLeader(func(n *node.Node) error {
		_, err := n.Commit(ctx, &idemkv.CommitRequest{Tenant: "acme", Key: settled, Fingerprint: fp(settled),
			Fence: fences[settled], RemoteSystem: "linear", RemoteID: "LIN-0"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.WaitConverged()

	armed.Store(true)
	key := "k257"
	if err := c.OnLeader(func(n *node.Node) error {
		_, err := n.Commit(ctx, &idemkv.CommitRequest{Tenant: "acme", Key: key, Fingerprint: fp(key),
			Fence: fences[key], RemoteSystem: "linear", RemoteID: "LIN-1"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	waitHalted(t, c.Node(2))
	if got, want := c.Node(2).AppliedIndex(), c.Node(c.WaitLeader()).AppliedIndex(); got >= want {
		t.Fatalf("the halted replica applied up to %d, the leader %d", got, want)
	}
	armed.Store(false)
	// Its store reads again, but a halted state machine answers nothing from it, not
	// even the replay of a committed record (docs/protocol.md "Followers").
	replay := &idemkv.ReserveRequest{Tenant: "acme", Key: settled, Tool: "create_ticket", Fingerprint: fp(settled), AttemptID: "b"}
	if res, ok := c.Node(2).ReserveLocal(replay); ok {
		t.Fatalf("the halted replica answered a reserve from its state: %+v", res)
	}
	if res, err := c.Node(2).Reserve(ctx, replay); err == nil {
		t.Fatalf("the halted replica answered a reserve: %+v", res)
	}
	faulty = false
	c.Stop(2)
	c.Restart(2)
	c.WaitConverged()
	rec, err := c.Node(2).Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: key, Consistency: idemkv.Stale})
	if err != nil || rec.Status != idemkv.StatusCommitted {
		t.Fatalf("%s on the restarted replica: %v %+v", key, err, rec)
	}
}

// cutSnapshots hands Raft's restore a snapshot cut in half while armed.
type cutSnapshots struct {
	raft.SnapshotStore
	armed *atomic.Bool
	cut   *atomic.Int64
}

func (s cutSnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	meta, rc, err := s.SnapshotStore.Open(id)
	if err != nil || !s.armed.Load() {
		return meta, rc, err
	}
	s.cut.Add(1)
	return meta, struct {
		io.Reader
		io.Closer
	}{io.LimitReader(rc, meta.Size/2), rc}, nil
}

// TestFailedSnapshotInstallHaltsReplica: a follower whose snapshot install fails to
// restore (the stream it reads back is cut) stops applying and says so on /readyz,
// instead of applying the next entries on a store that is not the snapshot's (it was
// wiped before version 2 of the format; it is now left as it was, behind); a restart
// restores the installed snapshot and converges (issue 12, defect 2).
func TestFailedSnapshotInstallHaltsReplica(t *testing.T) {
	var armed atomic.Bool
	var cut atomic.Int64
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
		if i == 2 {
			cfg.WrapRaftStores = func(s node.RaftStores) node.RaftStores {
				s.Snapshots = cutSnapshots{SnapshotStore: s.Snapshots, armed: &armed, cut: &cut}
				return s
			}
		}
	}))
	ctx := opsCtx(t)
	if l := c.WaitLeader(); l == 2 {
		c.Stop(2)
		c.Restart(2)
	}
	c.Stop(2)
	l := c.WaitLeader()
	for i := range 200 {
		if _, err := reserveAndCommit(ctx, c.Node(l), fmt.Sprintf("k%03d", i), i%2 == 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Node(l).Snapshot(); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	c.Restart(2)
	waitHalted(t, c.Node(2))
	if cut.Load() == 0 {
		t.Fatal("no snapshot was restored through the cut store: the scenario is wrong")
	}
	if _, err := c.Node(2).Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: "k000", Consistency: idemkv.Stale}); !errors.Is(err, idemkv.ErrUnavailable) {
		t.Fatalf("a stale read of the halted replica: %v, want unavailable", err)
	}
	armed.Store(false)
	c.Stop(2)
	c.Restart(2)
	c.WaitConverged()
	rec, err := c.Node(2).Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: "k198", Consistency: idemkv.Stale})
	if err != nil || rec.Status != idemkv.StatusCommitted {
		t.Fatalf("k198 on the restarted replica: %v %+v", err, rec)
	}
}
