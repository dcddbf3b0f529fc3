package node

import (
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"

	"github.com/idemkv/idemkv/metrics"
)

// RaftStageSink takes the few timers of hashicorp/raft that say where a write's time
// goes into idemkv's stage histogram (metrics.WriteStages) and drops every other
// metric Raft emits. Raft times its work whether or not anyone listens (into a
// sink that discards it by default); this sink adds a switch on the key and one
// histogram observation per timer it keeps.
//
//	raft.leader.dispatchLog               leader_append    the leader's log write, durable
//	raft.commitTime                       commit           from that write's start until a quorum has the entry
//	raft.fsm.enqueue                      fsm_enqueue      committed entries handed to the state machine's goroutine
//	raft.fsm.applyBatch                   fsm_apply        one batch through the state machine
//	raft.replication.appendEntries.rpc    append_rpc       one AppendEntries round trip, the follower's write inside
//	raft.rpc.appendEntries.storeLogs      follower_append  a follower's own log write
type RaftStageSink struct {
	m *metrics.Metrics
}

// InstallRaftStageSink routes hashicorp/raft's metrics, which go through one global
// registry per process, into m's stage histogram. A process serving one node calls it
// once (idemkv serve does); in a process of several nodes the last call wins.
func InstallRaftStageSink(m *metrics.Metrics) error {
	cfg := gometrics.DefaultConfig("")
	// No host name or runtime statistics: the first is no stage, the second a
	// goroutine sampling the Go runtime every second that the Go collector already
	// covers.
	cfg.EnableHostname, cfg.EnableHostnameLabel, cfg.EnableRuntimeMetrics, cfg.EnableServiceLabel = false, false, false, false
	_, err := gometrics.NewGlobal(cfg, &RaftStageSink{m: m})
	return err
}

// raftStage maps one of Raft's keys to a stage, or -1 for a key this sink drops.
func raftStage(key []string) int {
	if len(key) < 2 || key[0] != "raft" {
		return -1
	}
	switch {
	case len(key) == 3 && key[1] == "leader" && key[2] == "dispatchLog":
		return metrics.StageLeaderAppend
	case len(key) == 2 && key[1] == "commitTime":
		return metrics.StageCommit
	case len(key) == 3 && key[1] == "fsm" && key[2] == "enqueue":
		return metrics.StageFSMEnqueue
	case len(key) == 3 && key[1] == "fsm" && key[2] == "applyBatch":
		return metrics.StageFSMApply
	case len(key) == 4 && key[1] == "replication" && key[2] == "appendEntries" && key[3] == "rpc":
		// The labelled key; Raft's legacy one names the peer in a fifth part.
		return metrics.StageAppendRPC
	case len(key) == 4 && key[1] == "rpc" && key[2] == "appendEntries" && key[3] == "storeLogs":
		return metrics.StageFollowerAppend
	}
	return -1
}

// AddSample observes a timer kept as a stage; Raft's timers are in milliseconds.
func (s *RaftStageSink) AddSample(key []string, val float32) {
	if st := raftStage(key); st >= 0 {
		s.m.Stage(st).Observe(float64(val) * float64(time.Millisecond) / float64(time.Second))
	}
}

// AddSampleWithLabels is AddSample: the stages carry no labels of Raft's.
func (s *RaftStageSink) AddSampleWithLabels(key []string, val float32, _ []gometrics.Label) {
	s.AddSample(key, val)
}

// SetGauge drops the gauge.
func (s *RaftStageSink) SetGauge([]string, float32) {}

// SetGaugeWithLabels drops the gauge.
func (s *RaftStageSink) SetGaugeWithLabels([]string, float32, []gometrics.Label) {}

// EmitKey drops the key.
func (s *RaftStageSink) EmitKey([]string, float32) {}

// IncrCounter drops the counter.
func (s *RaftStageSink) IncrCounter([]string, float32) {}

// IncrCounterWithLabels drops the counter.
func (s *RaftStageSink) IncrCounterWithLabels([]string, float32, []gometrics.Label) {}
