package node_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/node"
	"github.com/idemkv/idemkv/storage"
)

// writeAndSnapshot opens a single-node cluster on cfg, commits keys k<from>…k<to-1>,
// snapshots, and closes it; it returns the state hash.
func writeAndSnapshot(t *testing.T, cfg node.Config, from, to int) string {
	t.Helper()
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitLeaderReady(t, n)
	ctx := opsCtx(t)
	for i := from; i < to; i++ {
		if _, err := reserveAndCommit(ctx, n, fmt.Sprintf("k%d", i), true); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Snapshot(); err != nil {
		t.Fatal(err)
	}
	hash, err := n.StateHash()
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	return hash
}

// assertRestartHolds opens a node on cfg and checks it holds keys k0…k<to-1>,
// committed, and the state hash want.
func assertRestartHolds(t *testing.T, cfg node.Config, to int, want string) {
	t.Helper()
	n := openNode(t, cfg)
	waitLeaderReady(t, n)
	if got, err := n.StateHash(); err != nil || got != want {
		t.Fatalf("state after the start %s (%v), want %s", got, err, want)
	}
	ctx := opsCtx(t)
	for i := range to {
		rec, err := n.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: fmt.Sprintf("k%d", i)})
		if err != nil || rec.Status != idemkv.StatusCommitted {
			t.Fatalf("k%d after the start: %v %+v", i, err, rec)
		}
	}
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if err := os.CopyFS(to, os.DirFS(from)); err != nil {
		t.Fatal(err)
	}
}

// TestCrashMidSwapRestoresOnStart: a node that crashed while a restore swapped its
// store, between the two renames, has its Pebble directory gone, the old store beside
// it and part of the new one. At start the old store is put back, found behind the
// newest snapshot, and the snapshot restored: nothing is lost and nothing is left
// beside the store.
func TestCrashMidSwapRestoresOnStart(t *testing.T) {
	dir := t.TempDir()
	cfg := opsNodeConfig(t, "n1", dir)
	cfg.Bootstrap = true
	quickTimings(&cfg)
	writeAndSnapshot(t, cfg, 0, 20)
	old := filepath.Join(t.TempDir(), "pebble")
	copyDir(t, filepath.Join(dir, "pebble"), old)
	hash := writeAndSnapshot(t, cfg, 20, 50)

	store := filepath.Join(dir, "pebble")
	if err := os.RemoveAll(store); err != nil {
		t.Fatal(err)
	}
	copyDir(t, old, store+".restore-old")
	if err := os.MkdirAll(store+".restore-new", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(store+".restore-new", "000042.sst"), []byte("half a table"), 0o600); err != nil {
		t.Fatal(err)
	}
	assertRestartHolds(t, cfg, 50, hash)
	for _, leftover := range []string{".restore-old", ".restore-new"} {
		if _, err := os.Stat(store + leftover); !os.IsNotExist(err) {
			t.Errorf("%s still there after the start (%v)", store+leftover, err)
		}
	}
}

// TestVersion1SnapshotRestoresOnStart: a data dir from an older version holds Raft
// snapshots in the version-1 record stream. A node whose store is behind one (here
// wiped) reads its applied index and restores it.
func TestVersion1SnapshotRestoresOnStart(t *testing.T) {
	dir := t.TempDir()
	cfg := opsNodeConfig(t, "n1", dir)
	cfg.Bootstrap = true
	quickTimings(&cfg)
	hash := writeAndSnapshot(t, cfg, 0, 40)

	// Rewrite the newest snapshot as version 1: restore it into a scratch store and
	// write that store's record stream under the same index, term and configuration.
	snaps, err := raft.NewFileSnapshotStore(dir, 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	list, err := snaps.List()
	if err != nil || len(list) == 0 {
		t.Fatalf("snapshots: %v, %v", list, err)
	}
	meta, rc, err := snaps.Open(list[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	scratch, err := storage.Open(filepath.Join(t.TempDir(), "pebble"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer scratch.Close()
	err = scratch.Restore(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	_, trans := raft.NewInmemTransport("")
	defer trans.Close()
	sink, err := snaps.Create(meta.Version, meta.Index, meta.Term, meta.Configuration, meta.ConfigurationIndex, trans)
	if err != nil {
		t.Fatal(err)
	}
	snap := scratch.NewSnapshot()
	var v1 bytes.Buffer
	if _, err := snap.WriteRecordsTo(io.MultiWriter(sink, &v1)); err != nil {
		t.Fatal(err)
	}
	snap.Close()
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if v1.Bytes()[8] != 1 {
		t.Fatalf("version byte %d, want 1", v1.Bytes()[8])
	}
	for _, m := range list {
		if err := os.RemoveAll(filepath.Join(dir, "snapshots", m.ID)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(filepath.Join(dir, "pebble")); err != nil {
		t.Fatal(err)
	}
	assertRestartHolds(t, cfg, 40, hash)
}
