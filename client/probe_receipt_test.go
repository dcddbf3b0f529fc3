package client

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// A probe that finds the effect but reports a receipt without remote_system: the error
// says the tool did not run and the probe found the effect (it used to say "the tool
// ran but its receipt was not stored"), and no commit is sent for a receipt that can
// never be stored. The record stays pending: the outcome is unknown to the store.
func TestProbeReceiptIsCheckedBeforeAnyStoreCall(t *testing.T) {
	e := newEnv(t)
	op := ticketOp("k-probe-bad-receipt", "Outage X")
	op.LeaseTTL = 5 * time.Second
	op.Probe = func(context.Context) (*Result, error) { return &Result{RemoteID: "LIN-1001"}, nil }
	e.leavePending(t, op)
	commits := e.store.count("commit")
	_, err := e.runner.Do(ctxT(t), op, func(context.Context) (*Result, error) {
		t.Error("executed although the probe found the ticket")
		return nil, nil
	})
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("error %v, want outcome unknown", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "the tool did not run") || !strings.Contains(msg, "probe found") || strings.Contains(msg, "the tool ran") ||
		!strings.Contains(msg, "remote_system") {
		t.Errorf("message %q does not say what happened", msg)
	}
	if n := e.store.count("commit") - commits; n != 0 {
		t.Errorf("%d commit calls for a receipt that cannot be stored", n)
	}
	if rec := e.store.record(op.Tenant, op.Key); rec == nil || rec.Status != idemkv.StatusPending {
		t.Fatalf("record %+v, want pending", rec)
	}
}

// A tool whose result lacks remote_id: the message says the tool ran and the receipt
// is invalid, and nothing is sent.
func TestToolReceiptIsCheckedBeforeAnyStoreCall(t *testing.T) {
	e := newEnv(t)
	op := ticketOp("k-tool-bad-receipt", "Outage X")
	_, err := e.runner.Do(ctxT(t), op, func(context.Context) (*Result, error) {
		return &Result{RemoteSystem: "linear"}, nil
	})
	if !errors.Is(err, ErrOutcomeUnknown) || !strings.Contains(err.Error(), "the tool ran, but its receipt is invalid") ||
		!strings.Contains(err.Error(), "remote_id") {
		t.Fatalf("error %v", err)
	}
	if n := e.store.count("commit"); n != 0 {
		t.Errorf("%d commit calls for a receipt that cannot be stored", n)
	}
}
