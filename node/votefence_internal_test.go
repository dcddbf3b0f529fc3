package node

import (
	"io"
	"log/slog"
	"testing"

	"github.com/hashicorp/raft"
)

// TestVoteFenceTarget: before any leader is heard every vote is refused; the first
// AppendEntries that names indexes sets the target to the further of the leader's
// commit index and its last named entry (heartbeats name none), a leader of a later
// term sets it again, and a candidate at least as up to date as the target's leader
// is handed to Raft. Refusals are answered in the candidate's own term.
func TestVoteFenceTarget(t *testing.T) {
	f := newVoteFence("n3", "127.0.0.1:1", slog.New(slog.NewTextHandler(io.Discard, nil)))
	vote := func(lastTerm, lastIndex uint64) (answered, granted bool) {
		t.Helper()
		ch := make(chan raft.RPCResponse, 1)
		rpc := raft.RPC{Command: &raft.RequestVoteRequest{Term: 9, LastLogTerm: lastTerm, LastLogIndex: lastIndex}, RespChan: ch}
		if !f.answer(rpc) {
			return false, false
		}
		resp := (<-ch).Response.(*raft.RequestVoteResponse)
		if resp.Term != 9 {
			t.Fatalf("a refusal in term %d, want the candidate's 9", resp.Term)
		}
		return true, resp.Granted
	}
	preVote := func(lastTerm, lastIndex uint64) bool {
		ch := make(chan raft.RPCResponse, 1)
		return f.answer(raft.RPC{Command: &raft.RequestPreVoteRequest{Term: 9, LastLogTerm: lastTerm, LastLogIndex: lastIndex}, RespChan: ch})
	}
	heard := func(req *raft.AppendEntriesRequest) {
		if f.answer(raft.RPC{Command: req}) {
			t.Fatal("the fence answered an AppendEntries")
		}
	}
	refused := func(lastTerm, lastIndex uint64, want bool) {
		t.Helper()
		answered, granted := vote(lastTerm, lastIndex)
		if answered != want || granted || preVote(lastTerm, lastIndex) != want {
			t.Fatalf("a candidate at term %d index %d: refused %v (granted %v), want refused %v", lastTerm, lastIndex, answered, granted, want)
		}
	}

	refused(100, 1000, true) // no leader heard: nothing to compare with
	heard(&raft.AppendEntriesRequest{Term: 3})
	refused(100, 1000, true) // a heartbeat names no index
	heard(&raft.AppendEntriesRequest{Term: 3, PrevLogEntry: 20, PrevLogTerm: 3, LeaderCommitIndex: 18})
	if f.term != 3 || f.index != 20 {
		t.Fatalf("target term %d index %d, want 3 and 20 (the entry named, past the commit index)", f.term, f.index)
	}
	refused(3, 19, true)
	refused(2, 500, true)
	refused(3, 20, false)
	refused(4, 1, false)
	heard(&raft.AppendEntriesRequest{Term: 3, PrevLogEntry: 1, Entries: []*raft.Log{{Index: 2}, {Index: 30}}, LeaderCommitIndex: 25})
	if f.index != 20 {
		t.Fatalf("the same leader moved the target to %d", f.index)
	}
	heard(&raft.AppendEntriesRequest{Term: 5, PrevLogEntry: 1, Entries: []*raft.Log{{Index: 2}, {Index: 12}}, LeaderCommitIndex: 40})
	if f.term != 5 || f.index != 40 {
		t.Fatalf("target term %d index %d after a later leader, want 5 and 40", f.term, f.index)
	}
	refused(4, 1000, true)
	refused(5, 40, false)
	if !f.withholds() {
		t.Fatal("a fence with no Raft behind it opened")
	}
	var open *voteFence
	if open.withholds() {
		t.Fatal("no fence withholds votes")
	}
}
