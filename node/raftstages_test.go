package node

import (
	"testing"

	"github.com/idemkv/idemkv/metrics"
)

// Each of Raft's timers that is a stage maps to its stage; Raft's other keys, and the
// legacy per-peer form of the AppendEntries timer, are dropped.
func TestRaftStageKeys(t *testing.T) {
	for _, c := range []struct {
		key  []string
		want int
	}{
		{[]string{"raft", "leader", "dispatchLog"}, metrics.StageLeaderAppend},
		{[]string{"raft", "commitTime"}, metrics.StageCommit},
		{[]string{"raft", "fsm", "enqueue"}, metrics.StageFSMEnqueue},
		{[]string{"raft", "fsm", "applyBatch"}, metrics.StageFSMApply},
		{[]string{"raft", "replication", "appendEntries", "rpc"}, metrics.StageAppendRPC},
		{[]string{"raft", "rpc", "appendEntries", "storeLogs"}, metrics.StageFollowerAppend},
		{[]string{"raft", "replication", "appendEntries", "rpc", "n2"}, -1},
		{[]string{"raft", "fsm", "apply"}, -1},
		{[]string{"raft", "apply"}, -1},
		{[]string{"raft"}, -1},
		{[]string{"other", "commitTime"}, -1},
	} {
		if got := raftStage(c.key); got != c.want {
			t.Errorf("%v: stage %d, want %d", c.key, got, c.want)
		}
	}
}
