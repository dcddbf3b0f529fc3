package workload

import (
	"testing"
	"time"

	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

func rtLeaseOp(id int64, f string, call, ret time.Duration, decision string, fence uint64, leaseMs int64) history.Op {
	op := history.Op{ID: id, Workload: "lease", F: f, Key: "lease:0", Type: history.OK, Call: int64(call), Return: int64(ret),
		In: history.Input{Fence: fence}}
	if f == history.FReserve || f == history.FHeartbeat {
		op.Out = &history.Output{Decision: decision, Grant: fence,
			Record: &history.Record{Fence: fence, UpdatedAt: 1_000_000, LeaseExpiresAt: 1_000_000 + leaseMs}}
	} else {
		op.Out = &history.Output{}
	}
	return op
}

func TestCheckLeasesRealTime(t *testing.T) {
	ms := time.Millisecond
	grant := rtLeaseOp(1, history.FReserve, 0, 10*ms, "execute", 5, 2000)
	cases := []struct {
		name string
		ops  []history.Op
		want int
	}{
		{"recover after the lease", []history.Op{grant, rtLeaseOp(2, history.FReserve, 1990*ms, 2010*ms, "recover", 6, 2000)}, 0},
		// The clock of the leader that granted the recover ran 1.4 s ahead.
		{"recover 1.4 s early", []history.Op{grant, rtLeaseOp(2, history.FReserve, 500*ms, 600*ms, "recover", 6, 2000)}, 1},
		{"a heartbeat extends it", []history.Op{grant, rtLeaseOp(3, history.FHeartbeat, 1500*ms, 1510*ms, "", 5, 2000),
			rtLeaseOp(2, history.FReserve, 2200*ms, 2300*ms, "recover", 6, 2000)}, 1},
		{"the holder released first", []history.Op{grant, rtLeaseOp(3, history.FRelease, 300*ms, 310*ms, "", 5, 0),
			rtLeaseOp(2, history.FReserve, 500*ms, 600*ms, "recover", 6, 2000)}, 0},
		{"a grant known only after the recover was asked", []history.Op{rtLeaseOp(1, history.FReserve, 0, 700*ms, "execute", 5, 2000),
			rtLeaseOp(2, history.FReserve, 500*ms, 600*ms, "recover", 6, 2000)}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := CheckLeasesRealTime(c.ops)
			if len(got) != c.want {
				t.Fatalf("%d anomalies, want %d: %v", len(got), c.want, got)
			}
			for _, a := range got {
				if a.Kind != AnomalyLeaseCutShort {
					t.Fatalf("kind %q", a.Kind)
				}
			}
		})
	}
}
