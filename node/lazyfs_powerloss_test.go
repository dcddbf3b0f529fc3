package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/freeport"
	"github.com/idemkv/idemkv/internal/lazyfs"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/metrics"
	"github.com/idemkv/idemkv/node"
)

// Power loss on the real stores (issue 22, point 5). powerloss_test.go models the cut
// with Pebble on Pebble's crash-testing vfs and Raft's log in memory; here nothing is
// modelled inside the node. Each node is a process of this test binary whose whole
// data dir (Pebble, raft-wal or raft-boltdb, Raft's file snapshot store, the marker
// files) is a lazyfs mount: a FUSE loopback that, at the cut, throws away every write
// not fsynced and every directory entry whose directory was not fsynced. The cut
// freezes the mounts (every later operation fails with EIO), kills the processes,
// rewrites each backing directory to what was durable, and starts the nodes again on
// it. Every acknowledged commit must still be there, and the replicas must converge.

// envLazyNode carries a child's lazyNodeSpec, as JSON.
const envLazyNode = "IDEMKV_TEST_LAZYFS_NODE"

// lazyNodeSpec is what a child process runs.
type lazyNodeSpec struct {
	ID, DataDir, RaftAddr, APIAddr, RaftLog string
	Bootstrap                               bool
	SnapshotThreshold                       uint64
	// Join, when set, is a member's API address the node joins through once open
	// (as `idemkv serve --join` does, with the data format it reads).
	Join string
}

// lazyState is what a child's /test/state answers.
type lazyState struct {
	Applied uint64 `json:"applied"`
	Hash    string `json:"hash"`
}

const lazyStatePath = "/test/state"

// lazyNodeChild runs the node of this process, if it is a child, and never returns.
func lazyNodeChild() bool {
	raw := os.Getenv(envLazyNode)
	if raw == "" {
		return false
	}
	var s lazyNodeSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fmt.Fprintln(os.Stderr, "lazyfs child:", err)
		os.Exit(2)
	}
	// The timing of testcluster's nodes: fast elections, tiny snapshot thresholds
	// and raft-wal segments, so snapshots and log compaction happen in every run.
	cfg := node.DefaultConfig()
	cfg.ID, cfg.DataDir, cfg.RaftAddr, cfg.APIAddr, cfg.RaftLog = s.ID, s.DataDir, s.RaftAddr, s.APIAddr, s.RaftLog
	cfg.Bootstrap = s.Bootstrap
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 500*time.Millisecond, 500*time.Millisecond, 250*time.Millisecond
	cfg.SnapshotThreshold, cfg.TrailingLogs, cfg.SnapshotInterval = s.SnapshotThreshold, 32, 100*time.Millisecond
	cfg.RaftWALSegmentBytes = 16 << 10
	cfg.ApplyTimeout = 5 * time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg.Metrics = metrics.New()
	n, err := node.Open(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lazyfs child: open:", err)
		os.Exit(3)
	}
	if s.Join != "" {
		go func() {
			c, err := client.New(client.Config{Endpoints: []string{s.Join}, Timeout: 5 * time.Second})
			if err == nil {
				_, err = c.JoinCluster(context.Background(), &idemkv.JoinRequest{ID: s.ID, RaftAddr: s.RaftAddr, APIAddr: s.APIAddr, Format: n.Format()})
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "lazyfs child: join:", err)
			}
		}()
	}
	mux := http.NewServeMux()
	mux.Handle("/", api.New(api.Config{Store: n, Logger: cfg.Logger, Metrics: cfg.Metrics}).Handler())
	mux.HandleFunc("GET "+lazyStatePath, func(w http.ResponseWriter, _ *http.Request) {
		applied := n.AppliedIndex()
		h, err := n.StateHash()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(w).Encode(lazyState{Applied: applied, Hash: h})
	})
	ln, err := net.Listen("tcp", s.APIAddr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lazyfs child: listen:", err)
		os.Exit(4)
	}
	err = api.NewHTTPServer(s.APIAddr, mux).Serve(ln)
	fmt.Fprintln(os.Stderr, "lazyfs child: serve:", err)
	os.Exit(5)
	return true
}

// lazyMember is one node: its backing directory, its mount (the data dir) and its
// process.
type lazyMember struct {
	spec    lazyNodeSpec
	backing string
	logPath string
	fs      *lazyfs.FS
	cmd     *exec.Cmd
	exited  chan struct{}
}

// lazyRig is a three-node cluster of processes on lazyfs mounts.
type lazyRig struct {
	t       *testing.T
	test    string // the top-level test the children run as
	members []*lazyMember
	// sabotage is switched on by a test: then skip says which files' syncs are no-ops.
	sabotage atomic.Bool
	skip     func(rel string) bool
	// made and skipped count the syncs of the mounts gone so far (lazyfs.FS.Syncs).
	made, skipped int64
}

// count adds a mount's syncs to the totals.
func (r *lazyRig) count(f *lazyfs.FS) {
	a, b := f.Syncs()
	r.made, r.skipped = r.made+a, r.skipped+b
}

func freeAddrT(t *testing.T) string {
	t.Helper()
	a, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// newLazyRig starts three nodes on fresh lazyfs mounts and joins them, or skips the
// test where FUSE cannot mount.
func newLazyRig(t *testing.T, test, raftLog string, snapshotThreshold uint64) *lazyRig {
	t.Helper()
	if err := lazyfs.Available(); err != nil {
		t.Skip(err)
	}
	r := &lazyRig{t: t, test: test}
	root := t.TempDir()
	for i := range 3 {
		id := fmt.Sprintf("n%d", i+1)
		m := &lazyMember{
			spec: lazyNodeSpec{ID: id, DataDir: filepath.Join(root, id), RaftAddr: freeAddrT(t), APIAddr: freeAddrT(t),
				RaftLog: raftLog, SnapshotThreshold: snapshotThreshold},
			backing: filepath.Join(root, id+".disk"),
			logPath: filepath.Join(root, id+".log"),
		}
		for _, d := range []string{m.spec.DataDir, m.backing} {
			if err := os.Mkdir(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		r.members = append(r.members, m)
	}
	t.Cleanup(r.stopAll)
	r.start(0, true, "")
	r.waitReady(0)
	for i := 1; i < 3; i++ {
		r.start(i, false, r.members[0].spec.APIAddr)
		r.waitReady(i)
	}
	if err := r.converged(30 * time.Second); err != nil {
		r.fail("the new cluster did not converge: %v", err)
	}
	return r
}

// fail ends the test with each node's warnings and errors and the tail of its log.
func (r *lazyRig) fail(format string, args ...any) {
	r.t.Helper()
	for _, m := range r.members {
		b, _ := os.ReadFile(m.logPath)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		// Each distinct warning once, at its first time, with how often it came: a
		// stuck node repeats one error many times a second ("nothing new to
		// snapshot"), which once hid the one that said why ("segment is sealed").
		var warned []string
		count := map[string]int{}
		for _, l := range lines {
			if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
				_, what, _ := strings.Cut(l, " ") // without its time
				if count[what]++; count[what] == 1 {
					warned = append(warned, l)
				}
			}
		}
		for i, l := range warned {
			_, what, _ := strings.Cut(l, " ")
			if n := count[what]; n > 1 {
				warned[i] = fmt.Sprintf("%s (×%d)", l, n)
			}
		}
		r.t.Logf("--- %s: its last distinct warnings and errors:\n%s\n--- the last lines of its log:\n%s", m.spec.ID,
			strings.Join(warned[max(0, len(warned)-15):], "\n"), strings.Join(lines[max(0, len(lines)-10):], "\n"))
	}
	r.t.Fatalf(format, args...)
}

// start mounts node i's backing directory and starts its process.
func (r *lazyRig) start(i int, bootstrap bool, join string) {
	r.t.Helper()
	m := r.members[i]
	f, err := lazyfs.Mount(m.backing, m.spec.DataDir, lazyfs.Options{SkipSync: func(rel string) bool {
		return r.sabotage.Load() && r.skip != nil && r.skip(rel)
	}})
	if err != nil {
		r.t.Fatal(err)
	}
	m.fs = f
	spec := m.spec
	spec.Bootstrap, spec.Join = bootstrap, join
	raw, _ := json.Marshal(spec)
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		r.t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+r.test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), envLazyNode+"="+string(raw))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	logf.Close()
	m.cmd, m.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(m.exited) }()
}

// waitReady waits for node i's /readyz.
func (r *lazyRig) waitReady(i int) {
	r.t.Helper()
	if err := r.ready(i, 30*time.Second); err != nil {
		r.fail("%s: %v", r.members[i].spec.ID, err)
	}
}

func (r *lazyRig) ready(i int, timeout time.Duration) error {
	m := r.members[i]
	return testcluster.Eventually(timeout, func() error {
		select {
		case <-m.exited:
			return fmt.Errorf("the process exited: %v", m.cmd.ProcessState)
		default:
		}
		resp, err := http.Get("http://" + m.spec.APIAddr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	})
}

// kill stops node i's process at once.
func (r *lazyRig) kill(i int) {
	m := r.members[i]
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Kill()
	<-m.exited
	m.cmd = nil
}

// cut cuts the power of the nodes named, at one moment: their mounts freeze first,
// then their processes die, then each backing directory is rewritten to what was
// durable, and the nodes start again on it.
func (r *lazyRig) cut(which ...int) {
	r.t.Helper()
	for _, i := range which {
		r.members[i].fs.Freeze()
	}
	for _, i := range which {
		r.kill(i)
	}
	for _, i := range which {
		m := r.members[i]
		r.count(m.fs)
		if err := m.fs.Cut(); err != nil {
			r.t.Fatalf("%s: %v", m.spec.ID, err)
		}
		if err := m.fs.Unmount(); err != nil {
			r.t.Fatalf("%s: %v", m.spec.ID, err)
		}
		m.fs = nil
	}
	for _, i := range which {
		r.start(i, false, "")
	}
}

func (r *lazyRig) stopAll() {
	for i, m := range r.members {
		r.kill(i)
		if m.fs != nil {
			_ = m.fs.Unmount()
			m.fs = nil
		}
	}
}

func (r *lazyRig) endpoints() []string {
	var eps []string
	for _, m := range r.members {
		eps = append(eps, m.spec.APIAddr)
	}
	return eps
}

// converged waits until every node answers the same applied index and state hash.
func (r *lazyRig) converged(timeout time.Duration) error {
	hc := http.Client{Timeout: 3 * time.Second}
	return testcluster.Eventually(timeout, func() error {
		var first lazyState
		for i, m := range r.members {
			resp, err := hc.Get("http://" + m.spec.APIAddr + lazyStatePath)
			if err != nil {
				return err
			}
			var s lazyState
			err = json.NewDecoder(resp.Body).Decode(&s)
			resp.Body.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", m.spec.ID, err)
			}
			if i == 0 {
				first = s
			} else if s != first {
				return fmt.Errorf("%s at index %d hash %s, n1 at %d %s", m.spec.ID, s.Applied, s.Hash, first.Applied, first.Hash)
			}
		}
		return nil
	})
}

// snapshotsTaken counts the snapshots on node i's disk.
func (r *lazyRig) snapshotsTaken(i int) int {
	des, _ := os.ReadDir(filepath.Join(r.members[i].backing, "snapshots"))
	return len(des)
}

// lazyPlan is one run: the cuts, each of the whole rack (nil) or of one node.
type lazyPlan struct {
	raftLog           string
	snapshotThreshold uint64
	cuts              []lazyCut
	// sabotage, when set, names the files whose syncs become no-ops once the
	// cluster is up.
	sabotage func(rel string) bool
}

type lazyCut struct {
	rack bool
	node int
}

// lazyResult is what the checks saw after the last cut.
type lazyResult struct {
	acked, tried int
	lost         []string
	skipped      int64 // syncs the sabotage made no-ops
	// broken says why the cluster could not be checked or did not converge: a node
	// that did not start again, a key that could not be read, replicas that differ.
	broken error
}

// runLazyPowerLoss runs the plan under four writers and checks the cluster after it.
func runLazyPowerLoss(t *testing.T, test string, p lazyPlan) lazyResult {
	r := newLazyRig(t, test, p.raftLog, p.snapshotThreshold)
	if p.sabotage != nil {
		r.skip = p.sabotage
		r.sabotage.Store(true)
	}
	c, err := client.New(client.Config{Endpoints: r.endpoints(), Timeout: 3 * time.Second, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	w := &writer{store: c, acked: map[string]string{}}
	var stop context.CancelFunc
	var wg sync.WaitGroup
	startWriters := func() {
		var ctx context.Context
		ctx, stop = context.WithCancel(context.Background())
		for id := range 4 {
			wg.Add(1)
			go func() { defer wg.Done(); w.run(ctx, id) }()
		}
	}
	startWriters()
	var res lazyResult
	for _, cut := range p.cuts {
		// A random moment, after enough writes for a few snapshots (64 entries).
		time.Sleep(1500*time.Millisecond + rand.N(1500*time.Millisecond))
		if cut.rack {
			r.cut(0, 1, 2)
			// The writers stop with the rack; what they were told after the cut
			// cannot have been acknowledged (no log can be written).
			stop()
			wg.Wait()
			startWriters()
		} else {
			r.cut(cut.node)
		}
		for i := range r.members {
			if err := r.ready(i, 30*time.Second); err != nil {
				res.broken = fmt.Errorf("%s did not start again after the cut: %w", r.members[i].spec.ID, err)
				break
			}
		}
		w.mu.Lock()
		t.Logf("cut (rack %v, node %d): %d commits acknowledged so far of %d tried", cut.rack, cut.node, len(w.acked), w.tries.Load())
		w.mu.Unlock()
		if res.broken != nil {
			break
		}
	}
	time.Sleep(500 * time.Millisecond) // writes after the last cut, on the restarted nodes
	stop()
	wg.Wait()
	w.mu.Lock()
	res.acked, res.tried = len(w.acked), int(w.tries.Load())
	w.mu.Unlock()
	if res.broken == nil {
		res.lost, res.broken = w.lostAckedWithin(20 * time.Second)
	}
	if res.broken == nil && len(res.lost) == 0 {
		res.broken = r.converged(30 * time.Second)
	}
	for i, m := range r.members {
		if m.fs != nil {
			r.count(m.fs)
		}
		t.Logf("%s: %d snapshots on disk", m.spec.ID, r.snapshotsTaken(i))
	}
	res.skipped = r.skipped
	t.Logf("%d syncs made something durable, %d were skipped by the sabotage", r.made, r.skipped)
	if p.sabotage == nil && res.broken != nil {
		r.fail("after the power cuts: %v", res.broken)
	}
	if p.sabotage == nil && p.snapshotThreshold < 1<<20 {
		for i := range r.members {
			if r.snapshotsTaken(i) == 0 {
				t.Errorf("%s took no snapshot: the run did not exercise the snapshot store", r.members[i].spec.ID)
			}
		}
	}
	return res
}

// mustKeepEverything fails unless commits were acknowledged and none was lost.
func (r lazyResult) mustKeepEverything(t *testing.T) {
	t.Helper()
	if r.acked == 0 {
		t.Fatal("no commit was acknowledged: the test proved nothing")
	}
	if len(r.lost) > 0 {
		t.Fatalf("%d of %d acknowledged commits lost after power cuts, e.g. %v", len(r.lost), r.acked, r.lost[:min(5, len(r.lost))])
	}
}

// TestPowerLossOnLazyFS: each backend of the Raft log, under writes, through a cut of
// the whole rack and then of one node at a time while the others go on.
func TestPowerLossOnLazyFS(t *testing.T) {
	if lazyNodeChild() {
		return
	}
	if testing.Short() {
		t.Skip("power cuts of process clusters take about half a minute")
	}
	for _, backend := range node.RaftLogs {
		t.Run(backend, func(t *testing.T) {
			runLazyPowerLoss(t, "TestPowerLossOnLazyFS", lazyPlan{
				raftLog: backend, snapshotThreshold: 64,
				cuts: []lazyCut{{rack: true}, {node: rand.N(3)}, {node: rand.N(3)}},
			}).mustKeepEverything(t)
		})
	}
}

// The check can fail: with the fsyncs of the Raft log (raft-wal's segments and its
// meta store) made no-ops once the cluster is up, a cut of the rack loses acknowledged
// commits, or leaves nodes that cannot start or replicas that cannot converge (a
// store ahead of every surviving log). Snapshots are kept out of the window: they
// sync Pebble, which would keep some of what the log dropped.
func TestPowerLossOnLazyFSCatchesALogWithoutSync(t *testing.T) {
	if lazyNodeChild() {
		return
	}
	if testing.Short() {
		t.Skip("power cuts of process clusters take about ten seconds")
	}
	r := runLazyPowerLoss(t, "TestPowerLossOnLazyFSCatchesALogWithoutSync", lazyPlan{
		raftLog: node.RaftLogWAL, snapshotThreshold: 1 << 20,
		cuts:     []lazyCut{{rack: true}},
		sabotage: func(rel string) bool { return strings.HasPrefix(rel, "wal/") },
	})
	if r.acked == 0 || r.skipped == 0 {
		t.Fatalf("%d commits acknowledged, %d syncs skipped: the test proved nothing", r.acked, r.skipped)
	}
	if len(r.lost) == 0 && r.broken == nil {
		t.Fatalf("all %d acknowledged commits survived a Raft log whose syncs are no-ops, and the replicas converged: the check cannot fail", r.acked)
	}
	t.Logf("caught: %d of %d acknowledged commits lost; broken: %v", len(r.lost), r.acked, r.broken)
}
