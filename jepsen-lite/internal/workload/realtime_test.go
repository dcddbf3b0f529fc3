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

func refused(op history.Op) history.Op {
	op.Out = &history.Output{Err: "not_found"}
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
		// Fences are Raft indexes: fence 5's grant applied before fence 6's, whichever
		// answer came back first.
		{"a grant answered after the recover", []history.Op{rtLeaseOp(1, history.FReserve, 0, 700*ms, "execute", 5, 2000),
			rtLeaseOp(2, history.FReserve, 500*ms, 600*ms, "recover", 6, 2000)}, 1},
		// A leader whose clock runs fast within fsm.ClockSlew makes a lease up to a
		// tenth shorter in real time: 1.85 s of 2 s is within it, 1.7 s is not.
		{"recover within the clock slew", []history.Op{grant, rtLeaseOp(2, history.FReserve, 1800*ms, 1850*ms, "recover", 6, 2000)}, 0},
		{"recover beyond the clock slew", []history.Op{grant, rtLeaseOp(2, history.FReserve, 1650*ms, 1700*ms, "recover", 6, 2000)}, 1},
		// The audit's run: the state machine clock jumped 240 s, the record expired
		// with its lease, and the key was granted execute again 70 ms later.
		{"execute while the lease is live", []history.Op{rtLeaseOp(1, history.FReserve, 1100*ms, 1120*ms, "execute", 1209, 1200),
			rtLeaseOp(2, history.FReserve, 1150*ms, 1190*ms, "execute", 1278, 1200)}, 1},
		{"execute after the lease", []history.Op{grant, rtLeaseOp(2, history.FReserve, 3000*ms, 3010*ms, "execute", 6, 2000)}, 0},
		{"execute after the holder committed", []history.Op{grant, rtLeaseOp(3, history.FCommit, 400*ms, 420*ms, "", 5, 0),
			rtLeaseOp(2, history.FReserve, 450*ms, 470*ms, "execute", 6, 2000)}, 0},
		// The holder's commit came too late: the record was gone.
		{"a refused commit ends nothing", []history.Op{grant, refused(rtLeaseOp(3, history.FCommit, 400*ms, 420*ms, "", 5, 0)),
			rtLeaseOp(2, history.FReserve, 450*ms, 470*ms, "execute", 6, 2000)}, 1},
		// An end sent only after the grant came back cannot have made way for it.
		{"a commit sent after the grant", []history.Op{grant, rtLeaseOp(2, history.FReserve, 450*ms, 470*ms, "execute", 6, 2000),
			rtLeaseOp(3, history.FCommit, 480*ms, 490*ms, "", 5, 0)}, 1},
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
