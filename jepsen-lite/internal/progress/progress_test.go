package progress

import (
	"testing"
	"time"

	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
	"github.com/idemkv/idemkv/jepsen-lite/internal/nemesis"
)

const sec = int64(time.Second)

// writes returns n writes per second from `from` to `to` seconds, acknowledged when ok.
func writes(from, to float64, n int, ok bool) []history.Op {
	var out []history.Op
	count := int((to - from) * float64(n))
	for i := range count {
		at := int64(from*1e9) + int64(i)*sec/int64(n)
		op := history.Op{F: history.FCommit, Call: at, Return: at + 1000, Type: history.Info}
		if ok {
			op.Type, op.Out = history.OK, &history.Output{}
		}
		out = append(out, op)
	}
	return out
}

func cat(parts ...[]history.Op) []history.Op {
	var out []history.Op
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestHealthyRunPasses(t *testing.T) {
	faults := []nemesis.Fault{{Kind: "kill-leader", Start: 10 * sec, End: 14 * sec}}
	ops := cat(writes(0, 10, 100, true), writes(10, 16, 20, false), writes(16, 40, 100, true))
	res := Check(ops, faults, 40*sec, DefaultConfig())
	if len(res.Anomalies) != 0 {
		t.Fatalf("anomalies %+v", res.Anomalies)
	}
	if len(res.Windows) != 3 || res.Windows[1].RecoveredIn == nil || *res.Windows[1].RecoveredIn != 3 {
		t.Fatalf("windows %+v", res.Windows)
	}
	if a := res.Windows[1].Availability; a == nil || *a != 0 {
		t.Fatalf("availability of the fault window: %v (%+v)", *a, res.Windows[1])
	}
	if res.Windows[1].Baseline != 100 {
		t.Fatalf("baseline %v", res.Windows[1].Baseline)
	}
}

// A build whose every write fails: no progress without a fault, no recovery after.
func TestNoProgressIsCaught(t *testing.T) {
	faults := []nemesis.Fault{{Kind: "pause-leader", Start: 5 * sec, End: 8 * sec}}
	ops := writes(0, 40, 50, false)
	res := Check(ops, faults, 40*sec, DefaultConfig())
	kinds := map[string]int{}
	for _, a := range res.Anomalies {
		kinds[a.Kind]++
	}
	if kinds[AnomalyNoProgress] != 2 || kinds[AnomalySlowRecovery] != 1 {
		t.Fatalf("anomalies %+v", res.Anomalies)
	}
	// Without any fault the whole run is one quiet window.
	if res := Check(ops, nil, 40*sec, DefaultConfig()); len(res.Anomalies) != 1 || res.Anomalies[0].Kind != AnomalyNoProgress {
		t.Fatalf("no nemesis: %+v", res.Anomalies)
	}
}

// Throughput that comes back, but only to a trickle, is not recovered.
func TestTrickleIsNotRecovery(t *testing.T) {
	faults := []nemesis.Fault{{Kind: "kill-all", Start: 10 * sec, End: 12 * sec}}
	ops := cat(writes(0, 10, 100, true), writes(12, 40, 10, true))
	res := Check(ops, faults, 40*sec, DefaultConfig())
	if len(res.Anomalies) != 1 || res.Anomalies[0].Kind != AnomalySlowRecovery {
		t.Fatalf("anomalies %+v", res.Anomalies)
	}
}

// Recovered is what the nemesis waits on: undecided while the series is short.
func TestRecoveredLive(t *testing.T) {
	faults := []nemesis.Fault{{Kind: "kill-one", Start: 3 * sec, End: 5 * sec}}
	acked := []int{100, 100, 100, 0, 0, 0, 0}
	if _, _, decided := Recovered(acked, faults, 5*sec, DefaultConfig()); decided {
		t.Fatal("decided without data")
	}
	acked = append(acked, 80, 5)
	after, ok, decided := Recovered(acked, faults, 5*sec+sec/2, DefaultConfig())
	if !ok || !decided || after != 2500*time.Millisecond {
		t.Fatalf("after %v ok %v decided %v", after, ok, decided)
	}
}

// One good second after each heal is not enough: the quiet time after it must keep
// acknowledging writes.
func TestStallAfterRecoveryIsCaught(t *testing.T) {
	faults := []nemesis.Fault{{Kind: "kill-one", Start: 10 * sec, End: 12 * sec}, {Kind: "kill-one", Start: 20 * sec, End: 22 * sec}}
	ops := cat(writes(0, 10, 100, true), writes(12, 13, 100, true), writes(13, 20, 100, false), writes(22, 40, 100, true))
	res := Check(ops, faults, 40*sec, DefaultConfig())
	if len(res.Anomalies) != 1 || res.Anomalies[0].Kind != AnomalyNoProgress {
		t.Fatalf("anomalies %+v", res.Anomalies)
	}
}
