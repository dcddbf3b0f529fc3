package client

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testlog"
)

// TestEveryDoErrorHasExactlyOneKind walks every way Do can fail and checks that the
// error answers errors.Is for exactly one of the six kinds, that KindOf names it, that
// the typed error is there, and that the cause is kept where there is one (issue 14,
// point 2: an unknown outcome used to come back as the tool's raw error).
func TestEveryDoErrorHasExactlyOneKind(t *testing.T) {
	toolErr := errors.New("POST /tickets: context deadline exceeded")
	unavailable := func(string, int) error { return idemkv.Errorf(idemkv.ErrUnavailable, "no leader") }
	short := func(e *testEnv) *Runner {
		r, err := NewRunner(e.store, RunConfig{Logger: testlog.New(t), StoreWait: 300 * time.Millisecond,
			BackoffMin: time.Millisecond, BackoffMax: 20 * time.Millisecond, CommitGrace: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	cases := []struct {
		name string
		kind string
		// run returns Do's error, and the cause that must be kept (nil: none).
		run func(t *testing.T, e *testEnv) (err, cause error)
		as  func(error) bool
	}{
		{"an invalid op", KindNotExecuted, func(t *testing.T, e *testEnv) (error, error) {
			op := ticketOp("k1", "x")
			op.Tool = ""
			_, err := e.runner.Do(ctxT(t), op, e.createFn("k1"))
			return err, idemkv.ErrInvalidArgument
		}, isType[*NotExecutedError]},
		{"no tool function", KindNotExecuted, func(t *testing.T, e *testEnv) (error, error) {
			_, err := e.runner.Do(ctxT(t), ticketOp("k2", "x"), nil)
			return err, idemkv.ErrInvalidArgument
		}, isType[*NotExecutedError]},
		{"a read-only tool's error", KindNotExecuted, func(t *testing.T, e *testEnv) (error, error) {
			_, err := e.runner.Do(ctxT(t), Op{Tenant: "t", Key: "k3", Tool: "get", Class: ReadOnly},
				func(context.Context) (*Result, error) { return nil, toolErr })
			return err, toolErr
		}, isType[*NotExecutedError]},
		{"the tool says not executed", KindNotExecuted, func(t *testing.T, e *testEnv) (error, error) {
			_, err := e.runner.Do(ctxT(t), ticketOp("k4", "x"), func(context.Context) (*Result, error) { return nil, NotExecuted(toolErr) })
			if e.store.record("tenant_42", "k4") != nil {
				t.Error("the key was not released")
			}
			return err, toolErr
		}, isType[*NotExecutedError]},
		{"the reserve is refused", KindNotExecuted, func(t *testing.T, e *testEnv) (error, error) {
			e.store.faults(func(op string, _ int) error { return idemkv.Errorf(idemkv.ErrPermissionDenied, "no") }, nil)
			_, err := e.runner.Do(ctxT(t), ticketOp("k5", "x"), mustNotRunFn(t))
			return err, idemkv.ErrPermissionDenied
		}, isType[*NotExecutedError]},
		{"the context ends while another attempt holds the key", KindNotExecuted, func(t *testing.T, e *testEnv) (error, error) {
			op := ticketOp("k6", "x")
			op.LeaseTTL = time.Minute
			e.holdLease(t, op)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, err := e.runner.Do(ctx, op, mustNotRunFn(t))
			return err, context.DeadlineExceeded
		}, isType[*NotExecutedError]},
		{"the tool fails for good", KindStoredFailure, func(t *testing.T, e *testEnv) (error, error) {
			_, err := e.runner.Do(ctxT(t), ticketOp("k7", "x"), func(context.Context) (*Result, error) { return nil, Permanent(toolErr) })
			return err, toolErr
		}, isType[*StoredFailureError]},
		{"a stored failure is replayed", KindStoredFailure, func(t *testing.T, e *testEnv) (error, error) {
			op := ticketOp("k8", "x")
			_, _ = e.runner.Do(ctxT(t), op, func(context.Context) (*Result, error) { return nil, Permanent(toolErr) })
			_, err := e.runner.Do(ctxT(t), op, mustNotRunFn(t))
			return err, nil
		}, isType[*StoredFailureError]},
		{"the tool's error says nothing", KindOutcomeUnknown, func(t *testing.T, e *testEnv) (error, error) {
			_, err := e.runner.Do(ctxT(t), ticketOp("k9", "x"), func(context.Context) (*Result, error) { return nil, toolErr })
			return err, toolErr
		}, isType[*OutcomeUnknownError]},
		{"the receipt cannot be stored", KindOutcomeUnknown, func(t *testing.T, e *testEnv) (error, error) {
			e.store.faults(func(op string, _ int) error {
				if op == "commit" {
					return idemkv.Errorf(idemkv.ErrUnavailable, "no leader")
				}
				return nil
			}, nil)
			_, err := short(e).Do(ctxT(t), ticketOp("k10", "x"), e.createFn("k10"))
			return err, idemkv.ErrUnavailable
		}, isType[*OutcomeUnknownError]},
		{"the failure cannot be stored", KindOutcomeUnknown, func(t *testing.T, e *testEnv) (error, error) {
			e.store.faults(func(op string, _ int) error {
				if op == "fail" {
					return idemkv.Errorf(idemkv.ErrUnavailable, "no leader")
				}
				return nil
			}, nil)
			_, err := short(e).Do(ctxT(t), ticketOp("k11", "x"), func(context.Context) (*Result, error) { return nil, Permanent(toolErr) })
			return err, toolErr
		}, isType[*OutcomeUnknownError]},
		{"a newer attempt took the key while the tool ran", KindOutcomeUnknown, func(t *testing.T, e *testEnv) (error, error) {
			op := ticketOp("k12", "x")
			op.LeaseTTL = 3 * time.Second
			_, err := e.runner.Do(ctxT(t), op, func(context.Context) (*Result, error) {
				e.store.advance(op.LeaseTTL + time.Second)
				e.holdLease(t, op)
				return e.tickets.create(op.Key), nil
			})
			return err, idemkv.ErrFenced
		}, isType[*OutcomeUnknownError]},
		{"the probe fails", KindOutcomeUnknown, func(t *testing.T, e *testEnv) (error, error) {
			op := ticketOp("k13", "x")
			op.LeaseTTL = 3 * time.Second
			e.leavePending(t, op)
			op.Probe = func(context.Context) (*Result, error) { return nil, toolErr }
			_, err := e.runner.Do(ctxT(t), op, mustNotRunFn(t))
			return err, toolErr
		}, isType[*OutcomeUnknownError]},
		{"a conflict", KindConflict, func(t *testing.T, e *testEnv) (error, error) {
			_, _ = e.runner.Do(ctxT(t), ticketOp("k14", "x"), e.createFn("k14"))
			_, err := e.runner.Do(ctxT(t), ticketOp("k14", "y"), mustNotRunFn(t))
			return err, nil
		}, isType[*ConflictError]},
		{"in doubt", KindInDoubt, func(t *testing.T, e *testEnv) (error, error) {
			op := ticketOp("k15", "x")
			op.LeaseTTL = 3 * time.Second
			e.leavePending(t, op)
			_, err := e.runner.Do(ctxT(t), op, mustNotRunFn(t))
			return err, nil
		}, isType[*InDoubtError]},
		{"no store within StoreWait", KindStoreUnavailable, func(t *testing.T, e *testEnv) (error, error) {
			e.store.faults(unavailable, nil)
			_, err := short(e).Do(context.Background(), ticketOp("k16", "x"), mustNotRunFn(t))
			return err, idemkv.ErrUnavailable
		}, isType[*StoreUnavailableError]},
		{"outcome_unknown from the store within StoreWait", KindStoreUnavailable, func(t *testing.T, e *testEnv) (error, error) {
			e.store.faults(func(string, int) error { return idemkv.Errorf(idemkv.ErrOutcomeUnknown, "leadership lost") }, nil)
			_, err := short(e).Do(context.Background(), ticketOp("k17", "x"), mustNotRunFn(t))
			return err, idemkv.ErrOutcomeUnknown
		}, isType[*StoreUnavailableError]},
		{"the context ends while the store is unavailable", KindStoreUnavailable, func(t *testing.T, e *testEnv) (error, error) {
			e.store.faults(unavailable, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, err := e.runner.Do(ctx, ticketOp("k18", "x"), mustNotRunFn(t))
			return err, idemkv.ErrUnavailable
		}, isType[*StoreUnavailableError]},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			err, cause := c.run(t, e)
			if err == nil {
				t.Fatal("Do returned no error")
			}
			var matched []string
			for _, k := range kinds {
				if errors.Is(err, k.err) {
					matched = append(matched, k.kind)
				}
			}
			if len(matched) != 1 || matched[0] != c.kind || KindOf(err) != c.kind {
				t.Fatalf("%v: kinds %v, KindOf %q; want exactly %q", err, matched, KindOf(err), c.kind)
			}
			if !c.as(err) {
				t.Fatalf("%v: not the typed error of %s (%T)", err, c.kind, err)
			}
			if cause != nil && !errors.Is(err, cause) {
				t.Fatalf("%v: the cause %v is lost", err, cause)
			}
			if strings.Contains(err.Error(), "idemkv: idemkv:") {
				t.Fatalf("the message stutters: %v", err)
			}
		})
	}
	if KindOf(nil) != "" || KindOf(errors.New("x")) != "" {
		t.Fatal("KindOf names a kind for an error that is not Do's")
	}
}

func isType[T error](err error) bool {
	var target T
	return errors.As(err, &target)
}

func mustNotRunFn(t *testing.T) Func {
	return func(context.Context) (*Result, error) {
		t.Error("the tool ran, and must not have")
		return nil, errors.New("must not run")
	}
}

// holdLease reserves op's key for another worker, who keeps it.
func (e *testEnv) holdLease(t *testing.T, op Op) {
	t.Helper()
	res, err := e.store.Reserve(context.Background(), &idemkv.ReserveRequest{Tenant: op.Tenant, Key: op.Key, Tool: op.Tool,
		Fingerprint: mustFP(t, op), AttemptID: "other-worker", LeaseTTLMs: op.LeaseTTL.Milliseconds()})
	if err != nil || (res.Decision != idemkv.DecisionExecute && res.Decision != idemkv.DecisionRecover) {
		t.Fatalf("holdLease: %+v, %v", res, err)
	}
}
