package main

import (
	"github.com/idemkv/idemkv/internal/testhooks"
	"github.com/idemkv/idemkv/node"
)

// wireTestFaults puts the test build's storage fault injectors (internal/testhooks)
// under the node: Pebble's filesystem, Raft's log and snapshot stores. jepsen-lite
// switches them on and off at run time. In any other build testhooks.Enabled is the
// constant false and the node runs on its stores directly.
func wireTestFaults(cfg *node.Config) {
	if !testhooks.Enabled {
		return
	}
	cfg.PebbleFS = testhooks.PebbleFS()
	prev := cfg.WrapRaftStores
	cfg.WrapRaftStores = func(s node.RaftStores) node.RaftStores {
		if prev != nil {
			s = prev(s)
		}
		s.Log = testhooks.WrapLogStore(s.Log)
		s.Snapshots = testhooks.WrapSnapshotStore(s.Snapshots)
		return s
	}
}
