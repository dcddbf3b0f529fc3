package node_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// unfinishedSnapshots lists the snapshots/<id>.tmp directories of dataDir: Raft's
// snapshots that were never finished.
func unfinishedSnapshots(t *testing.T, dataDir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dataDir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	var tmp []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			tmp = append(tmp, e.Name())
		}
	}
	return tmp
}

// TestKilledSnapshotLeavesNothingAfterRestart: a node killed while it wrote a Raft
// snapshot (its own, every SnapshotThreshold entries, or one a leader sent it) leaves
// snapshots/<id>.tmp with the part of state.bin it wrote, up to a copy of the whole
// store. Raft never lists, reaps or removes such a directory, so each kill used to leave
// one more for good, until the disk was full. A start removes them, and the state
// is whole.
func TestKilledSnapshotLeavesNothingAfterRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := opsNodeConfig(t, "n1", dir)
	cfg.Bootstrap = true
	quickTimings(&cfg)
	hash := writeAndSnapshot(t, cfg, 0, 20)

	// What a process killed in the middle of a snapshot leaves: Raft's own sink,
	// created and written to, neither closed nor cancelled.
	for i := range 2 {
		snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, hclog.NewNullLogger())
		if err != nil {
			t.Fatal(err)
		}
		_, trans := raft.NewInmemTransport("")
		conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: "n1", Address: trans.LocalAddr()}}}
		sink, err := snaps.Create(raft.SnapshotVersionMax, uint64(1000+i), 3, conf, 1, trans)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sink.Write(bytes.Repeat([]byte("part of a store "), 64<<10)); err != nil {
			t.Fatal(err)
		}
		trans.Close()
	}
	if left := unfinishedSnapshots(t, dir); len(left) != 2 {
		t.Fatalf("the simulated kills left %v, want two unfinished snapshots", left)
	}

	assertRestartHolds(t, cfg, 20, hash)
	if left := unfinishedSnapshots(t, dir); len(left) != 0 {
		t.Fatalf("after the restart snapshots/ still holds %v, left by killed snapshots", left)
	}
}
