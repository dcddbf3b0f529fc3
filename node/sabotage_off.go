//go:build !idemkv_testhooks

package node

import (
	"net"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
)

// The sabotages of the apply seam exist only in the test build (sabotage_on.go); in
// this build each is a constant no-op the compiler removes, and node does not import
// internal/testhooks.

// earlyAck never answers a write here: every write waits for Raft.
func (n *Node) earlyAck(*fsm.Command) (res *fsm.Result, handled bool, err error) {
	return nil, false, nil
}

// unbindApproval leaves every reserve as it is here.
func (n *Node) unbindApproval(r *idemkv.ReserveRequest) *idemkv.ReserveRequest { return r }

// raftFSM is the state machine as Raft sees it: the FSM itself.
func (n *Node) raftFSM() raft.FSM { return n.fsm }

// wedgeGap is always false here.
func (n *Node) wedgeGap(uint64) bool { return false }

// establishByBarrier is always false here: a new leader establishes with a command.
func (n *Node) establishByBarrier() bool { return false }

// unboundedClock is always false here: stamps stay within fsm.BoundStamp's band.
func unboundedClock() bool { return false }

// unanchoredStamps is always false here: a node that has seen no live entry stamps from
// the state machine clock (stampClock).
func unanchoredStamps() bool { return false }

// unboundedForwardClock is always false here: stamps stay below the band's upper bound.
func unboundedForwardClock() bool { return false }

// sabotageLocalAnswer returns every local answer as it is here.
func (n *Node) sabotageLocalAnswer(_ *idemkv.Record, res *idemkv.ReserveResult) *idemkv.ReserveResult {
	return res
}

// localPending is always false here: only committed and failed records are answered
// from local state.
func localPending() bool { return false }

// admitLegacy never handles a connection here: the listener admits by its policy.
func (g *guardedListener) admitLegacy(net.Conn) (admitted, handled bool) { return false, false }

// legacyHandshake returns the listener's handshake bound unchanged here.
func legacyHandshake(d time.Duration) time.Duration { return d }

// ignoreDiskStall is always false here: a node whose own log append is held past the
// stall limit sends nothing (stall.go).
func ignoreDiskStall() bool { return false }
