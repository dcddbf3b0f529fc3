package node_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/expiry"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// otherRaftLog is a backend other than b.
func otherRaftLog(b string) string {
	for _, o := range node.RaftLogs {
		if o != b {
			return o
		}
	}
	panic("one raft log backend only")
}

// markedRaftLog is the backend the data dir records.
func markedRaftLog(t testing.TB, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "raft-log"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// checkRaftLogFiles fails unless dir holds backend's files and not the other's.
func checkRaftLogFiles(t testing.TB, dir, backend string) {
	t.Helper()
	_, boltErr := os.Stat(filepath.Join(dir, "raft.db"))
	_, walErr := os.Stat(filepath.Join(dir, "wal", "wal-meta.db"))
	if got := markedRaftLog(t, dir); got != backend {
		t.Fatalf("%s records the raft log %q, want %q", dir, got, backend)
	}
	if (boltErr == nil) != (backend == node.RaftLogBolt) || (walErr == nil) != (backend == node.RaftLogWAL) {
		t.Fatalf("%s with the %s backend: raft.db %v, wal/wal-meta.db %v", dir, backend, boltErr, walErr)
	}
}

// embeddingLog wraps a log store the way the fault hooks do, by embedding the
// interface, which hides any method raft.LogStore does not name.
type embeddingLog struct{ raft.LogStore }

// countingSnapshots counts the snapshots Raft opens: on a running node only an
// install from the leader does (a restart opens none when Pebble is current).
type countingSnapshots struct {
	raft.SnapshotStore
	opened *atomic.Int64
}

func (s countingSnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	s.opened.Add(1)
	return s.SnapshotStore.Open(id)
}

// TestRaftLogBackends runs three-node clusters on each backend and on both at once
// (a cluster in the middle of moving its nodes over), with the log store wrapped as
// the fault hooks wrap it: writes replicate; a follower that missed the compacted
// part of the log catches up from a snapshot install and then takes new entries
// (raft-wal refuses an append that leaves a gap, which Raft avoids only if it knows
// the log is monotonic); every node restarts from its data dir with every write.
// The wal segments are small so that compaction deletes some: raft-wal still serves
// entries from a segment it keeps, and the follower would need no snapshot.
func TestRaftLogBackends(t *testing.T) {
	for _, tc := range []struct {
		name     string
		backends [3]string
	}{
		{"bolt", [3]string{node.RaftLogBolt, node.RaftLogBolt, node.RaftLogBolt}},
		{"wal", [3]string{node.RaftLogWAL, node.RaftLogWAL, node.RaftLogWAL}},
		{"mixed", [3]string{node.RaftLogBolt, node.RaftLogWAL, node.RaftLogBolt}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var installs [3]atomic.Int64
			c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
				cfg.RaftLog, cfg.RaftWALSegmentBytes = tc.backends[i], 4<<10
				cfg.WrapRaftStores = func(s node.RaftStores) node.RaftStores {
					s.Log = embeddingLog{s.Log}
					s.Snapshots = countingSnapshots{SnapshotStore: s.Snapshots, opened: &installs[i]}
					return s
				}
			}))
			ctx := ctxT(t)
			write := func(prefix string, n int) {
				t.Helper()
				ln := c.Node(c.WaitLeader())
				for i := range n {
					if _, err := reserveAndCommit(ctx, ln, fmt.Sprintf("%s-%03d", prefix, i), true); err != nil {
						t.Fatal(err)
					}
				}
			}
			write("first", 20)
			// The second node: in the mixed cluster, the wal one.
			const lagger = 1
			c.Stop(lagger)
			write("missed", 100)
			if err := c.Node(c.WaitLeader()).Snapshot(); err != nil {
				t.Fatal(err)
			}
			installs[lagger].Store(0)
			c.Restart(lagger)
			c.WaitConverged()
			if installs[lagger].Load() == 0 {
				t.Fatal("the follower caught up without a snapshot install: the test proves less than it says")
			}
			write("after", 20)
			c.WaitConverged()
			c.StopAll()
			for i := range c.Len() {
				checkRaftLogFiles(t, c.DataDir(i), tc.backends[i])
				c.Restart(i)
			}
			c.WaitConverged()
			ln := c.Node(c.WaitLeader())
			for _, k := range []string{"first-000", "missed-099", "after-019"} {
				rec, err := ln.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: k})
				if err != nil || rec.Status != idemkv.StatusCommitted {
					t.Fatalf("%s after the restart: %+v, %v", k, rec, err)
				}
			}
			write("restarted", 5)
			c.WaitConverged()
		})
	}
}

// openAndWrite opens a single node on cfg, commits key and closes it.
func openAndWrite(t *testing.T, cfg node.Config, key string) {
	t.Helper()
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitLeaderReady(t, n)
	if _, err := reserveAndCommit(opsCtx(t), n, key, true); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
}

// openAndRead opens a single node on cfg, checks that every key is committed and
// closes it.
func openAndRead(t *testing.T, cfg node.Config, keys ...string) {
	t.Helper()
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	waitLeaderReady(t, n)
	for _, k := range keys {
		rec, err := n.Get(opsCtx(t), &idemkv.GetRequest{Tenant: "acme", Key: k})
		if err != nil || rec.Status != idemkv.StatusCommitted {
			t.Fatalf("%s: %+v, %v", k, rec, err)
		}
	}
}

// TestDataDirKeepsItsRaftLog: a new data dir records its backend, the one asked for or
// the default; a later start without a choice gets it, and one that asks for the other
// is refused with an error naming both, before anything in the data dir changes.
func TestDataDirKeepsItsRaftLog(t *testing.T) {
	for _, asked := range append([]string{""}, node.RaftLogs...) {
		t.Run("asked="+asked, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "n1")
			cfg := opsNodeConfig(t, "n1", dir)
			cfg.Bootstrap, cfg.RaftLog = true, asked
			openAndWrite(t, cfg, "k1")
			want := asked
			if want == "" {
				want = node.DefaultRaftLog
			}
			checkRaftLogFiles(t, dir, want)

			other := otherRaftLog(want)
			before := dirListing(t, dir)
			cfg.RaftLog = other
			_, err := node.Open(cfg)
			if !errors.Is(err, node.ErrRaftLogMismatch) {
				t.Fatalf("open a %s data dir asking for %s: %v, want ErrRaftLogMismatch", want, other, err)
			}
			for _, s := range []string{strconv.Quote(want), strconv.Quote(other), "docs/operations.md"} {
				if !strings.Contains(err.Error(), s) {
					t.Fatalf("the mismatch error does not say %s: %v", s, err)
				}
			}
			if after := dirListing(t, dir); after != before {
				t.Fatalf("a refused start changed the data dir:\n%s\nthen\n%s", before, after)
			}

			cfg.RaftLog = ""
			openAndRead(t, cfg, "k1")
			cfg.RaftLog = want
			openAndRead(t, cfg, "k1")
			checkRaftLogFiles(t, dir, want)
		})
	}
}

// dirListing names every file under dir with its size and modification time.
func dirListing(t testing.TB, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %s\n", path, info.Size(), info.ModTime().Format(time.RFC3339Nano))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestDataDirWithoutMarkerIsBolt: a data dir from before the marker (raft.db, no
// raft-log file) is a bolt one: a start without a choice opens it with every record
// and records it; a start that asks for wal is refused.
func TestDataDirWithoutMarkerIsBolt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "n1")
	cfg := opsNodeConfig(t, "n1", dir)
	cfg.Bootstrap, cfg.RaftLog = true, node.RaftLogBolt
	openAndWrite(t, cfg, "k1")
	unmark := func() {
		t.Helper()
		if err := os.Remove(filepath.Join(dir, "raft-log")); err != nil {
			t.Fatal(err)
		}
	}
	unmark()
	cfg.RaftLog = node.RaftLogWAL
	if _, err := node.Open(cfg); !errors.Is(err, node.ErrRaftLogMismatch) {
		t.Fatalf("open a bolt data dir without a marker asking for wal: %v, want ErrRaftLogMismatch", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "wal")); !os.IsNotExist(err) {
		t.Fatalf("a refused start made wal/: %v", err)
	}
	cfg.RaftLog = ""
	openAndRead(t, cfg, "k1")
	checkRaftLogFiles(t, dir, node.RaftLogBolt)
}

func TestValidateRejectsAnUnknownRaftLog(t *testing.T) {
	cfg := opsNodeConfig(t, "n1", t.TempDir())
	cfg.RaftLog = "rocksdb"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "rocksdb") {
		t.Fatalf("Validate with raft log %q: %v", cfg.RaftLog, err)
	}
	if _, err := node.Restore(cfg, bytes.NewReader(nil)); err == nil || !strings.Contains(err.Error(), "rocksdb") {
		t.Fatalf("Restore with raft log %q: %v", cfg.RaftLog, err)
	}
	for _, ok := range append([]string{""}, node.RaftLogs...) {
		cfg.RaftLog = ok
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Validate with raft log %q: %v", ok, err)
		}
	}
}

// TestRestoreIntoEachRaftLog: a backup restores into a data dir of either backend (Raft's
// term goes into that backend's stable store); the node then starts on it without
// being told the backend, continues the log past the gap in a later term, and does so
// again after a restart.
func TestRestoreIntoEachRaftLog(t *testing.T) {
	ctx := opsCtx(t)
	src := opsNodeConfig(t, "n1", filepath.Join(t.TempDir(), "n1"))
	src.Bootstrap = true
	n := openNode(t, src)
	waitLeaderReady(t, n)
	for i := range 10 {
		if _, err := reserveAndCommit(ctx, n, fmt.Sprintf("k%d", i), true); err != nil {
			t.Fatal(err)
		}
	}
	var backup bytes.Buffer
	if err := n.Backup(ctx, &backup); err != nil {
		t.Fatal(err)
	}
	for _, backend := range node.RaftLogs {
		t.Run(backend, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "r1")
			cfg := opsNodeConfig(t, "r1", dir)
			cfg.RaftLog = backend
			info, err := node.Restore(cfg, bytes.NewReader(backup.Bytes()))
			if err != nil {
				t.Fatal(err)
			}
			checkRaftLogFiles(t, dir, backend)
			cfg.RaftLog = ""
			for round := range 2 {
				r, err := node.Open(cfg)
				if err != nil {
					t.Fatalf("start %d: %v", round+1, err)
				}
				waitLeaderReady(t, r)
				if term, _ := strconv.ParseUint(r.RaftStats()["term"], 10, 64); term <= info.Term {
					t.Fatalf("start %d: term %d, the backup's is %d", round+1, term, info.Term)
				}
				a, err := reserveAndCommit(ctx, r, fmt.Sprintf("new-%d", round), true)
				if err != nil {
					t.Fatal(err)
				}
				if a.reserved.Fence <= info.ContinuesAt {
					t.Fatalf("start %d: new fence %d, the log continues at %d", round+1, a.reserved.Fence, info.ContinuesAt)
				}
				for _, k := range []string{"k0", "k9", "new-0"} {
					if rec, err := r.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: k}); err != nil || rec.Status != idemkv.StatusCommitted {
						t.Fatalf("start %d: %s: %+v, %v", round+1, k, rec, err)
					}
				}
				if err := r.Close(); err != nil {
					t.Fatal(err)
				}
			}
			checkRaftLogFiles(t, dir, backend)
		})
	}
}

// A clock tick under a millisecond made the leader's half-tick ticker zero, which
// panics; a negative sweep batch means nothing. Both are refused before anything opens.
func TestValidateRefusesATickerOfZeroAndANegativeSweep(t *testing.T) {
	cfg := opsNodeConfig(t, "n1", t.TempDir())
	for _, tick := range []time.Duration{time.Nanosecond, time.Microsecond} {
		cfg.ClockTick = tick
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "clock tick") {
			t.Errorf("clock tick %s: %v", tick, err)
		}
	}
	for _, tick := range []time.Duration{0, -1, time.Millisecond, node.DefaultClockTick} {
		cfg.ClockTick = tick
		if err := cfg.Validate(); err != nil {
			t.Errorf("clock tick %s: %v", tick, err)
		}
	}
	cfg.Sweep.BatchLimit = -1
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "sweep batch") {
		t.Errorf("sweep batch -1: %v", err)
	}
	// Above the most is taken as the most (expiry.TestBatchLimitAboveTheMostIsTheMost),
	// so that an upgraded node with an earlier release's setting still starts.
	for _, batch := range []int{0, 1, expiry.MaxBatchLimit, math.MaxInt} {
		cfg.Sweep.BatchLimit = batch
		if err := cfg.Validate(); err != nil {
			t.Errorf("sweep batch %d: %v", batch, err)
		}
	}
}
