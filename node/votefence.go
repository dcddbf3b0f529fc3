package node

import (
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// voteFence keeps a node that started with no Raft state from voting until it has
// caught up with a leader.
//
// Raft's safety rests on a voter remembering its log and its vote. A member whose data
// dir was lost (a new disk) and that comes back at the same id and address remembers
// neither: its empty log is behind every candidate's, and hashicorp/raft grants a vote
// to anyone while its configuration is empty. An entry committed on the leader and on
// this node before it lost its disk is then on the leader alone; if the leader fails
// before this node has the entry again, a candidate without it wins with this node's
// vote, and an acknowledged commit is gone (its key could execute a second time).
//
// While fenced, the node answers every RequestVote and pre-vote itself with a refusal
// that leaves Raft's state alone, as a lost message would: no term is taken up and no
// vote is persisted. Its own vote requests do not leave it either: as a candidate its
// short log could win a peer that lacks the same entries. The first AppendEntries of a
// leader (not a heartbeat: those carry no indexes) says how far it must catch up: the
// leader's commit index, or the last index that request names if that is further (a
// leader just elected may not know yet that entries before its term committed, but its
// log holds them). A leader of a later term sets it again. Once Raft's last index (log
// or installed snapshot) reaches it, the fence opens for good.
//
// A candidate whose log is at least as up to date as that leader's was is handed to
// Raft as usual: a later last term, or that leader's term and an index at or past the
// target, means its log holds that leader's up to the target (Raft's log matching), so
// a cluster whose leader fails during the catch-up can still elect one that has
// everything. Before any leader is heard there is nothing to compare with, and every
// vote is refused: the node cannot tell an up-to-date candidate from one that is not.
//
// What it cannot see: a deposed leader that has not noticed yet (hashicorp/raft steps
// down within LeaderLeaseTimeout without a quorum) may be the first to reach the node,
// with a shorter log than the cluster's.
type voteFence struct {
	log    *slog.Logger
	header raft.RPCHeader
	raft   atomic.Pointer[raft.Raft] // nil until Raft runs: nothing caught up before
	open   atomic.Bool

	mu    sync.Mutex
	term  uint64 // of the leader that set index; 0 until one is heard
	index uint64
}

func newVoteFence(id raft.ServerID, addr raft.ServerAddress, log *slog.Logger) *voteFence {
	log.Info("started without Raft state: declines votes until caught up with a leader")
	return &voteFence{log: log, header: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(id), Addr: []byte(addr)}}
}

// withholds reports whether the fence still refuses votes. A nil fence is open.
func (f *voteFence) withholds() bool {
	if f == nil || f.open.Load() {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.caughtUpLocked()
}

func (f *voteFence) caughtUpLocked() bool {
	if f.open.Load() {
		return true
	}
	r := f.raft.Load()
	if f.term == 0 || r == nil || r.LastIndex() < f.index {
		return false
	}
	f.open.Store(true)
	f.log.Info("caught up with the leader after starting without Raft state: votes again", "index", f.index)
	return true
}

// heard notes an AppendEntries on its way to Raft.
func (f *voteFence) heard(req *raft.AppendEntriesRequest) {
	last := req.PrevLogEntry
	if n := len(req.Entries); n > 0 {
		last = req.Entries[n-1].Index
	}
	target := max(req.LeaderCommitIndex, last)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.caughtUpLocked() || target == 0 || req.Term <= f.term {
		return
	}
	f.term, f.index = req.Term, target
	f.log.Info("started without Raft state: declines votes until caught up to index "+strconv.FormatUint(target, 10), "index", target, "leader_term", req.Term)
}

// refuses reports whether a candidate whose log ends at lastTerm, lastIndex is to be
// refused without asking Raft.
func (f *voteFence) refuses(lastTerm, lastIndex uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.caughtUpLocked() {
		return false
	}
	return f.term == 0 || lastTerm < f.term || (lastTerm == f.term && lastIndex < f.index)
}

// answer answers rpc itself if the fence refuses it, and reports whether it did.
func (f *voteFence) answer(rpc raft.RPC) bool {
	if f.open.Load() {
		return false
	}
	switch req := rpc.Command.(type) {
	case *raft.AppendEntriesRequest:
		f.heard(req)
	case *raft.RequestVoteRequest:
		if f.refuses(req.LastLogTerm, req.LastLogIndex) {
			// The candidate's own term: a larger one would make it step down, and
			// the node has not taken the term up.
			rpc.Respond(&raft.RequestVoteResponse{RPCHeader: f.header, Term: req.Term}, nil)
			return true
		}
	case *raft.RequestPreVoteRequest:
		if f.refuses(req.LastLogTerm, req.LastLogIndex) {
			rpc.Respond(&raft.RequestPreVoteResponse{RPCHeader: f.header, Term: req.Term}, nil)
			return true
		}
	default:
		f.withholds() // opens the fence once caught up
	}
	return false
}

// filter passes the RPCs of in to out, answering the votes the fence refuses, until
// done closes.
func (f *voteFence) filter(in <-chan raft.RPC, out chan<- raft.RPC, done <-chan struct{}) {
	for {
		var rpc raft.RPC
		select {
		case rpc = <-in:
		case <-done:
			return
		}
		if f.answer(rpc) {
			continue
		}
		select {
		case out <- rpc:
		case <-done:
			// Unanswered: the transport's close ends the sender's wait.
			return
		}
	}
}

// WithholdsVotes reports whether this node, started without Raft state, still refuses
// votes because it has not caught up with a leader (votefence.go).
func (n *Node) WithholdsVotes() bool { return n.transport.fence.withholds() }
