package workload

import (
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// ackedOp is an answered operation of workload on key "k"; times in milliseconds of
// the run.
func ackedOp(workload string, id int64, f string, in history.Input, call, ret int64, out *history.Output) history.Op {
	ms := int64(time.Millisecond)
	return history.Op{ID: id, Workload: workload, F: f, Key: "k", In: in, Type: history.OK, Out: out, Call: call * ms, Return: ret * ms}
}

// A short-lease key: fence 5 granted at stamp 1000 (created then), its record expiring
// at 4000, committed at 2500 with receipt r.
func leaseAcked() ([]history.Op, *history.Receipt) {
	r := &history.Receipt{Status: "committed", Fingerprint: leaseFP, RemoteID: "L-5", RemoteURL: "https://x/L-5",
		ResultDigest: history.Digest([]byte(`{"n":1.50}`)), CommittedAt: 2500}
	grant := &history.Record{Status: "pending", Fingerprint: leaseFP, Fence: 5, CreatedAt: 1000, UpdatedAt: 1000,
		LeaseExpiresAt: 2000, ExpiresAt: 4000}
	return []history.Op{
		ackedOp("lease", 1, history.FReserve, history.Input{Fingerprint: leaseFP}, 0, 10, &history.Output{Decision: "execute", Grant: 5, Record: grant}),
		ackedOp("lease", 2, history.FCommit, history.Input{Fingerprint: leaseFP, Fence: 5}, 20, 30, &history.Output{Receipt: r}),
	}, r
}

// committedRecord is the record that replays r at fence 5.
func committedRecord(r *history.Receipt) *history.Record {
	return &history.Record{Status: r.Status, Fingerprint: r.Fingerprint, Fence: 5, RemoteID: r.RemoteID, RemoteURL: r.RemoteURL,
		ResultDigest: r.ResultDigest, CommittedAt: r.CommittedAt, CreatedAt: 1000, UpdatedAt: r.CommittedAt, ExpiresAt: 4000}
}

func TestCheckAcknowledgedLease(t *testing.T) {
	reserve := func(id, call int64, out *history.Output) history.Op {
		return ackedOp("lease", id, history.FReserve, history.Input{Fingerprint: leaseFP}, call, call+5, out)
	}
	pending := func(fence uint64, created int64) *history.Record {
		return &history.Record{Status: "pending", Fingerprint: leaseFP, Fence: fence, CreatedAt: created, UpdatedAt: created + 3000, ExpiresAt: created + 3000}
	}
	cases := []struct {
		name  string
		later func(r *history.Receipt) []history.Op
		want  string
	}{
		{"replays, then a grant once it expired", func(r *history.Receipt) []history.Op {
			return []history.Op{
				reserve(3, 40, &history.Output{Decision: "replay", Receipt: r, Record: committedRecord(r)}),
				reserve(4, 50, &history.Output{Decision: "execute", Grant: 9, Record: pending(9, 4000)}),
			}
		}, ""},
		{"a read overlapping the commit sees it pending", func(*history.Receipt) []history.Op {
			return []history.Op{reserve(3, 25, &history.Output{Decision: "in_progress", Record: pending(5, 1000)})}
		}, ""},
		{"a recover of the committed key", func(*history.Receipt) []history.Op {
			return []history.Op{reserve(3, 40, &history.Output{Decision: "recover", Grant: 9, Record: pending(9, 1000)})}
		}, AnomalyAckThenExecuted},
		{"a new record before it expired", func(*history.Receipt) []history.Op {
			return []history.Op{reserve(3, 40, &history.Output{Decision: "execute", Grant: 9, Record: pending(9, 3999)})}
		}, AnomalyAckThenExecuted},
		{"the key still pending under the acknowledged fence, twice (one anomaly)", func(*history.Receipt) []history.Op {
			return []history.Op{reserve(3, 40, &history.Output{Decision: "in_progress", Record: pending(5, 1000)}),
				reserve(4, 50, &history.Output{Decision: "in_progress", Record: pending(5, 1000)})}
		}, AnomalyAckThenExecuted},
		{"another fence committed before it expired", func(*history.Receipt) []history.Op {
			return []history.Op{ackedOp("lease", 3, history.FCommit, history.Input{Fingerprint: leaseFP, Fence: 9}, 40, 45,
				&history.Output{Receipt: &history.Receipt{Status: "committed", Fingerprint: leaseFP, RemoteID: "L-9", CommittedAt: 3000}})}
		}, AnomalyAckThenExecuted},
		{"a replay without the result", func(r *history.Receipt) []history.Op {
			c := *r
			c.ResultDigest = ""
			return []history.Op{reserve(3, 40, &history.Output{Decision: "replay", Receipt: &c, Record: committedRecord(r)})}
		}, AnomalyReceiptMismatch},
		{"a replay re-stamped", func(r *history.Receipt) []history.Op {
			c := *r
			c.CommittedAt++
			return []history.Op{reserve(3, 40, &history.Output{Decision: "replay", Receipt: &c, Record: committedRecord(&c)})}
		}, AnomalyReceiptMismatch},
		{"a retried commit answered another URL", func(r *history.Receipt) []history.Op {
			c := *r
			c.RemoteURL = ""
			return []history.Op{ackedOp("lease", 3, history.FCommit, history.Input{Fingerprint: leaseFP, Fence: 5}, 40, 45, &history.Output{Receipt: &c})}
		}, AnomalyReceiptMismatch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ops, r := leaseAcked()
			ops = append(ops, c.later(r)...)
			// An operation whose outcome is unknown says nothing either way.
			ops = append(ops, history.Op{ID: 99, Workload: "lease", F: history.FReserve, Key: "k", Type: history.Info, Call: 100, Return: 200})
			got := CheckAcknowledged(ops)
			switch {
			case c.want == "" && len(got) != 0:
				t.Fatalf("anomalies %+v", got)
			case c.want != "" && (len(got) != 1 || got[0].Kind != c.want):
				t.Fatalf("got %+v, want one %s", got, c.want)
			}
		})
	}
	// The register and agent workloads are judged elsewhere.
	ops, _ := leaseAcked()
	ops = append(ops, reserve(3, 40, &history.Output{Decision: "recover", Grant: 9, Record: pending(9, 1000)}))
	for i := range ops {
		ops[i].Workload = "register"
	}
	if got := CheckAcknowledged(ops); len(got) != 0 {
		t.Fatalf("judged the register workload: %+v", got)
	}
}

func TestCheckAcknowledgedApprovals(t *testing.T) {
	const hour = int64(time.Hour / time.Millisecond)
	_, fp := refundEffect("k", 40)
	denied := &history.Record{Status: "failed", Fingerprint: fp, ApprovalID: "apr_1", ApprovalState: "denied",
		ErrorCode: idemkv.CodeApprovalDenied, CreatedAt: 1000, UpdatedAt: 2000, ExpiresAt: 1000 + hour}
	deny := func() []history.Op {
		return []history.Op{
			ackedOp("approvals", 1, history.FReserve, history.Input{Fingerprint: fp}, 0, 10, &history.Output{Decision: "needs_approval",
				Record: &history.Record{Status: "awaiting_approval", Fingerprint: fp, ApprovalID: "apr_1", ApprovalState: "waiting", CreatedAt: 1000, UpdatedAt: 1000, ExpiresAt: 1000 + hour}}),
			ackedOp("approvals", 2, history.FDecide, history.Input{Fingerprint: fp, ApprovalID: "apr_1", Verdict: "deny"}, 20, 30, &history.Output{Record: denied}),
		}
	}
	replay := ackedOp("approvals", 3, history.FReserve, history.Input{Fingerprint: fp}, 40, 45, &history.Output{Decision: "replay",
		Receipt: &history.Receipt{Status: "failed", Fingerprint: fp, ErrorCode: idemkv.CodeApprovalDenied, CommittedAt: 2000}, Record: denied})
	if got := CheckAcknowledged(append(deny(), replay)); len(got) != 0 {
		t.Fatalf("a denial replayed: %+v", got)
	}
	// Denied, then asked again: a fresh approval id, which an approver may grant.
	fresh := ackedOp("approvals", 3, history.FReserve, history.Input{Fingerprint: fp}, 40, 45, &history.Output{Decision: "needs_approval",
		Record: &history.Record{Status: "awaiting_approval", Fingerprint: fp, ApprovalID: "apr_9", ApprovalState: "waiting", CreatedAt: 2100, UpdatedAt: 2100, ExpiresAt: 2100 + hour}})
	if got := CheckAcknowledged(append(deny(), fresh)); len(got) != 1 || got[0].Kind != AnomalyAckThenExecuted {
		t.Fatalf("a denial forgotten: %+v", got)
	}

	// Approved, executed, committed; the final read ten seconds into the run.
	receipt := &history.Receipt{Status: "committed", Fingerprint: fp, RemoteID: "RF-k-7", RemoteURL: "https://p/RF-k-7", ResultDigest: "9:abc", CommittedAt: 2600}
	committed := func() []history.Op {
		return []history.Op{
			ackedOp("approvals", 1, history.FReserve, history.Input{Fingerprint: fp}, 0, 10, &history.Output{Decision: "execute", Grant: 7,
				Record: &history.Record{Status: "pending", Fingerprint: fp, Fence: 7, ApprovalID: "apr_1", CreatedAt: 1000, UpdatedAt: 2500, ExpiresAt: 1000 + hour}}),
			ackedOp("approvals", 2, history.FCommit, history.Input{Fingerprint: fp, Fence: 7}, 20, 30, &history.Output{Receipt: receipt}),
		}
	}
	final := func(out *history.Output) history.Op {
		return ackedOp("approvals", 3, history.FGet, history.Input{Final: true}, 10_000, 10_010, out)
	}
	held := &history.Record{Status: "committed", Fingerprint: fp, Fence: 7, ApprovalID: "apr_1", RemoteID: receipt.RemoteID, RemoteURL: receipt.RemoteURL,
		ResultDigest: receipt.ResultDigest, CommittedAt: 2600, CreatedAt: 1000, UpdatedAt: 2600, ExpiresAt: 1000 + hour}
	if got := CheckAcknowledged(append(committed(), final(&history.Output{Record: held}))); len(got) != 0 {
		t.Fatalf("a commit held: %+v", got)
	}
	if got := CheckAcknowledged(append(committed(), final(&history.Output{Err: idemkv.CodeNotFound}))); len(got) != 1 || got[0].Kind != AnomalyLostAcknowledgedWrite {
		t.Fatalf("a commit lost by the final read: %+v", got)
	}
	// Recovered under the same approval after the commit (a second refund), and gone.
	recovered := ackedOp("approvals", 4, history.FReserve, history.Input{Fingerprint: fp}, 40, 45, &history.Output{Decision: "recover", Grant: 11,
		Record: &history.Record{Status: "pending", Fingerprint: fp, Fence: 11, ApprovalID: "apr_1", CreatedAt: 1000, UpdatedAt: 2700, ExpiresAt: 1000 + hour}})
	got := kinds(CheckAcknowledged(append(committed(), recovered, final(&history.Output{Err: idemkv.CodeNotFound}))))
	if got[AnomalyAckThenExecuted] != 1 || got[AnomalyLostAcknowledgedWrite] != 1 || len(got) != 2 {
		t.Fatalf("a recover after the commit: %v", got)
	}
	// A record that lives seconds may be gone by the final read.
	short := committed()
	short[0].Out.Record.ExpiresAt = 4000
	if got := CheckAcknowledged(append(short, final(&history.Output{Err: idemkv.CodeNotFound}))); len(got) != 0 {
		t.Fatalf("a record that may have expired: %+v", got)
	}
}
