package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// TestLongPollWaitsForTheDecision: a long-poll on a record awaiting approval parks
// until the decision applies and answers the decided record; before, it answered at
// once (only pending records were waited on), so a waiting client spun.
func TestLongPollWaitsForTheDecision(t *testing.T) {
	c := testcluster.Start(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var asked *idemkv.ReserveResult
	if err := c.OnLeader(func(n *node.Node) error {
		var err error
		asked, err = n.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "shop", Key: "k1", Tool: "refund", AttemptID: "a1",
			Effect:   json.RawMessage(`{"order":17}`),
			Approval: &idemkv.ApprovalAsk{Required: true, Summary: "refund order 17"}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if asked.Decision != idemkv.DecisionNeedsApproval || asked.Approval == nil {
		t.Fatalf("reserve: %+v", asked)
	}
	leader := c.Node(c.LeaderIndex(t))
	type got struct {
		rec *idemkv.Record
		err error
	}
	done := make(chan got, 1)
	go func() {
		rec, err := leader.Get(ctx, &idemkv.GetRequest{Tenant: "shop", Key: "k1", Wait: 30 * time.Second})
		done <- got{rec, err}
	}()
	if err := testcluster.Eventually(10*time.Second, func() error {
		select {
		case g := <-done:
			done <- g
			return nil // answered already: judged below
		default:
		}
		if leader.LongPolling() == 0 {
			return errors.New("the long-poll is not parked yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-done:
		t.Fatalf("the long-poll answered before any decision: %+v, %v", g.rec, g.err)
	default:
	}
	if _, err := leader.DecideApproval(ctx, &idemkv.DecideApprovalRequest{Tenant: "shop", Key: "k1", ApprovalID: asked.Approval.ID,
		Fingerprint: asked.Record.Fingerprint, Decision: idemkv.VerdictApprove, Approver: "ana"}); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-done:
		if g.err != nil || g.rec.Approval == nil || g.rec.Approval.State != idemkv.ApprovalApproved {
			t.Fatalf("long-poll answered %+v, %v; want the approved record", g.rec, g.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the long-poll did not wake on the decision")
	}
	// The metrics of the leader saw one request and one decision.
	families, err := c.Metrics(c.LeaderIndex(t)).Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if m.GetCounter() != nil {
				seen[f.GetName()] += m.GetCounter().GetValue()
			}
		}
	}
	if seen["idemkv_approval_requests_total"] != 1 || seen["idemkv_approval_decisions_total"] != 1 {
		t.Errorf("approval counters = %v, want one request and one decision", fmt.Sprint(seen["idemkv_approval_requests_total"], " ", seen["idemkv_approval_decisions_total"]))
	}
}
