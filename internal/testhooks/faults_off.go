//go:build !idemkv_testhooks

package testhooks

import (
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// PebbleFS is nil in this build: Pebble runs on the OS's filesystem directly.
func PebbleFS() vfs.FS { return nil }

// WrapLogStore returns s unchanged in this build.
func WrapLogStore(s raft.LogStore) raft.LogStore { return s }

// WrapSnapshotStore returns s unchanged in this build.
func WrapSnapshotStore(s raft.SnapshotStore) raft.SnapshotStore { return s }

// SetTransfer does nothing in this build.
func SetTransfer(func() error) {}
