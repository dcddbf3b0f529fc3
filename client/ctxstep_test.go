package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/node"
)

// cancelAfterReserve is an in-process node whose caller gives up the moment a reserve
// is answered: the grant arrived, the tool has not started.
type cancelAfterReserve struct {
	*node.Node
	cancel context.CancelFunc
}

func (s cancelAfterReserve) Reserve(ctx context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
	res, err := s.Node.Reserve(ctx, req)
	s.cancel()
	return res, err
}

// A caller whose context ends after the reserve was granted and before the tool ran
// gets not_executed, and the key is released: the effect certainly did not happen.
// Left pending, the key would wait out the lease and then be in doubt for a tool that
// never ran.
func TestCallerGivingUpBeforeTheToolRunsReleasesTheKey(t *testing.T) {
	c := testcluster.Start(t, 1)
	n := c.Node(0)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r, err := client.NewRunner(cancelAfterReserve{n, cancel}, client.RunConfig{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	api := newTicketAPI()
	key := "conversation_9:approval_41:create_ticket"
	op := createTicket(key, "Caller gave up")
	ran := false
	_, err = r.Do(ctx, op, func(ctx context.Context) (*client.Result, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ran = true
		return api.create(key), nil
	})
	if ran {
		t.Fatal("the tool ran under an ended context")
	}
	if !errors.Is(err, client.ErrNotExecuted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Do: %v (kind %q), want not_executed caused by the cancellation", err, client.KindOf(err))
	}
	if rec, err := n.Get(timeout(t, 5*time.Second), &idemkv.GetRequest{Tenant: op.Tenant, Key: key}); !errors.Is(err, idemkv.ErrNotFound) {
		t.Fatalf("the key is still held: %+v, %v", rec, err)
	}
	// The next call runs the tool at once, no recover, no doubt.
	r2, err := client.NewRunner(n, client.RunConfig{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	out, err := r2.Do(timeout(t, 10*time.Second), op, func(context.Context) (*client.Result, error) { return api.create(key), nil })
	if err != nil || out.Decision != idemkv.DecisionExecute || api.count(key) != 1 {
		t.Fatalf("retry: %+v, %v; %d tickets", out, err, api.count(key))
	}
}

// The same caller with an approved grant: the key is not released, since a release
// deletes the record and the person's approval with it (docs/protocol.md section 7);
// the tool gets the ended context and decides, and the record stays pending, approved.
func TestCallerGivingUpBeforeAnApprovedToolRunsKeepsTheApproval(t *testing.T) {
	c := testcluster.Start(t, 1)
	n := c.Node(0)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r, err := client.NewRunner(cancelAfterReserve{n, func() {}}, client.RunConfig{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	op := refundOp("order-17:refund:gave-up", 40, 0)
	_, err = r.Do(ctx, op, mustNotRun(t))
	var pending *client.ApprovalPendingError
	if !errors.As(err, &pending) {
		t.Fatalf("Do: %v, want approval pending", err)
	}
	fp := fingerprintOf(t, op)
	if _, err := n.DecideApproval(timeout(t, 5*time.Second), &idemkv.DecideApprovalRequest{Tenant: op.Tenant, Key: op.Key,
		ApprovalID: pending.ApprovalID, Fingerprint: fp, Decision: idemkv.VerdictApprove, Approver: "ana"}); err != nil {
		t.Fatal(err)
	}
	r, err = client.NewRunner(cancelAfterReserve{n, cancel}, client.RunConfig{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Do(ctx, op, func(ctx context.Context) (*client.Result, error) { return nil, ctx.Err() })
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("Do: %v (kind %q), want outcome_unknown", err, client.KindOf(err))
	}
	rec, err := n.Get(timeout(t, 5*time.Second), &idemkv.GetRequest{Tenant: op.Tenant, Key: op.Key})
	if err != nil || rec.Status != idemkv.StatusPending || rec.Approval == nil || rec.Approval.State != idemkv.ApprovalApproved {
		t.Fatalf("record %+v, %v: want it pending with its approval", rec, err)
	}
}
