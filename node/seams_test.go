package node_test

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv/node"
)

// countingLogStore counts the entries Raft stores through a wrapped log store.
type countingLogStore struct {
	raft.LogStore
	stored atomic.Int64
}

func (c *countingLogStore) StoreLogs(logs []*raft.Log) error {
	c.stored.Add(int64(len(logs)))
	return c.LogStore.StoreLogs(logs)
}

func (c *countingLogStore) StoreLog(l *raft.Log) error { return c.StoreLogs([]*raft.Log{l}) }

// TestFaultSeams: PebbleFS puts Pebble on the given filesystem, and WrapRaftStores'
// stores are the ones Raft writes through. Fault tests build on both.
func TestFaultSeams(t *testing.T) {
	dir := t.TempDir()
	cfg := opsNodeConfig(t, "n1", dir)
	cfg.Bootstrap = true
	mem := vfs.NewMem()
	cfg.PebbleFS = mem
	logs := &countingLogStore{}
	wrapped := 0
	cfg.WrapRaftStores = func(s node.RaftStores) node.RaftStores {
		wrapped++
		logs.LogStore = s.Log
		s.Log = logs
		return s
	}
	n := openNode(t, cfg)
	waitLeaderReady(t, n)
	if _, err := reserveAndCommit(opsCtx(t), n, "k1", true); err != nil {
		t.Fatal(err)
	}
	if wrapped != 1 || logs.stored.Load() == 0 {
		t.Fatalf("wrapped %d times, %d entries stored through the wrapper", wrapped, logs.stored.Load())
	}
	if _, err := os.Stat(filepath.Join(dir, "pebble")); !os.IsNotExist(err) {
		t.Fatalf("pebble dir on the OS filesystem: %v", err)
	}
	names, err := mem.List(filepath.Join(dir, "pebble"))
	if err != nil || len(names) == 0 {
		t.Fatalf("pebble files on the given filesystem: %v %v", names, err)
	}
}
