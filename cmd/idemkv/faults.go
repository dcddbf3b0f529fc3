package main

import (
	"github.com/idemkv/idemkv/internal/testhooks"
	"github.com/idemkv/idemkv/node"
)

// wireTestFaults puts the test build's fault injectors (internal/testhooks) under the
// node: the clock it stamps commands with (jepsen-lite's clock nemesis offsets it),
// Pebble's filesystem, Raft's log and snapshot stores. jepsen-lite switches them on and
// off at run time. In any other build testhooks.Enabled is the constant false and the
// node runs on the wall clock and its stores directly. The node itself never reads
// the hooks: cmd passes them in.
func wireTestFaults(cfg *node.Config) {
	if !testhooks.Enabled {
		return
	}
	cfg.Now = testhooks.Now
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
