package testhooks

import (
	"fmt"
	"strings"
)

// Storage faults of the test build: jepsen-lite's storage nemesis switches them on and
// off in a running node through PathFaults. Each names one way the disk under a node
// can fail; the node must stop (and recover on restart) or refuse, never skip.
const (
	// FaultPebbleFull makes every write operation on Pebble's files fail with ENOSPC.
	// Commits without sync land in the memtable; the next sync is Pebble's fatal
	// commit error, which stops the process.
	FaultPebbleFull = "pebble-full"
	// FaultPebbleRead makes every read of Pebble's files fail (block cache misses).
	FaultPebbleRead = "pebble-read"
	// FaultRaftLogWrite makes storing Raft log entries fail.
	FaultRaftLogWrite = "raft-log-write"
	// FaultRaftLogRead makes reading Raft log entries from the log store fail (the log
	// cache in front still answers the newest 1024).
	FaultRaftLogRead = "raft-log-read"
	// FaultRaftLogStall holds every append of Raft log entries until it is switched
	// off: a disk that stopped completing writes, neither failing nor finishing them.
	FaultRaftLogStall = "raft-log-stall"
	// FaultSnapshotRestore cuts every snapshot read from the snapshot store midway:
	// a snapshot install on a follower, or a restore at start, fails part-way through.
	FaultSnapshotRestore = "snapshot-restore"
)

// StorageFaults lists every storage fault in a stable order.
var StorageFaults = []string{FaultPebbleFull, FaultPebbleRead, FaultRaftLogWrite, FaultRaftLogRead, FaultRaftLogStall, FaultSnapshotRestore}

// Paths of the fault endpoints (test build only).
const (
	// PathFaults: GET returns the FaultState; POST a FaultUpdate replaces the set of
	// faults in force and returns the new FaultState.
	PathFaults = "/debug/faults"
	// PathTransfer: POST hands leadership to another voter (a no-op on a follower).
	PathTransfer = "/debug/transfer-leadership"
)

// FaultState is what PathFaults reports: the faults in force and, per fault, how many
// operations it has failed since the process started (a fault that never fired proved
// nothing, and the harness says so).
type FaultState struct {
	Faults   []string         `json:"faults"`
	Injected map[string]int64 `json:"injected"`
}

// FaultUpdate replaces the set of faults in force.
type FaultUpdate struct {
	Faults []string `json:"faults"`
}

// ParseFaults checks fault names.
func ParseFaults(names []string) ([]string, error) {
	var out []string
	for _, n := range names {
		n = strings.TrimSpace(n)
		known := false
		for _, k := range StorageFaults {
			known = known || k == n
		}
		if !known {
			return nil, fmt.Errorf("testhooks: unknown storage fault %q (known: %s)", n, strings.Join(StorageFaults, ", "))
		}
		out = append(out, n)
	}
	return out, nil
}
