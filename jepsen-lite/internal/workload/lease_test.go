package workload

import (
	"testing"

	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

func leaseOp(id int64, f string, fence uint64, call, ret int64, out *history.Output) history.Op {
	return history.Op{ID: id, Workload: "lease", F: f, Key: "k", In: history.Input{Fence: fence}, Type: history.OK, Out: out, Call: call, Return: ret}
}

func grantOut(decision string, fence uint64, stamp, expiry int64) *history.Output {
	return &history.Output{Decision: decision, Grant: fence, Record: &history.Record{Status: "pending", Fence: fence, UpdatedAt: stamp, LeaseExpiresAt: expiry}}
}

func TestCheckLeases(t *testing.T) {
	cases := []struct {
		name string
		ops  []history.Op
		want string
	}{
		{"recover after the lease", []history.Op{
			leaseOp(1, history.FReserve, 0, 0, 10, grantOut("execute", 5, 1000, 2000)),
			leaseOp(2, history.FReserve, 0, 20, 30, grantOut("recover", 9, 2000, 3000)),
		}, ""},
		{"recover before the lease", []history.Op{
			leaseOp(1, history.FReserve, 0, 0, 10, grantOut("execute", 5, 1000, 2000)),
			leaseOp(2, history.FReserve, 0, 20, 30, grantOut("recover", 9, 1500, 2500)),
		}, AnomalyEarlyRecover},
		{"a heartbeat extended the lease", []history.Op{
			leaseOp(1, history.FReserve, 0, 0, 10, grantOut("execute", 5, 1000, 2000)),
			leaseOp(2, history.FHeartbeat, 5, 11, 12, &history.Output{Record: &history.Record{Fence: 5, UpdatedAt: 1800, LeaseExpiresAt: 2800}}),
			leaseOp(3, history.FReserve, 0, 20, 30, grantOut("recover", 9, 2500, 3500)),
		}, AnomalyEarlyRecover},
		{"execute while the holder's lease is live", []history.Op{
			leaseOp(1, history.FReserve, 0, 0, 10, grantOut("execute", 5, 1000, 2000)),
			leaseOp(2, history.FReserve, 0, 20, 30, grantOut("execute", 9, 1500, 2500)),
		}, AnomalyOverlappingLeases},
		{"released first: someone unseen may sit in between", []history.Op{
			leaseOp(1, history.FReserve, 0, 0, 10, grantOut("execute", 5, 1000, 2000)),
			leaseOp(2, history.FRelease, 5, 11, 12, &history.Output{Released: true}),
			leaseOp(3, history.FReserve, 0, 20, 30, grantOut("recover", 9, 1500, 2500)),
		}, ""},
		{"a later grant with an earlier stamp", []history.Op{
			leaseOp(1, history.FReserve, 0, 0, 10, grantOut("execute", 5, 3000, 4000)),
			leaseOp(2, history.FRelease, 5, 11, 12, &history.Output{Released: true}),
			leaseOp(3, history.FReserve, 0, 20, 30, grantOut("execute", 9, 2000, 2500)),
		}, AnomalyFenceOrder},
	}
	for _, c := range cases {
		got := CheckLeases(c.ops)
		switch {
		case c.want == "" && len(got) != 0:
			t.Errorf("%s: anomalies %+v", c.name, got)
		case c.want != "" && (len(got) != 1 || got[0].Kind != c.want):
			t.Errorf("%s: got %+v, want one %s", c.name, got, c.want)
		}
	}
}

func TestCheckStaleFences(t *testing.T) {
	committed := &history.Output{Receipt: &history.Receipt{Status: "committed"}}
	register := func(op history.Op) history.Op { op.Workload = "register"; return op }
	cases := []struct {
		name string
		ops  []history.Op
		want int
	}{
		{"a zombie commit succeeds", []history.Op{
			leaseOp(1, history.FReserve, 0, 0, 10, grantOut("execute", 5, 1000, 2000)),
			leaseOp(2, history.FReserve, 0, 20, 30, grantOut("recover", 9, 2000, 3000)),
			leaseOp(3, history.FCommit, 5, 40, 50, committed),
		}, 1},
		{"a zombie commit is fenced", []history.Op{
			leaseOp(1, history.FReserve, 0, 0, 10, grantOut("execute", 5, 1000, 2000)),
			leaseOp(2, history.FReserve, 0, 20, 30, grantOut("recover", 9, 2000, 3000)),
			leaseOp(3, history.FCommit, 5, 40, 50, &history.Output{Err: "fenced"}),
		}, 0},
		{"the commit was sent before the newer grant came back", []history.Op{
			leaseOp(1, history.FReserve, 0, 0, 10, grantOut("execute", 5, 1000, 2000)),
			leaseOp(2, history.FReserve, 0, 20, 45, grantOut("recover", 9, 2000, 3000)),
			leaseOp(3, history.FCommit, 5, 40, 50, committed),
		}, 0},
		{"the register: a reused fence commits after a newer grant", []history.Op{
			register(leaseOp(1, history.FReserve, 0, 0, 10, grantOut("execute", 5, 1000, 2000))),
			register(leaseOp(2, history.FRelease, 5, 11, 12, &history.Output{Released: true})),
			register(leaseOp(3, history.FReserve, 0, 20, 30, grantOut("execute", 9, 2000, 3000))),
			register(leaseOp(4, history.FCommit, 5, 40, 50, committed)),
		}, 1},
		{"the register: a reused fence replays its own commit", []history.Op{
			register(leaseOp(1, history.FReserve, 0, 0, 10, grantOut("execute", 5, 1000, 2000))),
			register(leaseOp(2, history.FCommit, 5, 11, 12, committed)),
			register(leaseOp(3, history.FCommit, 5, 40, 50, committed)),
		}, 0},
		{"another workload's key of the same name", []history.Op{
			register(leaseOp(1, history.FReserve, 0, 20, 30, grantOut("execute", 9, 2000, 3000))),
			leaseOp(2, history.FReserve, 0, 0, 10, grantOut("execute", 5, 1000, 2000)),
			leaseOp(3, history.FCommit, 5, 40, 50, committed),
		}, 0},
	}
	for _, c := range cases {
		got := CheckStaleFences(c.ops)
		if len(got) != c.want {
			t.Errorf("%s: got %+v, want %d", c.name, got, c.want)
		}
		for _, a := range got {
			if a.Kind != AnomalyStaleFenceAccepted {
				t.Errorf("%s: kind %s", c.name, a.Kind)
			}
		}
		if len(CheckLeases(c.ops)) != 0 {
			t.Errorf("%s: CheckLeases reported %+v", c.name, CheckLeases(c.ops))
		}
	}
}
