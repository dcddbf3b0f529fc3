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
		{"a zombie commit succeeds", []history.Op{
			leaseOp(1, history.FReserve, 0, 0, 10, grantOut("execute", 5, 1000, 2000)),
			leaseOp(2, history.FReserve, 0, 20, 30, grantOut("recover", 9, 2000, 3000)),
			leaseOp(3, history.FCommit, 5, 40, 50, &history.Output{Receipt: &history.Receipt{Status: "committed"}}),
		}, AnomalyStaleFenceAccepted},
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
