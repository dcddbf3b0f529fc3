package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
)

// approvalGauges reads the waiting-approval gauges and counters from node i.
func approvalMetrics(t *testing.T, c *testcluster.Cluster, i int) map[string]float64 {
	t.Helper()
	families, err := c.Metrics(i).Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			name := f.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "decision" {
					name += "{" + l.GetValue() + "}"
				}
			}
			switch {
			case m.GetGauge() != nil:
				out[name] += m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[name] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func refundOp(key string, amount int, wait time.Duration) client.Op {
	return client.Op{Tenant: "shop", Key: key, Tool: "refund", Actor: "agent-1",
		Effect:   map[string]any{"order": 17, "amount": amount, "currency": "EUR"},
		Approval: &client.ApprovalRequirement{Required: true, TTL: time.Hour, Summary: fmt.Sprintf("Refund %d EUR to order 17", amount), Wait: wait}}
}

// TestApprovalsEndToEnd runs the whole contract on one node and on three, through the
// HTTP client against real nodes: a suspended Do sees one request however often it is
// resumed, the approver's decision through a follower binds to that request and
// effect, the approved Do runs the tool once, a second decision is 409, and another
// effect under the key is a conflict.
func TestApprovalsEndToEnd(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d nodes", n), func(t *testing.T) {
			c := testcluster.Start(t, n)
			agent, err := client.New(client.Config{Endpoints: c.Endpoints()})
			if err != nil {
				t.Fatal(err)
			}
			// The approver talks to the last node: a follower on three.
			approver, err := client.New(client.Config{Endpoints: []string{c.Endpoint(n - 1)}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var ran atomic.Int32
			refund := func(context.Context) (*client.Result, error) {
				ran.Add(1)
				return &client.Result{RemoteSystem: "payments", RemoteID: "re_1"}, nil
			}

			var ids []string
			for range 3 { // the agent suspends, is resumed, suspends again
				_, err := agent.Do(ctx, refundOp("order-17:refund", 40, 0), refund)
				var pending *client.ApprovalPendingError
				if !errors.As(err, &pending) || client.KindOf(err) != client.KindApprovalPending {
					t.Fatalf("Do = %v, want an *ApprovalPendingError", err)
				}
				ids = append(ids, pending.ApprovalID)
			}
			if ids[0] == "" || ids[1] != ids[0] || ids[2] != ids[0] {
				t.Fatalf("approval ids across resumes = %v, want one request", ids)
			}
			if ran.Load() != 0 {
				t.Fatal("the tool ran before approval")
			}
			page, err := approver.Approvals(ctx, &idemkv.ApprovalsRequest{Tenant: "shop"})
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Approvals) != 1 || page.Approvals[0].Approval.ID != ids[0] ||
				string(page.Approvals[0].Effect) != `{"amount":40,"currency":"EUR","order":17}` {
				t.Fatalf("listed %+v, want the one request with its canonical effect", page.Approvals)
			}
			rec := page.Approvals[0]
			testcluster.Eventually(10*time.Second, func() error {
				if m := approvalMetrics(t, c, c.LeaderIndex(t)); m["idemkv_approvals_waiting"] != 1 || m["idemkv_approval_requests_total"] != 1 {
					return fmt.Errorf("metrics %v", m)
				}
				return nil
			})

			// A decision with another fingerprint or id is refused; the right one lands.
			_, err = approver.DecideApproval(ctx, &idemkv.DecideApprovalRequest{Tenant: "shop", Key: rec.Key,
				ApprovalID: ids[0], Fingerprint: "sha256:" + fmt.Sprintf("%064d", 0), Decision: idemkv.VerdictApprove, Approver: "ana"})
			if !errors.Is(err, idemkv.ErrFingerprintMismatch) {
				t.Fatalf("decision on another fingerprint: %v", err)
			}
			decided, err := approver.DecideApproval(ctx, &idemkv.DecideApprovalRequest{Tenant: "shop", Key: rec.Key,
				ApprovalID: ids[0], Fingerprint: rec.Fingerprint, Decision: idemkv.VerdictApprove, Approver: "ana", Reason: "customer called"})
			if err != nil || decided.Approval.State != idemkv.ApprovalApproved || decided.Approval.Approver != "ana" || decided.Approval.DecidedAt == 0 {
				t.Fatalf("approve: %+v, %v", decided, err)
			}
			_, err = approver.DecideApproval(ctx, &idemkv.DecideApprovalRequest{Tenant: "shop", Key: rec.Key,
				ApprovalID: ids[0], Fingerprint: rec.Fingerprint, Decision: idemkv.VerdictDeny, Approver: "bob"})
			if !errors.Is(err, idemkv.ErrNotPending) {
				t.Fatalf("second decision: %v, want not_pending", err)
			}

			// Another refund under the approved key never borrows the approval.
			_, err = agent.Do(ctx, refundOp("order-17:refund", 4000, 0), refund)
			if !errors.Is(err, client.ErrConflict) {
				t.Fatalf("another effect under the approved key: %v, want a conflict", err)
			}
			out, err := agent.Do(ctx, refundOp("order-17:refund", 40, 0), refund)
			if err != nil || out.Decision != idemkv.DecisionExecute || ran.Load() != 1 {
				t.Fatalf("approved Do: %+v, %v (ran %d)", out, err, ran.Load())
			}
			out, err = agent.Do(ctx, refundOp("order-17:refund", 40, 0), refund)
			if err != nil || !out.Replayed || ran.Load() != 1 {
				t.Fatalf("Do after the refund: %+v, %v (ran %d)", out, err, ran.Load())
			}
			got, err := agent.Get(ctx, &idemkv.GetRequest{Tenant: "shop", Key: rec.Key})
			if err != nil || got.Status != idemkv.StatusCommitted || got.Approval.Reason != "customer called" {
				t.Fatalf("record after the refund: %+v, %v; want committed with its approval kept", got, err)
			}
			testcluster.Eventually(10*time.Second, func() error {
				if m := approvalMetrics(t, c, c.LeaderIndex(t)); m["idemkv_approvals_waiting"] != 0 {
					return fmt.Errorf("metrics %v", m)
				}
				return nil
			})
		})
	}
}

// TestApprovalWaitWakesOnDecision: a Do that waits for the decision returns as soon as
// it is given (the long-poll wakes on it), not at the end of its wait; a denial comes
// back as the stored approval_denied failure, on every retry.
func TestApprovalWaitWakesOnDecision(t *testing.T) {
	c := testcluster.Start(t, 3)
	agent, err := client.New(client.Config{Endpoints: c.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var ran atomic.Int32
	refund := func(context.Context) (*client.Result, error) {
		ran.Add(1)
		return &client.Result{RemoteSystem: "payments", RemoteID: "re_2"}, nil
	}
	for _, verdict := range []idemkv.ApprovalVerdict{idemkv.VerdictApprove, idemkv.VerdictDeny} {
		key := "order-18:" + string(verdict)
		type result struct {
			out *client.Outcome
			err error
			at  time.Time
		}
		done := make(chan result, 1)
		go func() {
			out, err := agent.Do(ctx, refundOp(key, 40, 60*time.Second), refund)
			done <- result{out, err, time.Now()}
		}()
		var rec *idemkv.Record
		if err := testcluster.Eventually(20*time.Second, func() error {
			page, err := agent.Approvals(ctx, &idemkv.ApprovalsRequest{Tenant: "shop"})
			if err != nil || len(page.Approvals) != 1 {
				return fmt.Errorf("approvals %+v, %v", page, err)
			}
			rec = page.Approvals[0]
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		decidedAt := time.Now()
		if _, err := agent.DecideApproval(ctx, &idemkv.DecideApprovalRequest{Tenant: "shop", Key: key, ApprovalID: rec.Approval.ID,
			Fingerprint: rec.Fingerprint, Decision: verdict, Approver: "ana", Reason: "checked"}); err != nil {
			t.Fatal(err)
		}
		r := <-done
		latency := r.at.Sub(decidedAt)
		t.Logf("%s: Do returned %s after the decision", verdict, latency)
		if latency > 20*time.Second {
			t.Errorf("%s: the wait did not wake on the decision (%s)", verdict, latency)
		}
		switch verdict {
		case idemkv.VerdictApprove:
			if r.err != nil || r.out.Decision != idemkv.DecisionExecute || ran.Load() != 1 {
				t.Fatalf("approved wait: %+v, %v", r.out, r.err)
			}
		case idemkv.VerdictDeny:
			if !client.IsApprovalDenied(r.err) || ran.Load() != 1 {
				t.Fatalf("denied wait: %v (ran %d)", r.err, ran.Load())
			}
			if _, err := agent.Do(ctx, refundOp(key, 40, 0), refund); !client.IsApprovalDenied(err) {
				t.Fatalf("retry of a denied call: %v", err)
			}
		}
	}
}

// TestApprovalRuleHoldsEveryClient: an admin's rule requires approval of a tool for a
// client that asks for none.
func TestApprovalRuleHoldsEveryClient(t *testing.T) {
	c := testcluster.Start(t, 3)
	cl, err := client.New(client.Config{Endpoints: c.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rules, err := cl.SetApprovalRule(ctx, &idemkv.SetApprovalRuleRequest{ApprovalRule: idemkv.ApprovalRule{Tenant: "shop", Tool: "refund"}})
	if err != nil || len(rules.Rules) != 1 {
		t.Fatalf("set rule: %+v, %v", rules, err)
	}
	op := refundOp("order-19:refund", 40, 0)
	op.Approval = &client.ApprovalRequirement{} // asks for nothing; sends the effect
	_, err = cl.Do(ctx, op, func(context.Context) (*client.Result, error) {
		t.Error("the tool ran under a rule without approval")
		return nil, nil
	})
	var pending *client.ApprovalPendingError
	if !errors.As(err, &pending) || !pending.Approval.ByRule {
		t.Fatalf("Do under a rule: %v, want pending by rule", err)
	}
	op.Approval, op.Key = nil, "order-20:refund"
	if _, err := cl.Do(ctx, op, func(context.Context) (*client.Result, error) { return nil, nil }); !errors.Is(err, idemkv.ErrInvalidArgument) {
		t.Fatalf("Do under a rule with only a fingerprint: %v, want invalid_argument naming the effect", err)
	}
}
