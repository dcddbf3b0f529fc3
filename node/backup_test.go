package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/freeport"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
	"github.com/idemkv/idemkv/storage"
)

func opsCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type opsLogWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *opsLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

// opsLogger logs to t.Log until the test ends (Raft logs from its goroutines a little
// after Close returns).
func opsLogger(t testing.TB) *slog.Logger {
	w := &opsLogWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, nil))
}

func opsAddr(t testing.TB) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// opsNodeConfig is a fast-timing configuration for a node outside a testcluster.
func opsNodeConfig(t testing.TB, id, dir string) node.Config {
	cfg := node.DefaultConfig()
	cfg.ID, cfg.DataDir = id, dir
	cfg.RaftAddr, cfg.APIAddr = opsAddr(t), opsAddr(t)
	cfg.HeartbeatTimeout = 500 * time.Millisecond
	cfg.ElectionTimeout = 500 * time.Millisecond
	cfg.LeaderLeaseTimeout = 250 * time.Millisecond
	cfg.ApplyTimeout = 5 * time.Second
	cfg.Logger = opsLogger(t).With("node", id)
	return cfg
}

func openNode(t testing.TB, cfg node.Config) *node.Node {
	t.Helper()
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("close %s: %v", cfg.ID, err)
		}
	})
	return n
}

func waitLeaderReady(t testing.TB, n *node.Node) {
	t.Helper()
	if err := testcluster.Eventually(20*time.Second, func() error {
		if !n.IsLeader() {
			return errors.New("not the leader")
		}
		return n.Ready()
	}); err != nil {
		t.Fatal(err)
	}
}

func fp(s string) string { return fmt.Sprintf("sha256:%064x", []byte(s)[:min(len(s), 32)]) }

// ack is what a client saw acknowledged for one key, and when.
type ack struct {
	reserved, committed *idemkv.Record
	reservedAt          time.Time
	committedAt         time.Time // zero if the commit was not acknowledged
}

func reserveAndCommit(ctx context.Context, n *node.Node, key string, commit bool) (*ack, error) {
	res, err := n.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "acme", Key: key, Tool: "create_ticket",
		Fingerprint: fp(key), AttemptID: "a-" + key})
	if err != nil {
		return nil, err
	}
	if res.Decision != idemkv.DecisionExecute {
		return nil, fmt.Errorf("reserve %s: %s", key, res.Decision)
	}
	a := &ack{reserved: res.Record, reservedAt: time.Now()}
	if !commit {
		return a, nil
	}
	if _, err := n.Commit(ctx, &idemkv.CommitRequest{Tenant: "acme", Key: key, Fingerprint: fp(key), Fence: res.Fence,
		RemoteSystem: "linear", RemoteID: "LIN-" + key, Result: json.RawMessage(`{"n":1}`)}); err != nil {
		return a, err
	}
	a.committedAt = time.Now()
	rec, err := n.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: key})
	if err != nil {
		return a, err
	}
	a.committed = rec
	return a, nil
}

func recordJSON(t testing.TB, r *idemkv.Record) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestBackupWhileWritingThenRestoreLosesNothing(t *testing.T) {
	ctx := opsCtx(t)
	c := testcluster.Start(t, 3)
	leader := c.Node(c.WaitLeader())

	acked := map[string]*ack{}
	var mu sync.Mutex
	for i := range 60 {
		key := fmt.Sprintf("a:%03d", i)
		a, err := reserveAndCommit(ctx, leader, key, i%6 != 5)
		if err != nil {
			t.Fatal(err)
		}
		acked[key] = a
	}

	// Writers keep going before, during and after the backup.
	var stop atomic.Bool
	var started atomic.Int64
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load() && i < 2000; i++ {
				key := fmt.Sprintf("b:%d:%04d", w, i)
				a, err := reserveAndCommit(ctx, leader, key, true)
				if a != nil {
					mu.Lock()
					acked[key] = a
					mu.Unlock()
				}
				if err != nil {
					t.Errorf("writer %d, %s: %v", w, key, err)
					return
				}
				started.Add(1)
			}
		}()
	}
	if err := testcluster.Eventually(20*time.Second, func() error {
		if n := started.Load(); n < 40 {
			return fmt.Errorf("%d writes so far", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	backupFile := filepath.Join(t.TempDir(), "idemkv.backup")
	out, err := os.Create(backupFile)
	if err != nil {
		t.Fatal(err)
	}
	backupStart := time.Now()
	if err := leader.Backup(ctx, out); err != nil {
		t.Fatalf("backup: %v", err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	afterBackup := started.Load()
	if err := testcluster.Eventually(20*time.Second, func() error {
		if n := started.Load(); n < afterBackup+20 {
			return fmt.Errorf("%d writes after the backup", n-afterBackup)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stop.Store(true)
	wg.Wait()
	if t.Failed() {
		return
	}

	cfg := opsNodeConfig(t, "r1", filepath.Join(t.TempDir(), "r1"))
	backup, err := os.Open(backupFile)
	if err != nil {
		t.Fatal(err)
	}
	info, err := node.Restore(cfg, backup)
	backup.Close()
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	restored := openNode(t, cfg)
	waitLeaderReady(t, restored)

	// Every restored record is a state the original acknowledged, and every write
	// acknowledged before the backup started is there.
	page, err := restored.List(ctx, &idemkv.ListRequest{Tenant: "acme", Limit: idemkv.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*idemkv.Record{}
	var maxFence uint64
	for _, r := range page.Records {
		got[r.Key] = r
		maxFence = max(maxFence, r.Fence)
	}
	if page.Next != "" || len(got) != info.Records {
		t.Fatalf("restored %d records in the first page (next %q), Restore counted %d", len(got), page.Next, info.Records)
	}
	mustHave := 0
	for key, a := range acked {
		r, ok := got[key]
		switch {
		case !a.committedAt.IsZero() && a.committedAt.Before(backupStart):
			mustHave++
			if !ok || recordJSON(t, r) != recordJSON(t, a.committed) {
				t.Errorf("%s: committed before the backup as %s, restored as %s", key, recordJSON(t, a.committed), recordJSON(t, r))
			}
		case a.committedAt.IsZero() && a.reservedAt.Before(backupStart):
			mustHave++
			if !ok || recordJSON(t, r) != recordJSON(t, a.reserved) {
				t.Errorf("%s: reserved before the backup as %s, restored as %s", key, recordJSON(t, a.reserved), recordJSON(t, r))
			}
		case ok:
			// Written while the backup ran: either state is fine, nothing else is.
			if s := recordJSON(t, r); s != recordJSON(t, a.reserved) && (a.committed == nil || s != recordJSON(t, a.committed)) {
				t.Errorf("%s: restored as %s, which was never acknowledged", key, s)
			}
		}
	}
	for key := range got {
		if acked[key] == nil {
			t.Errorf("restored %s, which was never written", key)
		}
	}
	if mustHave < 100 || len(got) < mustHave || len(got) >= len(acked) {
		t.Errorf("%d must-have records, %d restored, %d acknowledged in all: the backup did not run while writing", mustHave, len(got), len(acked))
	}
	t.Logf("backup at index %d term %d: %d records restored, %d acknowledged before it, %d in all",
		info.Index, info.Term, len(got), mustHave, len(acked))

	// The log continues: new grants get fences above every restored one, in a later term.
	a, err := reserveAndCommit(ctx, restored, "after-restore", true)
	if err != nil {
		t.Fatal(err)
	}
	if a.reserved.Fence <= maxFence || a.reserved.Fence <= info.Index {
		t.Fatalf("new fence %d, restored fences up to %d, backup index %d", a.reserved.Fence, maxFence, info.Index)
	}
	// ... and above every fence the original cluster granted, after the backup too:
	// attempts of that lost timeline must not see their fences granted again (issue
	// 12, defect 4).
	var oldMax uint64
	for _, a := range acked {
		oldMax = max(oldMax, a.reserved.Fence)
	}
	if oldMax <= info.Index {
		t.Fatalf("the original cluster granted fences up to %d, the backup is at %d: no writes after the backup", oldMax, info.Index)
	}
	if a.reserved.Fence <= oldMax {
		t.Fatalf("new fence %d after the restore, the original cluster granted up to %d", a.reserved.Fence, oldMax)
	}
	if term, _ := strconv.ParseUint(restored.RaftStats()["term"], 10, 64); term <= info.Term {
		t.Fatalf("restored node in term %d, the backup was taken in term %d", term, info.Term)
	}
	// A replay of a restored receipt still works.
	for key, a := range acked {
		if a.committed == nil || !a.committedAt.Before(backupStart) {
			continue
		}
		res, err := restored.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "acme", Key: key, Tool: "create_ticket", Fingerprint: fp(key)})
		if err != nil || res.Decision != idemkv.DecisionReplay || res.Receipt.RemoteID != "LIN-"+key {
			t.Fatalf("replay of %s after restore: %+v, %v", key, res, err)
		}
		break
	}

	// Others join the restored node and converge on its state.
	var members []*node.Node
	for _, id := range []string{"r2", "r3"} {
		jc := opsNodeConfig(t, id, filepath.Join(t.TempDir(), id))
		m := openNode(t, jc)
		if _, err := restored.Join(ctx, &idemkv.JoinRequest{ID: id, RaftAddr: jc.RaftAddr, APIAddr: jc.APIAddr, Format: m.Format()}); err != nil {
			t.Fatalf("join %s: %v", id, err)
		}
		members = append(members, m)
	}
	want, err := restored.StateHash()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		if err := testcluster.Eventually(30*time.Second, func() error {
			h, err := m.StateHash()
			if err != nil {
				return err
			}
			if h != want {
				return fmt.Errorf("%s hash %s, restored node %s", m.ID(), h, want)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBackupOnAFollowerWritesNothing(t *testing.T) {
	c := testcluster.Start(t, 3)
	l := c.WaitLeader()
	f := c.Node((l + 1) % c.Len())
	var buf bytes.Buffer
	err := f.Backup(opsCtx(t), &buf)
	if !errors.Is(err, idemkv.ErrNotLeader) || buf.Len() != 0 {
		t.Fatalf("backup on a follower: %v, %d bytes", err, buf.Len())
	}
}

func TestRestoreRefusesBadInputAndLeavesNothing(t *testing.T) {
	cfg, full := backupOfANewNode(t, 20)

	for name, data := range map[string][]byte{
		"truncated": full.Bytes()[:full.Len()-3],
		"cut short": full.Bytes()[:full.Len()/2],
		"flipped":   flipByte(full.Bytes(), full.Len()/2),
		"not one":   []byte("hello, this is not a backup"),
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "r")
			rc := opsNodeConfig(t, "r1", dir)
			_, err := node.Restore(rc, bytes.NewReader(data))
			if !errors.Is(err, storage.ErrCorrupt) {
				t.Fatalf("restore of a %s backup: %v, want ErrCorrupt", name, err)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Fatalf("a failed restore left %d entries in the data dir", len(entries))
			}
		})
	}

	// The node's own data dir holds state: restoring over it is refused, and the
	// refusal leaves it alone.
	before, _ := os.ReadDir(cfg.DataDir)
	if _, err := node.Restore(cfg, bytes.NewReader(full.Bytes())); err == nil {
		t.Fatal("restore into a data dir with state succeeded")
	}
	if after, _ := os.ReadDir(cfg.DataDir); len(after) != len(before) || len(before) == 0 {
		t.Fatalf("refused restore changed the data dir: %d entries, then %d", len(before), len(after))
	}
	// The good backup restores into a fresh dir, record for record.
	rc := opsNodeConfig(t, "r1", filepath.Join(t.TempDir(), "good"))
	info, err := node.Restore(rc, bytes.NewReader(full.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if info.Records != 20 {
		t.Fatalf("restored %d records, want 20", info.Records)
	}
}

func flipByte(b []byte, i int) []byte {
	out := bytes.Clone(b)
	out[i] ^= 0x40
	return out
}

// A restore that is stopped midway (a kill, a power cut) leaves its data dir marked,
// and no node starts on it: it holds part of a backup, or nothing, and a node on it
// would answer execute for keys the backup holds. A restore that fails cleanly leaves
// the data dir empty. A store whose Raft files are gone is not bootstrapped over.
func TestUnfinishedRestoreIsRefused(t *testing.T) {
	_, full := backupOfANewNode(t, 20)
	dir := filepath.Join(t.TempDir(), "r")
	rc := opsNodeConfig(t, "r1", dir)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { _, err := node.Restore(rc, pr); done <- err }()
	if _, err := pw.Write(full.Bytes()[:full.Len()/2]); err != nil {
		t.Fatal(err)
	}
	// Midway, as a process killed now would leave it.
	rc.Bootstrap = true
	if _, err := node.Open(rc); err == nil || !strings.Contains(err.Error(), "did not finish") {
		t.Fatalf("a node opened on a data dir whose restore is under way: %v", err)
	}
	pw.CloseWithError(errors.New("the backup's source went away"))
	if err := <-done; err == nil {
		t.Fatal("a restore whose input failed succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("a failed restore left %d entries", len(entries))
	}

	// A finished restore whose Raft snapshot and log are then lost.
	if _, err := node.Restore(rc, bytes.NewReader(full.Bytes())); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"snapshots", "wal", "raft-log"} {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := node.Open(rc); err == nil || !strings.Contains(err.Error(), "refusing to bootstrap") {
		t.Fatalf("a node bootstrapped a new cluster over a store that applied a log it no longer has: %v", err)
	}
}

// A restored data dir starts a new cluster: started with --join (into the cluster it
// was backed up from, say) it would be a voter that skips every entry it is sent as
// old. The first start must be without --join; later restarts are as any node's.
func TestRestoredDataDirStartsANewCluster(t *testing.T) {
	_, full := backupOfANewNode(t, 1)
	rc := opsNodeConfig(t, "r1", filepath.Join(t.TempDir(), "r1"))
	if _, err := node.Restore(rc, bytes.NewReader(full.Bytes())); err != nil {
		t.Fatal(err)
	}
	rc.Joining = true // --join
	if _, err := node.Open(rc); err == nil || !strings.Contains(err.Error(), "without --join") {
		t.Fatalf("a restored data dir opened to join a cluster: %v", err)
	}
	rc.Joining = false
	r, err := node.Open(rc)
	if err != nil {
		t.Fatal(err)
	}
	waitLeaderReady(t, r)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	rc.Joining = true // a later restart with --join is a restart
	r, err = node.Open(rc)
	if err != nil {
		t.Fatalf("a restored node that started once did not restart with --join: %v", err)
	}
	waitLeaderReady(t, r)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// backupOfANewNode bootstraps a node, commits keys k0… through it, takes a backup and
// closes it: its configuration (its data dir holds the state) and the backup.
func backupOfANewNode(t *testing.T, keys int) (node.Config, *bytes.Buffer) {
	t.Helper()
	ctx := opsCtx(t)
	cfg := opsNodeConfig(t, "n1", filepath.Join(t.TempDir(), "n1"))
	cfg.Bootstrap = true
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitLeaderReady(t, n)
	for i := range keys {
		if _, err := reserveAndCommit(ctx, n, fmt.Sprintf("k%d", i), true); err != nil {
			t.Fatal(err)
		}
	}
	var full bytes.Buffer
	if err := n.Backup(ctx, &full); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	return cfg, &full
}
