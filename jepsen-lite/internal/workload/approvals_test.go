package workload

import (
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// approvalHistory builds a small approvals history: a request, its approval, and
// whatever more tailors it.
func approvalHistory(more ...history.Op) []history.Op {
	ok := func(op history.Op) history.Op { op.Workload, op.Type = "approvals", history.OK; return op }
	waiting := &history.Record{Fingerprint: "fpA", ApprovalID: "apr_1", ApprovalState: string(idemkv.ApprovalWaiting)}
	ops := []history.Op{
		ok(history.Op{ID: 1, F: history.FReserve, Key: "k", In: history.Input{Fingerprint: "fpA"}, Call: 1, Return: 2,
			Out: &history.Output{Decision: string(idemkv.DecisionNeedsApproval), Record: waiting}}),
		ok(history.Op{ID: 2, F: history.FDecide, Key: "k", In: history.Input{Fingerprint: "fpA", ApprovalID: "apr_1", Verdict: "approve"},
			Call: 3, Return: 4, Out: &history.Output{Record: &history.Record{ApprovalID: "apr_1", ApprovalState: "approved"}}}),
	}
	for _, op := range more {
		ops = append(ops, ok(op))
	}
	return ops
}

func grantOp(id int64, fp string, fence uint64, call int64) history.Op {
	return history.Op{ID: id, F: history.FReserve, Key: "k", In: history.Input{Fingerprint: fp}, Call: call, Return: call + 1,
		Out: &history.Output{Decision: string(idemkv.DecisionExecute), Grant: fence,
			Record: &history.Record{Fingerprint: "fpA", ApprovalID: "apr_1", ApprovalState: "approved"}}}
}

// TestCheckApprovals: each anomaly the checker names is found in a history that has it,
// and none in one that does not.
func TestCheckApprovals(t *testing.T) {
	tests := []struct {
		name string
		ops  []history.Op
		want string // "" valid
	}{
		{"approved, executed once, retried with the same fence", approvalHistory(grantOp(3, "fpA", 10, 5), grantOp(4, "fpA", 10, 7)), ""},
		{"another fingerprint executed under the approval", approvalHistory(grantOp(3, "fpB", 10, 5)), AnomalyUnapprovedExecute},
		{"a request nobody decided", approvalHistory()[:1:1], ""},
		{"one approval granted to two fences", approvalHistory(grantOp(3, "fpA", 10, 5), grantOp(4, "fpA", 11, 7)), AnomalyApprovalReused},
		{"a read after the approval sees it waiting", approvalHistory(history.Op{ID: 3, F: history.FGet, Key: "k", Call: 6, Return: 7,
			Out: &history.Output{Record: &history.Record{ApprovalID: "apr_1", ApprovalState: "waiting"}}}), AnomalyLostDecision},
		{"a second decision succeeded", approvalHistory(history.Op{ID: 3, F: history.FDecide, Key: "k",
			In: history.Input{ApprovalID: "apr_1", Verdict: "deny"}, Call: 6, Return: 7, Out: &history.Output{}}), AnomalyLostDecision},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckApprovals(tc.ops)
			switch {
			case tc.want == "" && len(got) > 0:
				t.Fatalf("anomalies in a valid history: %+v", got)
			case tc.want != "" && (len(got) == 0 || got[0].Kind != tc.want):
				t.Fatalf("got %+v, want %s", got, tc.want)
			}
		})
	}
	// An execute with no approval at all is unapproved.
	ops := []history.Op{{ID: 1, Workload: "approvals", Type: history.OK, F: history.FReserve, Key: "k", In: history.Input{Fingerprint: "fpA"},
		Out: &history.Output{Decision: string(idemkv.DecisionExecute), Grant: 5, Record: &history.Record{Fingerprint: "fpA"}}}}
	if got := CheckApprovals(ops); len(got) != 1 || got[0].Kind != AnomalyUnapprovedExecute {
		t.Fatalf("execute without approval: %+v", got)
	}
}
