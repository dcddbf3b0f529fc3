package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// A tool that panics stops its heartbeat: the lease runs out, and the next attempt
// recovers the key instead of waiting in_progress for as long as the caller lives.
func TestPanickingToolStopsItsHeartbeat(t *testing.T) {
	e := newEnv(t)
	e.store.real = true
	op := ticketOp("k-panic", "x")
	op.LeaseTTL = time.Second
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the tool's panic did not reach the caller")
			}
		}()
		_, _ = e.runner.Do(context.Background(), op, func(context.Context) (*Result, error) { panic("boom") })
	}()
	before := e.store.count("heartbeat")
	time.Sleep(3 * op.LeaseTTL)
	if n := e.store.count("heartbeat") - before; n != 0 {
		t.Fatalf("%d heartbeats after the tool panicked", n)
	}
	if rec := e.store.record(op.Tenant, op.Key); rec == nil || !rec.LeaseExpiresAt.Time().Before(time.Now()) {
		t.Fatalf("the lease of the panicked attempt is still live: %+v", rec)
	}
}

// A caller that gives up does not end the lease of a tool still running (one that
// does not watch its context): the heartbeat goes on until the tool returns, so no
// second worker recovers the key and runs it again meanwhile.
func TestCancelledCallerKeepsTheLeaseWhileTheToolRuns(t *testing.T) {
	e := newEnv(t)
	e.store.real = true
	op := ticketOp("k-cancel", "x")
	op.LeaseTTL = time.Second
	op.Probe = e.tickets.probe("k-cancel")
	ctx, cancel := context.WithCancel(context.Background())
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := e.runner.Do(ctx, op, func(context.Context) (*Result, error) {
			close(started)
			<-release // an SDK call that does not take ctx
			return e.tickets.create("k-cancel"), nil
		})
		done <- err
	}()
	<-started
	cancel()
	time.Sleep(3 * op.LeaseTTL)
	op2 := op
	op2.AttemptID, op2.Actor = "", "worker-2"
	wctx, wcancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, err := e.runner.Do(wctx, op2, e.createFn("k-cancel"))
	wcancel()
	if KindOf(err) != KindNotExecuted {
		t.Errorf("a second worker while the first tool still ran: %v (kind %q), want not_executed after waiting in_progress", err, KindOf(err))
	}
	close(release)
	err1 := <-done
	t.Logf("the first worker: %v", err1)
	if n := e.tickets.created.Load(); n != 1 {
		t.Fatalf("%d tickets created, want 1", n)
	}
}

// A store that sheds the approval long-poll (resource_exhausted) is waited for with
// backoff, within StoreWait: it was polled and reserved again as fast as the loop ran.
// A refusal of the long-poll is not_executed, one of Do's kinds.
func TestApprovalWaitBacksOffAndKeepsToTheKinds(t *testing.T) {
	e, op := approvalWaitFailing(t, idemkv.Errorf(idemkv.ErrResourceExhausted, "too many long-polls"))
	_, err := e.runner.Do(ctxT(t), op, e.createFn(op.Key))
	if KindOf(err) == "" {
		t.Errorf("Do: %v has none of the kinds", err)
	}
	if n := e.store.count("reserve"); n > 200 {
		t.Errorf("%d reserves in a wait of 1 s: no backoff", n)
	}
	e, op = approvalWaitFailing(t, idemkv.Errorf(idemkv.ErrPermissionDenied, "token may not read"))
	if _, err := e.runner.Do(ctxT(t), op, e.createFn(op.Key)); KindOf(err) != KindNotExecuted {
		t.Errorf("a refused long-poll: %v (kind %q), want not_executed", err, KindOf(err))
	}
}

// approvalWaitFailing is a store whose every get fails with err, and an op that waits
// a second for its approval.
func approvalWaitFailing(t *testing.T, err error) (*testEnv, Op) {
	e := newEnv(t)
	e.store.real = true
	e.store.faults(func(op string, n int) error {
		if op == "get" {
			return err
		}
		return nil
	}, nil)
	op := ticketOp("k-appr", "x")
	op.Approval = &ApprovalRequirement{Required: true, Wait: time.Second}
	return e, op
}

// A reserve that lands while the caller gives up leaves this attempt holding the key:
// Do says so with the attempt id to retry as (store_unavailable), not not_executed,
// whose retry with a new attempt waited out the lease and, for a tool without a probe,
// marked the key in doubt though nothing had run.
func TestCallerGivingUpDuringTheFirstReserveNamesTheAttempt(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	e.store.faults(nil, func(op string, n int) error {
		if op == "reserve" && n == 1 {
			cancel()
			return context.Canceled
		}
		return nil
	})
	op := ticketOp("k-gave-up", "x")
	_, err := e.runner.Do(ctx, op, e.createFn("k-gave-up"))
	var su *StoreUnavailableError
	if !errors.As(err, &su) || su.AttemptID == "" {
		t.Fatalf("Do: %v (kind %q), want store_unavailable naming the attempt", err, KindOf(err))
	}
	rec := e.store.record(op.Tenant, op.Key)
	if rec == nil || rec.AttemptID != su.AttemptID {
		t.Fatalf("the record's attempt %+v, the error's %q", rec, su.AttemptID)
	}
	op.AttemptID = su.AttemptID
	if out, err := e.runner.Do(ctxT(t), op, e.createFn("k-gave-up")); err != nil || out.Replayed {
		t.Fatalf("the retry as the same attempt: %+v, %v; want it to run", out, err)
	}
}
